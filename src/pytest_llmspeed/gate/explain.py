"""Why a cell changed between two runs, from the server's own figures (docs/metrics.md,
"Server figures and why a cell changed"). Pure: figures in, data and one line out.

A decode cell's total tok/s is engine steps per second × output tokens per step, and output
tokens per step is running requests × acceptance length, so the log-change of the cell's
figure between two runs is exactly::

    ln(T1/T0) = ln(S1/S0) + ln(R1/R0) + ln(A1/A0) + residual

with the residual what the three factors do not carry (prefill work inside the window, the
client's count against the server's); it is returned and shown, never folded into a factor.
A prefill cell's TTFT is the server's queue time + prefill time + the rest (the client, the
API server), an exact additive split of its change; prefix cache hits say why prefill time
moved. ``explain`` keeps the parts that moved beyond their noise, largest first, and the
findings that matter even when the figure held (preemptions, a prefix cache that stopped
hitting, requests that queue)::

    got = explain("decode[32K-c8]", "decode", Side(2400.0, old_figures),
                  Side(2152.0, new_figures))
    got.line()   # 'decode[32K-c8] −10.3%: acceptance length 2.41 → 1.93 (−19.9%), ...'
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from ..core.server_figures import ServerFigures

__all__ = [
    "NOISE_FLOOR",
    "PREFIX_SHIFT",
    "Decomposition",
    "Explanation",
    "Finding",
    "Part",
    "Side",
    "Unexplained",
    "change_noise",
    "decompose_decode",
    "decompose_prefill",
    "explain",
    "findings",
    "relative_noise",
]

CellKind = Literal["decode", "prefill"]

#: the relative noise a factor is judged against when none is given (its interval unknown):
#: a decode window's total tok/s interval is typically ±1–3 % (docs/metrics.md, Uncertainty)
NOISE_FLOOR = 0.03
#: a prefix cache hit rate that moved by this much (absolute) is a finding
PREFIX_SHIFT = 0.25
#: mean waiting requests from which a cell counts as queued
QUEUED = 0.5
#: the share of a finished request's time in the engine (queue + prefill + decode) spent in its
#: queue from which a cell counts as queued, read from the histograms when the polls saw no
#: waiting: a starved API server updates the gauges late (real vLLM on 2 busy cores: mean
#: waiting 0 with --max-num-seqs 1 at c2, while each request queued 0.74 s)
QUEUE_SHARE = 0.1

RESIDUAL_DECODE = "other (the client's count against the server's)"
#: the decode residual's label when running requests came from the gauge (no step counters)
RESIDUAL_DECODE_GAUGE = "other (prefill in the window, the client)"
RESIDUAL_PREFILL = "other (client, API server)"

_DECODE_FACTORS = (
    ("steps_per_s", "steps/s"),
    ("running", "running"),
    ("acceptance_length", "acceptance length"),
)


def relative_noise(value: float, ci: tuple[float, float] | None) -> float | None:
    """A figure's relative noise from its 95 % interval: the wider side over the value."""
    if ci is None or value <= 0:
        return None
    return max(value - ci[0], ci[1] - value, 0.0) / value


def change_noise(
    old: float, old_ci: tuple[float, float] | None, new: float, new_ci: tuple[float, float] | None
) -> float | None:
    """The relative noise of a change between two runs' figures: the root-sum-square of each
    one's ``relative_noise`` (None when either has no interval)."""
    a, b = relative_noise(old, old_ci), relative_noise(new, new_ci)
    if a is None or b is None:
        return None
    return math.hypot(a, b)


@dataclass(frozen=True)
class Side:
    """One run's cell: the client's figure (decode: total tok/s; prefill: TTFT ms) and the
    server's figures over its window (None: the results file has none)."""

    figure: float
    server: ServerFigures | None


@dataclass(frozen=True)
class Part:
    """One term of a decomposition."""

    key: str  # "steps_per_s", "running", "acceptance_length", "queue_ms", ..., "residual"
    label: str
    old: float | None  # the factor's value in each run (None for the residual)
    new: float | None
    change: float  # decode: ln(new / old); prefill: new − old, ms
    share: float  # change / the total change (0 when the total is 0)
    noise: float  # the relative noise it was judged against
    moved: bool  # beyond its noise
    assumed: bool = False  # a value the server did not give (acceptance length 1: no drafts)


@dataclass(frozen=True)
class Decomposition:
    """A cell's change split into parts whose changes sum to ``total`` (the residual last)."""

    kind: CellKind
    total: float  # decode: ln(T1 / T0) of total tok/s; prefill: TTFT1 − TTFT0, ms
    parts: tuple[Part, ...]

    @property
    def residual(self) -> float:
        return self.parts[-1].change

    def part(self, key: str) -> Part:
        return next(p for p in self.parts if p.key == key)


@dataclass(frozen=True)
class Finding:
    """A change that matters by itself, whatever the cell's figure did."""

    key: str  # "preemptions", "prefix_cache_hit_rate", "queued", "running_capped"
    old: float
    new: float
    text: str  # e.g. "preemptions 0 → 41"


@dataclass(frozen=True)
class Explanation:
    """Why one cell changed: the parts that moved beyond their noise, largest first, the
    parts that held, and the findings."""

    cell: str
    kind: CellKind
    change: float  # the client figure's relative change, new / old − 1
    decomposition: Decomposition | None  # None: the server lacks a factor (``note`` says)
    moved: tuple[Part, ...]
    held: tuple[Part, ...]
    findings: tuple[Finding, ...]
    note: str | None = None

    def line(self) -> str:
        """One line, e.g. ``decode[32K-c8] −10.3%: acceptance length 2.41 → 1.93 (−19.9%),
        steps/s 41.0 → 45.9 (+12.0%), running 8 → 8; preemptions 0 → 41``."""
        # a prefill cell's change is its TTFT's (up is slower), said so beside the prompt tok/s
        # a comparison shows
        figure = "TTFT " if self.kind == "prefill" else ""
        head = f"{self.cell} {figure}{_pct(self.change)}: "
        if self.decomposition is None:
            body = self.note or "no decomposition"
        elif self.moved:
            shown = [_part_text(p, with_change=True) for p in self.moved]
            shown += [_part_text(p, with_change=False) for p in self.held if _show_held(p)]
            body = ", ".join(shown)
        else:
            held = [_part_text(p, with_change=False) for p in self.held if _show_held(p)]
            body = "no factor moved beyond its noise"
            if held:
                body += f" ({', '.join(held)})"
        if self.findings:
            body += "; " + "; ".join(f.text for f in self.findings)
        return head + body


@dataclass(frozen=True)
class Unexplained:
    """No explanation, and why (one side has no server figures)."""

    cell: str
    reason: str

    def line(self) -> str:
        return f"{self.cell}: {self.reason}"


NO_FIGURES_OLD = "no explanation: the earlier run has no server figures (an older results file)"
NO_FIGURES_NEW = "no explanation: this run has no server figures"


def _noise(noise: Mapping[str, float] | None, key: str) -> float:
    if noise is None or key not in noise:
        return NOISE_FLOOR
    return max(noise[key], 0.0)


def _share(change: float, total: float) -> float:
    return change / total if total != 0 else 0.0


def decompose_decode(
    old: Side, new: Side, noise: Mapping[str, float] | None = None
) -> Decomposition | str:
    """The log-change of a decode cell's total tok/s split into steps/s, running requests,
    acceptance length (1 where the server gives none) and the residual; or why it cannot be
    (a factor the server does not give, a zero). ``noise``: relative noise by part key
    (``"total"`` for the client's figure); ``NOISE_FLOOR`` for the others."""
    if old.server is None or new.server is None:
        return NO_FIGURES_OLD if old.server is None else NO_FIGURES_NEW
    if old.figure <= 0 or new.figure <= 0:
        return "no decomposition: a total tok/s of 0"
    # running requests from both runs' exact counters, or from both runs' gauges
    counted = all(f.output_tokens_per_step for f in (old.server, new.server))
    values: dict[str, tuple[float, float]] = {}
    assumed: set[str] = set()
    for key, label in _DECODE_FACTORS:
        if key == "running":
            a, b = _running(old.server, counted), _running(new.server, counted)
        else:
            a, b = getattr(old.server, key), getattr(new.server, key)
        if key == "acceptance_length":
            if a is None and b is None:
                assumed.add(key)
            a, b = a or 1.0, b or 1.0
        if a is None or b is None:
            side = "the earlier run" if a is None else "this run"
            return f"no decomposition: the server gives no {label} in {side}"
        if a <= 0 or b <= 0:
            return f"no decomposition: {label} of 0"
        values[key] = (float(a), float(b))
    total = math.log(new.figure / old.figure)
    parts: list[Part] = []
    for key, label in _DECODE_FACTORS:
        a, b = values[key]
        change = math.log(b / a)
        n = _noise(noise, key)
        parts.append(
            Part(
                key=key,
                label=label,
                old=a,
                new=b,
                change=change,
                share=_share(change, total),
                noise=n,
                moved=abs(change) > math.log1p(n),
                assumed=key in assumed,
            )
        )
    residual = total - sum(p.change for p in parts)
    # the residual carries the noise of every term: root-sum-square in log terms
    keys = ("total", *(k for k, _ in _DECODE_FACTORS))
    n_res = math.expm1(math.sqrt(sum(math.log1p(_noise(noise, k)) ** 2 for k in keys)))
    parts.append(
        Part(
            key="residual",
            label=RESIDUAL_DECODE if counted else RESIDUAL_DECODE_GAUGE,
            old=None,
            new=None,
            change=residual,
            share=_share(residual, total),
            noise=n_res,
            moved=abs(residual) > math.log1p(n_res),
        )
    )
    return Decomposition(kind="decode", total=total, parts=tuple(parts))


def _running(f: ServerFigures, counted: bool) -> float | None:
    """The mean requests that produced a token in each engine step: output tokens per step ÷
    acceptance length, from the window's exact counters; the running gauge's mean over the
    polls only where the server has no step or generation counter (a poll between one
    request's end and the next one's start reads one fewer: 4 → 3.75 once, 6 % of a change
    moved to the residual)."""
    if counted and f.output_tokens_per_step:
        return f.output_tokens_per_step / (f.acceptance_length or 1.0)
    return f.running_mean


def decompose_prefill(
    old: Side, new: Side, noise: Mapping[str, float] | None = None
) -> Decomposition | str:
    """The change of a prefill cell's TTFT (ms) split into the server's mean queue time and
    prefill time per request and the rest (client, API server); or why it cannot be. A part
    moved when its change exceeds its noise × the earlier TTFT (``noise`` by part key:
    ``"queue_ms"``, ``"prefill_ms"``, ``"total"`` for the rest)."""
    if old.server is None or new.server is None:
        return NO_FIGURES_OLD if old.server is None else NO_FIGURES_NEW
    got: dict[str, tuple[float, float]] = {}
    for key, attr, label in (
        ("queue_ms", "queue_time_mean_s", "queue time"),
        ("prefill_ms", "prefill_time_mean_s", "prefill time"),
    ):
        a, b = getattr(old.server, attr), getattr(new.server, attr)
        if a is None or b is None:
            side = "the earlier run" if a is None else "this run"
            return f"no decomposition: the server gives no {label} in {side}"
        got[key] = (a * 1000.0, b * 1000.0)
    total = new.figure - old.figure
    scale = old.figure if old.figure > 0 else 1.0
    parts: list[Part] = []
    for key, label in (("queue_ms", "queue time"), ("prefill_ms", "prefill time")):
        a, b = got[key]
        n = _noise(noise, key)
        parts.append(Part(key, label, a, b, b - a, _share(b - a, total), n, abs(b - a) > n * scale))
    rest_old = old.figure - sum(v[0] for v in got.values())
    rest_new = new.figure - sum(v[1] for v in got.values())
    residual = total - sum(p.change for p in parts)
    n_res = _noise(noise, "total")
    parts.append(
        Part(
            key="residual",
            label=RESIDUAL_PREFILL,
            old=rest_old,
            new=rest_new,
            change=residual,
            share=_share(residual, total),
            noise=n_res,
            moved=abs(residual) > n_res * scale,
        )
    )
    return Decomposition(kind="prefill", total=total, parts=tuple(parts))


def findings(
    kind: CellKind,
    old: ServerFigures,
    new: ServerFigures,
    concurrency: int | None = None,
) -> tuple[Finding, ...]:
    """Changes that are a finding by themselves, even when the cell's figure held:
    preemptions that appeared (0 → N) or at least doubled; a prefix cache hit rate that moved
    by ``PREFIX_SHIFT`` or more (a decode cell's warm prefix that stopped hitting); requests
    that queue (mean waiting from below ``QUEUED`` to at or above it; else, from the
    histograms, the share of a request's time spent queued from below ``QUEUE_SHARE`` to at or
    above it); and, given the cell's
    ``concurrency``, a server that ran all of it at once before and no longer does."""
    out: list[Finding] = []
    a, b = old.preemptions, new.preemptions
    if a is not None and b is not None and b > a and (a == 0 or b >= 2 * a):
        out.append(Finding("preemptions", a, b, f"preemptions {a:,} → {b:,}"))
    ha, hb = old.prefix_cache_hit_rate, new.prefix_cache_hit_rate
    if ha is not None and hb is not None and abs(hb - ha) >= PREFIX_SHIFT:
        rates = f"hit rate {ha:.0%} → {hb:.0%}"
        text = (
            f"warm prefix stopped hitting the cache ({rates})"
            if kind == "decode" and hb < ha
            else f"prefix cache {rates}"
        )
        out.append(Finding("prefix_cache_hit_rate", ha, hb, text))
    wa, wb = old.waiting_mean, new.waiting_mean
    if wa is not None and wb is not None and wa < QUEUED <= wb:
        peak = f", at most {new.waiting_max:g}" if new.waiting_max is not None else ""
        reasons = [r for r, mean, _ in new.waiting_by_reason or () if mean >= QUEUED]
        why = f" ({', '.join(reasons)})" if reasons else ""
        out.append(Finding("queued", wa, wb, f"requests waiting {_pair(wa, wb, 1)}{peak}{why}"))
    qa, qb = _queue(old), _queue(new)
    if not any(f.key == "queued" for f in out) and qa and qb and qa[1] < QUEUE_SHARE <= qb[1]:
        text = (
            f"requests queued {_pair(qa[0] * 1000, qb[0] * 1000)} ms each before running "
            f"({qb[1]:.0%} of their time in the server)"
        )
        out.append(Finding("queue_time", qa[0], qb[0], text))
    ra, rb = old.running_max, new.running_max
    if concurrency and ra is not None and rb is not None and ra >= concurrency > rb:
        out.append(
            Finding(
                "running_capped",
                ra,
                rb,
                f"at most {_num(rb)} of {concurrency} requests running (was {_num(ra)})",
            )
        )
    return tuple(out)


def _queue(f: ServerFigures) -> tuple[float, float] | None:
    """A finished request's mean queue time (s) and its share of the request's time in the
    engine, or None."""
    q, p, d = f.queue_time_mean_s, f.prefill_time_mean_s, f.decode_time_mean_s
    if q is None or p is None or d is None or q + p + d <= 0:
        return None
    return q, q / (q + p + d)


def explain(
    cell: str,
    kind: CellKind,
    old: Side,
    new: Side,
    *,
    noise: Mapping[str, float] | None = None,
    concurrency: int | None = None,
) -> Explanation | Unexplained:
    """Why ``cell`` changed from ``old`` to ``new``: the decomposition's parts that moved
    beyond their noise, largest share first, those that held, and the findings; or, when one
    side has no server figures, ``Unexplained`` with the reason."""
    if old.server is None:
        return Unexplained(cell, NO_FIGURES_OLD)
    if new.server is None:
        return Unexplained(cell, NO_FIGURES_NEW)
    split = (
        decompose_decode(old, new, noise)
        if kind == "decode"
        else decompose_prefill(old, new, noise)
    )
    change = new.figure / old.figure - 1 if old.figure > 0 else math.inf
    found = findings(kind, old.server, new.server, concurrency)
    if isinstance(split, str):
        return Explanation(cell, kind, change, None, (), (), found, note=split)
    moved = tuple(sorted((p for p in split.parts if p.moved), key=lambda p: -abs(p.change)))
    held = tuple(p for p in split.parts if not p.moved and p.key != "residual")
    return Explanation(cell, kind, change, split, moved, held, found)


# -- words


def _pct(x: float) -> str:
    return f"{x:+.1%}".replace("-", "−")


def _num(x: float) -> str:
    return _pair(x, x).split(" → ")[0]


def _pair(a: float, b: float, most: int = 2) -> str:
    """``a → b`` with one number of decimals for both: none when both are whole, else by the
    larger's size (2 below 10, 1 below 100, none above), at most ``most``."""
    if a == round(a) and b == round(b):
        return f"{round(a):,} → {round(b):,}"
    big = max(abs(a), abs(b))
    digits = min(most, 0 if big >= 100 else 1 if big >= 10 else 2)
    return f"{a:,.{digits}f} → {b:,.{digits}f}"


def _show_held(p: Part) -> bool:
    return not p.assumed


def _part_text(p: Part, *, with_change: bool) -> str:
    if p.key.endswith("_ms") or p.label == RESIDUAL_PREFILL:
        assert p.old is not None and p.new is not None
        text = f"{p.label} {_pair(p.old, p.new)} ms"
        delta = f"{p.change:+,.1f}".replace("-", "−")
        return f"{text} ({delta} ms)" if with_change else text
    if p.old is None or p.new is None:  # the decode residual
        return f"{p.label} {_pct(math.expm1(p.change))}"
    text = f"{p.label} {_pair(p.old, p.new)}"
    return f"{text} ({_pct(math.expm1(p.change))})" if with_change else text
