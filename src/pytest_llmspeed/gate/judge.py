"""The judge of "did this figure change" (issue 31), as pure arithmetic: four verdicts from one
estimate of the change and its noise, and the estimate from ABBA-ordered rounds of an A/B.

A figure's change is the log ratio ``ln(new / old)``, signed so that positive is better (a
rate's rise, a latency's fall), with its standard error and degrees of freedom. Working in logs
makes a relative change symmetric and lets a multiplicative drift cancel by subtraction.

- **regressed**: worse than the tolerance, beyond the noise: the point estimate is past
  ``−tolerance`` and the one-sided 99 % test says it is worse at all (as the stored-baseline
  gate's rule, docs/judge.md "The rule across restarts");
- **improved**: the mirror;
- **same**: the change's two-sided 95 % interval lies inside ``±tolerance``: shown to be within
  tolerance (an equivalence test, two one-sided tests at 2.5 %);
- **unknown**: neither: too noisy to tell at this tolerance. ``more_needed`` says about how many
  more measurements (rounds, starts) would decide it, if the change is what it seems.

Old and new measured now, alternately (the A/B): rounds in ABBA order (A B B A, A B B A, …),
each block of four giving ``d = (ln B1 + ln B2 − ln A1 − ln A2) / 2``: a drift linear within
the block cancels exactly, a slower one nearly; the blocks' d are the samples (n − 1 degrees
of freedom). Unpaired, the same rounds give the difference of the arms' log means, with the
drift in both arms' spread.

No numpy, no pytest.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum

from .noise import t_quantile

#: the two-sided level of "same" (each one-sided test at 2.5 %)
SAME_LEVEL = 0.95
#: the one-sided level of "regressed" and "improved", as the stored-baseline gate's
CHANGE_LEVEL = 0.99


class Verdict(Enum):
    REGRESSED = "regressed"
    IMPROVED = "improved"
    SAME = "same"
    UNKNOWN = "unknown"


@dataclass(frozen=True)
class Change:
    """ln(new / old), positive better; its standard error; its degrees of freedom (None: a
    known variance, the normal quantiles); how many measurements (blocks, or each arm's runs)
    went into it."""

    log_ratio: float
    se: float
    df: float | None  # whole for a sample's spread; an A/B's pooled spread counts fractions
    n: int

    @property
    def relative(self) -> float:
        """The change as a fraction: new / old − 1 (positive better)."""
        return math.expm1(self.log_ratio)

    def interval(self, level: float = SAME_LEVEL) -> tuple[float, float]:
        """The two-sided interval of the relative change at ``level``."""
        q = t_quantile(0.5 + level / 2, self.df)
        return math.expm1(self.log_ratio - q * self.se), math.expm1(self.log_ratio + q * self.se)


@dataclass(frozen=True)
class Judgement:
    verdict: Verdict
    change: Change
    tolerance: float
    #: for an unknown: about how many more measurements like these would decide it (None when
    #: the estimate sits so near the tolerance that no number would)
    more: int | None = None

    def words(self) -> str:
        lo, hi = self.change.interval()
        text = (
            f"{self.change.relative:+.1%} (95 % interval {lo:+.1%} … {hi:+.1%}, "
            f"tolerance ±{self.tolerance:.0%}): {self.verdict.value}"
        )
        if self.verdict is Verdict.UNKNOWN:
            text += (
                f"; about {self.more} more measurement(s) would decide it"
                if self.more is not None
                else "; too close to the tolerance to decide"
            )
        return text


def _sign(higher_is_better: bool) -> float:
    return 1.0 if higher_is_better else -1.0


def _mean_sd(values: Sequence[float]) -> tuple[float, float]:
    n = len(values)
    mean = sum(values) / n
    if n < 2:
        return mean, 0.0
    return mean, math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))


def abba_blocks(old: Sequence[float], new: Sequence[float]) -> list[float]:
    """The blocks' ln(new / old) of an A/B measured in ABBA order: rounds A1 B1 B2 A2, then the
    next block. ``old`` and ``new`` are each arm's figures in the order measured (two per
    block). Raises ValueError when they do not make whole blocks."""
    if len(old) != len(new) or len(old) % 2 or not old:
        raise ValueError("an ABBA A/B has two measurements of each arm per block")
    if min(old) <= 0 or min(new) <= 0:
        raise ValueError("figures must be positive")
    out = []
    for i in range(0, len(old), 2):
        a1, a2, b1, b2 = old[i], old[i + 1], new[i], new[i + 1]
        out.append((math.log(b1) + math.log(b2) - math.log(a1) - math.log(a2)) / 2)
    return out


def paired(blocks: Sequence[float], higher_is_better: bool = True) -> Change:
    """The change from ABBA blocks' ln(new / old): their mean, its standard error from their
    spread (n − 1 degrees of freedom). One block: no spread to go on (se infinite)."""
    mean, sd = _mean_sd(blocks)
    n = len(blocks)
    se = sd / math.sqrt(n) if n > 1 else math.inf
    return Change(_sign(higher_is_better) * mean, se, n - 1 if n > 1 else None, n)


def unpaired(
    old: Sequence[float],
    new: Sequence[float],
    higher_is_better: bool = True,
    within: float = 0.0,
) -> Change:
    """The change from each arm's runs taken apart (no pairing): the difference of their log
    means, Welch's standard error and Satterthwaite's degrees of freedom. ``within``: a known
    relative standard error of one measurement, used when an arm has one run."""
    if not old or not new or min(old) <= 0 or min(new) <= 0:
        raise ValueError("each arm needs positive figures")
    lo, ln_ = [math.log(v) for v in old], [math.log(v) for v in new]
    mo, so = _mean_sd(lo)
    mn, sn = _mean_sd(ln_)
    so = so if len(old) > 1 else within
    sn = sn if len(new) > 1 else within
    vo, vn = so * so / len(old), sn * sn / len(new)
    se = math.sqrt(vo + vn)
    df: float | None = None
    if len(old) > 1 and len(new) > 1 and se > 0:
        denom = vo * vo / (len(old) - 1) + vn * vn / (len(new) - 1)
        df = max(1, round((vo + vn) ** 2 / denom)) if denom > 0 else None
    return Change(_sign(higher_is_better) * (mn - mo), se, df, min(len(old), len(new)))


def judge(change: Change, tolerance: float) -> Judgement:
    """The verdict on one figure's change at ``tolerance`` (a fraction, e.g. 0.05)."""
    if not 0 < tolerance < 1:
        raise ValueError("tolerance must be a fraction in (0, 1)")
    verdict = verdict_of(change, tolerance)
    more = more_needed(change, tolerance) if verdict is Verdict.UNKNOWN else None
    return Judgement(verdict, change, tolerance, more)


def more_needed(change: Change, tolerance: float, most: int = 1000) -> int | None:
    """About how many more measurements like the ones so far would turn an unknown into a
    verdict, if the estimate and the spread stay as they are (the standard error falls as
    1/√n): the fewest extra m for which the estimate is then shown same, regressed or
    improved; None when no m up to ``most`` would (the estimate sits on the tolerance)."""
    if not math.isfinite(change.se) or change.n < 1:
        return None

    def decided(m: int) -> bool:
        n = change.n + m
        df = None if change.df is None else change.df + m
        se = change.se * math.sqrt(change.n / n)
        return verdict_of(Change(change.log_ratio, se, df, n), tolerance) is not Verdict.UNKNOWN

    if not decided(most):
        return None
    lo, hi = 0, most  # more measurements only narrow the interval: the first m that decides
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if decided(mid) else (mid, hi)
    return hi


def verdict_of(change: Change, tolerance: float) -> Verdict:
    """The four-way rule itself (``judge`` adds what would decide an unknown)."""
    limit = math.log1p(-tolerance), math.log1p(tolerance)
    d, se = change.log_ratio, change.se
    q_change = t_quantile(CHANGE_LEVEL, change.df)
    if d < limit[0] and (se == 0 or -d / se > q_change):
        return Verdict.REGRESSED
    if d > limit[1] and (se == 0 or d / se > q_change):
        return Verdict.IMPROVED
    q_same = t_quantile(0.5 + SAME_LEVEL / 2, change.df)
    if limit[0] < d - q_same * se and d + q_same * se < limit[1]:
        return Verdict.SAME
    return Verdict.UNKNOWN
