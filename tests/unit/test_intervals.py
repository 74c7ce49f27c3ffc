"""The interval computations on synthetic series whose answer is known (issue 11)."""

import functools
import math
from collections.abc import Callable
from typing import ParamSpec, TypeVar

import numpy as np
import pytest

from pytest_llmspeed.core import intervals
from pytest_llmspeed.core.intervals import (
    batch_counts,
    in_flight,
    little_residual,
    long_run_sd,
    t_quantile,
    von_neumann_correlated,
)

P = ParamSpec("P")
T = TypeVar("T")
Window = tuple[np.ndarray, np.ndarray]  # token arrival times, tokens at each


def answered(f: Callable[P, T | None]) -> Callable[P, T]:
    """``f`` for inputs that have an answer: a None fails the test where it comes."""

    @functools.wraps(f)
    def call(*args: P.args, **kwargs: P.kwargs) -> T:
        value = f(*args, **kwargs)
        assert value is not None, f"{f.__name__} answered None"
        return value

    return call


# the core's, for windows and samples long enough to have an answer
batch_means = answered(intervals.batch_means)
median_interval = answered(intervals.median_interval)
trend = answered(intervals.trend)

# Student's t at 97.5 % from the tables (Abramowitz & Stegun, table 26.10)
T_TABLE = {3: 3.182, 7: 2.365, 15: 2.131, 31: 2.040, 120: 1.980}


@pytest.mark.parametrize(("df", "exact"), sorted(T_TABLE.items()))
def test_t_quantile_matches_the_table(df, exact):
    assert t_quantile(0.975, df) == pytest.approx(exact, abs=0.005)


def poisson_window(rng, rate, seconds) -> Window:
    """Token arrivals of a Poisson process: white noise around a known rate."""
    n = rng.poisson(rate * seconds)
    return np.sort(rng.uniform(0, seconds, n)), np.ones(n)


def ar1_window(rng, phi, seconds=30.0, dt=0.01, mean=100.0, sd=3.0) -> Window:
    """Tokens per 10 ms step following an AR(1) process: autocorrelated noise."""
    n = int(seconds / dt)
    e = np.zeros(n)
    noise = rng.normal(size=n)
    for j in range(1, n):
        e[j] = phi * e[j - 1] + noise[j]
    return np.arange(n) * dt + dt / 2, mean + sd * e


def coverage(make: Callable[[], Window], truth, runs):
    hits = 0
    for _ in range(runs):
        bm = batch_means(*make(), 0, 30.0 if make.__name__ != "poisson" else 10.0)
        hits += bm.interval.low <= truth <= bm.interval.high
    return hits / runs


def test_white_noise_interval_covers_the_rate_95_percent_of_the_time():
    rng = np.random.default_rng(7)
    hits = kept = 0
    for _ in range(1000):
        bm = batch_means(*poisson_window(rng, 500, 10.0), 0, 10.0)
        kept += bm.batches == 32  # the von Neumann test at 10 % merges about one in ten
        hits += bm.interval.low <= 500 <= bm.interval.high
    assert 0.93 <= hits / 1000 <= 0.97  # binomial sd at 95 %: 0.7 %
    assert kept / 1000 > 0.85


def test_autocorrelated_noise_merges_batches_and_still_covers():
    rng = np.random.default_rng(11)
    hits = 0
    merged = 0
    for _ in range(400):
        bm = batch_means(*ar1_window(rng, 0.98), 0, 30.0)
        merged += bm.batches < 32
        hits += bm.interval.low <= 100 / 0.01 <= bm.interval.high
    # correlation over ~0.5 s (50 steps of 10 ms): 0.94 s batches look correlated, and pairs
    # get merged. (Correlated over more than a batch of D/8, the interval is too narrow: with
    # phi = 0.995, 2 s, it covered 86 %. docs/metrics.md says so.)
    assert merged / 400 > 0.5
    assert 0.90 <= hits / 400 <= 0.99
    # the naive interval (every 10 ms step independent) would be far too narrow
    times, counts = ar1_window(rng, 0.98)
    naive = 1.96 * counts.std(ddof=1) / math.sqrt(len(counts)) * 100
    assert batch_means(times, counts, 0, 30.0).interval.half_width_rel(10_000) > 3 * naive / 1e4


def test_von_neumann_tells_correlated_means_from_independent_ones():
    rng = np.random.default_rng(3)
    assert not von_neumann_correlated(rng.normal(size=32))
    assert von_neumann_correlated(np.cumsum(rng.normal(size=32)))  # a random walk


def test_short_windows_get_fewer_batches_and_none_below_eight():
    rng = np.random.default_rng(5)
    assert batch_means(*poisson_window(rng, 1000, 1.6), 0, 1.6).batches == 16
    assert intervals.batch_means(*poisson_window(rng, 1000, 0.5), 0, 0.5) is None


def test_a_trend_is_flagged_and_noise_is_not():
    rng = np.random.default_rng(9)
    steady = trend(batch_means(*ar1_window(rng, 0.5), 0, 30.0).fine_rates)
    assert steady is not None and not steady.flagged
    times, counts = ar1_window(rng, 0.5)
    slowing = counts * (1 - 0.05 * times / 30)  # 5 % slower by the end: a server throttling
    drift = trend(batch_means(times, slowing, 0, 30.0).fine_rates)
    assert drift is not None and drift.flagged
    assert drift.change == pytest.approx(-0.05, abs=0.01)
    assert "fell 5" in drift.words()


def test_trend_false_alarms_on_white_noise_are_rare():
    rng = np.random.default_rng(13)
    flagged = sum(
        trend(batch_means(*poisson_window(rng, 2000, 10.0), 0, 10.0).fine_rates).significant
        for _ in range(300)
    )
    assert flagged / 300 < 0.03  # tested at 1 %


def test_median_interval_uses_the_binomial_ranks():
    # n = 10: ranks 2 and 9 (P(Bin(10, ½) ≤ 1) = 1.1 % ≤ 2.5 % < P(≤ 2) = 5.5 %)
    assert median_interval(list(range(1, 11))).as_pair() == (2.0, 9.0)
    # n = 6: the extremes (coverage 96.9 %); fewer values have no 95 % interval
    assert median_interval([5, 1, 4, 2, 6, 3]).as_pair() == (1.0, 6.0)
    assert intervals.median_interval([1, 2, 3, 4, 5]) is None


def test_median_interval_covers_the_true_median():
    rng = np.random.default_rng(17)
    hits = 0
    for _ in range(1000):
        ci = median_interval(rng.exponential(size=40))
        hits += ci.low <= math.log(2) <= ci.high
    assert 0.94 <= hits / 1000 <= 0.99  # discrete ranks: coverage at least 95 %


def test_little_residual_is_zero_when_n_are_kept_in_flight_and_negative_when_not():
    # 4 slots, each a 1 s request restarted at once, window [0.05, 10.05)
    kept = [(slot_start, slot_start + 1.0) for s in range(4) for slot_start in np.arange(0.0, 11)]
    assert little_residual(kept, 0.05, 10.05, 4) == pytest.approx(0.0, abs=0.02)
    # each restart 0.25 s late: 0.8 of the time in flight
    late = [(t, t + 1.0) for s in range(4) for t in np.arange(0, 12, 1.25)]
    assert little_residual(late, 0.05, 10.05, 4) == pytest.approx(-0.2, abs=0.03)
    assert little_residual([], 0.0, 1.0, 4) is None


def test_requests_in_flight_count_only_their_time_inside_the_window():
    # 64 long requests sent 0.2 s before a 3 s window opens (one TTFT), all cut at its end:
    # 64 in flight at every instant of the window, exactly. Their time in the system, send to
    # end, is 3.2 s each: λ·W over the window said 64 × 3.2 / 3 = 68.3 (+6.7 %)
    spans = [(-0.2, 3.0)] * 64
    assert in_flight(spans, 0.0, 3.0) == pytest.approx(64.0, abs=1e-9)
    assert little_residual(spans, 0.0, 3.0, 64) == pytest.approx(0.0, abs=1e-12)
    # one slot empty for the last 0.6 s (a failed request that waited before its restart,
    # restarted 0.3 s before the end): 63.8 on average; a request entirely outside counts 0
    gap = [(-0.2, 2.1), (2.7, 3.5), (3.0, 4.0), (-1.0, -0.5)]
    assert in_flight([*spans[:63], *gap], 0.0, 3.0) == pytest.approx(63 + 2.4 / 3, abs=1e-9)
    assert little_residual([*spans[:63], *gap], 0.0, 3.0, 64) == pytest.approx(
        (63 + 0.8) / 64 - 1, abs=1e-12
    )
    assert in_flight(spans, 1.0, 1.0) is None


def test_spreading_chunks_over_their_stream_removes_edge_noise():
    # one steady stream: 3 tokens every 70 ms, exactly 42.86 tok/s; 0.31 s batches cut chunks
    times = np.arange(1, 200) * 0.07
    counts = np.full(len(times), 3.0)
    starts = np.concatenate([[times[0]], times[:-1]])
    by_arrival = batch_means(times, counts, 0.5, 10.5)
    by_rate = batch_means(times, counts, 0.5, 10.5, starts)
    # the figure is the same (tokens that arrived in the window over its length) ...
    assert (by_arrival.interval.low + by_arrival.interval.high) / 2 == pytest.approx(
        (by_rate.interval.low + by_rate.interval.high) / 2
    )

    # ... but a whole chunk more or less per batch looked like noise: ±3 % for nothing
    def half(bm):
        return (bm.interval.high - bm.interval.low) / 2 / (3 / 0.07)

    assert half(by_arrival) > 0.01
    assert half(by_rate) < 0.001
    # spread tokens add up to those of the window (the part of the first chunk's interval
    # before the window opened is not in it)
    assert sum(by_rate.fine_rates) * (10 / 32) == pytest.approx(3 / 0.07 * 10, rel=0.01)


def test_clearly_alternating_batches_get_the_long_run_variance():
    # a server whose steps alternate slow and fast: batches anti-correlated, the mean steady
    rng = np.random.default_rng(21)
    rates = 100 + np.tile([3.0, -3.0], 16) + rng.normal(0, 0.3, 32)
    sd, how = long_run_sd(rates)
    assert how == ", Newey-West"
    assert rates.std(ddof=1) / 4 <= sd < rates.std(ddof=1) / 2  # floored at a quarter
    # white noise keeps its plain standard deviation
    noise = rng.normal(100, 3, 32)
    while (d := noise - noise.mean())[1:] @ d[:-1] < 0:  # lag-1 correlation not negative
        noise = rng.normal(100, 3, 32)
    assert long_run_sd(noise) == (pytest.approx(noise.std(ddof=1)), "")


def trending_window(rng, seconds, change, rate=2000.0) -> Window:
    """Poisson arrivals whose rate falls linearly by ``change`` (a fraction) every 30 s: the
    contexts of lockstep streams growing as their outputs lengthen."""
    times, _ = poisson_window(rng, rate * 1.2, seconds)
    keep = rng.uniform(size=len(times)) < (1 - change * times / 30) / 1.2  # thinning
    return times[keep], np.ones(int(keep.sum()))


def full_window_mean(change, rate=2000.0, full=30.0):
    return rate * (1 - change * full / 2 / 30)


def test_a_trend_every_run_has_is_not_noise_in_the_full_window_interval():
    # the figure of a 30 s window with a deterministic 3 % fall: runs differ by noise only
    rng = np.random.default_rng(19)
    hits, widths = 0, []
    for _ in range(400):
        bm = batch_means(*trending_window(rng, 30.0, 0.03), 0, 30.0)
        hits += bm.interval.low <= full_window_mean(0.03) <= bm.interval.high
        widths.append(bm.interval.high - bm.interval.low)
    assert 0.93 <= hits / 400 <= 0.98
    # the half-width of white noise at 2,000 tok/s over 30 s: t · √(λ/T) (√(2000/30) = 8.2)
    assert np.median(widths) / 2 == pytest.approx(1.98 * math.sqrt(1970 / 30), rel=0.15)


def test_an_early_end_reports_the_interval_of_the_full_window():
    # 8 s of a window planned for 30 s, the rate falling 3 % per 30 s: the first 8 s are
    # ~1.1 % faster than the full window; the projected interval holds the full window's mean
    rng = np.random.default_rng(23)
    truth = full_window_mean(0.03)
    hits, shifts = 0, []
    for _ in range(400):
        times, counts = trending_window(rng, 8.0, 0.03)
        bm = batch_means(times, counts, 0, 8.0, full=30.0)
        measured = counts.sum() / 8.0
        hits += bm.interval.low <= truth <= bm.interval.high
        centre = (bm.interval.low + bm.interval.high) / 2
        shifts.append(centre - measured)
        assert "projected to 30 s" in bm.interval.method
    assert 0.93 <= hits / 400 <= 0.98
    # moved by the slope (−2 tok/s per s) over (30 − 8) / 2 s: −22 tok/s on average (one
    # run's slope is uncertain: ±6.8 tok/s per s, so ±3.7 tok/s over 400 runs)
    assert -32 < np.mean(shifts) < -12
    # without the projection, the interval of the first 8 s misses the full window's figure
    # often: it estimates another quantity
    missed = sum(
        not (lo <= truth <= hi)
        for lo, hi in (
            (bm.interval.low, bm.interval.high)
            for bm in (batch_means(*trending_window(rng, 8.0, 0.03), 0, 8.0) for _ in range(200))
        )
    )
    assert missed / 200 > 0.15


def test_the_projection_costs_width_only_where_the_window_ends_early():
    rng = np.random.default_rng(29)
    times, counts = poisson_window(rng, 2000, 10.0)
    plain = batch_means(times, counts, 0, 10.0)
    same = batch_means(times, counts, 0, 10.0, full=10.0)
    early = batch_means(times, counts, 0, 10.0, full=30.0)
    assert (same.interval.low, same.interval.high) == (plain.interval.low, plain.interval.high)
    # the slope's uncertainty over (30 − 10) / 2 s: √(1 + 12·10²/10²·k/(k²−1)·…) ≈ 3.6× wider
    ratio = (early.interval.high - early.interval.low) / (plain.interval.high - plain.interval.low)
    assert 3.0 < ratio < 4.2


def test_batch_counts_spread_every_chunk_over_its_time_whatever_its_span():
    # the reference: each chunk's tokens shared out by the edges it spans, through one array;
    # batch_counts takes a shortcut for chunks inside one batch and must give the same
    rng = np.random.default_rng(31)
    n = 5000
    times = np.sort(rng.uniform(-1.0, 12.0, n))  # some before the window, some after
    starts = times - rng.exponential(rng.choice([0.001, 0.2, 2.0], n))
    first = rng.uniform(size=n) < 0.05
    starts[first] = times[first]  # a stream's first chunk: no time before it
    counts = rng.integers(1, 4, n).astype(float)
    w0, w1, k = 0.0, 10.0, 32
    edges = np.linspace(w0, w1, k + 1)
    keep = (times >= w0) & (starts < w1)
    span = np.maximum(times[keep] - starts[keep], 1e-12)
    share = np.clip((edges[None, :] - starts[keep, None]) / span[:, None], 0.0, 1.0)
    reference = np.diff(share.T @ counts[keep])
    got = batch_counts(times, counts, w0, w1, k, starts)
    assert got == pytest.approx(reference, abs=1e-9)
    assert got.sum() == pytest.approx(reference.sum())
