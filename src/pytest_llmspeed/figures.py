"""The figures a cell records, in one list: what each is called, where it is written, how it is
gated.

The results model (its file's keys, their order and types, the JUnit properties), the baseline
file (floors, commented-out ceilings, their decimals), the gate's words and ``compare``'s
headline read :data:`FIGURES`; adding a figure is one :class:`Figure` here, a typed field of
:class:`~pytest_llmspeed.results.CellRecord` and the code that computes it (docs/design.md,
"Adding a figure"). The order of :data:`FIGURES` is the order a cell writes its figures in (the
results file, the JUnit properties, the baseline). Imports nothing of the project.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Literal

#: the phase of the cells that record a figure: "both" is prefill and decode, "open" the
#: open-loop cells (rate and trace: docs/workloads.md), "conversation" the conversation cells
Where = Literal["prefill", "decode", "both", "open", "conversation"]
#: the phases of the open-loop cells
OPEN_PHASES = ("rate", "trace")


class Gate(StrEnum):
    """How the gate reads a figure against its baseline."""

    FLOOR = "floor"  # higher is better: a later run must not fall below it (gated)
    CEILING = "ceiling"  # lower is better: written commented out, gated once uncommented


@dataclass(frozen=True)
class Figure:
    """One figure of a cell (units as docs/metrics.md gives them)."""

    key: str  # the results file's key, the record's field
    phase: Where
    label: str  # in messages: "total tok/s", "TTFT ms"
    unit: str = ""  # "tok/s", "ms", "s", "fraction" (shown as a %); "" for counts and words
    digits: int = 1  # decimals the baseline writes it with
    #: the value's type: float, int, str, bool, dict (counts by kind), tuple (a series)
    kind: type = float
    #: the JUnit property's name ("" = the key); None: not a property (not a scalar, or internal)
    junit: str | None = ""
    optional: bool = False  # written only when known (else a measured cell writes it, null too)
    gate: Gate | None = None
    ci: bool = False  # a 95 % interval beside it: KEY_ci = [low, high]
    headline: bool = False  # the figure compare judges its phase's cells by
    #: listed with a cell's further figures (the terminal's -v, the page's measurements); the
    #: others have their place in the tables' own layout, or none
    listed: bool = False
    #: a service-level objective may bound it (--llm-slo, docs/slo.md): "max" (lower is
    #: better: an upper bound), "min" (higher is better: a lower bound); None: no objective
    slo: Literal["max", "min"] | None = None

    def __post_init__(self) -> None:
        if self.junit == "":
            object.__setattr__(self, "junit", self.key)

    @property
    def ci_key(self) -> str:
        return f"{self.key}_ci"

    def in_phase(self, phase: str) -> bool:
        """Recorded by cells of ``phase`` ("prefill", "decode", "rate", "trace",
        "conversation", or a Phase)."""
        if self.phase == "open":
            return phase in OPEN_PHASES
        return self.phase == phase or (self.phase == "both" and phase in ("prefill", "decode"))


_F = Figure
_FLOOR, _CEILING = Gate.FLOOR, Gate.CEILING

FIGURES: tuple[Figure, ...] = (
    _F(
        "total_tok_s",
        "decode",
        "total tok/s",
        "tok/s",
        gate=_FLOOR,
        ci=True,
        headline=True,
        slo="min",
    ),
    _F(
        "per_request_tok_s", "decode", "per-request tok/s", "tok/s", gate=_FLOOR, ci=True, slo="min"
    ),
    _F("prompt_tok_s", "prefill", "prompt tok/s", "tok/s", gate=_FLOOR, ci=True, headline=True),
    _F("ttft_ms", "both", "TTFT ms", "ms", gate=_CEILING, ci=True, slo="max"),
    _F("ttft_p90_ms", "decode", "TTFT p90 ms", "ms", slo="max"),
    _F("ttft_p99_ms", "decode", "TTFT p99 ms", "ms", slo="max"),
    _F(
        "tbt_ms",
        "decode",
        "time between tokens ms",
        "ms",
        digits=3,
        gate=_CEILING,
        ci=True,
        slo="max",
    ),
    _F("tbt_p90_ms", "decode", "time between tokens p90 ms", "ms", digits=3, slo="max"),
    _F("tbt_p99_ms", "decode", "time between tokens p99 ms", "ms", digits=3, slo="max"),
    _F("avg_active", "decode", "average active requests", digits=3),
    _F("completed", "both", "completed requests", kind=int),
    _F("max_tokens", "prefill", "max tokens of a cold request", kind=int, junit=None),
    _F("repeats", "prefill", "cold requests", kind=int, junit=None),
    _F("output_tokens", "decode", "output tokens", kind=int),
    _F("measured_s", "decode", "measured for", "s", digits=3),
    _F("requests", "decode", "requests started", kind=int),
    _F("errors", "decode", "errors", kind=int),
    _F("error_summary", "decode", "errors by kind", kind=dict, junit=None),
    _F("early_stops", "decode", "early stops", kind=int),
    _F("wrong_prompt_lengths", "decode", "prompts at another length", kind=dict, junit=None),
    _F("tokens", "decode", "token accounting", kind=str),
    _F("queued", "decode", "queued", kind=bool),
    _F("effective_concurrency", "decode", "requests running on the server", digits=2),
    _F("max_waiting", "decode", "most requests waiting", junit=None),
    _F("stability_cv", "decode", "per-second throughput's variation", digits=4),
    _F("per_second_tok", "decode", "tokens each second", kind=tuple, junit=None),
    _F("received_tokens", "decode", "tokens received", kind=int, junit=None),
    _F("received_chunks", "decode", "chunks received", kind=int, junit=None),
    _F("client_processes", "decode", "client processes", kind=int, junit=None, optional=True),
    _F("generation_tokens_delta", "decode", "server's generation tokens", junit=None),
    _F("received_span", "decode", "tokens received, bracket", kind=tuple, junit=None),
    _F("max_output", "decode", "max output tokens", kind=int, junit=None),
    _F("duration_s", "decode", "window", "s", junit=None),
    # written only when known
    _F("ci_method", "decode", "interval method", kind=str, junit=None, optional=True),
    _F("precision", "decode", "precision reached", digits=4, optional=True),
    _F("window_end", "decode", "window ended at", kind=str, optional=True),
    _F("drift", "decode", "drift", digits=4, optional=True),
    _F("little_residual", "decode", "Little's law residual", digits=4, optional=True),
    # with --llm-slo (docs/slo.md)
    _F("goodput_tok_s", "decode", "goodput tok/s", "tok/s", digits=2, optional=True),
    _F("slo", "decode", "objectives", kind=str, optional=True),
    # the distance to the bandwidth bound (docs/metrics.md): bytes read per second per GPU,
    # their share of the GPU's peak, from the server's counter or estimated
    _F("output_in_flight", "decode", "tokens a request in flight had generated", optional=True),
    _F("read_gb_s", "decode", "read bandwidth GB/s", "GB/s", optional=True, listed=True),
    _F(
        "bandwidth_share",
        "decode",
        "share of the bandwidth bound",
        "fraction",
        digits=4,
        optional=True,
        listed=True,
    ),
    _F("bandwidth_from", "decode", "bandwidth from", kind=str, optional=True),
    # every gap and every finished request (docs/metrics.md, "Inter-token latency" and
    # "End-to-end latency"), each percentile beside its sample (a p90 from 10 values, a p99
    # from 100: "A percentile and its sample")
    _F("ttft_n", "decode", "TTFT samples", kind=int, optional=True),
    _F("tbt_n", "decode", "time between tokens samples", kind=int, optional=True),
    _F("itl_ms", "decode", "inter-token latency ms", "ms", digits=3, optional=True),
    _F("itl_p90_ms", "decode", "inter-token latency p90 ms", "ms", digits=3, optional=True),
    _F(
        "itl_p99_ms",
        "decode",
        "inter-token latency p99 ms",
        "ms",
        digits=3,
        optional=True,
        listed=True,
    ),
    _F("itl_max_ms", "decode", "largest gap ms", "ms", digits=3, optional=True, listed=True),
    _F("itl_n", "decode", "gaps", kind=int, optional=True),
    _F(
        "itl_stalls",
        "decode",
        "stalls",
        kind=int,
        optional=True,
        listed=True,
    ),
    _F("e2e_ms", "decode", "end-to-end ms", "ms", digits=2, optional=True, listed=True),
    _F("e2e_p90_ms", "decode", "end-to-end p90 ms", "ms", digits=2, optional=True),
    _F("e2e_p99_ms", "decode", "end-to-end p99 ms", "ms", digits=2, optional=True),
    _F("e2e_n", "decode", "end-to-end samples", kind=int, optional=True),
    # reasoning and answer, chat only (docs/metrics.md, "Reasoning and answer"): written where
    # a request of the cell carried reasoning (tool-call deltas: where one came)
    _F(
        "answer_ttft_ms",
        "decode",
        "time to first answer token ms",
        "ms",
        digits=2,
        optional=True,
        listed=True,
    ),
    _F("reasoning_tokens", "decode", "reasoning tokens", kind=int, optional=True, listed=True),
    _F("answer_tokens", "decode", "answer tokens", kind=int, optional=True, listed=True),
    _F("reasoning_from", "decode", "reasoning counted from", kind=str, optional=True, listed=True),
    _F("tool_call_deltas", "decode", "tool-call deltas", kind=int, optional=True, listed=True),
    # open-loop cells (docs/workloads.md): latencies from each request's scheduled send, and
    # from its actual send beside them
    _F(
        "sched_ttft_ms",
        "open",
        "TTFT from the scheduled send ms",
        "ms",
        gate=_CEILING,
        ci=True,
        headline=True,
    ),
    _F("sched_ttft_p90_ms", "open", "TTFT p90 from the scheduled send ms", "ms"),
    _F("sched_ttft_p99_ms", "open", "TTFT p99 from the scheduled send ms", "ms"),
    _F("sent_ttft_ms", "open", "TTFT from the actual send ms", "ms", listed=True),
    _F("sched_e2e_ms", "open", "end-to-end from the scheduled send ms", "ms", ci=True, listed=True),
    _F("sched_e2e_p90_ms", "open", "end-to-end p90 from the scheduled send ms", "ms"),
    _F("sched_e2e_p99_ms", "open", "end-to-end p99 from the scheduled send ms", "ms"),
    _F("sent_e2e_ms", "open", "end-to-end from the actual send ms", "ms", listed=True),
    _F("open_tbt_ms", "open", "time between tokens ms", "ms", digits=3, ci=True),
    _F("open_output_tok_s", "open", "output tok/s", "tok/s"),
    _F("offered_rate", "open", "offered rate req/s", "req/s", digits=3, listed=True),
    _F("achieved_rate", "open", "achieved rate req/s", "req/s", digits=3, listed=True),
    _F("open_requests", "open", "requests sent", kind=int),
    _F("open_completed", "open", "requests completed", kind=int),
    _F("open_failed", "open", "requests failed", kind=int),
    _F("open_early_stops", "open", "early stops", kind=int),
    _F("send_lag_p99_ms", "open", "send lag p99 ms", "ms", digits=2, listed=True),
    _F("max_in_flight", "open", "most requests in flight", kind=int, listed=True),
    _F(
        "open_span_s",
        "open",
        "the schedule's start to its end or the last request's",
        "s",
        digits=3,
    ),
    _F("server_queue_ms", "open", "server queue time ms", "ms", optional=True, listed=True),
    _F(
        "expected_hit_share",
        "open",
        "prefix-cache share the trace's blocks give",
        "fraction",
        digits=4,
        optional=True,
        listed=True,
    ),
    # conversation cells (docs/workloads.md, "Conversations"): the cell's own figures over
    # turns 2 ... T (those that should hit the prefix cache), then one value per turn index,
    # turn 1 first (None where a turn has none)
    _F(
        "conv_ttft_ms",
        "conversation",
        "TTFT of the turns after the first ms",
        "ms",
        gate=_CEILING,
        headline=True,
    ),
    _F(
        "conv_hit_rate",
        "conversation",
        "server's prefix-cache hit rate after the first turn",
        "fraction",
        digits=4,
        listed=True,
    ),
    _F(
        "conv_expected_hit_share",
        "conversation",
        "prefix-cache share the history should hit",
        "fraction",
        digits=4,
        listed=True,
    ),
    _F("conv_turns", "conversation", "turns reached", kind=int, listed=True),
    _F("conv_requests", "conversation", "requests sent", kind=int),
    _F("conv_failed", "conversation", "requests failed", kind=int),
    _F("conv_early_stops", "conversation", "early stops", kind=int),
    _F("turn_users", "conversation", "users in each turn", kind=tuple, junit=None),
    _F("turn_prompt_tokens", "conversation", "prompt tokens of each turn", kind=tuple, junit=None),
    _F("turn_ttft_ms", "conversation", "TTFT of each turn ms", "ms", kind=tuple, junit=None),
    _F(
        "turn_new_prefill_tok_s",
        "conversation",
        "prefill of each turn's new part tok/s",
        "tok/s",
        kind=tuple,
        junit=None,
    ),
    _F(
        "turn_output_tok_s",
        "conversation",
        "output tok/s of each turn",
        "tok/s",
        kind=tuple,
        junit=None,
    ),
    _F(
        "turn_hit_rate",
        "conversation",
        "server's prefix-cache hit rate in each turn",
        "fraction",
        kind=tuple,
        junit=None,
    ),
    _F(
        "turn_expected_hit_share",
        "conversation",
        "prefix-cache share each turn should hit",
        "fraction",
        kind=tuple,
        junit=None,
    ),
    _F(
        "turn_expected_hit_share_answers",
        "conversation",
        "... with the answers cached too",
        "fraction",
        kind=tuple,
        junit=None,
    ),
    _F("conv_answers", "conversation", "answers carried as", kind=str, optional=True),
)


def by_key(key: str) -> Figure:
    """The figure written under ``key``; KeyError naming the known ones otherwise."""
    for f in FIGURES:
        if f.key == key:
            return f
    raise KeyError(f"no figure {key!r} (figures: {', '.join(f.key for f in FIGURES)})")


def find(key: str) -> Figure | None:
    return next((f for f in FIGURES if f.key == key), None)


def keys() -> tuple[str, ...]:
    return tuple(f.key for f in FIGURES)


def of_phase(phase: str, optional: bool | None = None) -> tuple[Figure, ...]:
    """The figures cells of ``phase`` record, in order; ``optional`` True / False: only the
    figures written only when known / the ones a measured cell always writes."""
    return tuple(
        f for f in FIGURES if f.in_phase(phase) and (optional is None or f.optional is optional)
    )


def floors() -> tuple[Figure, ...]:
    return tuple(f for f in FIGURES if f.gate is Gate.FLOOR)


def ceilings() -> tuple[Figure, ...]:
    return tuple(f for f in FIGURES if f.gate is Gate.CEILING)


def gated() -> tuple[Figure, ...]:
    """The figures a baseline may hold (floors and ceilings), in order."""
    return tuple(f for f in FIGURES if f.gate is not None)


def gate_of(key: str) -> Gate | None:
    f = find(key)
    return None if f is None else f.gate


def with_interval() -> tuple[Figure, ...]:
    """The figures with a 95 % interval, in the order the intervals are written: the decode
    cells' figures first, then the prefill cells' only (the order of 0.2, kept), then the
    open-loop cells'."""
    ci = [f for f in FIGURES if f.ci]
    return (
        *[f for f in ci if f.phase not in ("prefill", "open")],
        *[f for f in ci if f.phase == "prefill"],
        *[f for f in ci if f.phase == "open"],
    )


def headline(phase: str) -> Figure:
    """The figure a cell of ``phase`` is compared by (total tok/s, prompt tok/s; an open-loop
    cell's TTFT from the scheduled send)."""
    return next(f for f in FIGURES if f.headline and f.in_phase(phase))


def listed() -> tuple[Figure, ...]:
    return tuple(f for f in FIGURES if f.listed)


def text(figure: Figure, value: Any) -> str:
    """A value in a table: its decimals, thousands separated; — where there is none."""
    if value is None:
        return "—"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float) and figure.unit == "fraction":
        return f"{value:.1%}"
    if isinstance(value, float):
        return f"{value:,.{figure.digits}f}"
    return str(value)


def read(figure: Figure, value: Any) -> Any:
    """A value as the results file gives it, as the record keeps it (a series as a tuple)."""
    if value is not None and figure.kind is tuple:
        return tuple(value)
    return value


def written(value: Any) -> Any:
    """A record's value as the results file writes it (a tuple as a list, a mapping as a
    dict)."""
    if isinstance(value, tuple):
        return list(value)
    if isinstance(value, Mapping):
        return dict(value)
    return value
