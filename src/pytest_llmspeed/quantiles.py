"""The quantiles every figure's interval and every verdict use, implemented once (issue 31):
the standard normal's and Student's t's. The core's intervals (core/intervals.py) and the gate
(gate/noise.py, gate/judge.py) import them from here.

- :func:`normal_quantile`: Acklam's rational approximation (|error| < 1.2e-9);
- :func:`t_quantile`: Student's t by bisection of its CDF: for an integer number of degrees
  of freedom the exact finite series (Abramowitz & Stegun 26.7.3-4, in cos θ), for a
  non-integer one (an effective sample size) the regularized incomplete beta function
  (A&S 26.7.1, its continued fraction 26.5.8 by Lentz's method, to 1e-12); the normal
  quantile for ``df`` None (a known variance); from 100 degrees of freedom on, the normal
  quantile's expansion in 1/df (A&S 26.7.5), as exact there and much cheaper.

No numpy, no pytest: light enough for the results model's readers.
"""

from __future__ import annotations

import functools
import math

__all__ = ["f_cdf", "f_quantile", "normal_quantile", "t_cdf", "t_quantile"]

_A = (-39.69683028665376, 220.9460984245205, -275.9285104469687, 138.3577518672690,
      -30.66479806614716, 2.506628277459239)  # fmt: skip
_B = (-54.47609879822406, 161.5858368580409, -155.6989798598866, 66.80131188771972,
      -13.28068155288572)  # fmt: skip
_C = (-7.784894002430293e-03, -3.223964580411365e-01, -2.400758277161838, -2.549732539343734,
      4.374664141464968, 2.938163982698783)  # fmt: skip
_D = (7.784695709041462e-03, 3.224671290700398e-01, 2.445134137142996, 3.754408661907416)


def normal_quantile(p: float) -> float:
    """The standard normal quantile (Acklam's rational approximation, |error| < 1.2e-9)."""
    if not 0 < p < 1:
        raise ValueError("p must be in (0, 1)")
    a, b, c, d = _A, _B, _C, _D
    lo = 0.02425
    if p < lo:
        q = math.sqrt(-2 * math.log(p))
        num = ((((c[0] * q + c[1]) * q + c[2]) * q + c[3]) * q + c[4]) * q + c[5]
        return num / ((((d[0] * q + d[1]) * q + d[2]) * q + d[3]) * q + 1)
    if p > 1 - lo:
        return -normal_quantile(1 - p)
    q = p - 0.5
    r = q * q
    num = (((((a[0] * r + a[1]) * r + a[2]) * r + a[3]) * r + a[4]) * r + a[5]) * q
    return num / (((((b[0] * r + b[1]) * r + b[2]) * r + b[3]) * r + b[4]) * r + 1)


def t_cdf(t: float, df: int) -> float:
    """P(T ≤ t) for Student's t with an integer ``df`` (Abramowitz & Stegun 26.7.3-4: a finite
    series in cos θ, θ = atan(t / √df); exact up to rounding)."""
    theta = math.atan(t / math.sqrt(df))
    s, c2 = math.sin(theta), math.cos(theta) ** 2
    if df % 2 == 1:
        term, total = math.cos(theta), 0.0
        if df > 1:
            total = term
            for j in range(3, df - 1, 2):
                term *= c2 * (j - 1) / j
                total += term
        a = 2 / math.pi * (theta + s * total)
    else:
        term = total = 1.0
        for j in range(2, df - 1, 2):
            term *= c2 * (j - 1) / j
            total += term
        a = s * total
    return 0.5 + a / 2


def _beta_fraction(a: float, b: float, x: float) -> float:
    """The continued fraction of the incomplete beta function (A&S 26.5.8), by the modified
    Lentz method."""
    tiny = 1e-300
    c, d = 1.0, 1 - (a + b) * x / (a + 1)
    d = 1 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 300):
        for num in (
            m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
            -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1)),
        ):
            d = 1 + num * d
            d = 1 / (d if abs(d) > tiny else tiny)
            c = 1 + num / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1) < 1e-12:
            break
    return h


def _beta_regularized(a: float, b: float, x: float) -> float:
    """I_x(a, b), the regularized incomplete beta function."""
    if x <= 0:
        return 0.0
    if x >= 1:
        return 1.0
    front = math.exp(
        math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    )
    if x < (a + 1) / (a + b + 2):
        return front * _beta_fraction(a, b, x) / a
    return 1 - front * _beta_fraction(b, a, 1 - x) / b


#: above this many degrees of freedom the finite series (one term per two of them) costs more
#: than the continued fraction, which is as exact (1e-12)
_SERIES_UP_TO = 64


def _cdf(t: float, df: float) -> float:
    if df == int(df) and df <= _SERIES_UP_TO:
        return t_cdf(t, int(df))
    tail = 0.5 * _beta_regularized(df / 2, 0.5, df / (df + t * t))
    return 1 - tail if t >= 0 else tail


@functools.lru_cache(maxsize=512)
def _t(p: float, df: float) -> float:
    lo, hi = 0.0, 1.0
    while _cdf(hi, df) < p:
        hi *= 2
    while hi - lo > 1e-13 * hi:  # to about double precision (some 45 halvings, not 100)
        mid = (lo + hi) / 2
        if _cdf(mid, df) < p:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def f_cdf(x: float, d1: float, d2: float) -> float:
    """The F distribution's CDF with ``d1`` and ``d2`` degrees of freedom (any real > 0):
    ``I_{d1 x / (d1 x + d2)}(d1 / 2, d2 / 2)``."""
    if x <= 0:
        return 0.0
    return _beta_regularized(d1 / 2, d2 / 2, d1 * x / (d1 * x + d2))


@functools.lru_cache(maxsize=256)
def f_quantile(p: float, d1: float, d2: float) -> float:
    """The F distribution's quantile for p in (0, 1), by bisection of :func:`f_cdf` (to a
    relative 1e-10): the one-sided test of two variances (an A/B's own spread against an
    earlier one's, docs/judge.md)."""
    if not 0 < p < 1:
        raise ValueError("p must be in (0, 1)")
    if d1 <= 0 or d2 <= 0:
        raise ValueError("degrees of freedom must be positive")
    lo, hi = 0.0, 1.0
    while f_cdf(hi, d1, d2) < p:
        hi *= 2
    while hi - lo > 1e-10 * hi:
        mid = (lo + hi) / 2
        if f_cdf(mid, d1, d2) < p:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


#: from this many degrees of freedom on, Student's t quantile is the normal one's expansion
#: in 1/df (Abramowitz & Stegun 26.7.5, four terms: within 1e-8 of the bisection there at the
#: usual levels, the normal quantile's own error; 1e-7 at a p-value of 1e-7) instead of a
#: bisection of the CDF (a few ms each for a history's many segment lengths, docs/history.md)
_EXPANSION_FROM = 100


def t_quantile(p: float, df: float | None) -> float:
    """Student's t quantile for p > 0.5 (any real ``df`` ≥ 1), the normal quantile for ``df``
    None."""
    if not 0.5 < p < 1:
        raise ValueError("p must be in (0.5, 1)")
    if df is None:
        return normal_quantile(p)
    if df < 1:
        raise ValueError("df must be at least 1")
    if df >= _EXPANSION_FROM:
        return _expansion(p, float(df))
    return _t(p, float(df))


def _expansion(p: float, df: float) -> float:
    """A&S 26.7.5: t_p ≈ x + g1(x)/ν + g2(x)/ν² + g3(x)/ν³ + g4(x)/ν⁴, x the normal quantile."""
    x = normal_quantile(p)
    x2 = x * x
    g1 = (x2 + 1) * x / 4
    g2 = ((5 * x2 + 16) * x2 + 3) * x / 96
    g3 = (((3 * x2 + 19) * x2 + 17) * x2 - 15) * x / 384
    g4 = ((((79 * x2 + 776) * x2 + 1482) * x2 - 1920) * x2 - 945) * x / 92160
    return x + (g1 + (g2 + (g3 + g4 / df) / df) / df) / df
