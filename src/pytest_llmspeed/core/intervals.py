"""Uncertainty of a cell's figures: confidence intervals, a drift test, a Little's-law check.

Pure functions of recorded numbers (docs/metrics.md, "Uncertainty"):

- throughput (total and per-request tok/s): **batch means** over the window, with the number
  of batches chosen by a test of the batch means' serial correlation (Fishman's LBATCH rule
  with the von Neumann ratio); Student's t on the batches that pass;
- medians (TTFT, time between tokens, prefill repeats): the distribution-free **order-statistic**
  interval of a median (the binomial ranks around n/2);
- drift: the least-squares slope of the fine batches over time, its standard error widened for
  the residuals' lag-1 autocorrelation (an effective sample size), tested at 1 %;
- requests in flight: the time-average of the requests open over the window (Little's L,
  measured directly), against the requests the protocol keeps in flight.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..quantiles import normal_quantile
from ..quantiles import t_quantile as t_quantile  # the one implementation, re-exported

LEVEL = 0.95
#: batches the throughput interval starts from, and the fewest it merges down to
START_BATCHES = 32
MIN_BATCHES = 8
#: a batch is at least this long (s): shorter windows get fewer batches
MIN_BATCH_S = 0.1
#: the von Neumann test's level: batch means are taken as uncorrelated unless the test rejects
#: at 10 % (Fishman's choice: a conservative test favours longer batches)
VON_NEUMANN_ALPHA = 0.10
#: drift: a trend significant at 1 % that moves the figure by at least this much over the window
DRIFT_ALPHA = 0.01
DRIFT_MIN_CHANGE = 0.01
#: a note when the requests in flight on average differ from those asked by more than this
LITTLE_TOLERANCE = 0.05


#: the normal and Student's t quantiles, implemented once for the intervals and the gate
_z = normal_quantile


@dataclass(frozen=True)
class Interval:
    """A confidence interval of a figure (``LEVEL``), and how it was made."""

    low: float
    high: float
    method: str  # "batch means (k=16)", "order statistics (n=40)"

    def half_width_rel(self, value: float) -> float:
        """The larger side's distance from ``value``, as a fraction of it."""
        if value == 0:
            return math.inf
        return max(value - self.low, self.high - value) / abs(value)

    def as_pair(self, digits: int = 3) -> tuple[float, float]:
        return (round(self.low, digits), round(self.high, digits))


# -- batch means ---------------------------------------------------------------------------


def von_neumann_correlated(
    means: Sequence[float] | np.ndarray, alpha: float = VON_NEUMANN_ALPHA
) -> bool:
    """Do successive batch means look positively correlated? Young's C statistic (von Neumann's
    ratio of successive differences to variance), one-sided at ``alpha``."""
    x = np.asarray(means, dtype=np.float64)
    k = len(x)
    if k < 4:
        return False
    dev = x - x.mean()
    ss = float(dev @ dev)
    if ss == 0:
        return False
    c = 1 - float(np.sum(np.diff(x) ** 2)) / (2 * ss)
    return c / math.sqrt((k - 2) / (k * k - 1)) > _z(1 - alpha)


def batch_counts(
    times: np.ndarray,
    counts: np.ndarray,
    w0: float,
    w1: float,
    k: int,
    starts: np.ndarray | None = None,
) -> np.ndarray:
    """Tokens in each of ``k`` equal batches of [w0, w1).

    Without ``starts``, each chunk's tokens count where the chunk arrived. With them (for each
    chunk, when its stream's previous chunk arrived; equal to its own time for a stream's first
    chunk), a chunk's tokens are spread evenly over the time since that previous chunk: the
    stream's rate, not its arrivals. Arrivals make a batch edge fall before or after a whole
    chunk, which adds noise to each batch that cancels between neighbours (a chunk is in one or
    the other) — batch means would count it as variance of the window's mean, and over-cover."""
    out = np.zeros(k, dtype=np.float64)
    if starts is None:
        inside = (times >= w0) & (times < w1)
        idx = np.minimum(((times[inside] - w0) / (w1 - w0) * k).astype(np.int64), k - 1)
        np.add.at(out, idx, counts[inside])
        return out
    edges = np.linspace(w0, w1, k + 1)
    keep = (times >= w0) & (starts < w1)
    t, s0, c = times[keep], starts[keep], counts[keep]
    # most chunks begin and end inside one batch: all their tokens are that batch's
    width = (w1 - w0) / k
    bt = np.floor((t - w0) / width)
    one = (bt == np.floor((s0 - w0) / width)) & (bt < k)
    out += np.bincount(bt[one].astype(np.int64), weights=c[one], minlength=k)[:k]
    t, s0, c = t[~one], s0[~one], c[~one]  # the rest span an edge (or start before w0)
    span = np.maximum(t - s0, 1e-12)
    block = 20_000  # chunks at a time: a (block × k+1) array
    for i in range(0, len(t), block):
        sl = slice(i, i + block)
        # share of each chunk's tokens in by each edge
        share = np.clip((edges[None, :] - s0[sl, None]) / span[sl, None], 0.0, 1.0)
        out += np.diff(share.T @ c[sl])
    return out


def start_batches(measured_s: float) -> int:
    """How many batches a window of this length starts from (a power of two, so merging pairs
    halves it): 32 when each batch is at least ``MIN_BATCH_S`` long, fewer for short windows."""
    k = START_BATCHES
    while k > MIN_BATCHES and measured_s / k < MIN_BATCH_S:
        k //= 2
    return k


@dataclass(frozen=True)
class BatchMeans:
    """The throughput interval of a window by batch means."""

    interval: Interval
    batches: int  # the batches the interval uses
    correlated: bool  # the batch means still looked correlated at MIN_BATCHES
    rates: tuple[float, ...]  # tok/s of each batch used
    fine_rates: tuple[float, ...]  # tok/s of the batches it started from (the drift test's)


def batch_means(
    times: np.ndarray,
    counts: np.ndarray,
    w0: float,
    w1: float,
    starts: np.ndarray | None = None,
    full: float | None = None,
) -> BatchMeans | None:
    """The 95 % interval of total tok/s over [w0, w1), around the tokens that arrived in it over
    its length: the window cut into k batches (each chunk's tokens spread since its stream's
    previous chunk, given ``starts``), merged in pairs while the von Neumann test finds their
    detrended means correlated (not below 8); the interval by :func:`window_interval`. Given
    ``full`` (the window's planned length, when it ended early), the interval is that of the
    figure the full window would have measured. None for a window too short for 8 batches of
    ``MIN_BATCH_S``."""
    measured = w1 - w0
    if measured < MIN_BATCHES * MIN_BATCH_S:
        return None
    k = start_batches(measured)
    tokens = batch_counts(times, counts, w0, w1, k, starts)
    mean = float(counts[(times >= w0) & (times < w1)].sum()) / measured
    return batch_means_of(tokens, mean, measured, full)


def batch_means_of(
    tokens: np.ndarray, mean: float, measured: float, full: float | None = None
) -> BatchMeans:
    """:func:`batch_means` from the tokens of each of its starting batches (a window's, summed
    request by request: no array of every chunk at once) and the window's ``mean`` tok/s."""
    k = len(tokens)
    fine = tuple(float(r) for r in tokens / (measured / k))
    correlated = von_neumann_correlated(detrended(tokens))
    while correlated and k > MIN_BATCHES:
        tokens = tokens.reshape(-1, 2).sum(axis=1)
        k //= 2
        correlated = von_neumann_correlated(detrended(tokens))
    rates = tokens / (measured / k)
    return BatchMeans(
        window_interval(rates, mean, measured, full),
        k,
        correlated,
        tuple(float(r) for r in rates),
        fine,
    )


def detrended(values: Sequence[float] | np.ndarray) -> np.ndarray:
    """Residuals of a least-squares line through equally spaced values."""
    y = np.asarray(values, dtype=np.float64)
    x = np.arange(len(y), dtype=np.float64) - (len(y) - 1) / 2
    sxx = float(x @ x)
    slope = float(x @ (y - y.mean())) / sxx if sxx > 0 else 0.0
    out: np.ndarray = y - y.mean() - slope * x
    return out


def window_interval(
    batches: Sequence[float] | np.ndarray,
    value: float,
    measured: float,
    full: float | None = None,
) -> Interval:
    """The 95 % interval of a window's ``value`` from its k equal batches' figures.

    The batches are fitted with a line over time; the residuals give the standard error of
    the window's mean (:func:`long_run_sd` with k − 2 degrees of freedom): a trend that every
    run of the window would have (contexts that grow as outputs lengthen) is not noise, and
    would widen the interval for nothing (the drift test reports it). Given ``full`` longer
    than ``measured`` (a window that ended early), the interval is that of the full window's
    figure: the line's value over [0, full] rather than [0, measured], i.e. ``value`` moved by
    slope × (full − measured) / 2, with the slope's standard error in the half-width — so an
    early end cannot report a figure its trend would have moved."""
    y = np.asarray(batches, dtype=np.float64)
    width = measured / len(y)
    x = (np.arange(len(y), dtype=np.float64) - (len(y) - 1) / 2) * width  # s from the centre
    keep = ~np.isnan(y)  # a batch without a figure (per-request tok/s) is left out
    x, y = x[keep] - x[keep].mean(), y[keep]
    k = len(y)
    sxx = float(x @ x)
    slope = float(x @ (y - y.mean())) / sxx
    sd, how = long_run_sd(y - y.mean() - slope * x, ddof=2)
    reach = max(full - measured, 0.0) / 2 if full is not None else 0.0
    se = sd * math.sqrt(1 / k + reach * reach / sxx)
    centre = value + slope * reach
    half = t_quantile(0.5 + LEVEL / 2, k - 2) * se
    how += f", projected to {full:g} s" if reach > 0 and full is not None else ""
    return Interval(centre - half, centre + half, f"batch means (k={k}{how})")


#: the long-run variance may fall below the batches' own variance by this factor at most
LRV_FLOOR = 1 / 16


def long_run_sd(rates: np.ndarray, ddof: int = 1) -> tuple[float, str]:
    """The standard deviation that makes sd / √k the standard error of the batches' mean.

    Batches that passed the von Neumann test are not positively correlated, but they may be
    negatively correlated — a server whose steps alternate slow and fast, a chunk boundary
    that gives one batch what it takes from the next — and then their plain variance
    overstates the mean's. Where the batches' lag-1 autocorrelation is clearly negative (below
    −1.96/√k, so white noise takes this path 2.5 % of the time), the
    long-run variance with Bartlett weights over ⌈k^⅓⌉ lags (Newey and West's estimator)
    takes its place, floored at 1/16 of the plain variance (a 4× narrower interval at most)."""
    k = len(rates)
    dev = rates - rates.mean()
    var = float(dev @ dev) / (k - ddof)
    if var == 0 or k < 8:
        return math.sqrt(var), ""
    gamma = [float(dev[lag:] @ dev[: k - lag]) / k for lag in range(0, k)]
    if gamma[1] / gamma[0] > -_z(0.975) / math.sqrt(k):  # not clearly negative: plain
        return math.sqrt(var), ""
    lags = math.ceil(k ** (1 / 3))
    lrv = gamma[0] + 2 * sum((1 - lag / (lags + 1)) * gamma[lag] for lag in range(1, lags + 1))
    lrv *= k / (k - ddof)
    return math.sqrt(max(lrv, LRV_FLOOR * var)), ", Newey-West"


def per_request_interval(
    requests: Sequence[tuple[np.ndarray, np.ndarray]],
    w0: float,
    w1: float,
    k: int,
    value: float,
    full: float | None = None,
) -> Interval | None:
    """The interval of per-request tok/s: the METRICS.md definition applied to each of the
    ``k`` batches (the token-weighted mean of each request's rate inside the batch); those
    figures' interval by :func:`window_interval` (detrended; projected to ``full``), around
    the whole window's ``value`` (a batch without a figure is left out). None when fewer than
    half the batches have one."""
    edges = np.linspace(w0, w1, k + 1)
    num = np.zeros(k)
    den = np.zeros(k)
    for times, counts in requests:  # each request's arrivals in order: its batches at once
        if not len(times):
            continue
        at = np.searchsorted(times, edges, side="left")  # batch j: chunks at[j] .. at[j+1]-1
        lo, hi = at[:-1], at[1:]
        total = np.concatenate(([0.0], np.cumsum(counts, dtype=np.float64)))
        n = total[hi] - total[lo]
        first = times[np.minimum(lo, len(times) - 1)]
        last = times[np.maximum(hi - 1, 0)]
        ok = (hi > lo) & (n >= 2) & (last > first)
        num[ok] += n[ok] * (n[ok] - 1) / (last[ok] - first[ok])
        den[ok] += n[ok]
    with np.errstate(invalid="ignore", divide="ignore"):
        f = np.where(den > 0, num / den, math.nan)
    if int((~np.isnan(f)).sum()) < MIN_BATCHES // 2:
        return None
    return window_interval(f, value, w1 - w0, full)


# -- medians -------------------------------------------------------------------------------


def _binom_cdf_half(n: int, r: int) -> float:
    """P(Binomial(n, 1/2) ≤ r)."""
    if r < 0:
        return 0.0
    if n > 1000:  # normal approximation with continuity correction
        return 0.5 * math.erfc(-((r + 0.5 - n / 2) / math.sqrt(n / 4)) / math.sqrt(2))
    return math.fsum(math.comb(n, i) for i in range(r + 1)) / 2.0**n


def median_interval(values: Sequence[float] | np.ndarray) -> Interval | None:
    """The distribution-free 95 % interval of a median: order statistics x(l) and x(n+1−l),
    l the largest rank with P(Bin(n, ½) ≤ l − 1) ≤ 2.5 %. None below 6 values (no pair of
    ranks covers 95 % then)."""
    n = len(values)
    if n < 6:
        return None
    tail = (1 - LEVEL) / 2
    lo_rank = 0  # 1-based rank l
    while _binom_cdf_half(n, lo_rank) <= tail:
        lo_rank += 1
    if lo_rank == 0:
        return None
    x = np.sort(np.asarray(values, dtype=np.float64))
    return Interval(float(x[lo_rank - 1]), float(x[n - lo_rank]), f"order statistics (n={n})")


# -- drift ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Drift:
    """A trend of throughput inside the window."""

    change: float  # fitted change over the window, as a fraction of the mean (− = slowing)
    t_stat: float
    significant: bool  # |t| beyond the 1 % level with the effective sample size
    material: bool  # |change| ≥ DRIFT_MIN_CHANGE

    @property
    def flagged(self) -> bool:
        return self.significant and self.material

    def words(self) -> str:
        return drift_words(self.change)


def drift_words(change: float) -> str:
    """The drift flag in words, from the fitted change over the window (− = slowing)."""
    way = "fell" if change < 0 else "rose"
    return (
        f"drift: total tok/s {way} {abs(change):.1%} over the window (a trend, not noise): "
        "the figure depends on when the window was taken"
    )


def drift_noted(
    change: float | None,
    value: float | None,
    ci: tuple[float, float] | None,
    measured_s: float | None,
    duration_s: float | None,
    early_end: bool,
) -> bool:
    """Is a window's trend a note on the cell? ``change``: the flagged trend's fitted change
    over the window (a fraction of the figure, − = slowing; None when none was flagged).

    Only where the trend moves the figure the protocol defines — the mean over the full
    ``duration_s`` window — beyond the figure's own interval, or where early ends were asked
    (``early_end``: ``--llm-precision``), whose end and projected interval a trend decides.
    Over a full window the trend is part of that figure (the interval, taken around the line
    through the batches, already describes it): no note. Over a window shorter than asked
    (cut short), the line carried on to the full window moves the figure by
    |change| · (D − t) / 2t of it: a note when that is beyond the interval's wider side
    (docs/metrics.md, "Drift")."""
    if change is None:
        return False
    if early_end:
        return True
    if not value or not measured_s or not duration_s or measured_s >= duration_s - 1e-3:
        return False
    shift = abs(change) * (duration_s - measured_s) / (2 * measured_s) * abs(value)
    if ci is None:
        return True
    return shift > max(value - ci[0], ci[1] - value)


def trend(rates: Sequence[float]) -> Drift | None:
    """Least-squares slope of a rate series over equal batches, tested against zero with its
    standard error widened for the residuals' lag-1 autocorrelation (n_eff = n(1−r)/(1+r))."""
    y = np.asarray(rates, dtype=np.float64)
    n = len(y)
    if n < 6 or y.mean() <= 0:
        return None
    x = np.arange(n, dtype=np.float64) - (n - 1) / 2
    sxx = float(x @ x)
    slope = float(x @ (y - y.mean())) / sxx
    resid = y - y.mean() - slope * x
    ss = float(resid @ resid)
    r1 = float(resid[1:] @ resid[:-1]) / ss if ss > 0 else 0.0
    r1 = min(max(r1, 0.0), 0.95)
    n_eff = max(n * (1 - r1) / (1 + r1), 3.0)
    se = math.sqrt(ss / (n - 2) / sxx * (n - 2) / max(n_eff - 2, 1.0)) if ss > 0 else 0.0
    t_stat = slope / se if se > 0 else (0.0 if slope == 0 else math.copysign(math.inf, slope))
    change = slope * n / float(y.mean())
    crit = t_quantile(1 - DRIFT_ALPHA / 2, max(n_eff - 2, 1.0))
    return Drift(change, t_stat, abs(t_stat) > crit, abs(change) >= DRIFT_MIN_CHANGE)


# -- requests in flight (Little's L) ------------------------------------------------------


def in_flight(spans: Sequence[tuple[float, float]], w0: float, w1: float) -> float | None:
    """Requests in flight on average over the window [w0, w1): the time-integral of the
    requests open at each instant — each request's overlap of [send, end) with the window —
    over the window's length (METRICS.md, "average active requests"). None for an empty
    window."""
    measured = w1 - w0
    if measured <= 0:
        return None
    return math.fsum(max(0.0, min(end, w1) - max(start, w0)) for start, end in spans) / measured


def little_residual(
    spans: Sequence[tuple[float, float]], w0: float, w1: float, concurrency: int
) -> float | None:
    """L / N − 1: the requests in flight on average over the window (:func:`in_flight`, the
    L of Little's law measured directly) against the N the protocol keeps in flight. 0 when
    the client keeps N in flight; below when it restarts late or requests fail and wait
    before they restart. None without a request.

    Not λ·W from the requests that left in the window: their time in the system includes
    the part before the window opened (one TTFT or more for each of the first N, the whole
    window and more for long requests cut at its end), which put λ·W above N — 67.7 in
    flight for 64 asked on a 3 s window — when the client lost no time at all."""
    held = in_flight(spans, w0, w1)
    if held is None or not spans or concurrency <= 0:
        return None
    return held / concurrency - 1


#: how far the server's generation counter may sit outside the received bracket: a relative
#: part, and tokens per stream (a step's output generated, not yet read, at each /metrics read)
COUNTER_TOLERANCE = 0.05
COUNTER_SLACK_PER_STREAM = 8


def counter_gap(
    delta: float | None, span: tuple[int, int] | None, concurrency: int
) -> float | None:
    """How far the server's generation counter rose outside the tokens received over the same
    span, relative to the bracket's top (+ above, − below); None when inside [lo − s, hi + s]
    or not known (docs/metrics.md, "The server's generation counter as a referee")."""
    if delta is None or span is None:
        return None
    lo, hi = span
    slack = COUNTER_TOLERANCE * hi + COUNTER_SLACK_PER_STREAM * concurrency
    if lo - slack <= delta <= hi + slack or not hi:
        return None
    return delta / hi - 1
