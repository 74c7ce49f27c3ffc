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

pytestmark = pytest.mark.slow

# A 10 % slower server is a regression where the change is past the 5 % tolerance and beyond the
# two figures' noise (the one-sided 99 % test of the gate, docs/gate.md), so each figure must
# move less than a few % on a busy machine, and say so (the thresholds below are those of the
# rule compare had before the one judge, max(5 %, 3 × the combined standard error)):
# - prefill: the reference profile at 10x, whose 16K and 32K cold prefills take 200 and 500 ms
#   (its 8K takes 83 ms, and beside two busy loops a median of 3 came out up to 5.7 % slower;
#   the tiny profile's take 4-15 ms, where jitter alone moved one by 20 %), each the median of
#   3 cold requests;
# - decode: each window runs until its total tok/s is within ±2 % (2 s on a quiet machine, up
#   to 20 s): a busy machine's 2 s windows were ±3-5 %, thresholds up to 11 %, and a −9 % cell
#   "within noise"; capped at 6 s, a machine with four busy loops beside the tests still left
#   4 of 6 cells "within noise" (thresholds ±7.7 %). 512-token
#   requests: every restart pauses a stream for a warm prefill (10-30 ms at 10x), which made
#   128-token windows unsteady
PROFILE = "sim:h200-qwen3.5-27b-int4"
MATRIX = (
    "--llm-contexts=16K,32K",
    "--llm-concurrency=1,4",
    "--llm-duration=20",
    "--llm-precision=2%",
    "--llm-min-duration=2",
    "--llm-max-output=512",
    "--llm-prefill-repeats=3",
    "-p",
    "no:randomly",
)


def run(pytester, endpoint, name, *args):
    result = pytester.runpytest(
        f"--llm-endpoint={endpoint}", *MATRIX, f"--llm-results={name}", *args
    )
    result.assert_outcomes(passed=6)
    return pytester.path / name


def cli(*args, cwd):
    return subprocess.run(
        [sys.executable, "-m", "pytest_llmspeed", *args], cwd=cwd, capture_output=True, text=True
    )


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Three runs of the simulator: speed 10 (the reference), 9 (10 % slower), 10 with 3 %
    noise, each in its own process."""
    work = tmp_path_factory.mktemp("runs")
    out = {}
    for name, spec in (
        ("ref", "speed=10&seed=1"),
        ("slow", "speed=9&seed=2"),
        ("noisy", "speed=10&noise=0.03&seed=3"),
    ):
        done = subprocess.run(
            [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-W", "ignore",
             f"--llm-endpoint={PROFILE}?{spec}", *MATRIX, f"--llm-results={name}.json"],
            cwd=work, capture_output=True, text=True, timeout=900,
        )  # fmt: skip
        assert done.returncode == 0, done.stdout[-2000:]
        out[name] = work / f"{name}.json"
    return out


def test_a_ten_percent_slower_server_is_a_regression_in_every_measured_cell(runs, tmp_path):
    done = cli("compare", str(runs["ref"]), str(runs["slow"]), "--markdown", "c.md", cwd=tmp_path)
    assert done.returncode == 1, done.stdout + done.stderr  # a regression: exit 1
    cmp = compare(load(runs["ref"]), load(runs["slow"]))
    verdicts = {c.cid: c.verdict for c in cmp.cells}
    # every decode cell regressed (unknown only where the machine's load widened a window's
    # interval beyond telling: a −40 % window of ±28 % beside other tests); no cell same or
    # improved. A prefill cell is the median of 3 cold requests, with no interval (the flat
    # rule): measured here, a 10 % slower server moved a prefill figure by −4.2 % to −12.3 %
    # from one run to the next, so a prefill cell may read same, as the stored gate would
    # read it; it is never improved.
    decode = {cid: v for cid, v in verdicts.items() if cid.startswith("decode")}
    assert set(decode.values()) <= {Verdict.REGRESSION, Verdict.UNKNOWN}, done.stdout
    assert sum(v is Verdict.REGRESSION for v in decode.values()) >= 3, done.stdout
    assert Verdict.IMPROVEMENT not in verdicts.values(), done.stdout
    assert f"6 cell(s): {cmp.count(Verdict.REGRESSION)} regressed, " in done.stdout
    changes = [float(x) for x in _changes(done.stdout, "REGRESSION")]
    # −10 % on the server; a busy machine moves a figure by a few points more (−8.4 to −10.8 %
    # beside two busy loops)
    assert changes and all(-18 < c < -4 for c in changes), changes
    assert "❌" in (tmp_path / "c.md").read_text()


def test_a_noisy_server_at_the_same_speed_is_no_regression(runs, tmp_path):
    # At 10 %: compare judges as the stored gate on a one-run baseline, whose noise is the
    # windows' intervals only. Two runs at the same speed on this shared machine (load 6-9)
    # differed by −6.6 % and −8.4 % beyond those intervals, a shift between runs that no
    # window sees (docs/gate.md, "Across restarts": a one-run baseline cannot tell it from a
    # slowdown); at 5 % the judge called them regressed, as the gate would.
    done = cli("compare", str(runs["ref"]), str(runs["noisy"]), "--tolerance=0.1", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "6 cell(s): 0 regressed, " in done.stdout, done.stdout
    unknown = int(re.search(r"(\d+) unknown", done.stdout).group(1))  # type: ignore[union-attr]
    assert unknown == done.stdout.count("  unknown     "), done.stdout  # each named
    # what an unknown does to the exit status: warn by default, fail when asked
    strict = cli(
        "compare", str(runs["ref"]), str(runs["noisy"]), "--tolerance=0.1", "--unknown=fail",
        cwd=tmp_path,
    )  # fmt: skip
    assert strict.returncode == (1 if unknown else 0), strict.stdout + strict.stderr


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
    result = pytester.runpytest(
        f"--llm-endpoint={PROFILE}?speed=9&seed=4", *MATRIX, f"--llm-compare={runs['ref']}"
    )
    result.assert_outcomes(passed=6)
    result.stdout.fnmatch_lines(
        ["Compared with *ref.json (*", "  6 cell(s): * regressed, * unknown, 0 improved, * same"]
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
