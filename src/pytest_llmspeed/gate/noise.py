"""The gate's two levels of noise, as pure arithmetic (docs/judge.md, "The rule across restarts").

- **Within a window**: a figure's own 95 % interval gives its relative standard error,
  ``w = (half-width / value) / 1.96`` (0 when it has none).
- **Between starts**: a real server's speed differs from start to start. A baseline made of
  several runs shows it: the relative spread of each cell's runs around their mean, pooled over
  the baseline's cells per figure (the start effect is mostly server-wide, and one cell's 3 runs
  give only 2 degrees of freedom), less the part the windows' own noise explains:
  ``σ_b² = max(0, Σ_c Σ_r (v_cr / v̄_c − 1)² / Σ_c (k_c − 1) − mean w_cr²)``.

No numpy, no pytest: the gate and the results model read these numbers.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from ..quantiles import t_quantile
from ..results import Z95, Z99, Pair, relative_se

#: the one-sided level of the gate's test (Z99 its normal quantile)
LEVEL = 0.99

__all__ = [
    "LEVEL",
    "UNKNOWN",
    "Z95",
    "Z99",
    "Pair",
    "Spread",
    "pooled_spread",
    "reference_se",
    "t_quantile",
    "with_attempts",
    "within_se",
]


#: a figure's relative standard error from its 95 % interval (0 without one): the results
#: model's one reading of an interval as noise
within_se = relative_se


@dataclass(frozen=True)
class Spread:
    """The between-start spread of one figure, pooled over a baseline's cells.

    ``sigma`` is relative (0.03 = 3 %), None when unknown (every cell has one run); ``dof`` the
    degrees of freedom of its estimate, Σ (k_c − 1); ``cells`` how many cells gave it."""

    sigma: float | None
    dof: int = 0
    cells: int = 0

    @property
    def known(self) -> bool:
        return self.sigma is not None

    @property
    def quantile(self) -> float:
        """The gate's one-sided 99 % quantile: Student's t with the estimate's degrees of
        freedom, the normal one when the spread is unknown (then taken as 0)."""
        if not self.known or self.dof == 0:
            return Z99
        return t_quantile(LEVEL, self.dof)


UNKNOWN = Spread(None)


def pooled_spread(
    cells: Iterable[tuple[Sequence[float], Sequence[Pair | None]]], runs: int | None = None
) -> Spread:
    """σ_b of one figure from its runs in each cell: (values, intervals) per cell. ``runs``:
    how many runs the baseline holds (a cell with that many was in every run, its i-th value
    from run i); it sets the degrees of freedom (:func:`effective_dof`)."""
    squares = 0.0
    dof = 0
    count = 0
    w2: list[float] = []
    complete: list[list[float]] = []
    longest = 0
    for values, cis in cells:
        k = len(values)
        if k < 2:
            continue
        mean = sum(values) / k
        deviations = [v / mean - 1 for v in values]
        squares += sum(d * d for d in deviations)
        dof += k - 1
        count += 1
        longest = max(longest, k)
        w2 += [within_se(v, ci) ** 2 for v, ci in zip(values, cis, strict=True)]
        if k == runs:
            complete.append(deviations)
    if dof == 0:
        return UNKNOWN
    between = squares / dof - sum(w2) / len(w2)
    return Spread(math.sqrt(max(between, 0.0)), effective_dof(complete, dof, longest), count)


def effective_dof(complete: Sequence[Sequence[float]], pooled: int, longest: int) -> int:
    """Degrees of freedom of the pooled spread when the start effect may be shared by the cells.

    Pooling over C cells gives Σ (k_c − 1) degrees of freedom only if the cells' deviations
    from start to start are independent; a start that is slow for every cell (what the
    simulator's ``start_noise`` draws, and mostly what a real server does) is one draw per
    start, whatever the number of cells: k − 1 degrees of freedom. The deviations
    d_cr = v_cr / v̄_c − 1 of the cells measured in every run (``complete``: one list per cell,
    aligned by run) split into the runs' common part m_r (the mean over cells) and the rest:
    a = Σ m_r² / (R − 1) and b = Σ (d_cr − m_r)² / (R − 1) / C, whose sum is the pooled
    variance. Satterthwaite's approximation gives ν = (a + b)² / (a² / (R − 1) + b² / ((C − 1)
    (R − 1))): R − 1 when the runs' deviations are shared, the pooled count when independent.
    Rounded down, within [longest run count − 1, ``pooled``]. Without two complete cells: the
    longest cell's own k − 1."""
    floor = max(longest - 1, 1)
    cells = len(complete)
    if cells < 2:
        return min(floor, pooled)
    runs = len(complete[0])
    means = [sum(c[r] for c in complete) / cells for r in range(runs)]
    a = sum(m * m for m in means) / (runs - 1)
    rest = sum((c[r] - means[r]) ** 2 for c in complete for r in range(runs))
    b = rest / (runs - 1) / cells
    denominator = a * a / (runs - 1) + b * b / ((cells - 1) * (runs - 1))
    if denominator <= 0:
        return min(floor, pooled)
    nu = (a + b) ** 2 / denominator
    return max(min(int(nu), pooled), min(floor, pooled))


def with_attempts(spread: Spread, values: Sequence[float], cis: Sequence[Pair | None]) -> Spread:
    """The baseline's spread pooled with what a cell's attempts on fresh starts show.

    Each attempt on a fresh start is one more draw of the start effect: their deviations from
    their own mean (less the windows' noise) estimate σ_b with n − 1 degrees of freedom, shifted
    or not by a real change, since a change moves every attempt alike. Pooled with the
    baseline's estimate, ``σ² = (ν_b σ_b² + (n − 1) σ_a²) / (ν_b + n − 1)`` with
    ``ν_b + n − 1`` degrees of freedom: a 3-run baseline's 2 degrees of freedom (Student's t
    6.96) grow with each confirmation, which is what lets confirmations buy power
    (docs/judge.md, "The rule across restarts"). Unknown stays unknown (a one-run baseline keeps its
    rule), as does a single attempt."""
    n = len(values)
    if spread.sigma is None or spread.dof == 0 or n < 2:
        return spread
    mean = sum(values) / n
    raw = sum((v / mean - 1) ** 2 for v in values) / (n - 1)
    w2 = sum(within_se(v, ci) ** 2 for v, ci in zip(values, cis, strict=True)) / n
    dof = spread.dof + n - 1
    pooled = (spread.dof * spread.sigma**2 + (n - 1) * (raw - w2)) / dof
    return Spread(math.sqrt(max(pooled, 0.0)), dof, spread.cells)


def reference_se(values: Sequence[float], cis: Sequence[Pair | None], sigma: float) -> float:
    """The reference's relative standard error, the mean of k runs:
    ``u_R² = (σ_b² + mean w_r²) / k``."""
    k = len(values)
    w2 = sum(within_se(v, ci) ** 2 for v, ci in zip(values, cis, strict=True)) / k
    return math.sqrt((sigma**2 + w2) / k)
