"""The gate's two levels of noise (docs/judge.md, "The rule across restarts"), case by case, in
exact arithmetic: a baseline of several runs whose spread makes a −10 % figure unknown (too noisy to
tell) where a one-run baseline fails it; confirmations on fresh starts judged on the mean of
all; attempts on one start judged as before; the spread's degrees of freedom; what the summary
says. The judge (gate/judge.py) decides on the change ln(X / R) with its standard error
√(u_X² + u_R²): regressed when past ln(1 − t) and beyond q·se."""

import dataclasses
import json
import math
from pathlib import Path

import jsonschema
import pytest

from pytest_llmspeed.gate.baseline import Baseline, CellBaseline, FigureRuns, baseline_of, load
from pytest_llmspeed.gate.noise import UNKNOWN, Spread, pooled_spread, t_quantile, with_attempts
from pytest_llmspeed.gate.verdict import (
    SPREAD_UNKNOWN,
    account,
    change_of,
    gated,
    mean_figures,
    variance,
    verdict,
    wants_another,
)
from pytest_llmspeed.results import (
    Z95,
    CellId,
    CellRecord,
    Check,
    Outcome,
    Results,
    RunInfo,
    Status,
)

ROOT = Path(__file__).resolve().parents[2]
ID = "decode[8K-c4]"
# three runs 97, 100, 103 (no intervals) whose figure spreads 3 % between starts, pooled over
# the baseline's cells with 4 degrees of freedom: u_R = 3 % / √3, q = t(99 %, 4) = 3.747
SPREAD = Spread(0.03, 4, 2)
THREE = CellBaseline(
    ID,
    {"total_tok_s": 100.0},
    0.05,
    1,
    runs={"total_tok_s": FigureRuns((97.0, 100.0, 103.0))},
    spread={"total_tok_s": SPREAD},
)
ONE = CellBaseline(ID, {"total_tok_s": 100.0}, 0.05, 1)  # floor 95, no noise known
TTFT = CellBaseline(
    ID,
    {"ttft_ms": 100.0},
    0.05,
    1,
    runs={"ttft_ms": FigureRuns((97.0, 100.0, 103.0))},
    spread={"ttft_ms": SPREAD},
)
Q = 3.7469474
U_R = 0.03 / math.sqrt(3)


def cell(total=None, ttft=None):
    return CellRecord(CellId.parse(ID), Status.VALID, 8192, total_tok_s=total, ttft_ms=ttft)


def margin(var):
    """q · se of the change: q · √(u_X² + u_R²), in ln(X / R)."""
    return Q * math.sqrt(var + U_R**2)


def test_a_check_carries_the_baselines_noise():
    (check,) = verdict(THREE, [cell(total=90.0)]).checks
    assert check.reference_se == pytest.approx(U_R, rel=1e-12)
    assert (check.spread, check.spread_dof, check.reference_runs) == (0.03, 4, 3)
    assert check.quantile == pytest.approx(Q, abs=1e-6)
    change = change_of(check)
    assert change.log_ratio == pytest.approx(math.log(0.9), rel=1e-12)
    assert change.se == pytest.approx(math.sqrt(0.03**2 + U_R**2), rel=1e-12)
    assert change.df == 4 and check.change_se == pytest.approx(change.se, rel=1e-12)


def test_minus_ten_percent_fails_a_one_run_baseline_and_is_unknown_against_three_runs():
    assert verdict(ONE, [cell(total=90.0)]).outcome is Outcome.REGRESSION
    result = verdict(THREE, [cell(total=90.0)])
    # past the floor of 95, but ln 0.9 = −0.105 within q·√(0.03² + 0.0173²) = 0.130
    assert margin(0.03**2) == pytest.approx(0.1298, abs=1e-4)
    assert result.outcome is Outcome.UNKNOWN and result.unknowns
    assert result.checks[0].more is not None  # how many more would decide it
    # −15 %: ln 0.85 = −0.163, beyond 0.130
    assert verdict(THREE, [cell(total=85.0)]).outcome is Outcome.REGRESSION


def test_fresh_starts_are_judged_on_the_mean_of_all_the_attempts():
    values = [90.0, 88.0, 87.0, 89.0]
    attempts = [cell(total=v) for v in values]
    # the first is past its limit (noisy): every confirmation is taken, none stops it
    for n in (1, 2, 3):
        assert wants_another(THREE, attempts[:n], confirm=3, fresh_starts=True)
    assert not wants_another(THREE, attempts, confirm=3, fresh_starts=True)
    assert wants_another(THREE, [cell(total=90.0), cell(total=100.0)], 3, fresh_starts=True)
    # the mean 88.5 of four starts: variance 0.03² / 4, ln 0.885 = −0.122 beyond
    # q·√(0.015² + 0.0173²) = 0.086
    assert margin(0.03**2 / 4) == pytest.approx(0.0858, abs=1e-4)
    result = verdict(THREE, attempts, fresh_starts=True)
    assert result.outcome is Outcome.REGRESSION
    (check,) = result.checks
    assert check.fresh_starts and check.regressed
    # a first attempt inside its limit but not shown within it (unknown: ±9.6 % at 4 d.f.)
    # is re-measured too; one shown within it (same) is not
    assert verdict(THREE, [cell(total=96.0)], fresh_starts=True).outcome is Outcome.UNKNOWN
    assert wants_another(THREE, [cell(total=96.0)], confirm=3, fresh_starts=True)
    assert verdict(ONE, [cell(total=96.0)], fresh_starts=True).outcome is Outcome.SAME
    assert not wants_another(ONE, [cell(total=96.0)], confirm=3, fresh_starts=True)


def test_a_passing_confirmation_counts_in_the_mean_on_fresh_starts():
    attempts = [cell(total=v) for v in (85.0, 100.0, 99.0)]
    # 85 alone misses; the mean 94.7 of three starts is past 95 but within the noise
    assert verdict(THREE, attempts[:1], fresh_starts=True).outcome is Outcome.REGRESSION
    result = verdict(THREE, attempts, fresh_starts=True)
    assert result.outcome is Outcome.UNKNOWN and result.unknowns


def test_attempts_on_one_start_keep_the_every_attempt_rule():
    # the start's own offset is in every attempt: their mean does not shrink the spread
    attempts = [cell(total=v) for v in (85.0, 84.0)]
    assert wants_another(THREE, attempts[:1], confirm=1)
    assert verdict(THREE, attempts).outcome is Outcome.REGRESSION
    (check,) = verdict(THREE, attempts).checks
    assert variance(check) == pytest.approx(0.03**2)  # σ_b² + mean w² / n, w = 0
    # an unknown first attempt is not a miss, but is measured again: what Pinpoint repeats
    unknown_first = [cell(total=90.0)]
    assert wants_another(THREE, unknown_first, confirm=1)
    assert not wants_another(THREE, unknown_first, confirm=0)
    # the second attempt does not miss: not confirmed, too noisy to tell (was "passed")
    assert verdict(THREE, [cell(total=85.0), cell(total=90.0)]).outcome is Outcome.UNKNOWN


def test_improvements_and_ceilings_mirror_the_floor():
    # ln 1.12 = 0.113 < 0.130: past +5 %, not beyond the noise (was "passed")
    assert verdict(THREE, [cell(total=112.0)]).outcome is Outcome.UNKNOWN
    assert verdict(THREE, [cell(total=120.0)]).outcome is Outcome.IMPROVEMENT  # 0.182 > 0.130
    # a ceiling's change is ln(1 − (X / R − 1)): its limit R·(1 + t) is the judge's ln(1 − t)
    assert verdict(TTFT, [cell(ttft=115.0)]).outcome is Outcome.REGRESSION  # 0.163 > 0.130
    slow = verdict(TTFT, [cell(ttft=112.0)])  # ln 0.88 = −0.128, within 0.130
    assert slow.outcome is Outcome.UNKNOWN and slow.unknowns


def test_the_window_noise_adds_to_the_spread():
    # an attempt with its own ±2 % (w = 1.02 %): u_X² = 0.03² + w²
    x = 88.0
    rec = dataclasses.replace(cell(total=x), total_tok_s_ci=(x * 0.98, x * 1.02))
    (check,) = verdict(THREE, [rec]).checks
    w = 0.02 / 1.959963984540054
    assert variance(check) == pytest.approx(0.03**2 + w**2, rel=1e-9)
    assert check.unknown  # ln 0.88 = −0.128, within q·√(0.03² + w² + 0.0173²) = 0.134


def test_a_one_run_baseline_says_its_spread_is_unknown():
    (check,) = verdict(ONE, [cell(total=100.0)]).checks
    assert check.spread is None and not check.spread_known
    assert verdict(ONE, [cell(total=100.0)]).spread_unknown
    assert not verdict(THREE, [cell(total=100.0)]).spread_unknown
    baseline = Baseline(Path("b.toml"), {}, 0.05, {ID: ONE}, {"total_tok_s": Spread(None)})
    acc = account(baseline, [cell(total=100.0)], {ID})
    assert acc.spread_unknown and acc.spread_line() == SPREAD_UNKNOWN
    assert SPREAD_UNKNOWN == (
        "between-run spread unknown (a one-run baseline): make the baseline from several runs, "
        "--llm-runs=3 or --llm-save-baseline=FILE run again"
    )
    several = Baseline(Path("b.toml"), {"runs": 3}, 0.05, {ID: THREE}, {"total_tok_s": SPREAD})
    assert account(several, [], set()).spread_line() == (
        "between-run spread of the baseline's 3 runs: total tok/s 3.0% (4 d.f.)"
    )


def test_messages_name_the_runs_and_the_spread():
    (reg,) = verdict(THREE, [cell(total=85.0)]).checks
    assert reg.message() == (
        "decode[8K-c4] total tok/s 85.0 ±5.9% < floor 95.0 (baseline of 3 runs 100.0 ±3.4% "
        "− 5%): −15.0%, beyond the noise (between-run spread 3.0%)"
    )
    (noisy,) = verdict(THREE, [cell(total=90.0)]).checks
    assert noisy.unknown_message() == (
        "decode[8K-c4] total tok/s 90.0 ±5.9% is past its limit 95.0 (−10.0% against baseline "
        "of 3 runs 100.0 ±3.4%), but within the noise between runs (between-run spread 3.0%): too "
        "noisy to "
        "tell (more runs in the baseline, or more confirmations on fresh starts (a higher "
        f"--llm-confirm), narrow it); about "
        f"{noisy.more} more measurement(s) would decide it (--llm-confirm={noisy.more})"
    )
    fresh = verdict(THREE, [cell(total=v) for v in (90.0, 88.0)], fresh_starts=True)
    assert fresh.checks[0].message().endswith("[attempts on fresh starts: 90.0, 88.0]")


def test_a_check_with_the_new_keys_is_written_read_back_and_valid():
    rec = dataclasses.replace(cell(total=90.0), total_tok_s_ci=(89.0, 91.0))
    attempts = [rec, cell(total=88.0)]
    result = verdict(THREE, attempts, fresh_starts=True)
    (check,) = result.checks
    data = check.to_v1()
    assert data["values_ci"] == [[89.0, 91.0], []]
    # the baseline's 3 % on 4 d.f., pooled with the two fresh starts' own spread (1 d.f.)
    w = (91.0 - 89.0) / 2 / 90.0 / Z95
    own = (90 / 89 - 1) ** 2 + (88 / 89 - 1) ** 2 - w * w / 2
    assert data["spread"] == pytest.approx(math.sqrt((4 * 0.03**2 + own) / 5), rel=1e-12)
    assert (data["spread_dof"], data["reference_runs"]) == (5, 3)
    assert data["fresh_starts"] is True and data["verdict"] == "regressed"
    assert Check.from_v1(ID, data) == check
    record = gated(rec, result, attempts)
    doc = Results(RunInfo("pytest-llmspeed", "2026-12-01", "sim"), (record,)).to_document()
    schema = json.loads((ROOT / "docs" / "results.schema.json").read_text())
    jsonschema.Draft202012Validator(schema).validate(doc)


def test_fresh_starts_pool_their_own_spread_with_the_baselines():
    base = Spread(0.03, 2, 4)
    assert with_attempts(base, [90.0], [None]) == base  # one attempt: nothing to pool
    assert with_attempts(UNKNOWN, [90.0, 80.0], [None, None]) == UNKNOWN  # one-run: its rule
    pooled = with_attempts(base, [91.0, 90.0, 89.0, 90.0], [None] * 4)
    own = ((91 / 90 - 1) ** 2 + (89 / 90 - 1) ** 2) / 3
    assert pooled.dof == 5 and pooled.cells == 4
    assert pooled.sigma == pytest.approx(math.sqrt((2 * 0.03**2 + 3 * own) / 5), rel=1e-12)
    # a real change moves every attempt alike: the pooled spread does not see it
    slower = with_attempts(base, [v * 0.9 for v in (91.0, 90.0, 89.0, 90.0)], [None] * 4)
    assert slower.sigma == pytest.approx(pooled.sigma, rel=1e-12)
    # the quantile falls with the degrees of freedom: confirmations buy power
    assert pooled.quantile < base.quantile
    # a 10 % slower cell: unknown on its first attempt, a regression once 5 fresh starts agree
    first = verdict(THREE, [cell(total=90.0)], fresh_starts=True)
    assert first.outcome is Outcome.UNKNOWN and first.checks[0].unknown
    agreed = [cell(total=v) for v in (90.0, 89.5, 90.5, 90.0, 89.8, 90.2)]
    assert verdict(THREE, agreed, fresh_starts=True).outcome is Outcome.REGRESSION


# -- the spread's degrees of freedom ----------------------------------------------------------


def cells_of(deviations):
    """Cells whose runs deviate from 100 by these relative amounts, no intervals."""
    return [(tuple(100 * (1 + d) for d in devs), (None,) * len(devs)) for devs in deviations]


def test_a_start_effect_shared_by_every_cell_has_the_runs_degrees_of_freedom():
    shared = cells_of([(-0.02, 0.0, 0.02)] * 4)  # every cell slow in run 1, fast in run 3
    spread = pooled_spread(shared, runs=3)
    assert spread.dof == 2  # three starts, whatever the number of cells (pooled would say 8)
    assert spread.quantile == pytest.approx(t_quantile(0.99, 2))


def test_cells_that_move_independently_keep_most_of_the_pooled_ones():
    # the runs' means are 0: no common part; Satterthwaite gives (C − 1)(R − 1) = 4 of 6
    own = cells_of([(0.01, 0.0, -0.01), (-0.01, 0.01, 0.0), (0.0, -0.01, 0.01)])
    assert pooled_spread(own, runs=3).dof == 4
    # without run alignment (runs unknown): the longest cell's own k − 1
    assert pooled_spread(own).dof == 2


def test_baseline_of_runs_pools_as_a_file_would(tmp_path):
    runs = [
        [
            cell(total=100.0 * f),
            dataclasses.replace(cell(total=200.0 * f), id=CellId.parse("decode[8K-c8]")),
        ]
        for f in (0.97, 1.0, 1.03)
    ]
    base = baseline_of(runs)
    assert base.runs == 3 and base.spread["total_tok_s"].dof == 2
    assert base.spread["total_tok_s"].sigma == pytest.approx(0.03, rel=1e-9)
    path = tmp_path / "b.toml"
    path.write_text(
        "[run]\nruns = 3\n\n"
        '[cells."decode[8K-c4]"]\ntotal_tok_s = 100.0\ntotal_tok_s_runs = [97.0, 100.0, 103.0]\n'
        '[cells."decode[8K-c8]"]\ntotal_tok_s = 200.0\ntotal_tok_s_runs = [194.0, 200.0, 206.0]\n'
    )
    assert load(path).spread["total_tok_s"] == base.spread["total_tok_s"]


def test_a_cell_measured_several_times_shows_the_mean_its_verdict_judged():
    """One number for one figure: the record of a cell re-measured is the mean of its
    attempts, with the interval of that mean, in every output that reads the record; each
    attempt stays listed, and the verdict line names the spread it judged by."""
    runs = [(90.0, (88.0, 92.0), 40.0), (88.0, (87.0, 89.0), 44.0), (86.0, None, 39.0)]
    attempts = [dataclasses.replace(cell(total=v, ttft=t), total_tok_s_ci=ci) for v, ci, t in runs]
    result = verdict(THREE, attempts, fresh_starts=True)
    (check,) = result.checks
    record = gated(attempts[0], result, attempts)
    assert record.total_tok_s == pytest.approx(check.value) == pytest.approx(88.0)
    assert record.ttft_ms == pytest.approx(41.0)  # not judged here, but a mean figure too
    assert record.total_tok_s_ci is None  # an attempt had no interval: none for the mean
    assert [a["total_tok_s"] for a in record.attempts] == [90.0, 88.0, 86.0]
    assert f"{record.total_tok_s:,.1f}" in check.message()
    assert "pooled with this cell's 3 starts" in check.message()
    # both intervals known: each side's half-widths in quadrature over their number
    two = attempts[:2]
    record = gated(two[0], verdict(THREE, two, fresh_starts=True), two)
    assert record.total_tok_s_ci is not None
    low, high = record.total_tok_s_ci
    assert record.total_tok_s == pytest.approx(89.0)
    assert 89.0 - low == pytest.approx(math.sqrt(2**2 + 1**2) / 2)
    assert high - 89.0 == pytest.approx(math.sqrt(2**2 + 1**2) / 2)
    # an A/B's version: the geometric mean (the judge works in logs)
    assert mean_figures(two, geometric=True)["total_tok_s"] == pytest.approx(math.sqrt(90 * 88))
    # one attempt: the record as measured
    assert gated(attempts[0], verdict(THREE, attempts[:1]), attempts[:1]).total_tok_s == 90.0
