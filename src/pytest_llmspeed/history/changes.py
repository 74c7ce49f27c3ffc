"""The change points of one figure over a series of runs, and its segments' levels
(docs/history.md).

E-divisive means (Matteson & James 2014, "A nonparametric approach for multiple change point
analysis of multivariate data", JASA 109(505); applied to CI performance data by Daly et al.,
ICPE 2020) as Apache Otava (formerly Hunter: Fleming et al., "Hunter: Using Change Point
Detection to Hunt for Performance Regressions", ICPE 2023) runs it:

1. **split**: on overlapping windows of :data:`WINDOW` points (step half a window), E-divisive's
   binary segmentation: the split maximising ``q̂(τ)`` (α = 1, the right end at the segment's
   end, as MongoDB's signal-processing-algorithms computes it) among the current segments,
   kept while a t-test between its two sides is significant at a loose level (two-sided
   p < 0.01, Otava's ``max_pvalue × 10``);
2. **merge**: while some change point fails the strict test between its two neighbouring
   segments, the weakest (the smallest |t|) is removed and its neighbours are tested again.

Here the t-test uses each point's own interval: a point's variance is the between-run spread
plus its window's noise, ``σ_b² + w_r²`` (``w_r`` its relative standard error; ``σ_b²`` the
gate's between-start spread, gate/noise.py, pooled over the two segments less the windows'
noise), each segment's level the mean of its points' logs weighted by ``1 / (σ_b² + w_r²)``.
The strict test is the one judge (gate/judge.py) and Otava's p-value: a change point stays
only where the judge says regressed or improved (beyond the tolerance, the minimum magnitude,
and its one-sided 99 % test) and the t-test's two-sided p-value is below 0.001 (Otava's
``max_pvalue``; in a series longer than 40 runs, 0.001 × 40 / n: the split chose the point as
the best of many places). A segment has at least :data:`MIN_SIZE` runs. When the newest
segment is judged the same as the one before its previous, ``Found.back_to`` says so (the
previous was a dip or a rise that did not last).

Pure numpy and the judge: no pytest, no I/O.
"""

from __future__ import annotations

import bisect
import itertools
import math
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from ..gate.judge import Change, Judgement, Verdict, judge, verdict_of
from ..quantiles import t_quantile

Array = npt.NDArray[np.float64]

#: points per E-divisive window (Otava's ``window_len``), and the step between windows
WINDOW = 50
#: the fewest runs a segment holds: one run off its neighbours is an outlier until the next
MIN_SIZE = 2
#: the split phase's one-sided quantile level: two-sided p < 0.01
SPLIT_LEVEL = 0.995
#: the merge's two-sided p-value a change point must reach beside the judge's verdict, in a
#: series of up to :data:`STRICT_RUNS` runs (Otava's default ``max_pvalue``): the split picked
#: it as the best of many places, which a 99 % one-sided test alone does not allow for. A
#: longer series offers more places: its p-value is ``STRICT_P × STRICT_RUNS / n`` (Bonferroni
#: over the places), so that a long flat series is not a row of false changes
STRICT_P = 0.001
STRICT_RUNS = 40
#: the level of a segment's interval
LEVEL = 0.95
_DECIDED = (Verdict.REGRESSED, Verdict.IMPROVED)


@dataclass(frozen=True)
class Level:
    """One segment: points ``[start, end)`` of the series, its level (the weighted geometric
    mean) and the level's 95 % interval."""

    start: int
    end: int
    level: float
    low: float
    high: float


@dataclass(frozen=True)
class Found:
    """A series' segments, in order, and the judge's verdict on each change between two
    neighbouring segments (``changes[i]``: from ``segments[i]`` to ``segments[i + 1]``)."""

    segments: tuple[Level, ...]
    changes: tuple[Judgement, ...]
    #: the newest segment is judged the same as the one before its previous (the previous a
    #: dip or a rise between two equal levels): that segment's index; None otherwise
    back_to: int | None = None
    #: the judge's verdict of the newest segment against the one before its previous (three
    #: segments or more; None otherwise): a fall after a rise regressed only when it is below
    #: the level before the rise too
    against_earlier: Verdict | None = None


def find(
    values: Array,
    w2: Array,
    tolerance: float,
    higher_is_better: bool = True,
    window: int = WINDOW,
    min_size: int = MIN_SIZE,
) -> Found:
    """The segments of a series of positive ``values`` (one per run, in time order), each
    with the squared relative standard error of its own window, ``w2`` (NaN: no interval;
    such a point is given the series' mean)."""
    if min_size < 2:
        raise ValueError("a segment needs at least two runs")
    w2 = np.asarray(w2, dtype=float)
    if np.isnan(w2).any():
        known = w2[~np.isnan(w2)]
        w2 = np.where(np.isnan(w2), known.mean() if known.size else 0.0, w2)
    data = Logs(np.log(np.asarray(values, dtype=float)), w2)
    points = _split(data, window, min_size)
    bounds, changes = _merge(data, points, tolerance, higher_is_better)
    edges = [0, *bounds, data.n]
    back_to = against = None
    if len(edges) >= 4:  # three segments or more: is the newest back where it was before?
        earlier, newest = (edges[-4], edges[-3]), (edges[-2], edges[-1])
        against = verdict_of(data.between(earlier, newest, higher_is_better), tolerance)
        if against is Verdict.SAME:
            back_to = len(edges) - 4
    return Found(_levels(data, edges), tuple(changes), back_to, against)


class Logs:
    """A series' logs ``y`` and their windows' squared relative standard errors ``w2``, with
    the running sums that give any segment's spread in O(1)."""

    def __init__(self, y: Array, w2: Array) -> None:
        self.offset = float(y.mean()) if len(y) else 0.0
        y = y - self.offset  # centred: the running sums of squares keep their precision
        self.y, self.w2, self.n = y, w2, len(y)
        zero = np.zeros(1)
        self._s1 = np.concatenate((zero, np.cumsum(y))).tolist()
        self._s2 = np.concatenate((zero, np.cumsum(y * y))).tolist()
        self._w = np.concatenate((zero, np.cumsum(w2))).tolist()

    def squares(self, a: int, b: int) -> float:
        """Σ (y − ȳ)² over ``[a, b)``."""
        s1 = self._s1[b] - self._s1[a]
        return max(self._s2[b] - self._s2[a] - s1 * s1 / (b - a), 0.0)

    def spread(self, ranges: list[tuple[int, int]]) -> tuple[float, int]:
        """σ_b² and its degrees of freedom: the points' spread around their own segment's
        mean, pooled over the segments ``[a, b)`` of ``ranges``, less the mean of the windows'
        own noise (gate/noise.py's between-start spread, in logs); 0 when unknown or
        explained by the windows."""
        points = sum(b - a for a, b in ranges)
        dof = points - len(ranges)
        if dof <= 0:
            return 0.0, 0
        squares = sum(self.squares(a, b) for a, b in ranges)
        within = sum(self._w[b] - self._w[a] for a, b in ranges) / points
        return max(squares / dof - within, 0.0), dof

    def level(self, a: int, b: int, sigma2: float) -> tuple[float, float]:
        """The mean of ``y[a:b]`` weighted by ``1 / (σ_b² + w²)`` and its variance; a point of
        no known noise (no interval, no spread) leaves the plain mean, of variance 0."""
        var = self.w2[a:b] + sigma2
        if not (var > 0).all():
            return self.offset + (self._s1[b] - self._s1[a]) / (b - a), 0.0
        weights = 1.0 / var
        total = float(weights.sum())
        return self.offset + float(weights @ self.y[a:b]) / total, 1.0 / total

    def change(self, a: int, b: int, c: int, higher_is_better: bool = True) -> Change:
        """The change from segment ``[a, b)`` to ``[b, c)`` (:meth:`between`)."""
        return self.between((a, b), (b, c), higher_is_better)

    def between(
        self, old: tuple[int, int], new: tuple[int, int], higher_is_better: bool = True
    ) -> Change:
        """The change from segment ``old`` to segment ``new`` (each ``[start, end)``): the
        difference of their weighted levels, positive better, with its standard error and
        degrees of freedom (the two segments' points less their two means)."""
        sigma2, dof = self.spread([old, new])
        la, va = self.level(*old, sigma2)
        lb, vb = self.level(*new, sigma2)
        d = lb - la
        n = min(old[1] - old[0], new[1] - new[0])
        return Change(d if higher_is_better else -d, math.sqrt(va + vb), dof or None, n)


def _qhat(table: Array, a: int, c: int, m: int) -> tuple[int, float] | None:
    """E-divisive's best split of ``[a, c)`` (each side at least ``m`` points) and its
    ``q̂``, from the summed-area table of the window's distances |z_i − z_j|."""
    taus = np.arange(a + m, c - m + 1)
    if taus.size == 0:
        return None
    s = table
    n = np.full_like(taus, c)
    first = np.full_like(taus, a)

    def block(
        r0: npt.NDArray[np.int64],
        r1: npt.NDArray[np.int64],
        c0: npt.NDArray[np.int64],
        c1: npt.NDArray[np.int64],
    ) -> Array:
        return s[r1, c1] - s[r0, c1] - s[r1, c0] + s[r0, c0]

    cross = block(first, taus, taus, n)
    left = block(first, taus, first, taus) / 2
    right = block(taus, n, taus, n) / 2
    k = (taus - a).astype(float)
    r = (c - taus).astype(float)
    q = (
        k
        * r
        / (c - a)
        * (2 * cross / (k * r) - left / (k * (k - 1) / 2) - right / (r * (r - 1) / 2))
    )
    best = int(np.argmax(q))
    return int(taus[best]), float(q[best])


def _window(data: Logs, start: int, end: int, m: int) -> list[int]:
    """E-divisive's binary segmentation of ``y[start:end]``: the change points (series
    indices) whose split passes the loose test."""
    z = data.y[start:end]
    table = np.zeros((len(z) + 1, len(z) + 1))
    table[1:, 1:] = np.abs(z[:, None] - z[None, :]).cumsum(0).cumsum(1)
    bounds = [0, len(z)]
    quantile = t_quantile(SPLIT_LEVEL, None)
    while True:
        best: tuple[float, int, int, int] | None = None
        for a, c in itertools.pairwise(bounds):
            found = _qhat(table, a, c, m)
            if found is not None and (best is None or found[1] > best[0]):
                best = (found[1], a, found[0], c)
        if best is None:
            break
        _, a, tau, c = best
        change = data.change(start + a, start + tau, start + c)
        q = quantile if change.df is None else t_quantile(SPLIT_LEVEL, change.df)
        if not abs(change.log_ratio) > q * change.se:
            break
        bisect.insort(bounds, tau)
    return [start + b for b in bounds[1:-1]]


def _split(data: Logs, window: int, m: int) -> list[int]:
    """Otava's ``split``: E-divisive on windows overlapping by half, each next window starting
    at the last change point found or half a window on, whichever is later."""
    n, found = data.n, set()
    start, step = 0, max(window // 2, 1)
    while n - start >= 2 * m:
        end = min(start + window, n)
        points = _window(data, start, end, m)
        found.update(points)
        if end == n:
            break
        start = max(max(points, default=0), start + step)
    return sorted(found)


def _merge(
    data: Logs, points: list[int], tolerance: float, higher_is_better: bool
) -> tuple[list[int], list[Judgement]]:
    """Otava's ``merge``: while a change point is not judged regressed or improved between its
    neighbouring segments, remove the weakest (smallest |t|, then smallest change) and judge
    its neighbours again."""
    cps = list(points)
    n = data.n
    p = strict_p(n)

    def change(i: int) -> Change:
        a = cps[i - 1] if i > 0 else 0
        c = cps[i + 1] if i + 1 < len(cps) else n
        return data.change(a, cps[i], c, higher_is_better)

    def strength(c: Change) -> tuple[float, float]:
        d = abs(c.log_ratio)
        return (d / c.se if c.se > 0 else math.inf, d)

    changes = [change(i) for i in range(len(cps))]
    while True:
        weak = [i for i, c in enumerate(changes) if not _kept(c, tolerance, p)]
        if not weak:
            return cps, [judge(c, tolerance) for c in changes]
        i = min(weak, key=lambda i: strength(changes[i]))
        del cps[i], changes[i]
        for j in (i - 1, i):
            if 0 <= j < len(cps):
                changes[j] = change(j)


def strict_p(n: int) -> float:
    """The two-sided p-value a change point must reach in a series of ``n`` runs."""
    return STRICT_P * min(1.0, STRICT_RUNS / max(n, 1))


def _kept(change: Change, tolerance: float, p: float) -> bool:
    """A change point stays: the judge says regressed or improved, and the t-test's two-sided
    p-value is below ``p`` (:func:`strict_p`)."""
    if verdict_of(change, tolerance) not in _DECIDED:
        return False
    if change.se == 0:
        return True
    return abs(change.log_ratio) / change.se > t_quantile(1 - p / 2, change.df)


def _levels(data: Logs, bounds: list[int]) -> tuple[Level, ...]:
    """Each segment's level with its 95 % interval, the between-run spread pooled over all
    the series' segments (``n − k`` degrees of freedom)."""
    sigma2, dof = data.spread(list(itertools.pairwise(bounds)))
    q = t_quantile(0.5 + LEVEL / 2, dof or None)
    out = []
    for a, c in itertools.pairwise(bounds):
        level, var = data.level(a, c, sigma2)
        half = q * math.sqrt(var)
        out.append(Level(a, c, math.exp(level), math.exp(level - half), math.exp(level + half)))
    return tuple(out)
