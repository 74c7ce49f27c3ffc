"""A baseline of several runs through the plugin: --llm-save-baseline adds a run to a file of
the same settings, refuses one of other settings before any cell runs, still reads a file
written before runs; confirmations on a fresh start of a server the plugin starts; --llm-runs."""

import shutil
import tomllib
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # every test here runs cells on the simulator

TODAY = Path(__file__).parents[1] / "data" / "baseline" / "one_run_dee8b0b.toml"

ARGS = (
    "--llm-contexts=1K",
    "--llm-concurrency=1",
    "--llm-duration=1",
    "--llm-max-output=128",
    "-p",
    "no:randomly",
)


def sim(query="speed=1&seed=3"):
    return f"--llm-endpoint=sim:tiny?{query}"


def runs_of(path):
    return tomllib.loads(Path(path).read_text())["run"].get("runs", 1)


def test_a_second_run_is_added_to_the_baseline(pytester):
    result = pytester.runpytest(sim(), *ARGS, "--llm-save-baseline=b.toml")
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(["note: baseline: 2 cells written to b.toml"])
    result = pytester.runpytest(sim(), *ARGS, "--llm-save-baseline=b.toml")
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(["note: baseline: run 2 added to b.toml (2 cells; 2 runs now)"])
    doc = tomllib.loads((pytester.path / "b.toml").read_text())
    assert doc["run"]["runs"] == 2 and len(doc["run"]["dates"]) == 2
    assert len(doc["cells"]["decode[1K-c1]"]["total_tok_s_runs"]) == 2


def test_a_run_of_other_settings_is_refused_before_any_cell(pytester):
    pytester.runpytest(sim(), *ARGS, "--llm-save-baseline=b.toml").assert_outcomes(passed=2)
    before = (pytester.path / "b.toml").read_text()
    result = pytester.runpytest(sim(), *ARGS, "--llm-max-output=64", "--llm-save-baseline=b.toml")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    errors = [line for line in result.stderr.lines if line.startswith("ERROR")]
    assert errors == [
        "ERROR: pytest-llmspeed: --llm-save-baseline: b.toml holds runs taken with other "
        "settings (max_output 128 in the baseline, 64 now): a run is added only to runs of the "
        "same settings and server; save to another file, or delete this one to start a new "
        "baseline"
    ]
    assert "Traceback" not in result.stderr.str()
    result.assert_outcomes()  # no cell ran
    assert (pytester.path / "b.toml").read_text() == before


def test_a_file_written_before_runs_is_gated_on_and_added_to(pytester):
    shutil.copy(TODAY, pytester.path / "b.toml")
    same = ("--llm-duration=2", "--llm-prefill-repeats=6")
    result = pytester.runpytest(sim(), *ARGS, *same, "--llm-baseline=b.toml", "--llm-confirm=0")
    result.stdout.fnmatch_lines(["Baseline *b.toml: * regression(s), *"])
    assert "other settings" not in result.stdout.str()
    result = pytester.runpytest(sim(), *ARGS, *same, "--llm-save-baseline=b.toml")
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(["note: baseline: run 2 added to b.toml (2 cells; 2 runs now)"])
    doc = tomllib.loads((pytester.path / "b.toml").read_text())
    assert doc["run"]["runs"] == 2
    assert len(doc["cells"]["decode[1K-c1]"]["total_tok_s_runs"]) == 2
    assert "total_tok_s_runs" not in doc["cells"]["decode[4K-c1]"]  # not measured: one run
