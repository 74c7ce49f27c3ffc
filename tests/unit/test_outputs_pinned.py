"""Every output, rendered from one stored results file, is what 0.1.0 printed for that run.

``tests/data/v1/`` holds a run of 0.1.0 (commit f7d8ec3) against the simulator: a baseline taken
at ``speed=4``, then a gated run at ``speed=2`` (prefill and decode regressions confirmed by a
re-measurement, a cell with no floor, an over-capacity cell, cells longer than max_model_len):
its results file, its JUnit XML, its terminal output, its step summary, its pytest-benchmark
entries, and what 0.1.0's renderers gave for those records (``rendered/``). The typed model
must read the file and give the same text, property for property.
"""

import json
import re
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from pytest_llmspeed.gate import baseline as baseline_file
from pytest_llmspeed.gate.verdict import account
from pytest_llmspeed.report.markdown import summary
from pytest_llmspeed.report.terminal import gate_lines, render
from pytest_llmspeed.results import load

DATA = Path(__file__).resolve().parents[1] / "data" / "v1"


@pytest.fixture(scope="module")
def results():
    return load(DATA / "results.json")


def test_the_file_is_read_and_written_back_unchanged(results):
    assert results.to_document() == json.loads((DATA / "results.json").read_text())


@pytest.mark.parametrize("width", [80, 200])
@pytest.mark.parametrize("verbose", [False, True])
def test_terminal_matrix(results, width, verbose):
    expected = (DATA / "rendered" / f"terminal_w{width}_{'v' if verbose else 'q'}.txt").read_text()
    lines = render(list(results.cells), width, verbose, list(results.run.notes))
    assert "\n".join(lines) + "\n" == expected


def test_terminal_section_of_the_real_run(results):
    """The run printed the wide matrix and the details (-v, COLUMNS=200) and the gate's lines.

    The gate's summary grew (every baseline cell accounted for, cells counted not figures); its
    regression and no-floor lines are as 0.1.0 printed them."""
    printed = (DATA / "terminal.txt").read_text()
    for line in render(list(results.cells), 200, True, list(results.run.notes)):
        for part in line.splitlines():
            assert part in printed, part
    baseline = baseline_file.load(DATA / "baseline.toml")
    selected = [str(c.id) for c in results.cells]
    gate = gate_lines("baseline.toml", account(baseline, results.cells, selected))
    # the counts name the judge's four verdicts (issue 31), where 0.1.0 said "passed"
    old = [line for line in printed.splitlines() if line.startswith(("  REGRESSION", "  no floor"))]
    assert [line for line in gate if line.startswith(("  REGRESSION", "  no floor"))] == old
    assert gate[1] == "Baseline baseline.toml: 6 regression(s), 0 improvement(s) beyond tolerance"
    assert gate[2] == (
        "  6 baseline cell(s): 0 same, 0 improved, 0 unknown, 6 regressed, 0 not run, "
        "0 deselected, 0 not gated"
    )


def test_markdown_step_summary(results):
    expected = (DATA / "step_summary.md").read_text()
    title = expected.splitlines()[0].removeprefix("## ")
    # 0.1.0's summary, and the gate's verdicts counted before its regressions (issue 31)
    counts = "**Against the baseline**: 6 regressed, 0 unknown, 0 improved, 0 same\n\n"
    expected = expected.replace("**Regressions**", counts + "**Regressions**", 1)
    assert summary(title, list(results.cells), list(results.run.notes)) == expected


def _as_010(props):
    """The properties 0.1.0 wrote: without the gate's verdicts (``gate_*``, issue 31)."""
    return [(k, v) for k, v in props if not k.startswith("gate_")]


def test_junit_properties(results):
    root = ET.parse(DATA / "junit.xml").getroot()
    by_name = {case.get("name"): case for case in root.iter("testcase")}
    for cell in results.cells:
        case = by_name[f"test_{cell.id.phase.value}[{cell.id.param_id}]"]
        got = [(p.get("name"), p.get("value")) for p in case.iter("property")]
        assert got == [(k, str(v)) for k, v in _as_010(cell.properties())], str(cell.id)
        gate = dict(cell.properties()).get("gate_verdict")
        assert gate == (cell.gate.outcome.value if cell.gate else None), str(cell.id)
    stored = json.loads((DATA / "rendered" / "properties.json").read_text())
    assert {str(c.id): [list(p) for p in _as_010(c.properties())] for c in results.cells} == (
        stored
    )


def test_pytest_benchmark_entries(results):
    entries = json.loads((DATA / "benchmark_entries.json").read_text())
    for name, entry in entries.items():
        match = re.match(r"test_(\w+)\[(.+)\]", name)
        assert match, name
        phase, param = match.groups()
        cell = results.cell(f"{phase}[{param}]")
        assert entry["extra_info"] == dict(_as_010(cell.properties()))
        assert entry["group"] == f"llmspeed {phase}"
        samples = cell.samples.ttft_ms if phase == "prefill" else cell.samples.tbt_ms
        assert sorted(entry["data"]) == pytest.approx(sorted(ms / 1e3 for ms in samples))


def test_baseline_file(results):
    expected = (DATA / "rendered" / "baseline.toml").read_text()
    found = re.search(r'date = "(.*)"', expected)
    assert found
    date = found.group(1)
    run = {
        "model": "tiny",
        "api": "completions",
        "prompt_form": "ids",
        "max_output": 128,
        "duration_s": 1.0,
        "engine": results.run.engine,
        "engine_version": results.run.engine_version,
        "server": "sim:tiny",
        "kv_capacity": 20000,
    }
    text, count = baseline_file.render(run, list(results.cells), date=date)
    assert text == expected and count == 1
