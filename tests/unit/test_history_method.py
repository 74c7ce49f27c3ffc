"""The change-point method itself (history/changes.py): E-divisive means with the merging of
weak change points, each kept only where the one judge says regressed or improved given each
point's own interval. Series of numbers here, made with a seeded generator; the series made of
results files are tests/unit/test_history.py's."""

from __future__ import annotations

import numpy as np
import pytest

from pytest_llmspeed.gate.judge import Verdict
from pytest_llmspeed.history.changes import Logs, find, strict_p


def w2_of(half_width: float, n: int) -> np.ndarray:
    """Each point's squared relative standard error from a ±``half_width`` 95 % interval."""
    return np.full(n, (half_width / 1.959963984540054) ** 2)


def step(n: int, at: int, k: float, noise: float, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.where(np.arange(n) < at, 1000.0, 1000.0 * k) * np.exp(rng.normal(0, noise, n))


def test_the_same_step_is_a_change_with_narrow_intervals_and_none_with_wide_ones():
    values = step(20, 11, 0.9, 0.005, seed=1)  # runs that agree within their windows
    narrow = find(values, w2_of(0.005, 20), 0.05)
    assert [s.start for s in narrow.segments] == [0, 11]
    assert narrow.changes[0].verdict is Verdict.REGRESSED
    # the same figures, each window ±30 %: nothing is shown beyond the noise
    wide = find(values, w2_of(0.30, 20), 0.05)
    assert len(wide.segments) == 1 and wide.changes == ()


def test_a_point_with_a_wide_interval_weighs_less_in_its_segments_level():
    values = np.array([100.0, 101.0, 99.0, 100.0, 150.0])
    w2 = np.array([1e-4, 1e-4, 1e-4, 1e-4, 0.25])
    (only,) = find(values, w2, 0.05).segments
    assert only.level < 105  # the plain geometric mean is 108
    plain = find(values, np.full(5, 1e-4), 0.05).segments[0].level
    assert plain > only.level


def test_a_segment_has_two_runs_at_least_so_one_run_off_is_no_change():
    values = np.r_[np.full(19, 1000.0), 700.0] * np.exp(
        np.random.default_rng(2).normal(0, 0.01, 20)
    )
    assert find(values, w2_of(0.01, 20), 0.05).changes == ()
    with pytest.raises(ValueError, match="two runs"):
        find(values, w2_of(0.01, 20), 0.05, min_size=1)


def test_a_latency_figure_getting_larger_is_a_regression():
    values = step(20, 11, 1.2, 0.02, seed=3)
    found = find(values, w2_of(0.01, 20), 0.05, higher_is_better=False)
    assert found.changes[0].verdict is Verdict.REGRESSED


def test_a_long_flat_series_is_not_a_row_of_false_changes():
    # the strict p-value falls as 1/n past 40 runs (Bonferroni over the places a change could be)
    assert strict_p(40) == pytest.approx(0.001) and strict_p(1000) == pytest.approx(4e-5)
    changes = sum(
        len(find(step(1000, 0, 1.0, 0.03, seed), w2_of(0.01, 1000), 0.05).changes)
        for seed in range(5)
    )
    assert changes <= 1


def test_several_steps_in_a_long_series_each_found_in_its_window():
    rng = np.random.default_rng(4)
    level = np.where(np.arange(300) < 100, 1.0, 0.85) * np.where(np.arange(300) < 220, 1.0, 1.25)
    values = 1000 * level * np.exp(rng.normal(0, 0.02, 300))
    found = find(values, w2_of(0.01, 300), 0.05)
    assert [s.start for s in found.segments] == [0, 100, 220]
    assert [c.verdict for c in found.changes] == [Verdict.REGRESSED, Verdict.IMPROVED]
    for s, k in zip(found.segments, (1.0, 0.85, 1.0625), strict=True):
        assert s.low < 1000 * k * 1.01 and s.high > 1000 * k * 0.99


def test_the_running_sums_give_the_spread_as_numpy_does():
    rng = np.random.default_rng(5)
    y = np.log(1000 * np.exp(rng.normal(0, 0.03, 50)))
    logs = Logs(y, np.zeros(50))
    sigma2, dof = logs.spread([(0, 20), (20, 50)])
    expected = (((y[:20] - y[:20].mean()) ** 2).sum() + ((y[20:] - y[20:].mean()) ** 2).sum()) / 48
    assert dof == 48 and sigma2 == pytest.approx(expected, rel=1e-9)


def test_a_dip_that_did_not_last_is_said_to_be_one():
    values = step(200, 0, 1.0, 0.01, seed=6)
    values[120:126] *= 0.85  # six runs 15 % slower, then back
    found = find(values, w2_of(0.01, 200), 0.05)
    assert [s.start for s in found.segments] == [0, 120, 126]
    assert [c.verdict for c in found.changes] == [Verdict.REGRESSED, Verdict.IMPROVED]
    assert found.back_to == 0
    lasting = step(200, 120, 0.85, 0.01, seed=6)
    lasting[180:186] /= 0.85  # back up for six runs, and down again: not back to the start
    assert find(lasting, w2_of(0.01, 200), 0.05).back_to == 1
