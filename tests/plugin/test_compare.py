"""Comparing two runs, cell by cell (python -m pytest_llmspeed compare, and --llm-compare), by
the stored gate's judge: a 10 % slower server is regressed by about −10 % in every measured cell
and nothing else; a noisy server at the same speed is no regression (same, or unknown where its
noise hides the answer: exit 0, or 1 with --unknown=fail)."""

import json
import re
import subprocess
import sys

import pytest

from pytest_llmspeed.report.compare import Verdict, compare
from pytest_llmspeed.results import load
from tests.history_runs import derive, simulator_run

pytestmark = pytest.mark.slow

# Chance: none. The runs compared are made, not measured: one real run of the reference profile at
# 10x (its document has every key, interval and server figure a run writes), and from it, by
# tests/history_runs.py's ``derive``, a run whose every gated figure is 10 % lower (a 10 % slower
# server) and one whose figures moved by at most 3 % either way (a noisy server at the same speed),
# each with its intervals made ±1 % or ±3 % of its figures. Their verdicts are therefore certain:
# what the tests check is that ``compare`` and ``--llm-compare`` read, judge and print them as
# documented (the judge's own statistics are tests/unit's; whether a real 10 % slower server is
# caught through the noise of a busy machine is the gate's benchmark, benchmarks/gate_noise.py, and
# the A/B's, benchmarks/results/ab_vs_stored.md).
PROFILE = "sim:h200-qwen3.5-27b-int4"
MATRIX = (
    "--llm-contexts=16K,32K",
    "--llm-concurrency=1,4",
    "--llm-duration=1",
    "--llm-max-output=512",
    "--llm-prefill-repeats=3",
    "-p",
    "no:randomly",
)
#: the noisy run's factor per cell, at most 3 % from 1 either way
NOISE = {
    "prefill[16K]": 1.02,
    "prefill[32K]": 0.97,
    "decode[16K-c1]": 1.03,
    "decode[16K-c4]": 0.98,
    "decode[32K-c1]": 0.99,
    "decode[32K-c4]": 1.01,
}


def cli(*args, cwd):
    return subprocess.run(
        [sys.executable, "-m", "pytest_llmspeed", *args], cwd=cwd, capture_output=True, text=True
    )


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The reference run (one real run of the simulator at 10x), a 10 % slower one and a
    noisy one at the same speed derived from it, and one three times as fast (for a real run
    compared with it inside pytest: every cell of a real run at 10x is far below it)."""
    work = tmp_path_factory.mktemp("runs")
    template = simulator_run(work / "real", *MATRIX, endpoint=f"{PROFILE}?speed=10&seed=1")
    out = {}
    for name, factor, interval, first in (
        ("ref", lambda i, cell, key: 1.0, 0.01, 0),
        ("slow", lambda i, cell, key: 0.9, 0.01, 1),
        ("noisy", lambda i, cell, key: NOISE[cell], 0.03, 1),
        ("fast", lambda i, cell, key: 3.0, 0.01, 0),
    ):
        (made,) = derive(template, work / name, 1, factor, interval=interval, first=first)
        out[name] = made.rename(work / f"{name}.json")
    return out


def test_a_ten_percent_slower_server_is_a_regression_in_every_measured_cell(runs, tmp_path):
    done = cli("compare", str(runs["ref"]), str(runs["slow"]), "--markdown", "c.md", cwd=tmp_path)
    assert done.returncode == 1, done.stdout + done.stderr  # a regression: exit 1
    cmp = compare(load(runs["ref"]), load(runs["slow"]))
    # every figure 10 % lower, each interval ±1 %: every cell regressed, by −10 %
    assert {c.cid: c.verdict for c in cmp.cells} == dict.fromkeys(NOISE, Verdict.REGRESSION)
    assert "6 cell(s): 6 regressed, 0 unknown, 0 improved, 0 same" in done.stdout, done.stdout
    changes = [float(x) for x in _changes(done.stdout, "REGRESSION")]
    assert len(changes) == 6 and all(-10.1 <= c <= -9.9 for c in changes), changes
    assert "❌" in (tmp_path / "c.md").read_text()


def test_a_noisy_server_at_the_same_speed_is_no_regression(runs, tmp_path):
    # ±3 % moves with ±3 % intervals: within 10 %, the same in every cell; exit 0
    done = cli("compare", str(runs["ref"]), str(runs["noisy"]), "--tolerance=0.1", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "6 cell(s): 0 regressed, 0 unknown, 0 improved, 6 same" in done.stdout, done.stdout
    # within 4 %, every interval straddles the tolerance: unknown, each named; what an unknown
    # does to the exit status: warn by default, fail when asked
    done = cli("compare", str(runs["ref"]), str(runs["noisy"]), "--tolerance=0.04", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "6 cell(s): 0 regressed, 6 unknown, 0 improved, 0 same" in done.stdout, done.stdout
    assert done.stdout.count("  unknown     ") == 6, done.stdout
    strict = cli(
        "compare", str(runs["ref"]), str(runs["noisy"]), "--tolerance=0.04", "--unknown=fail",
        cwd=tmp_path,
    )  # fmt: skip
    assert strict.returncode == 1, strict.stdout + strict.stderr


def _changes(text, word):
    """The changes of ``word``'s lines (``REGRESSION``) of compare's output."""
    return re.findall(
        rf"^  {word} .*: ([−+-][\d.]+)% \(95 % interval", text.replace("−", "-"), re.M
    )


def test_compare_inside_a_pytest_run_goes_to_the_summary_and_the_job_summary(
    pytester, runs, monkeypatch
):
    summary = pytester.path / "summary.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    # the old run's figures are 3 times what the simulator at 10x measured: a run at the same
    # speed regresses in every cell, unless a window measured more than twice its speed
    result = pytester.runpytest(
        f"--llm-endpoint={PROFILE}?speed=10&seed=4", *MATRIX, f"--llm-compare={runs['fast']}"
    )
    result.assert_outcomes(passed=6)
    result.stdout.fnmatch_lines(
        ["Compared with *fast.json (*", "  6 cell(s): 6 regressed, 0 unknown, 0 improved, 0 same"]
    )
    assert "  REGRESSION  decode[" in result.stdout.str()
    assert "compared with" in summary.read_text()


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "error: *missing.json: no such results file"),
        ('{"hello": 1}', "error: *bad.json: not a pytest-llmspeed results file (no 'schema' key*"),
        (
            '{"schema": "pytest-llmspeed/results/v9", "run": {}, "cells": []}',
            "error: *bad.json: results schema v9 is newer than this pytest-llmspeed reads (v1)*",
        ),
    ],
)
def test_bad_input_is_one_line(tmp_path, runs, content, message):
    name = "missing.json" if content is None else "bad.json"
    if content is not None:
        (tmp_path / name).write_text(content)
    done = cli("compare", name, str(runs["ref"]), cwd=tmp_path)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and pytest.importorskip("fnmatch").fnmatch(lines[0], message), lines


def test_two_different_models_is_a_warning_not_a_crash(runs, tmp_path):
    doc = json.loads(runs["ref"].read_text())
    doc["run"]["model"] = "another-model"
    (tmp_path / "other.json").write_text(json.dumps(doc))
    done = cli("compare", "other.json", str(runs["slow"]), "--html", "p.html", cwd=tmp_path)
    assert "warning: comparing two different models: another-model (old), qwen (new)" in done.stdout
    assert (tmp_path / "p.html").is_file()


def test_report_renders_the_page_of_a_results_file_of_an_earlier_version(tmp_path):
    from pathlib import Path

    old = Path(__file__).resolve().parents[1] / "data" / "v1" / "results.json"
    done = cli("report", str(old), "-o", "page.html", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    html = (tmp_path / "page.html").read_text()
    assert "tiny on llmspeed-sim" in html and html.count('<svg class="chart"') == 5  # 0.1.0's file


def test_bad_llm_compare_and_llm_meta_are_usage_errors(pytester):
    (pytester.path / "bad.json").write_text("[]")
    result = pytester.runpytest("--llm-endpoint=sim", "--llm-compare=bad.json")
    result.stderr.fnmatch_lines(["ERROR: --llm-compare: bad.json: not a pytest-llmspeed results*"])
    result = pytester.runpytest("--llm-endpoint=sim", "--llm-meta", "hardware")
    result.stderr.fnmatch_lines(["ERROR: --llm-meta='hardware': give KEY=VALUE, e.g. *"])


def test_a_comparison_inside_a_run_knows_the_runs_own_model_and_engine(pytester, monkeypatch):
    # made after the server was stopped: the run's facts must have outlived it
    summary = pytester.path / "summary.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    small = (
        "--llm-endpoint=sim:tiny?speed=4",
        "--llm-contexts=1K",
        "--llm-concurrency=1",
        "--llm-duration=1",
        "--llm-max-output=64",
        "-p",
        "no:randomly",
    )
    pytester.runpytest(*small, "--llm-results=old.json").assert_outcomes(passed=2)
    summary.unlink()
    result = pytester.runpytest(*small, "--llm-results=new.json", "--llm-compare=old.json")
    result.assert_outcomes(passed=2)
    out = result.stdout.lines
    at = next(i for i, ln in enumerate(out) if ln.startswith("Compared with old.json (tiny · "))
    assert out[at + 1].startswith("  2 cell(s): "), out[at : at + 3]  # no warning, no difference
    assert "warning" not in result.stdout.str()
    assert "None" not in result.stdout.str()
    text = summary.read_text()
    assert "compared with old.json" in text and "warning" not in text
    assert json.loads((pytester.path / "new.json").read_text())["run"]["model"] == "tiny"
