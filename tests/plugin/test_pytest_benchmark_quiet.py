"""pytest-benchmark's table after a matrix only when the run asks for what it gives (issue 30):
the plugin's own summary already is the matrix."""

import json

import pytest

pytestmark = pytest.mark.slow  # a one-cell matrix on the simulator

ARGS = (
    "--llm-endpoint=sim:tiny?speed=4",
    "--llm-contexts=1K",
    "--llm-concurrency=1",
    "--llm-max-output=64",
    "-m",
    "prefill",
    "-p",
    "no:cacheprovider",
)
TABLE = "*benchmark 'llmspeed prefill'*"


def test_no_table_unless_asked(pytester):
    result = pytester.runpytest(*ARGS)
    result.assert_outcomes(passed=1, deselected=1)
    result.stdout.fnmatch_lines(["Prefill (cold cache, prompt tok/s by context)"])
    result.stdout.no_fnmatch_line(TABLE)
    result.stdout.no_fnmatch_line("*Legend:*")


@pytest.mark.parametrize("asked", ["--benchmark-enable", "--benchmark-json=bench.json"])
def test_the_table_and_entries_when_asked(pytester, asked):
    result = pytester.runpytest(*ARGS, asked)
    result.assert_outcomes(passed=1, deselected=1)
    result.stdout.fnmatch_lines([TABLE])
    if "json" in asked:
        entries = json.loads((pytester.path / "bench.json").read_text())["benchmarks"]
        assert [e["name"] for e in entries] == ["test_prefill[1K]"]


def test_benchmark_skip_leaves_the_cells_alone(pytester):
    """--benchmark-skip skips tests that use pytest-benchmark's fixture: never a cell's."""
    result = pytester.runpytest(*ARGS, "--benchmark-skip")
    result.assert_outcomes(passed=1, deselected=1)
    result.stdout.no_fnmatch_line(TABLE)
