"""A baseline made of several runs (docs/gate.md, "Across restarts"): the runs' values and
intervals beside each reference, a run added to a file of the same settings, another refused
with one line, the pooled between-start spread, and files of earlier versions still read.

``tests/data/baseline/one_run_dee8b0b.toml`` was written by the code of commit dee8b0b (before
this change), on the simulator: ``pytest --llm-endpoint='sim:tiny?speed=4&seed=5&
max_model_len=8192&kv_capacity=32768' --llm-contexts=1K,4K --llm-concurrency=1,4
--llm-duration=2 --llm-max-output=128 --llm-prefill-repeats=6 --llm-save-baseline=...``.
"""

import dataclasses
import math
import shutil
from pathlib import Path

import pytest

from pytest_llmspeed.gate.baseline import (
    BaselineError,
    BaselineMismatch,
    FigureRuns,
    check_addable,
    load,
    render,
    save,
)
from pytest_llmspeed.gate.noise import (
    Z95,
    Spread,
    pooled_spread,
    reference_se,
    t_quantile,
    within_se,
)
from pytest_llmspeed.results import CellId, CellRecord, Status

DATA = Path(__file__).resolve().parents[1] / "data"
TODAY = DATA / "baseline" / "one_run_dee8b0b.toml"
V010 = DATA / "v1" / "baseline.toml"

RUN = {"model": "tiny", "api": "completions", "max_output": 128, "duration_s": 2.0}
D1, D2, D3 = "2026-12-01T00:00:00+00:00", "2026-12-02T00:00:00+00:00", "2026-12-03T00:00:00+00:00"


def decode(cid, total, ci=None, per_request=None, ttft=None):
    return CellRecord(
        CellId.parse(cid),
        Status.VALID,
        1024,
        total_tok_s=total,
        total_tok_s_ci=ci,
        per_request_tok_s=per_request,
        ttft_ms=ttft,
    )


# -- files of earlier versions ----------------------------------------------------------------


def test_a_file_written_before_runs_is_one_run_with_its_intervals():
    b = load(TODAY)
    assert b.runs == 1 and b.spread_unknown
    assert set(b.spread) == {"total_tok_s", "per_request_tok_s", "prompt_tok_s"}
    assert all(s == Spread(None) for s in b.spread.values())
    cell = b.cells["decode[1K-c4]"]
    assert cell.limits == {"total_tok_s": 7671.5, "per_request_tok_s": 1978.2}
    assert cell.figure_runs("total_tok_s") == FigureRuns((7671.5,), ((7625.9, 7717.1),))
    assert cell.intervals["total_tok_s"] == (7625.9, 7717.1)  # the one-run rule reads these
    assert cell.ungated["tbt_ms"] == FigureRuns((0.505,), ((0.504, 0.508),))
    assert b.cells["prefill[4K]"].figure_runs("prompt_tok_s").intervals == ((439831.3, 530888.6),)


def test_a_file_of_0_1_0_without_intervals_is_one_run_without_them():
    b = load(V010)
    assert b.runs == 1 and b.spread_unknown
    cell = b.cells["decode[1K-c4]"]
    assert cell.figure_runs("total_tok_s") == FigureRuns((7672.0,), (None,))
    assert cell.ungated["ttft_ms"] == FigureRuns((2.1,), (None,))


# -- writing and adding -----------------------------------------------------------------------


def test_save_without_a_file_writes_one_run_as_before(tmp_path):
    path = tmp_path / "b.toml"
    records = [decode("decode[1K-c4]", 1000.04, (995.06, 1004.91), 250.0, 5.0)]
    saved = save(path, RUN, records, date=D1)
    assert (saved.cells, saved.runs, saved.added) == (1, 1, False)
    assert saved.message() == f"baseline: 1 cells written to {path}"
    assert path.read_text() == render(RUN, records, date=D1)[0]
    assert "runs" not in path.read_text()


def test_runs_added_one_by_one_make_the_mean_and_keep_each_run(tmp_path):
    path = tmp_path / "b.toml"
    save(path, RUN, [decode("decode[1K-c4]", 1000.0, (990.0, 1010.0), 250.0, 5.0)], date=D1)
    # a hand edit the next run must keep: this cell's own tolerance
    path.write_text(
        path.read_text().replace("# ttft_ms = 5.0\n", "# ttft_ms = 5.0\ntolerance = 0.1\n")
    )
    second = save(
        path,
        RUN,
        [
            decode("decode[1K-c4]", 1020.0, None, 240.0, 6.0),
            decode("decode[1K-c8]", 1800.0, (1790.0, 1810.0)),
        ],
        date=D2,
    )
    assert (second.cells, second.runs, second.added) == (2, 2, True)
    assert second.message() == f"baseline: run 2 added to {path} (2 cells; 2 runs now)"
    third = save(path, RUN, [decode("decode[1K-c4]", 1040.0, (1030.0, 1050.0), 260.0)], date=D3)
    assert third.message() == f"baseline: run 3 added to {path} (1 cells; 3 runs now)"
    text = path.read_text()
    assert f'date = "{D1}"\nruns = 3\ndates = ["{D1}", "{D2}", "{D3}"]\nmodel = "tiny"\n' in text
    assert (
        '[cells."decode[1K-c4]"]\n'
        "total_tok_s = 1020.0\n"
        "total_tok_s_runs = [1000.0, 1020.0, 1040.0]\n"
        "total_tok_s_runs_ci = [[990.0, 1010.0], [], [1030.0, 1050.0]]\n"
        "per_request_tok_s = 250.0\n"
        "per_request_tok_s_runs = [250.0, 240.0, 260.0]\n"
        "# ttft_ms = 5.5\n"  # commented out it stays; the third run had none
        "# ttft_ms_runs = [5.0, 6.0]\n"
        "tolerance = 0.1\n"
    ) in text
    # a cell the first run lacked starts with the run that had it; the third lacked it: kept
    assert '[cells."decode[1K-c8]"]\ntotal_tok_s = 1800.0\ntotal_tok_s_ci = [1790.0, 1810.0]\n' in (
        text
    )
    b = load(path)
    assert b.runs == 3
    cell = b.cells["decode[1K-c4]"]
    assert cell.tolerance == 0.1 and cell.limits["total_tok_s"] == 1020.0
    assert cell.figure_runs("total_tok_s") == FigureRuns(
        (1000.0, 1020.0, 1040.0), ((990.0, 1010.0), None, (1030.0, 1050.0))
    )
    assert cell.ungated["ttft_ms"] == FigureRuns((5.0, 6.0))
    assert "ttft_ms" not in cell.limits  # adding a run never starts gating latency


def test_a_run_is_added_to_a_file_written_before_runs(tmp_path):
    path = tmp_path / "b.toml"
    shutil.copy(TODAY, path)
    run = {k: v for k, v in load(TODAY).run.items() if k != "date"}
    rec = dataclasses.replace(
        decode("decode[1K-c4]", 7600.0, (7550.0, 7650.0), 1960.0, 2.2), tbt_ms=0.51
    )
    save(path, run, [rec], date=D2)
    b = load(path)
    assert b.runs == 2 and b.run["dates"] == ["2026-12-01T16:22:07+00:00", D2]
    cell = b.cells["decode[1K-c4]"]
    assert cell.figure_runs("total_tok_s") == FigureRuns(
        (7671.5, 7600.0), ((7625.9, 7717.1), (7550.0, 7650.0))
    )
    assert cell.limits["total_tok_s"] == 7635.8  # (7671.5 + 7600.0) / 2, to one decimal
    assert cell.ungated["tbt_ms"] == FigureRuns((0.505, 0.51), ((0.504, 0.508), None))
    # the other cells keep their one run, their interval as written
    assert b.cells["decode[4K-c4]"].figure_runs("total_tok_s") == FigureRuns(
        (7556.0,), ((7521.0, 7591.0),)
    )
    # the spread comes from the one cell with two runs: 1 degree of freedom
    assert b.spread["total_tok_s"].dof == 1 and b.spread["prompt_tok_s"] == Spread(None)


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"max_output": 4096}, "max_output 128 in the baseline, 4096 now"),
        (
            {"engine_version": "0.27.0"},
            "engine_version 0.26.1+llmspeed.sim in the baseline, 0.27.0 now",
        ),
    ],
)
def test_a_run_of_other_settings_is_refused_with_one_line(tmp_path, change, named):
    path = tmp_path / "b.toml"
    shutil.copy(TODAY, path)
    before = path.read_text()
    run = {**{k: v for k, v in load(TODAY).run.items() if k != "date"}, **change}
    with pytest.raises(BaselineMismatch) as refused:
        save(path, run, [decode("decode[1K-c4]", 7600.0)], date=D2)
    message = str(refused.value)
    assert "\n" not in message
    assert message == (
        f"{path} holds runs taken with other settings ({named}): a run is added only to runs "
        "of the same settings and server; save to another file, or delete this one to start "
        "a new baseline"
    )
    assert path.read_text() == before  # nothing written
    with pytest.raises(BaselineMismatch):
        check_addable(path, run)
    assert isinstance(refused.value, BaselineError)


def test_check_addable_before_any_cell_runs(tmp_path):
    assert check_addable(tmp_path / "none.toml", RUN) is None  # a new file will be written
    shutil.copy(TODAY, tmp_path / "b.toml")
    found = check_addable(tmp_path / "b.toml", {"model": "tiny", "server": "http://elsewhere"})
    assert found is not None and found.runs == 1  # the endpoint is not a setting
    (tmp_path / "bad.toml").write_text("[cells\n")
    with pytest.raises(BaselineError, match="not valid TOML"):
        check_addable(tmp_path / "bad.toml", RUN)


def test_a_hand_edited_reference_is_the_reference(tmp_path):
    path = tmp_path / "b.toml"
    path.write_text(
        '[cells."decode[1K-c4]"]\ntotal_tok_s = 900.0\ntotal_tok_s_runs = [1000.0, 1010.0]\n'
    )
    cell = load(path).cells["decode[1K-c4]"]
    assert cell.limits["total_tok_s"] == 900.0
    assert cell.figure_runs("total_tok_s").values == (1000.0, 1010.0)


MULTI = """\
[cells."decode[1K-c4]"]
total_tok_s = 1000.0
total_tok_s_runs = [990.0, 1010.0]
total_tok_s_runs_ci = [[980.0, 1000.0], []]
"""


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            MULTI.replace("[990.0, 1010.0]", '"fast"'),
            r"b.toml, line 3: decode\[1K-c4\] total_tok_s_runs = 'fast' must be a list of "
            r"positive numbers, one a run",
        ),
        (
            MULTI.replace("[990.0, 1010.0]", "[990.0, -1.0]"),
            r"line 3: .* must be a list of positive numbers",
        ),
        (
            MULTI.replace("[[980.0, 1000.0], []]", "[[1000.0, 980.0], []]"),
            r"line 4: decode\[1K-c4\] total_tok_s_runs_ci = .* must be a list of intervals "
            r"\[low, high\] \(two positive numbers, low ≤ high\), \[\] for a run without one",
        ),
        (
            MULTI.replace("[[980.0, 1000.0], []]", "[[980.0, 1000.0]]"),
            r"line 4: decode\[1K-c4\] total_tok_s_runs_ci has 1 interval\(s\) for 2 run\(s\) "
            r"in total_tok_s_runs",
        ),
        (
            MULTI.replace("total_tok_s_runs_ci", "total_tok_s_runz"),
            r"line 4: unknown figure 'total_tok_s_runz' in decode\[1K-c4\]",
        ),
    ],
)
def test_broken_runs(tmp_path, text, message):
    path = tmp_path / "b.toml"
    path.write_text(text)
    with pytest.raises(BaselineError, match=message):
        load(path)


# -- the between-start spread -----------------------------------------------------------------


def pm(value, w):
    """The 95 % interval of a figure whose relative standard error is ``w``."""
    return (value * (1 - Z95 * w), value * (1 + Z95 * w))


def test_the_spread_is_pooled_over_cells_less_the_windows_own_noise():
    # cell A: 3 runs, relative deviations −2 %, 0, +2 % around 100, each with w = 1 %
    a = ((98.0, 100.0, 102.0), tuple(pm(v, 0.01) for v in (98.0, 100.0, 102.0)))
    # cell B: 2 runs, ±1 % around 1000; no intervals (w = 0)
    b = ((990.0, 1010.0), (None, None))
    spread = pooled_spread([a, b, ((500.0,), (None,))])  # a one-run cell adds nothing
    squares = 0.02**2 * 2 + 0.01**2 * 2
    mean_w2 = (3 * 0.01**2 + 2 * 0) / 5
    # pooled: Σ (k_c − 1) = 3; without runs aligned over every cell the degrees of freedom
    # are the longest cell's own, k − 1 = 2 (a start effect may be shared by the cells)
    assert spread.dof == 2 and spread.cells == 2
    assert spread.sigma == pytest.approx(math.sqrt(squares / 3 - mean_w2), rel=1e-9)


def test_the_spread_is_zero_when_the_windows_explain_it_and_unknown_with_one_run():
    runs = ((99.9, 100.1), ((98.0, 101.8), (98.2, 102.0)))  # ±0.1 % apart, ±1.9 % each
    assert pooled_spread([runs]) == Spread(0.0, 1, 1)
    assert pooled_spread([((100.0,), ((99.0, 101.0),))]) == Spread(None)
    assert not Spread(None).known and Spread(0.0, 1, 1).known


def test_the_reference_se_is_the_mean_of_k_runs():
    values, cis = (98.0, 102.0), (pm(98.0, 0.01), pm(102.0, 0.02))
    assert within_se(98.0, cis[0]) == pytest.approx(0.01, rel=1e-12)
    expected = math.sqrt((0.03**2 + (0.01**2 + 0.02**2) / 2) / 2)
    assert reference_se(values, cis, 0.03) == pytest.approx(expected, rel=1e-12)
    assert within_se(100.0, None) == 0.0


@pytest.mark.parametrize(
    ("df", "quantile"),
    # Student's t, one-sided 99 % (published tables, 3 decimals); None: the normal
    [
        (None, 2.326),
        (1, 31.821),
        (2, 6.965),
        (3, 4.541),
        (4, 3.747),
        (8, 2.896),
        (18, 2.552),
        (30, 2.457),
        (120, 2.358),
    ],
)
def test_t_quantile(df, quantile):
    assert round(t_quantile(0.99, df), 3) == quantile
    assert Spread(0.01, df or 0, 1).quantile == pytest.approx(t_quantile(0.99, df))


def _scaled(records: list[CellRecord], factor: float) -> list[CellRecord]:
    """Each valid record's figures (and their intervals) times ``factor``: a run of a server
    ``factor`` as fast."""
    out = []
    for rec in records:
        changes = {}
        for key in ("total_tok_s", "per_request_tok_s", "prompt_tok_s"):
            value = getattr(rec, key)
            if value is not None:
                changes[key] = value * factor
                ci = getattr(rec, f"{key}_ci", None)
                if ci is not None:
                    changes[f"{key}_ci"] = (ci[0] * factor, ci[1] * factor)
        out.append(dataclasses.replace(rec, **changes))
    return out


@pytest.mark.parametrize(
    ("factors", "named"),
    [((1.0, 0.995, 0.929), [3]), ((1.0, 0.995, 1.004), []), ((0.93, 1.0, 0.996, 1.003), [1])],
    ids=["third-disturbed", "three-alike", "first-of-four"],
)
def test_a_run_outside_the_others_is_named_when_saved(tmp_path, factors, named):
    """Runs of a baseline saved one by one: a run 7 % below two that agree within 0.5 % in
    every cell (the issue's [505.5, 503.0, 468.5]) is named when it lies outside the others
    beyond their noise; runs that agree are not. Deterministic: made runs, no draw."""
    from pytest_llmspeed.gate.baseline import save
    from pytest_llmspeed.results import load as load_results

    one = next(
        c
        for c in load_results(DATA / "v1" / "results.json").cells
        if c.id == CellId.decode(1024, 8)
    )
    # eight cells alike (a disturbed run moves every cell): 16 gated figures
    records = [
        dataclasses.replace(one, id=CellId.decode(1024 * k, n))
        for k in (1, 2, 4, 8)
        for n in (1, 4)
    ]
    path = tmp_path / "b.toml"
    run = {"engine": "llmspeed-sim", "engine_version": "0.26.1"}
    for i, factor in enumerate(factors):
        saved = save(path, run, _scaled(records, factor), date=f"2026-12-0{i + 1}")
    assert saved.runs == len(factors)
    said = [int(o.split()[1]) for o in saved.outliers]
    assert said == named, saved.outliers
    for line in saved.outliers:
        assert "lies outside the others beyond their noise" in line and "add runs" in line
    lines = saved.lines()
    assert lines[0] == saved.message() and len(lines) == 1 + len(named)
