"""The history of many runs (``python -m pytest_llmspeed history``, docs/history.md), on series
of results files made from one real simulator run.

How the series are made (tests/history_runs.py): the plugin runs once on the simulator (the
tiny profile, 1K and 4K × 1, 4 and 8 in flight, 1 s windows, decode[4K-c8] over capacity),
and its results file is the template of every run: run i starts a day after run i − 1, and
each cell's gated figures (total and per-request tok/s, prompt tok/s) and their intervals are
multiplied by ``step(i) × exp(0.03 z)``, z standard normal drawn per run, cell and figure from
a seeded generator (3 % noise between runs), each figure's interval ±1 % of it (what a 30 s
window gives; the real run's 1 s windows give ±1 % to ±15 % by how busy the machine was, and a
step hidden by its runs' intervals is rightly not found: test_history_method.py). Every cell's
figure is then a series of its own: the 7 measured cells give 12 series per set of files.
"""

from __future__ import annotations

import functools
import json
import math
import random
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from pytest_llmspeed.history import build
from pytest_llmspeed.report.history import document, lines
from tests.history_runs import derive, simulator_run

#: the runs of every test here: each figure's interval ±1 %
derive_ = functools.partial(derive, interval=0.01)


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(simulator_run(tmp_path_factory.mktemp("sim")).read_text())
    return doc


def noisy(seed: int, step_at: int | None = None, step: float = 1.0) -> Callable[..., float]:
    """3 % noise between runs, times ``step`` from run index ``step_at`` on."""
    rng = random.Random(seed)

    def factor(i: int, cell: str, key: str) -> float:
        k = step if step_at is not None and i >= step_at else 1.0
        return k * math.exp(0.03 * rng.gauss(0, 1))

    return factor


def figures_of(history):
    return [f for f in history.current.figures if f.segments]


def cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pytest_llmspeed", "history", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
    )


def test_a_10_percent_drop_at_run_12_of_20_is_found_at_run_12_give_or_take_one(template, tmp_path):
    found = []
    for seed in range(3):  # 3 sets of files: 36 series
        folder = tmp_path / f"set{seed}"
        derive_(template, folder, 20, noisy(seed, step_at=11, step=0.9))
        history = build([folder])
        for f in figures_of(history):
            assert len(f.segments) == 2, (f.cell, f.figure, [s.first for s in f.segments])
            assert f.regressed and f.newest is not None
            assert -0.14 < f.newest.change.relative < -0.06
            found.append(f.segments[1].first + 1)  # the run (1-based) the new level starts at
        assert history.exit_status() == 1
    assert len(found) == 36 and all(abs(run - 12) <= 1 for run in found), found


def test_flat_series_of_40_runs_show_at_most_one_change_point_in_20(template, tmp_path):
    changes = 0
    series = 0
    for seed in (100, 101):  # 2 sets of files: 24 series
        folder = tmp_path / f"flat{seed}"
        derive_(template, folder, 40, noisy(seed))
        for f in figures_of(build([folder])):
            series += 1
            changes += len(f.changes)
    assert series >= 20
    assert changes <= 1


def test_a_10_percent_rise_is_an_improvement_and_exits_0(template, tmp_path):
    derive_(template, tmp_path, 20, noisy(7, step_at=11, step=1.1))
    history = build([tmp_path])
    assert all(f.improved for f in figures_of(history))
    assert history.exit_status() == 0
    assert sum(line.lstrip().startswith("improvement") for line in lines(history)) == 12
    assert cli(str(tmp_path)).returncode == 0


def test_a_1_percent_step_is_below_the_minimum_magnitude_and_not_reported(template, tmp_path):
    derive_(template, tmp_path, 20, noisy(8, step_at=11, step=0.99))
    history = build([tmp_path])
    assert all(len(f.segments) == 1 for f in figures_of(history))
    assert history.exit_status() == 0
    # each figure's one level is the runs' mean, with an interval that holds it
    for f in figures_of(history):
        (only,) = f.segments
        assert only.low < only.level < only.high
        assert (only.first, only.last, only.runs) == (0, 19, 20)


def test_a_rise_that_did_not_last_is_back_not_a_regression(template, tmp_path):
    """Runs 11–20 are 15 % faster, then the level is back to runs 1–10: the newest change is
    judged regressed against the rise, but the figure is back where it was (the same as runs
    1–10, or too close to them to tell), and a nightly job must not fail on it. A figure whose
    newest runs the judge finds below runs 1–10 as well (3 % noise: about 5 % below by chance
    in one of twelve figures with this seed) did regress, and fails it."""
    rng = random.Random(11)

    def rise(i: int, cell: str, key: str) -> float:
        return (1.15 if 10 <= i < 20 else 1.0) * math.exp(0.03 * rng.gauss(0, 1))

    derive_(template, tmp_path, 30, rise)
    history = build([tmp_path])
    figs = figures_of(history)
    assert all(len(f.segments) == 3 for f in figs), [(f.cell, len(f.segments)) for f in figs]
    for f in figs:
        assert f.newest is not None and f.newest.verdict.value == "regressed"
        assert f.against_earlier is not None
        below = f.against_earlier.value == "regressed"
        assert f.returned is not below and f.regressed is below, (f.cell, f.figure)
        assert (f.back_to is not None) is (f.against_earlier.value == "same")
    back = [f for f in figs if f.returned]
    assert len(back) >= 10
    assert history.exit_status() == int(any(f.regressed for f in figs))
    shown = lines(history)
    assert sum(line.lstrip().startswith("back ") for line in shown) == len(back)
    assert sum(line.lstrip().startswith("REGRESSION") for line in shown) == len(figs) - len(back)
    assert any(f"{len(back)} back to an earlier level" in line for line in shown), shown
    near = [line for line in shown if "too close to tell" in line]
    assert len(near) == sum(f.returned and f.back_to is None for f in figs)
    assert cli(str(tmp_path)).returncode == history.exit_status()


@pytest.mark.parametrize("last", [0.85, 0.9], ids=["new-low", "the-dip-again"])
def test_a_fall_after_a_dip_and_a_recovery_is_a_regression_not_back(template, tmp_path, last):
    """Levels 100 → 90 → 100 → 85 (or → 90) over 50 nightly runs, 2 % noise: the newest level
    is 10–15 % below the one before it. It may be judged the same as the dip of runs 14–26,
    but that dip was itself a regression: the figure is not "back" anywhere, the run fails.
    Deterministic: a fixed seed."""
    rng = random.Random(5)
    levels = [1.0] * 13 + [0.9] * 13 + [1.0] * 13 + [last] * 11

    def factor(i: int, cell: str, key: str) -> float:
        return levels[i] * math.exp(0.02 * rng.gauss(0, 1))

    derive_(template, tmp_path, len(levels), factor)
    history = build([tmp_path])
    figs = figures_of(history)
    assert figs
    for f in figs:
        assert f.newest is not None and f.newest.verdict.value == "regressed", f.cell
        assert f.regressed and not f.returned, (f.cell, f.figure, f.against_earlier)
    assert history.exit_status() == 1
    shown = lines(history)
    assert not any(line.lstrip().startswith("back ") for line in shown), shown
    assert not any("did not last" in line for line in shown), shown
    again = [line for line in shown if "which was itself a regression" in line]
    assert len(again) == sum(f.back_to is not None for f in figs)
    if last == 0.9:  # the same level as the dip: most figures are judged so
        assert len(again) >= len(figs) // 2, shown
    assert cli(str(tmp_path)).returncode == 1


def test_runs_of_other_settings_are_a_series_of_their_own_said_once(template, tmp_path):
    def longer(i: int, doc: dict[str, Any]) -> None:
        if i >= 10:
            doc["run"]["settings"] = {**doc["run"]["settings"], "max_output": 256}

    # the second half is 20 % slower, but measures another thing: no change within a series
    derive_(template, tmp_path, 20, noisy(9, step_at=10, step=0.8), edit=longer)
    history = build([tmp_path])
    assert [len(s.runs) for s in history.series] == [10, 10]
    assert [s.settings["max_output"] for s in history.series] == [128, 256]
    assert all(len(f.segments) <= 1 for s in history.series for f in s.figures)
    shown = lines(history)
    assert sum("runs with other settings" in line for line in shown) == 1
    assert any("max_output 256" in line and "decides the exit status" in line for line in shown)
    assert history.exit_status() == 0


def test_cells_missing_over_capacity_or_failed_in_some_runs_are_not_zero(template, tmp_path):
    def gaps(i: int, doc: dict[str, Any]) -> None:
        cells = doc["cells"]
        if i in (3, 4):  # decode[1K-c1] not in these runs at all
            doc["cells"] = [c for c in cells if c["id"] != "decode[1K-c1]"]
        for c in doc["cells"]:
            if c["id"] == "decode[1K-c4]" and i in (5, 6):  # failed: no figures
                for key in ("total_tok_s", "per_request_tok_s", "total_tok_s_ci"):
                    c.pop(key, None)
                c["status"] = "failed"
            if c["id"] == "decode[1K-c8]" and i == 7:  # over capacity in one run
                c.clear()
                c.update(id="decode[1K-c8]", phase="decode", context="1K", concurrency=8)
                c.update(status="over capacity", reason="over capacity")
            if c["id"] == "decode[4K-c1]" and i == 8:  # failed, its figures kept (the gate's)
                c["status"] = "failed"

    derive_(template, tmp_path, 20, noisy(10), edit=gaps)
    history = build([tmp_path])
    by = {(f.cell, f.figure): f for f in history.current.figures}
    missing = by["decode[1K-c1]", "total_tok_s"]
    assert missing.states[3:5] == ("missing", "missing") and missing.values[3:5] == (None, None)
    failed = by["decode[1K-c4]", "total_tok_s"]
    assert failed.states[5:7] == ("failed", "failed") and failed.values[5] is None
    over = by["decode[1K-c8]", "total_tok_s"]
    assert over.states[7] == "over capacity" and over.values[7] is None
    kept = by["decode[4K-c1]", "total_tok_s"]
    assert kept.states[8] == "failed" and kept.values[8] is not None
    for f in (missing, failed, over, kept):  # one level, of the runs that measured it
        assert len(f.segments) == 1, f.cell
        assert f.segments[0].runs == sum(v is not None for v in f.values)
    # a cell over capacity in every run: shown so, never a figure
    never = by["decode[4K-c8]", "total_tok_s"]
    assert set(never.states) == {"over capacity"} and never.segments == ()
    doc = document(history)
    shown = next(f for f in doc["series"][0]["figures"] if f["cell"] == "decode[1K-c4]")
    assert shown["values"][5] is None and shown["states"][5] == "failed"


def test_a_segment_names_the_engine_version_and_meta_keys_that_changed_at_its_start(
    template, tmp_path
):
    def upgrade(i: int, doc: dict[str, Any]) -> None:
        run = doc["run"]
        run["engine_version"] = "0.27.0" if i >= 11 else "0.26.1"
        run["metadata"] = {"commit": "b2" if i >= 11 else "a1", "hardware": "sim"}

    derive_(template, tmp_path, 20, noisy(11, step_at=11, step=0.9), edit=upgrade)
    history = build([tmp_path])
    f = next(f for f in figures_of(history) if f.cell == "decode[1K-c1]")
    assert f.segments[0].changed == () and f.segments[0].engine_version == "0.26.1"
    assert f.segments[1].first == 11 and f.segments[1].engine_version == "0.27.0"
    assert f.segments[1].changed == (("engine_version", "0.26.1", "0.27.0"), ("commit", "a1", "b2"))
    line = next(ln for ln in lines(history) if "decode[1K-c1] total tok/s" in ln)
    assert line.lstrip().startswith("REGRESSION") and "since run 12 of 20" in line
    assert line.endswith("engine_version 0.26.1 → 0.27.0; commit a1 → b2")


def test_a_change_found_one_run_off_the_upgrade_still_names_it(template, tmp_path):
    """The step at run 12 (index 11), the upgrade recorded from run 13: nothing changed at the
    segment's start, and the line names the upgrade one run later (the noise can put a change
    point one run off the run that caused it)."""

    def upgrade(i: int, doc: dict[str, Any]) -> None:
        doc["run"]["engine_version"] = "0.27.0" if i >= 12 else "0.26.1"

    derive_(template, tmp_path, 20, noisy(11, step_at=11, step=0.9), edit=upgrade)
    history = build([tmp_path])
    f = next(f for f in figures_of(history) if f.cell == "decode[1K-c1]")
    assert f.segments[1].first == 11 and f.segments[1].changed == ()
    assert f.segments[1].changed_near == ((12, "engine_version", "0.26.1", "0.27.0"),)
    line = next(ln for ln in lines(history) if "decode[1K-c1] total tok/s" in ln)
    assert line.endswith("engine_version 0.26.1 → 0.27.0 one run later (at run 13)"), line
    doc = document(history)
    seg = next(x for x in doc["series"][0]["figures"] if x["cell"] == "decode[1K-c1]")["segments"][
        1
    ]
    assert seg["changed_near"] == [
        {"run": 12, "key": "engine_version", "before": "0.26.1", "after": "0.27.0"}
    ]


def test_exit_status_and_outputs_of_the_command(template, tmp_path):
    folder = tmp_path / "runs"
    derive_(template, folder, 20, noisy(12, step_at=11, step=0.9))
    (folder / "benchmark.json").write_text('{"benchmarks": []}')  # not a results file
    run = cli(str(folder), "--json", str(tmp_path / "h.json"), "--html", str(tmp_path / "h.html"))
    assert run.returncode == 1, run.stderr
    assert "1 other file(s) skipped" in run.stdout and "REGRESSION" in run.stdout
    doc = json.loads((tmp_path / "h.json").read_text())
    assert doc["schema"] == "pytest-llmspeed/history/v1" and doc["files"] == 20
    regressed = [
        f
        for f in doc["series"][0]["figures"]
        if f["changes"] and f["changes"][-1]["verdict"] == "regressed"
    ]
    assert len(regressed) == 12 and all(len(f["values"]) == 20 for f in regressed)
    assert (tmp_path / "h.html").read_text().count('<svg class="chart history"') == 14


@pytest.mark.parametrize(
    ("setup", "args", "words"),
    [
        ("truncated", ["runs"], "runs/run-0003.json: not a pytest-llmspeed results file (not JSON"),
        ("malformed", ["runs"], "runs/run-0003.json: a malformed results file"),
        ("newer", ["runs"], "newer than this pytest-llmspeed reads"),
        ("none", ["empty"], "no results files (written by --llm-results) found"),
        ("none", ["nowhere"], "nowhere: no such results file or folder"),
        ("none", ["runs", "--tolerance", "2"], "tolerance 2.0 must be a fraction"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(template, tmp_path, setup, args, words):
    paths = derive_(template, tmp_path / "runs", 5, noisy(13))
    (tmp_path / "empty").mkdir()
    broken = paths[3]
    if setup == "truncated":
        broken.write_text(broken.read_text()[:500])
    elif setup == "malformed":
        doc = json.loads(broken.read_text())
        doc["cells"][0]["status"] = "sideways"
        broken.write_text(json.dumps(doc))
    elif setup == "newer":
        doc = json.loads(broken.read_text())
        doc["schema"] = "pytest-llmspeed/results/v9"
        broken.write_text(json.dumps(doc))
    run = cli(*args, cwd=tmp_path)
    assert run.returncode == 2
    assert run.stdout == ""
    assert len(run.stderr.strip().splitlines()) == 1, run.stderr
    assert words in run.stderr and "Traceback" not in run.stderr
    if setup != "none":  # a broken file: what to do
        assert "remove it (or move it out of the folder) to read the others" in run.stderr


def test_a_results_file_named_on_the_command_line_must_be_one(template, tmp_path):
    derive_(template, tmp_path, 3, noisy(14))
    other = tmp_path / "benchmark.json"
    other.write_text('{"benchmarks": []}')
    run = cli(str(tmp_path / "run-0000.json"), str(other))
    assert (
        run.returncode == 2 and "benchmark.json: not a pytest-llmspeed results file" in run.stderr
    )
    assert "remove it to read the others" in run.stderr


def test_runs_are_ordered_by_when_they_started_not_by_name(template, tmp_path):
    paths = derive_(template, tmp_path, 20, noisy(15, step_at=11, step=0.9))
    for p in paths:  # names in reverse time order
        p.rename(tmp_path / f"x-{99 - int(p.stem.split('-')[1]):02d}.json")
    history = build([tmp_path])
    assert [r.started for r in history.current.runs] == sorted(
        r.started for r in history.current.runs
    )
    assert all(f.regressed for f in figures_of(history))


def test_one_run_is_a_history_too_of_one_point_per_cell(template, tmp_path):
    (path,) = derive_(template, tmp_path / "runs", 1, noisy(16))
    run = cli(str(path), "--html", str(tmp_path / "one.html"))
    assert run.returncode == 0, run.stderr
    assert "measured in fewer than two runs" in run.stdout
    assert (tmp_path / "one.html").read_text().count('<svg class="chart history"') == 14
