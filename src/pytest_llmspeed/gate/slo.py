"""Service-level objectives: their parsing, a decode cell's verdict against them (with its
figures' intervals), and the capacity of each context (docs/slo.md). Pure: text and records
in, data and words out.

    bounds = parse("ttft_p90<=2s,tbt_p90<=50ms,per_request_tok_s>=20")
    judge(cell, bounds).verdict            # Meets.YES / NO / CLOSE, or None (not judged)
    capacities(results.cells, bounds)      # {"8K": Capacity(32, "64 misses ttft_p90: ...")}
    rate_capacities(results.cells, bounds) # {"8K": RateCapacity(4.0, "16/s misses ttft: ...")}

An open-loop rate cell (``rate[8K-r4]``) is judged on the same latencies counted from each
request's scheduled send (:data:`OPEN_FIGURES`): the rate capacity is the highest measured rate
up to which every rate cell of a context meets the objectives.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import StrEnum

from .. import figures
from ..core.stats import RequestBounds
from ..results import CellRecord, Phase, Status, order_contexts

__all__ = [
    "OPEN_FIGURES",
    "Bound",
    "Capacity",
    "CellSLO",
    "Meets",
    "RateCapacity",
    "SLOError",
    "capacities",
    "capacity_miss",
    "judge",
    "parse",
    "quantile_interval",
    "rate_capacities",
    "request_bounds",
    "same",
    "text",
]


class SLOError(ValueError):
    """A --llm-slo value that cannot be read; the message says what to write instead."""


class Meets(StrEnum):
    YES = "meets"
    NO = "misses"
    CLOSE = "too close to call"


#: time units a latency bound takes, in ms
_TIME = {"ms": 1.0, "s": 1000.0}
_RATE = {"", "tok/s"}
_BOUND = re.compile(r"^\s*([A-Za-z0-9_]+)\s*(<=|>=|<|>)\s*([0-9.eE+-]+)\s*([A-Za-z/]*)\s*$")


@dataclass(frozen=True)
class Bound:
    """One objective: a decode figure, the side it must stay on, a value in the figure's unit."""

    name: str  # as the user wrote it, without a unit: "ttft_p90"
    key: str  # the results file's key: "ttft_p90_ms"
    op: str  # "<=", "<", ">=", ">"
    value: float  # in the figure's unit (ms, tok/s)
    text: str  # the bound as given, normalised: "ttft_p90<=2s"

    @property
    def upper(self) -> bool:
        return self.op in ("<=", "<")

    def holds(self, x: float) -> bool:
        return {
            "<=": x <= self.value,
            "<": x < self.value,
            ">=": x >= self.value,
            ">": x > self.value,
        }[self.op]

    def show(self, x: float) -> str:
        """A value in the bound's terms: ``2.6 s`` for a bound given in s, ``61 ms``."""
        unit = figures.by_key(self.key).unit
        if unit == "ms" and self.text.endswith("s") and not self.text.endswith("ms"):
            return f"{_g(x / 1000.0)} s"
        return f"{_g(x)} {unit}".strip()


def _g(x: float) -> str:
    if x >= 100:
        return f"{x:,.0f}"
    if x >= 10:
        return f"{x:.1f}"
    return f"{x:.2f}".rstrip("0").rstrip(".") if x != 0 else "0"


def _names() -> dict[str, str]:
    """Bound names → figure keys: each decode figure with an ``slo`` side, by its key and by
    its key without the unit (``ttft_p90`` and ``ttft_p90_ms``)."""
    out: dict[str, str] = {}
    for f in figures.FIGURES:
        if f.slo is None or not f.in_phase("decode"):
            continue
        out[f.key] = f.key
        if f.key.endswith("_ms"):
            out[f.key.removesuffix("_ms")] = f.key
    return out


def valid_names() -> str:
    keys = _names()
    return ", ".join(n for n in keys if not n.endswith("_ms"))


def parse(text: str) -> tuple[Bound, ...]:
    """``"ttft_p90<=2s,tbt_p90<=50ms,per_request_tok_s>=20"`` → bounds; SLOError, one line
    saying what is wrong (naming the part, when there are several) and what is valid,
    otherwise. The caller names the option and its value."""
    names = _names()
    out: list[Bound] = []
    parts = [p for p in text.split(",") if p.strip()]
    if not parts:
        raise SLOError(
            f"no bound: give bounds such as 'ttft_p90<=2s,tbt_p90<=50ms' (figures: {valid_names()})"
        )
    several = len(parts) > 1
    for part in parts:
        # the part named only when the value has several: the caller shows the value
        at = f"{part.strip()!r}: " if several else ""
        m = _BOUND.match(part)
        if not m:
            raise SLOError(
                f"{at}cannot read it: write NAME<=VALUE or NAME>=VALUE with a "
                f"unit where one is needed, e.g. 'ttft_p90<=2s' or 'per_request_tok_s>=20'"
            )
        name, op, number, unit = m.groups()
        key = names.get(name.lower())
        if key is None:
            raise SLOError(f"{at}unknown figure {name!r} (figures: {valid_names()})")
        fig = figures.by_key(key)
        short = key.removesuffix("_ms")
        try:
            value = float(number)
        except ValueError:
            value = math.nan
        if not math.isfinite(value) or value <= 0:
            raise SLOError(f"{at}the bound must be a positive number")
        upper = op in ("<=", "<")
        if upper != (fig.slo == "max"):
            side = "at most (<=)" if fig.slo == "max" else "at least (>=)"
            better = "lower" if fig.slo == "max" else "higher"
            raise SLOError(
                f"{at}{short} is better {better}, so its bound is "
                f"{side}, e.g. '{short}{'<=' if fig.slo == 'max' else '>='}{number}{unit}'"
            )
        if fig.unit == "ms":
            if unit.lower() not in _TIME:
                what = "no unit" if not unit else f"unit {unit!r}"
                raise SLOError(
                    f"{at}the bound has {what}: {short} is a time, give s or ms "
                    f"(e.g. '{short}{op}{number}s' or '{short}{op}{number}ms')"
                )
            value *= _TIME[unit.lower()]
        elif unit.lower() not in _RATE:
            raise SLOError(
                f"{at}{short} is in tok/s, give no unit or tok/s (e.g. '{short}{op}{number}')"
            )
        text_ = f"{short}{op}{number}{unit}"
        if any(b.key == key and b.upper == upper for b in out):
            raise SLOError(f"{short} is bounded twice ({text_!r}): keep one bound")
        out.append(Bound(short, key, op, value, text_))
    return tuple(out)


def text(bounds: Sequence[Bound]) -> str:
    """The bounds as one option value (what a baseline records)."""
    return ",".join(b.text for b in bounds)


def request_bounds(bounds: Sequence[Bound]) -> RequestBounds:
    """The per-request bounds goodput counts a request by: its own TTFT against the tightest
    TTFT bound (median, p90, p99 alike), its own mean time between tokens against the tightest
    TBT bound, its in-window tok/s against the per-request tok/s bound. Total tok/s bounds the
    cell, not a request."""

    def tightest(prefix: str, upper: bool) -> float | None:
        vals = [b.value for b in bounds if b.key.startswith(prefix) and b.upper == upper]
        if not vals:
            return None
        return min(vals) if upper else max(vals)

    return RequestBounds(
        ttft_ms=tightest("ttft", True),
        tbt_ms=tightest("tbt", True),
        tok_s=tightest("per_request_tok_s", False),
    )


# -- a cell's verdict


def quantile_interval(
    samples: Sequence[float], q: float, confidence: float = 0.95
) -> tuple[float, float] | None:
    """The distribution-free interval of the ``q`` quantile (0 < q < 1) of the population the
    samples came from: the order statistics x(l) ≤ x(u) whose ranks the binomial(n, q) count
    of samples below the quantile falls between with probability ≥ ``confidence``; None when
    n is too small for it (a quantile's interval then reaches past the samples)."""
    n = len(samples)
    if n < 2:
        return None
    xs = sorted(samples)
    # the binomial(n, q) distribution function
    cdf: list[float] = []
    acc = 0.0
    logq, log1q = math.log(q), math.log1p(-q)
    for k in range(n + 1):
        acc += math.exp(math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1)
                        + k * logq + (n - k) * log1q)  # fmt: skip
        cdf.append(min(acc, 1.0))
    tail = (1.0 - confidence) / 2.0
    # l: the largest rank with P(B < l) <= tail; u: the smallest with P(B >= u) <= tail
    lower = max((k for k in range(n + 1) if k == 0 or cdf[k - 1] <= tail), default=0)
    upper = min((k for k in range(1, n + 1) if 1.0 - cdf[k - 1] <= tail), default=n + 1)
    if lower < 1 or upper > n:
        return None
    return xs[lower - 1], xs[upper - 1]


_QUANTILES = {"ttft_p90_ms": ("ttft_ms", 0.9), "ttft_p99_ms": ("ttft_ms", 0.99),
              "tbt_p90_ms": ("tbt_ms", 0.9), "tbt_p99_ms": ("tbt_ms", 0.99),
              # an open-loop cell's samples: TTFTs from the scheduled send
              "sched_ttft_p90_ms": ("ttft_ms", 0.9),
              "sched_ttft_p99_ms": ("ttft_ms", 0.99)}  # fmt: skip

#: an objective's figure in an open-loop rate cell: the same latency, counted from each
#: request's scheduled send (docs/workloads.md); an objective not here (a TBT quantile, a
#: throughput) does not bound a rate cell, which then is not judged and says so
OPEN_FIGURES = {
    "ttft_ms": "sched_ttft_ms",
    "ttft_p90_ms": "sched_ttft_p90_ms",
    "ttft_p99_ms": "sched_ttft_p99_ms",
    "tbt_ms": "open_tbt_ms",
}


def interval(cell: CellRecord, key: str) -> tuple[float, float] | None:
    """A figure's 95 % interval: the one the file gives, else (p90, p99) the quantile's from
    the cell's samples, else None."""
    fig = figures.by_key(key)
    if fig.ci:
        got = getattr(cell, fig.ci_key, None)
        return (got[0], got[1]) if got is not None else None
    if key in _QUANTILES and cell.samples is not None:
        field, q = _QUANTILES[key]
        return quantile_interval(getattr(cell.samples, field), q)
    return None


@dataclass(frozen=True)
class CellSLO:
    """A decode cell against the objectives: its verdict (None: not judged, ``why`` says) and
    the bounds it missed or came too close to, in words."""

    cell: str
    verdict: Meets | None
    misses: tuple[str, ...] = ()  # "ttft_p90: 2.6 s > 2 s"
    close: tuple[str, ...] = ()  # "ttft_p90: 1.8–2.3 s, bound 2 s"
    why: str | None = None

    def words(self) -> str:
        """``misses ttft_p90: 2.6 s > 2 s`` / ``too close to call: ...`` / ``meets``."""
        if self.verdict is None:
            return self.why or "not judged"
        if self.verdict is Meets.NO:
            return "misses " + "; ".join(self.misses)
        if self.verdict is Meets.CLOSE:
            return "too close to call: " + "; ".join(self.close)
        return "meets"


def judge(cell: CellRecord, bounds: Sequence[Bound]) -> CellSLO:
    """A decode cell against ``bounds``: missed when a figure's whole interval is on the bad
    side of a bound, too close when an interval straddles one, met when every interval is on
    the good side (a figure without an interval: its value)."""
    cid = str(cell.id)
    phase = cell.id.phase
    if phase not in (Phase.DECODE, Phase.RATE):
        return CellSLO(
            cid, None, why=f"a {phase.value} cell (objectives bound decode and rate cells)"
        )
    # a cell the baseline's gate failed was measured in full: it is judged like a valid one
    regressed = cell.status is Status.FAILED and cell.gate is not None and cell.gate.regressions
    if cell.status is not Status.VALID and not regressed:
        return CellSLO(cid, None, why=f"not judged: {cell.status.value}")
    misses: list[str] = []
    close: list[str] = []
    for b in bounds:
        key = b.key if phase is Phase.DECODE else OPEN_FIGURES.get(b.key)
        if key is None:
            return CellSLO(cid, None, why=f"not judged: a rate cell has no {b.name}")
        value = getattr(cell, key, None)
        if value is None:
            return CellSLO(cid, None, why=f"not judged: no {b.name} (no request in the window)")
        lo, hi = interval(cell, key) or (value, value)
        lo, hi = min(lo, value), max(hi, value)
        good_all = b.holds(hi) if b.upper else b.holds(lo)
        good_none = not (b.holds(lo) if b.upper else b.holds(hi))
        sign = ">" if b.upper else "<"
        if good_none:
            misses.append(f"{b.name}: {b.show(value)} {sign} {b.show(b.value)}")
        elif not good_all:
            close.append(f"{b.name}: {b.show(lo)}–{b.show(hi)}, bound {b.show(b.value)}")
    if misses:
        return CellSLO(cid, Meets.NO, tuple(misses), tuple(close))
    if close:
        return CellSLO(cid, Meets.CLOSE, (), tuple(close))
    return CellSLO(cid, Meets.YES)


# -- the gate


def same(a: str, b: Sequence[Bound]) -> bool:
    """Are the objectives ``a`` (as a baseline records them) the bounds ``b``?"""
    try:
        return {x.text for x in parse(a)} == {x.text for x in b}
    except SLOError:
        return False


def capacity_miss(capacity: int, cell: CellRecord, bounds: Sequence[Bound]) -> str | None:
    """A decode cell at or below its context's baseline ``capacity`` that misses the
    objectives (shown: its interval beyond a bound): the capacity dropped, in words; else
    None (too close to call does not fail)."""
    if not capacity or cell.concurrency > capacity:
        return None
    got = judge(cell, bounds)
    if got.verdict is not Meets.NO:
        return None
    below = "0" if cell.concurrency == 1 else f"below {cell.concurrency}"
    return f"{cell.context}: capacity at SLO {capacity} → {below}: {cell.id} {got.words()}"


# -- capacity per context


@dataclass(frozen=True)
class Capacity:
    """A context's capacity at the objectives: the largest measured concurrency up to which
    every measured cell meets them (None: not even the smallest), and what stops the next."""

    context: str
    requests: int | None
    stopped_by: str | None  # "64 misses ttft_p90: 4.3 s > 2 s", "8 over capacity"; None: none

    def line(self) -> str:
        """``8K: 32 requests (64 misses ttft_p90: 4.3 s > 2 s)``"""
        n = self.requests
        count = "none" if not n else "1 request" if n == 1 else f"{n} requests"
        return f"{self.context}: {count}" + (f" ({self.stopped_by})" if self.stopped_by else "")

    def to_dict(self) -> dict[str, int | str | None]:
        """As the results file keeps it under ``run.capacity``."""
        return {"requests": self.requests, "stopped_by": self.stopped_by}


def capacities(cells: Iterable[CellRecord], bounds: Sequence[Bound]) -> dict[str, Capacity]:
    """Per context with decode cells, in the matrix's order: its capacity at ``bounds``."""
    decode = [c for c in cells if c.id.phase is Phase.DECODE]
    out: dict[str, Capacity] = {}
    for context in order_contexts(decode):
        row = sorted((c for c in decode if c.context == context), key=lambda c: c.concurrency)
        best: int | None = None
        stop: str | None = None
        for c in row:
            if c.status in (Status.OVER_CAPACITY, Status.DOES_NOT_FIT):
                stop = f"{c.concurrency} {c.status.value}"
                break
            if c.status is Status.NOT_RUN:
                continue  # not selected: neither meets nor stops
            got = judge(c, bounds)
            if got.verdict is Meets.YES:
                best = c.concurrency
                continue
            stop = f"{c.concurrency} {got.words()}"
            break
        out[context] = Capacity(context, best, stop)
    return out


@dataclass(frozen=True)
class RateCapacity:
    """A context's capacity at the objectives as an arrival rate: the highest measured rate
    (requests per second, open loop) up to which every rate cell meets them (None: not even
    the lowest), and what stops the next."""

    context: str
    rate: float | None
    stopped_by: str | None  # "16/s misses ttft: 2.6 s > 2 s"; None: none stopped it

    def line(self) -> str:
        """``8K: 4 requests/s (16/s misses ttft: 2.6 s > 2 s)``"""
        rate = self.rate
        count = "none" if rate is None else f"{rate:g} request{'' if rate == 1 else 's'}/s"
        return f"{self.context}: {count}" + (f" ({self.stopped_by})" if self.stopped_by else "")

    def to_dict(self) -> dict[str, float | str | None]:
        """As the results file keeps it under ``run.rate_capacity``."""
        return {"rate": self.rate, "stopped_by": self.stopped_by}


def rate_capacities(
    cells: Iterable[CellRecord], bounds: Sequence[Bound]
) -> dict[str, RateCapacity]:
    """Per context with rate cells, in the matrix's order: its capacity at ``bounds`` as a
    rate. A cell not judged (an objective a rate cell has no figure for, no request) stops
    it with its reason, as a miss does: nothing above it is shown to meet them."""
    rated = [c for c in cells if c.id.phase is Phase.RATE]
    out: dict[str, RateCapacity] = {}
    for context in order_contexts(rated):
        row = sorted((c for c in rated if c.context == context), key=lambda c: c.id.rate or 0)
        best: float | None = None
        stop: str | None = None
        for c in row:
            if c.status is Status.NOT_RUN:
                continue  # not selected: neither meets nor stops
            got = judge(c, bounds)
            if got.verdict is Meets.YES:
                best = c.id.rate
                continue
            stop = f"{c.id.rate or 0:g}/s {got.words()}"
            break
        out[context] = RateCapacity(context, best, stop)
    return out
