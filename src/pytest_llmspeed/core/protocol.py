"""The prefill cell and the sustained-decode cell of docs/metrics.md.

Plain async functions over a :class:`~pytest_llmspeed.client.Connection`; they return result
dataclasses and never import pytest.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import math
import statistics
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from ..results import Flag, FlagKind
from .client import (
    CHUNK_COUNT,
    DONE_GRACE_S,
    EXACT,
    FINAL_USAGE,
    MAX_TOKENS,
    RATIO,
    REASONING_ESTIMATE,
    REASONING_ORDER,
    TOKENIZE,
    USAGE,
    Connection,
    StreamRecord,
    account_tokens,
    split_reasoning,
    spread,
    stream_request,
)
from .errors import LLMSpeedError, RequestRejected, WrongPromptLength
from .heartbeat import Heartbeat, LoopLag
from .intervals import (
    COUNTER_SLACK_PER_STREAM,
    COUNTER_TOLERANCE,
    batch_means,
    counter_gap,
    trend,
)
from .probe import (
    SNAPSHOT_FAMILIES,
    MetricsSnapshot,
    metrics_text,
    parse_metrics,
    parse_problem,
    read_metrics,
    snapshot,
)
from .prompts import PromptFactory
from .recount import Recount, recount_or_why
from .replicas import ReplicaSet, sum_snapshots
from .server_figures import (
    ALL_FAMILIES,
    GAUGE_FAMILIES,
    ServerFigures,
    ServerSnapshot,
    combine,
    invalidated,
    refused_note,
    snapshot_from_samples,
    went_back,
    window_figures,
)
from .stats import (
    DecodeStats,
    RequestBounds,
    RequestTrace,
    decode_stats,
    goodput,
    prompt_tok_s,
)
from .streams import PromptSource, Streams
from .text import for_person, redact_known
from .tokenize import ServerTokenizer
from .wire import Dialect, StreamTally, request_fields
from .workers import ProcessStreams, WorkerSpec, portable, split

#: tokens of the dialect's second small request, when its first streamed a single chunk
PROBE_MORE_TOKENS = 16

#: what a /metrics read at a window's open or close (and around a prefill request) parses: the
#: referee's and the queue's series (``probe.SNAPSHOT_FAMILIES``) and every series of the
#: server's figures (``server_figures.ALL_FAMILIES``), in one parse
EDGE_FAMILIES = SNAPSHOT_FAMILIES | ALL_FAMILIES
#: what a poll inside the window parses: the queue's series and the figures' gauges
POLL_FAMILIES = SNAPSHOT_FAMILIES | GAUGE_FAMILIES
#: after a prefill request, /metrics is read again (every 50 ms, at most this many times)
#: while the server's request histograms do not yet count it: vLLM records a request's stats
#: just after it hands its last output to the API server
PREFILL_AFTER_READS = 20
#: the longest wait for an idle server before a decode window (bounded by the timeout too)
IDLE_WAIT_S = 10.0


async def negotiate(conn: Connection, factory: PromptFactory, model: str, api: str) -> Dialect:
    """Find which optional request fields the server accepts (HTTP 400/422 → drop them).

    A server that refuses even the plain request while the prompt is token ids is asked again
    with text prompts (``factory.text`` is set): some OpenAI-compatible servers take text only.
    A server without any tokenize route gets text prompts from the start (no ids to draw from).
    """
    if api == "completions" and not factory.text and not await factory.tokenizer.has_ids():
        factory.text = True  # no tokenize route: no token ids to build prompts of
        switched = "the server has no tokenize route: prompts sent as text"
    else:
        switched = None
    dialect, refused = await _negotiate_fields(conn, factory, model, api)
    if switched and refused is None:
        dialect.notes.insert(0, switched)
    if refused and _refused_prompt(refused) and api == "completions" and not factory.text:
        ids_refused = refused
        factory.text = True
        dialect, refused = await _negotiate_fields(conn, factory, model, api)
        if refused is None:
            dialect.notes.insert(
                0,
                f"server rejected token-id prompts (HTTP {ids_refused.status}): prompts sent "
                "as text sized with its tokenizer",
            )
        else:
            factory.text = False
            refused = ids_refused  # text did not help: the first refusal says the most
    if refused is not None:
        raise LLMSpeedError(
            f"a first small {api} request failed: {conn.url(dialect.path)} (finding which "
            f"request fields and prompt form the server takes): {refused.error}"
        )
    return dialect


def _refused_prompt(rec: StreamRecord) -> bool:
    """Could a refusal be of the prompt's form? 400 and 422 as vLLM and OpenAI answer a bad
    request; 500 as llama-cpp-python's server answers every validation error (token ids
    included), when its message is about the prompt. Not a missing route, a missing model,
    a busy or overloaded server, nor a 500 about something else."""
    if rec.status == 500:
        return "prompt" in (rec.error or "")
    return rec.status in (400, 422)


async def _negotiate_fields(
    conn: Connection, factory: PromptFactory, model: str, api: str
) -> tuple[Dialect, StreamRecord | None]:
    """The dialect, and the request the server refused (None once one was accepted): all
    optional fields first, then fewer on 400/422. An accepted request that fails later in its
    stream (an error event) still tells what the server accepts.

    Whether usage comes on every chunk or only at the end is told by a stream with two chunks
    or more: a stream whose only chunk is its last one (two tokens of a byte-level model that
    are both parts of one character stream no text, and ``transformers serve`` puts its usage
    on that last chunk) is asked again with more tokens."""
    dialect = Dialect(api=api)
    prompt = await factory.prompt(64, -1)
    tokens = 2
    while True:
        rec = await stream_request(
            conn, dialect.path, prompt.encode(request_fields(model, tokens, dialect))
        )
        if not rec.error:
            account_tokens(rec, tokens)
            if rec.usage_per_chunk and rec.chunks < 2 and tokens < PROBE_MORE_TOKENS:
                tokens = PROBE_MORE_TOKENS  # one chunk cannot tell
                continue
            if not rec.usage_per_chunk:
                dialect.notes.append(
                    "tokens: the server sends usage only at the end of a stream: each request's "
                    "total is exact, spread over its chunks; requests cut at the window's end "
                    "are estimated from the cell's tokens per chunk"
                    if rec.completion_tokens is not None
                    else "tokens: the server sends no usage in streams: a request that ends at "
                    "max_tokens counts max_tokens; requests cut at the window's end are "
                    "estimated from the cell's tokens per chunk"
                )
            return dialect, None
        if rec.status in (400, 422) and dialect.vendor_fields:
            dialect.vendor_fields = False
            dialect.notes.append(
                "server rejected ignore_eos/min_tokens: outputs may end early (flagged per cell)"
            )
        elif rec.status in (400, 422) and dialect.stream_options:
            dialect.stream_options = False
            dialect.notes.append("server rejected stream_options: tokens: chunk-count (estimate)")
        else:
            return dialect, rec


@dataclass
class PrefillResult:
    context: int
    prompt_tokens: int
    ttft_ms: float
    prompt_tok_s: float
    max_tokens: int
    error: str | None = None
    samples_ms: tuple[float, ...] = ()  # every cold request's TTFT when repeated
    #: the server's figures (``/metrics``) from just before the request was sent to just after
    #: its stream ended: queue, prefill and decode time, prefix cache; None when the server has
    #: no /metrics. Several cold requests: those of the request with the median TTFT (the lower
    #: middle of an even count)
    server: ServerFigures | None = None


def median_prefill(results: list[PrefillResult]) -> PrefillResult:
    """One prefill cell from several cold requests (each on its own fresh prefix): TTFT is
    their median, prompt tok/s = prompt tokens / that median; every TTFT is kept."""
    first = results[0]
    if len(results) == 1:
        return dataclasses.replace(first, samples_ms=(first.ttft_ms,))
    ttft = statistics.median(r.ttft_ms for r in results)
    middle = sorted(results, key=lambda r: r.ttft_ms)[(len(results) - 1) // 2]
    return dataclasses.replace(
        first,
        ttft_ms=ttft,
        prompt_tok_s=first.prompt_tokens / (ttft / 1e3),
        samples_ms=tuple(r.ttft_ms for r in results),
        server=middle.server,
    )


async def run_prefill(
    conn: Connection,
    factory: PromptFactory,
    dialect: Dialect,
    model: str,
    context: int,
    max_tokens: int,
    watch_metrics: bool = True,
    metrics_from: Connection | ReplicaSet | None = None,
) -> PrefillResult:
    """Send the first request at ``context`` on a cold cache; it warms the shared prefix.

    With ``watch_metrics``, ``/metrics`` (of ``metrics_from``, else of ``conn``) is read just
    before the request and just after its stream ended: the server's figures of the cell."""
    prompt = await factory.prompt(context, 0)
    body = prompt.encode(request_fields(model, max_tokens, dialect))
    where = metrics_from if metrics_from is not None else conn
    # The server's figures: /metrics read before the request is sent and after its stream
    # ended, never while it runs. The TTFT counts from the request's send to its first token
    # (``stream_request`` stamps both), so neither read nor parse is inside it.
    before = await _read(where) if watch_metrics else None
    rec = await stream_request(conn, dialect.path, body)
    account_tokens(rec, max_tokens)
    if rec.error and rec.status is not None and 400 <= rec.status < 500:
        raise RequestRejected(
            rec.status, rec.error.removeprefix(f"HTTP {rec.status}: "), conn.url(dialect.path)
        )
    if rec.error:
        raise LLMSpeedError(f"prefill request at {context} tokens failed: {rec.error}")
    if rec.t_first is None:
        raise LLMSpeedError(f"prefill request at {context} tokens produced no output token")
    if rec.prompt_tokens is not None and rec.prompt_tokens != context:
        raise WrongPromptLength(
            f"the server counted {rec.prompt_tokens} prompt tokens for a prompt built to be "
            f"{context}; prompt lengths would be wrong"
        )
    ttft = rec.t_first - rec.t_send
    server = await _prefill_figures(where, before) if before is not None else None
    return PrefillResult(
        context=context,
        prompt_tokens=context,
        ttft_ms=ttft * 1e3,
        prompt_tok_s=prompt_tok_s(context, ttft),
        max_tokens=max_tokens,
        server=server,
    )


async def _prefill_figures(
    conn: Connection | ReplicaSet, before: MetricsRead
) -> ServerFigures | None:
    """The server's figures from ``before`` to a read after a prefill request's stream ended,
    read again (bounded) until the request histograms count the request."""
    open_ = before.parse(EDGE_FAMILIES)[1]
    if open_ is None:
        return None
    close = None
    for attempt in range(PREFILL_AFTER_READS):
        if attempt:
            await asyncio.sleep(0.05)
        close = (await _read(conn)).parse(EDGE_FAMILIES)[1]
        if close is None or _counts_one_more(open_, close):
            break
    return _window_figures(open_, close, [])


def _counts_one_more(open_: ServerSnapshot, close: ServerSnapshot) -> bool:
    """Does ``close``'s queue-time histogram count a request more than ``open_``'s (or is
    there nothing to wait for: the server has no such histogram)?"""
    a, b = open_.total("queue_time", "count"), close.total("queue_time", "count")
    return a is None or b is None or b >= a + 1


@dataclass(frozen=True)
class ReasoningFigures:
    """A cell's reasoning and answer: the median time to the first answer token (ms) of the
    requests whose first answer token came before the window closed (None: none did), the
    tokens of each over every request of the cell (all received, as ``received_tokens``),
    and how they were told apart (the weakest way a request needed)."""

    answer_ttft_ms: float | None
    answer_ttft_samples_ms: tuple[float, ...]
    reasoning_tokens: int
    answer_tokens: int
    how: str


def reasoning_figures(records: Sequence[StreamRecord], w1: float) -> ReasoningFigures | None:
    """The reasoning figures of a cell's accounted records; None where none reasoned."""
    split = [r for r in records if r.reasoning_tokens is not None]
    if not split:
        return None
    waits = [
        (r.t_answer - r.t_send) * 1e3 for r in records if r.t_answer is not None and r.t_answer < w1
    ]
    how = max((r.reasoning_from or REASONING_ESTIMATE for r in split), key=REASONING_ORDER.index)
    return ReasoningFigures(
        answer_ttft_ms=statistics.median(waits) if waits else None,
        answer_ttft_samples_ms=tuple(round(x, 3) for x in waits),
        reasoning_tokens=sum(r.reasoning_tokens or 0 for r in split),
        answer_tokens=sum(
            r.answer_tokens if r.answer_tokens is not None else r.n_tokens for r in records
        ),
        how=how,
    )


@dataclass
class DecodeResult:
    context: int
    concurrency: int
    duration_s: float
    max_output: int
    stats: DecodeStats
    token_accounting: str  # the weakest way a request's tokens were counted (client.USAGE ...)
    early_stops: int  # requests that finished with fewer than max_output tokens
    errors: dict[str, int]
    received_tokens: int  # all tokens of all streams, window or not
    # rise of the server's generation counter from the window's opening to its closing, and
    # the tokens we received over that span (a range: the counter is read at an unknown moment
    # inside each /metrics request)
    generation_tokens_delta: float | None
    max_waiting: float | None
    mean_running: float | None
    queued: bool  # the server queued requests: effective concurrency below N
    #: the median of the server's running + waiting requests over the window's polls (None: no
    #: such gauges): above N, requests that are not ours (another client)
    median_in_server: float | None = None
    aborted: str | None = None  # why the cell stopped early
    aborted_setting: str | None = None  # the setting that may fix it ("timeout")
    error_settings: frozenset[str] = frozenset()  # settings that may fix failed requests
    token_flag: Flag | None = None  # how the tokens were counted, when not from continuous usage
    received_span: tuple[int, int] | None = None
    #: the generation counter's rise from the read before the cell's first request to the
    #: window's close read, and the tokens received before that read began: every token is
    #: generated before it is received, so the first is at least the second (the referee's
    #: floor, :func:`counter_disagreement`); None without a counter at both reads
    counter_floor: tuple[float, int] | None = None
    #: the tokens the requests open at the window's open could have been generated before it
    #: and received inside it, and those the requests open at its close could have generated
    #: and not yet sent (each max output less what it had received); None: not known (N × M)
    counter_room: tuple[int, int] | None = None
    window: tuple[float, float] = (0.0, 0.0)  # perf_counter times the window opened and closed
    received_chunks: int = 0  # token-carrying chunks of all streams
    # prompt lengths the server counted (usage.prompt_tokens) that were not C: {tokens: requests}
    wrong_lengths: dict[int, int] = field(default_factory=dict)
    records: list[StreamRecord] = field(default_factory=list, repr=False)
    replica_tok_s: tuple[float, ...] = ()  # total tok/s of each replica, when several
    precision_goal: float | None = None  # --llm-precision: the half-width the window aimed at
    ended_precise: bool = False  # the window ended early, its interval narrow enough
    #: the server's figures over the window (``/metrics`` at its open, at its close and at the
    #: 1 Hz polls between; several replicas combined); None when the server has no /metrics,
    #: none of the figures' series, or the window did not run its course (never opened, or
    #: aborted: no close read)
    server: ServerFigures | None = None
    #: output tok/s of the requests that met --llm-slo's per-request bounds (None: no bounds)
    goodput_tok_s: float | None = None
    #: how late the client's event loop ran over the window, in the client process that was
    #: the furthest behind (None: not measured)
    client_lag: LoopLag | None = None
    client_processes: int = 1  # the client processes that read the cell's streams
    #: reasoning and answer (docs/metrics.md, "Reasoning and answer"); None where no request
    #: of the cell carried reasoning (tool-call deltas: where none came)
    reasoning: ReasoningFigures | None = None
    tool_call_deltas: int | None = None
    #: the text re-count of the cell's first requests (core/recount.py); None: none re-counted
    recount: Recount | None = None
    client_cpu: float | None = None  # cores they used over the window, together
    #: the server's values over the window: busy at its start, /metrics that did not parse,
    #: values refused, counters that went back (:func:`_window_flags`)
    flags: tuple[Flag, ...] = ()
    notes: tuple[str, ...] = ()  # more to know about the cell, in words (the client processes)

    @property
    def error_rate(self) -> float:
        return sum(self.errors.values()) / max(self.stats.requests, 1)

    @property
    def token_note(self) -> str | None:
        """How the tokens were counted, in words (``tokens: …``), when not from usage."""
        return None if self.token_flag is None else self.token_flag.text()

    @property
    def client_flag(self) -> Flag | None:
        """The client could not keep up with the server (its event loop behind)."""
        return self.client_lag.flag() if self.client_lag is not None else None

    @property
    def client_note(self) -> str | None:
        """:attr:`client_flag` in words."""
        return self.client_lag.note() if self.client_lag is not None else None


async def run_decode(
    conn: Connection | ReplicaSet,
    factory: PromptFactory,
    dialect: Dialect,
    model: str,
    context: int,
    concurrency: int,
    max_output: int,
    duration: float,
    watch_metrics: bool = True,
    open_timeout: float | None = None,
    precision: float | None = None,
    min_duration: float = 5.0,
    on_tick: Callable[[DecodeTick], None] | None = None,
    keep_server: bool = True,
    request_bounds: RequestBounds | None = None,
    keep_reads: bool = False,
    processes: int = 1,
) -> DecodeResult:
    """N streams in flight, restarted at once; a D-second window opened when the first N
    streams all have their first token; every open stream cancelled at the window's end.

    With ``precision`` (a fraction), the window ends early once it is ``min_duration`` long,
    the 95 % interval of the full window's total tok/s is within that fraction of the figure
    so far, and no drift is seen (:meth:`_LiveEvents.precise_enough`); the cell's throughput
    intervals are then those of the full window's figures.
    ``on_tick`` is called about once a second while the window is open (:class:`DecodeTick`).

    With ``watch_metrics``, ``/metrics`` is read at the window's open, at its close and about
    once a second between: the generation counter (the referee), the queue's gauges and, with
    ``keep_server``, the server's figures (``DecodeResult.server``). Each read is one GET whose
    text is kept and parsed once, after the window (``keep_server=False``: only the referee's
    and the queue's series are parsed, as before the server's figures: the cost benchmark's
    baseline).

    With ``request_bounds`` (--llm-slo), the cell's goodput: the output tok/s of the requests
    that met them (:func:`~.stats.goodput`, docs/slo.md).

    The streams are counted as they arrive (:class:`~.wire.StreamTally`) and stop reading once
    the window has closed (after the close's ``/metrics`` read, the referee's, when there is
    one). A heartbeat measures how late the event loop runs: a client that cannot keep up
    with the server says so (``DecodeResult.client_flag``). ``keep_reads``: every stream's raw
    reads kept too (tests that compare the wire with the server's record).

    ``processes`` above 1: the streams are split over that many client processes (at most
    one per stream; one endpoint only, several replicas are read by one process), each with
    its own event loop (:mod:`.workers`); the window, the figures and the notes are those of
    one process, except the live ticks and the early end (``precision``), which need the
    tokens while they arrive and are off."""
    n = concurrency
    heart = Heartbeat()
    aborted: str | None = None
    aborted_setting: str | None = None
    ended_precise = False
    live = _LiveEvents()
    fields = request_fields(model, max_output, dialect)
    used = min(processes, n) if isinstance(conn, Connection) else 1
    streams: Streams | ProcessStreams
    if used > 1:
        assert isinstance(conn, Connection)
        streams = ProcessStreams(
            [
                WorkerSpec(i, conn.base_url, conn.api_key, conn.timeout, dialect.path, share,
                           n, portable(factory, i), context, fields, keep_reads)
                for i, share in enumerate(split(n, used))
            ]
        )  # fmt: skip
        on_tick = precision = None  # no live view of the workers' tokens
    else:
        prompts = PromptSource(factory, context, fields, 2 * n + 8)
        await prompts.build()
        streams = Streams(conn, dialect.path, prompts, range(n), n, keep_reads=keep_reads)
    records = streams.records
    loop = asyncio.get_running_loop()

    busy: Flag | None = None
    if watch_metrics:
        # Requests the previous cell cancelled may still run on the server (an engine notices a
        # closed stream late): start when it is idle, so they neither slow nor count in this cell.
        busy = await _wait_idle(conn, min(conn.timeout, IDLE_WAIT_S))
    if used == 1:
        await conn.warm_pool(n)  # (each client process warms its own)
    before = await _metrics(conn) if watch_metrics else None
    # /metrics reads at the window's open and close and the polls between: the text only. They
    # run beside the streams (on the same event loop) but in no stream's timing; their parse,
    # the CPU that could delay the streams' reads, waits until the streams are closed.
    read_open: MetricsRead | None = None
    read_close: MetricsRead | None = None
    polls: list[MetricsRead] = []
    streams.start()
    beat = loop.create_task(heart.run())
    try:
        timeout = open_timeout if open_timeout is not None else conn.timeout
        open_at = await streams.wait_open(timeout)
        aborted = streams.aborted
        if open_at is None and aborted is None:
            aborted = (
                f"the window never opened: {streams.with_token} of {n} streams had a first "
                f"token within {timeout:g} s"
            )
            aborted_setting = "timeout"
        opened_in_time = aborted is None and open_at is not None
        if opened_in_time:
            assert open_at is not None
            w0 = open_at
            w1 = w0 + duration
            if before is None:
                streams.stop.set(w1)  # no referee to read at the close: nothing after it needed
            if before is not None:
                read_open = await _read(conn)
            step = 1.0 if precision is None else 0.5
            ticks = _Ticks(live, records, w0, duration, on_tick) if on_tick else None
            while time.perf_counter() < w1 and (aborted := streams.aborted) is None:
                if watch_metrics and before is not None:
                    polls.append(await _read(conn))
                now = time.perf_counter()
                if ticks is not None:
                    ticks.maybe(now)
                if precision is not None and now - w0 >= min_duration and now < w1:
                    live.update(records)
                    if live.precise_enough(w0, now, precision, duration):
                        w1, ended_precise = now, True
                        break
                await asyncio.sleep(min(step, max(w1 - time.perf_counter(), 0)))
            t_stop = min(time.perf_counter(), w1)
            if read_open is not None and aborted is None:
                read_close = await _read(conn)
        else:
            w0 = w1 = t_stop = time.perf_counter()
    finally:
        beat.cancel()
        await asyncio.gather(beat, return_exceptions=True)
        await streams.close()
    # a stream task that ended in an exception at the close is the cell's reason too
    aborted = aborted or streams.aborted
    await tokenize_cut(records, factory.tokenizer, max_output)  # after the cell
    recount, not_recounted = await recount_or_why(records, factory.tokenizer)
    # the window's /metrics texts, parsed now that the streams are closed: each once, for the
    # referee and the queue (MetricsSnapshot) and the server's figures (ServerSnapshot) alike
    edges, gauges = (EDGE_FAMILIES, POLL_FAMILIES) if keep_server else (SNAPSHOT_FAMILIES,) * 2
    span_open = span_close = None
    server_open = server_close = None
    if read_open is not None:
        snap, server_open = read_open.parse(edges)
        span_open = (read_open.t0, read_open.t1, snap)
    if read_close is not None:
        snap, server_close = read_close.parse(edges)
        span_close = (read_close.t0, read_close.t1, snap)
    samples: list[MetricsSnapshot] = []
    server_polls: list[ServerSnapshot] = []
    for poll in polls:
        snap, server_poll = poll.parse(gauges)
        if snap is not None:
            samples.append(snap)
        if server_poll is not None:
            server_polls.append(server_poll)
    server = _window_figures(server_open, server_close, server_polls) if keep_server else None
    # the parent's heartbeat, and each client process's (with several)
    hearts = [heart, *getattr(streams, "heartbeats", ())]
    # how late each process's loop ran, and its CPU (the furthest behind is the cell's lag)
    lags = [lag for h in hearts if (lag := h.lag(w0, min(w1, max(t_stop, w0)))) is not None]
    if opened_in_time and t_stop < w1 - 1e-3:
        cut = f"the window was cut short after {t_stop - w0:.1f} of {duration:g} s"
        aborted = f"{cut}: {aborted}" if aborted else cut
    result = _decode_result(
        records,
        context,
        n,
        max_output,
        duration,
        w0,
        min(w1, max(t_stop, w0)),
        span_open,
        span_close,
        samples,
        aborted,
        full=duration if ended_precise else None,
        request_bounds=request_bounds,
        counter_before=before.generation_tokens if before is not None else None,
    )
    return dataclasses.replace(
        result,
        aborted_setting=aborted_setting,
        precision_goal=precision,
        ended_precise=ended_precise,
        server=server,
        recount=recount,
        client_lag=max(lags, key=lambda lag: (lag.late_s, lag.max_ms)) if lags else None,
        client_cpu=sum(x.cpu_share or 0.0 for x in lags) if lags else None,
        client_processes=used,
        flags=(
            *_window_flags(
                busy, (read_open, polls, read_close), (server_open, server_polls, server_close)
            ),
            *wire_flags(records, conn),
            *unrefereed(
                watch_metrics, before, span_open, span_close, result.generation_tokens_delta
            ),
            *([Flag(FlagKind.NOT_RECOUNTED, not_recounted)] if not_recounted else []),
        ),
    )


def unrefereed(
    watched: bool,
    before: MetricsSnapshot | None,
    span_open: tuple[float, float, MetricsSnapshot | None] | None,
    span_close: tuple[float, float, MetricsSnapshot | None] | None,
    delta: float | None,
) -> list[Flag]:
    """A referee that could not run is a note, never silence: the server has ``/metrics``
    (``watched``), and a read the referee needs — before the cell, at the window's open or
    at its close — did not answer in time or parse, or one of them lacked the generation
    counter the others had. A server whose ``/metrics`` has no such counter at all says
    nothing here (the referee has nothing to read)."""
    if not watched or delta is not None:
        return []
    reads = {
        "before the cell": before,
        "at the window's open": span_open[2] if span_open else None,
        "at the window's close": span_close[2] if span_close else None,
    }
    failed = [name for name, snap in reads.items() if snap is None]
    if failed:
        detail = f"/metrics {' and '.join(failed)} did not answer in time or parse"
        return [Flag(FlagKind.NOT_REFEREED, detail)]
    counted = [name for name, snap in reads.items() if snap and snap.generation_tokens is not None]
    if counted and len(counted) < len(reads):
        lacking = [name for name in reads if name not in counted]
        detail = f"/metrics {' and '.join(lacking)} had no generation counter"
        return [Flag(FlagKind.NOT_REFEREED, detail)]
    return []


def wire_flags(records: Sequence[StreamRecord], conn: Connection | ReplicaSet) -> list[Flag]:
    """What a cell's streams did that the figures do not show (docs/trust.md): usage that
    counted tokens before the chunk that carried them (a usage-only first chunk: each
    request's first token is its first chunk that carries one, so the TTFT is not moved by
    it), and streams the server held open after their ``[DONE]`` (the client ended each
    there; said once a run, in the cell where it was first seen)."""
    flags = []
    early = [r.tally.announced for r in records if r.tally.announced]
    if early:
        detail = f"{sum(early):,} token(s) in {len(early)} of {len(records)} requests"
        flags.append(Flag(FlagKind.USAGE_BEFORE_TOKENS, detail))
    models = collections.Counter(r.tally.model for r in records if r.tally.model)
    if len(models) > 1:
        shown = ", ".join(f"{for_person(m, 60)} ({k})" for m, k in models.most_common())
        flags.append(Flag(FlagKind.MODELS, f"{shown} requests"))
    conns = conn.connections if isinstance(conn, ReplicaSet) else [conn]
    held = sum(c.held_open for c in conns)
    if held and not any(c.held_open_said for c in conns):
        for c in conns:
            c.held_open_said = True
        detail = f"{held} stream(s), for {DONE_GRACE_S:g} s each"
        flags.append(Flag(FlagKind.HELD_AFTER_DONE, detail))
    return flags


@dataclass(frozen=True)
class DecodeTick:
    """A decode window so far, for a live display (``run_decode(on_tick=...)``).

    ``tokens`` are read from the raw stream while it runs: the rise of each stream's
    ``usage.completion_tokens`` (exact with continuous usage stats), else one per event until
    the final usage says how many there were; the cell's figure, counted after, is the one
    that counts."""

    elapsed_s: float  # since the window opened
    window_s: float  # the window's full length (an early end may close it sooner)
    tokens: int  # received inside the window so far
    tok_s_now: float  # over the last tick (about a second)
    in_flight: int  # streams open now


class _LiveEvents:
    """Tokens received so far, by arrival time, taken while the streams are open from what
    each stream's tally has counted (:class:`~.wire.StreamTally`): the rises of its usage, or,
    on a server that sends no usage on every chunk, one per chunk with output until the
    stream's end says how many there were. For the early end (``--llm-precision``) and the
    live display (:class:`DecodeTick`).

    On a server with usage in every chunk these are the tokens, times and spreading the
    window's interval is computed from after the cell (:func:`~.stats.window_tokens`): chunks
    of one read share its arrival and are spread together over the time since the stream's
    previous read, so an early-ended cell's ``precision`` is the half-width the early end's
    test saw."""

    def __init__(self) -> None:
        self.cursor: list[int] = []  # entries of each record's tally taken so far
        self.last: list[float | None] = []  # each record's latest arrival taken
        self.topped: list[bool] = []  # a stream without usage on every chunk: its end counted
        self._pieces: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        self._arrays: tuple[np.ndarray, np.ndarray, np.ndarray] = (
            np.empty(0),
            np.empty(0),
            np.empty(0),
        )

    def update(self, records: list[StreamRecord]) -> None:
        grow = len(records) - len(self.cursor)
        self.cursor.extend([0] * grow)
        self.last.extend([None] * grow)
        self.topped.extend([False] * grow)
        for i, rec in enumerate(records):
            tally = rec.tally
            usage = tally.chunks == tally.usage_chunks
            times = tally.usage_times if usage else tally.text_times
            k, n = self.cursor[i], len(times)
            if not usage and rec.t_end is not None and not self.topped[i] and n <= k:
                self._top_up(i, tally)
            if n <= k:
                continue
            t = np.frombuffer(times[k:n], dtype=np.float64)
            if usage:
                c = np.frombuffer(tally.usage_counts[k:n], dtype=np.uint32).astype(np.float64)
            else:
                c = np.ones(n - k)
            first = np.searchsorted(t, t, side="left")  # the first entry of each one's read
            previous = self.last[i]
            before = t if previous is None else np.full(n - k, previous)
            starts = np.where(first > 0, t[np.maximum(first - 1, 0)], before)
            self._pieces.append((t, c, starts))
            self.cursor[i], self.last[i] = n, float(t[-1])
            if not usage and rec.t_end is not None:
                self._top_up(i, tally)

    def _top_up(self, i: int, tally: StreamTally) -> None:
        """A stream without usage on every chunk has ended: its final usage, if it sent one,
        brings the tokens beyond one a chunk, at that usage's arrival."""
        self.topped[i] = True
        extra = (tally.completion_tokens or 0) - len(tally.text_times)
        if extra > 0 and tally.usage_times:
            t = tally.usage_times[-1]
            last = self.last[i]
            start = t if last is None else last
            self._pieces.append((np.array([t]), np.array([float(extra)]), np.array([start])))

    def arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Arrival, tokens and previous arrival of every entry so far, as arrays; only the
        entries since the last call are joined. The early end asks every half second on the
        event loop, which must not stall while streams are read: with 300,000 reads in a
        window its worst call took 63.8 ms when every read was converted on every call, 9.0 ms
        when only the new ones were (``benchmarks/studies/early_end_cost.py``)."""
        if self._pieces:
            t, c, s = self._arrays
            pieces, self._pieces = self._pieces, []
            self._arrays = (
                np.concatenate((t, *(p[0] for p in pieces))),
                np.concatenate((c, *(p[1] for p in pieces))),
                np.concatenate((s, *(p[2] for p in pieces))),
            )
        return self._arrays

    def precise_enough(self, w0: float, now: float, goal: float, full: float) -> bool:
        """May a window that opened at ``w0`` and would last ``full`` seconds end ``now``?
        Yes when the 95 % interval of the figure the full window would measure lies within
        ``goal`` (a fraction) of total throughput over [w0, now), and no drift is flagged.
        That interval is the window's so far moved by its trend extrapolated to ``full``,
        with the trend's uncertainty (:func:`~.intervals.window_interval`): a window that ends
        early must not hide a server that slows as its requests' contexts grow."""
        times, counts, starts = self.arrays()
        bm = batch_means(times, counts, w0, now, starts, full=full)
        if bm is None:
            return False
        value = float(counts[(times >= w0) & (times < now)].sum()) / (now - w0)
        if value <= 0 or bm.interval.half_width_rel(value) > goal:
            return False
        drift = trend(bm.fine_rates)
        return drift is None or not drift.flagged


class _Ticks:
    """Calls ``on_tick`` about once a second while the window is open, from the tokens that
    :class:`_LiveEvents` read since the last tick."""

    EVERY_S = 0.9  # the window loop wakes every 0.5 or 1 s: ticks about a second apart

    def __init__(
        self,
        live: _LiveEvents,
        records: list[StreamRecord],
        w0: float,
        duration: float,
        on_tick: Callable[[DecodeTick], None],
    ) -> None:
        self.live, self.records, self.w0, self.duration = live, records, w0, duration
        self.on_tick = on_tick
        self.last = w0
        self.seen = 0  # reads of live already summed
        self.tokens = 0

    def maybe(self, now: float) -> None:
        if now - self.last < self.EVERY_S:
            return
        self.live.update(self.records)
        times, counts, _ = self.live.arrays()
        times, counts = times[self.seen :], counts[self.seen :]
        self.seen += len(times)
        fresh = int(counts[times >= self.w0].sum())
        self.tokens += fresh
        in_flight = sum(1 for rec in self.records if rec.t_end is None)
        rate = fresh / (now - self.last)
        self.last = now
        self.on_tick(DecodeTick(now - self.w0, self.duration, self.tokens, rate, in_flight))


@dataclass(frozen=True)
class MetricsRead:
    """One read of ``/metrics`` (every replica's at once): when its GET began and ended
    (``time.perf_counter``) and each replica's text, None where one did not answer 200.
    Kept as text and parsed once, when nothing is being timed (:meth:`parse`)."""

    t0: float
    t1: float
    texts: tuple[str | None, ...]

    def parse(
        self, families: frozenset[str]
    ) -> tuple[MetricsSnapshot | None, ServerSnapshot | None]:
        """One parse of ``families`` per replica's text, read two ways: the referee's and the
        queue's figures (summed over replicas) and the server's snapshot at the read's
        midpoint (replicas combined, ``server_figures.combine``); both None when a replica's
        text is missing or does not parse (a sum without it would be wrong)."""
        parsed = []
        for text in self.texts:
            if text is None:
                return None, None
            try:
                parsed.append(parse_metrics(text, families))
            except ValueError:
                return None, None
        if not parsed:
            return None, None
        t = (self.t0 + self.t1) / 2
        server = combine([snapshot_from_samples(s, t) for s in parsed])
        if len(parsed) == 1:
            return (snapshot(parsed[0]) if parsed[0] else None), server
        return sum_snapshots([snapshot(s) for s in parsed]), server


async def _read(conn: Connection | ReplicaSet) -> MetricsRead:
    """``/metrics`` read once (every replica's at once), not parsed."""
    t0 = time.perf_counter()
    if isinstance(conn, ReplicaSet):
        texts = tuple(await conn.texts())
    else:
        texts = (await metrics_text(conn),)
    return MetricsRead(t0, time.perf_counter(), texts)


def _window_figures(
    open_: ServerSnapshot | None, close: ServerSnapshot | None, polls: Sequence[ServerSnapshot]
) -> ServerFigures | None:
    """The server's figures between two reads; None when either read is missing or the
    server exposes none of the figures' series."""
    if open_ is None or close is None or (open_.engine is None and close.engine is None):
        return None
    figures = window_figures(open_, close, polls)
    # a counter that went back inside the window: none of the cell's server figures is kept
    return invalidated(figures) if figures.reset else figures


def _counter_room(
    records: list[StreamRecord],
    max_output: int,
    read_open: tuple[float, float],
    read_close: tuple[float, float],
) -> tuple[int, int]:
    """What the server's generation counter may differ by from the tokens received between
    the window's two /metrics reads, each read at an unknown moment inside its request
    (docs/trust.md, "The referee's bounds"): below, the tokens generated before the open read
    and received after it, at most, for each request open at it, its max output less what it
    had received, and no more than it received after; above, the tokens generated before the
    close read and not yet received, at most, for each request open at it (or failed inside
    the window), its max output less what it had received."""
    o0, o1 = read_open
    c0, c1 = read_close
    below = above = 0
    for rec in records:
        times = rec.token_times
        if not len(times) and rec.t_end is not None and rec.t_end <= o0:
            continue
        t = np.asarray(times, dtype=np.float64)
        c = np.asarray(rec.token_counts, dtype=np.int64)
        ended = rec.t_end if rec.t_end is not None else math.inf
        if rec.t_send < o1 and ended > o0:
            had = int(c[t <= o0].sum())
            after = int(c[(t > o0) & (t <= c1)].sum())
            below += min(max(max_output - had, 0), after)
        if rec.t_send < c1 and (ended > c0 or (rec.error and ended > o0)):
            above += max(max_output - int(c[t <= c0].sum()), 0)
    return below, above


def _received_between(records: list[StreamRecord], t0: float, t1: float) -> int:
    total = 0
    for rec in records:
        if len(rec.token_times):
            t = np.asarray(rec.token_times, dtype=np.float64)
            c = np.asarray(rec.token_counts, dtype=np.int64)
            total += int(c[(t > t0) & (t <= t1)].sum())
    return total


async def _wait_idle(conn: Connection | ReplicaSet, timeout: float) -> Flag | None:
    """Poll /metrics until no request runs or waits, ``timeout`` seconds at most in all (each
    read bounded by what is left of it). None when the server got idle or cannot say (no
    /metrics, no running gauge, gauges that are NaN or negative: unknown, not busy, or no
    answer in time); else the cell's flag, ``FlagKind.SERVER_BUSY`` with ``R running, W
    waiting after waiting S s`` (the cell runs: docs/metrics.md, "A busy server")."""
    start = time.perf_counter()
    deadline = start + timeout
    last: MetricsSnapshot | None = None
    while (left := deadline - time.perf_counter()) > 0:
        try:
            snap = await asyncio.wait_for(_metrics(conn), left)
        except TimeoutError:
            break
        if snap is None or snap.running is None:
            return None
        if not snap.running and not snap.waiting:
            return None
        last = snap
        await asyncio.sleep(min(0.1, max(deadline - time.perf_counter(), 0.0)))
    if last is None:
        return None
    waiting = "?" if last.waiting is None else f"{last.waiting:g}"
    return Flag(
        FlagKind.SERVER_BUSY,
        f"{last.running:g} running, {waiting} waiting after waiting "
        f"{time.perf_counter() - start:.1f} s",
    )


def _window_flags(
    busy: Flag | None,
    reads: tuple[MetricsRead | None, Sequence[MetricsRead], MetricsRead | None],
    snapshots: tuple[ServerSnapshot | None, Sequence[ServerSnapshot], ServerSnapshot | None],
) -> tuple[Flag, ...]:
    """A decode cell's flags on its server's values: busy at the window's start, a /metrics
    read that did not parse (the first, with its line), series refused (NaN, infinite,
    negative) and counters that went back (the cell's server figures not kept). ``reads``
    and ``snapshots``: the open's, the polls', the close's (a poll's snapshot only where it
    parsed)."""
    flags = [busy] if busy else []
    read_open, polls, read_close = reads
    open_, server_polls, close = snapshots
    answered = [p for p in polls if None not in p.texts]
    suspects = [r for r, snap in ((read_open, open_), (read_close, close)) if snap is None]
    if len(server_polls) < len(answered):
        suspects += answered
    for read in suspects:
        if read is None or None in read.texts:
            continue
        problem = next((_unparsed(t) for t in read.texts if t and _unparsed(t)), None)
        if problem:
            flags.append(Flag(FlagKind.METRICS_UNPARSED, problem))
            break
    known = [s for s in (open_, *server_polls, close) if s is not None]
    refused = refused_note(known)
    if refused:
        flags.append(Flag(FlagKind.SERVER_VALUES_REFUSED, refused))
    if open_ is not None and close is not None:
        back = went_back(open_, server_polls, close)
        if back:
            flags.append(Flag(FlagKind.SERVER_WENT_BACK, back))
    return tuple(flags)


def _unparsed(text: str) -> str | None:
    """Why a /metrics text does not parse (its first failing line), or None when it does."""
    try:
        parse_metrics(text, EDGE_FAMILIES)
    except ValueError:
        return parse_problem(text, EDGE_FAMILIES)
    return None


async def _metrics(conn: Connection | ReplicaSet) -> MetricsSnapshot | None:
    if isinstance(conn, ReplicaSet):  # summed over the replicas
        return await conn.snapshot()
    try:
        samples = await read_metrics(conn, SNAPSHOT_FAMILIES)
    except LLMSpeedError:
        return None
    return snapshot(samples) if samples else None


def _decode_result(
    records: list[StreamRecord],
    context: int,
    n: int,
    max_output: int,
    duration: float,
    w0: float,
    w1: float,
    span_open: tuple[float, float, MetricsSnapshot | None] | None,
    span_close: tuple[float, float, MetricsSnapshot | None] | None,
    samples: list[MetricsSnapshot],
    aborted: str | None,
    full: float | None = None,
    request_bounds: RequestBounds | None = None,
    counter_before: float | None = None,
) -> DecodeResult:
    traces: list[RequestTrace] = []
    errors: Counter[str] = Counter()
    early = 0
    wrong: Counter[int] = Counter()
    error_settings: set[str] = set()
    received = 0
    chunks = 0
    for rec in records:
        account_tokens(rec, max_output)
    accounting = complete_accounting(records)
    for rec in records:
        split_reasoning(rec)  # on the counts the cell's accounting completed
        if rec.error:
            errors[_short(rec.error)] += 1
            if rec.error_setting:
                error_settings.add(rec.error_setting)
        if rec.prompt_tokens is not None and rec.prompt_tokens != context:
            wrong[rec.prompt_tokens] += 1
        done = rec.finished and not rec.cancelled and not rec.error
        if done and ended_early(rec, max_output):
            early += 1
        received += rec.n_tokens
        chunks += rec.chunks
        traces.append(
            RequestTrace(
                t_send=rec.t_send,
                t_end=rec.t_end if rec.t_end is not None else w1,
                token_times=rec.token_times,
                token_counts=rec.token_counts,
                finished=done,
                error=rec.error,
            )
        )
    stats = decode_stats(traces, w0, w1, n, full)
    good = goodput(traces, w0, w1, request_bounds) if request_bounds is not None else None
    gen_delta = None
    room: tuple[int, int] | None = None
    span_min: int | None = None
    span_max: int | None = None
    if span_open and span_close and span_open[2] and span_close[2]:
        a, b = span_open[2].generation_tokens, span_close[2].generation_tokens
        if a is not None and b is not None:
            gen_delta = b - a
            # the counter was read somewhere inside each /metrics request: bracket the tokens
            # we received over the same span
            span_min = _received_between(records, span_open[1], span_close[0])
            span_max = _received_between(records, span_open[0], span_close[1])
            room = _counter_room(records, max_output, span_open[:2], span_close[:2])
    floor = None
    if span_close and span_close[2] and counter_before is not None:
        b = span_close[2].generation_tokens
        if b is not None and math.isfinite(b) and math.isfinite(counter_before):
            floor = (b - counter_before, _received_between(records, -math.inf, span_close[0]))
    waits = [s.waiting for s in samples if s.waiting is not None]
    runs = [s.running for s in samples if s.running is not None]
    max_wait = max(waits) if waits else None
    mean_run = sum(runs) / len(runs) if runs else None
    queued = server_queued(waits, runs, n)
    in_server = [s.running + (s.waiting or 0.0) for s in samples if s.running is not None]
    return DecodeResult(
        context=context,
        concurrency=n,
        duration_s=duration,
        max_output=max_output,
        stats=stats,
        token_accounting=accounting.method,
        token_flag=accounting.flag,
        early_stops=early,
        errors=dict(errors),
        received_tokens=received,
        generation_tokens_delta=gen_delta,
        received_span=(span_min, span_max)
        if span_min is not None and span_max is not None
        else None,
        counter_floor=floor,
        counter_room=room,
        max_waiting=max_wait,
        mean_running=mean_run,
        queued=queued,
        median_in_server=statistics.median(in_server) if in_server else None,
        aborted=aborted,
        window=(w0, w1),
        received_chunks=chunks,
        wrong_lengths=dict(wrong),
        error_settings=frozenset(error_settings),
        records=records,
        goodput_tok_s=good,
        reasoning=reasoning_figures(records, w1),
        tool_call_deltas=sum(r.tool_call_deltas for r in records) or None,
    )


async def tokenize_cut(
    records: list[StreamRecord], tokenizer: ServerTokenizer, max_output: int
) -> None:
    """Where no request of a cell has an exact total (none finished, no usage), count the text
    each cut request received with the server's tokenizer (whatever route it has), after the
    cell; :func:`complete_accounting` uses it. Nothing where the server has no tokenize route,
    or where it fails (then one token per chunk stays, said loudly)."""
    for rec in records:
        account_tokens(rec, max_output)
    if any(r.count_method in EXACT and r.token_counts for r in records):
        return
    unknown = [r for r in records if r.count_method is None and r.token_counts]
    try:
        if not unknown or not await tokenizer.has_ids():
            return
        for rec in unknown:
            rec.tokenized = await tokenizer.count_text(rec.tally.output_text())
    except LLMSpeedError:
        for rec in unknown:
            rec.tokenized = None


@dataclass(frozen=True)
class Accounting:
    """How a cell's tokens were counted: the weakest method any request needed, in words."""

    method: str
    flag: Flag | None = None  # ``FlagKind.TOKENS``: how, when not from continuous usage
    ratio: float | None = None  # tokens per chunk used for the requests it estimated
    ratio_rel_error: float | None = None  # its relative standard error

    @property
    def note(self) -> str | None:
        """The flag in words (``tokens: …``)."""
        return None if self.flag is None else self.flag.text()


def complete_accounting(records: list[StreamRecord]) -> Accounting:
    """Count the tokens of requests whose stream said nothing exact (cut at the window's end
    with no usage): the tokens-per-chunk ratio of the cell's requests whose totals are exact,
    and its standard error; where no request's total is known, the server's tokenizer on the
    text received (:func:`tokenize_cut`); one token per chunk only where neither exists."""
    exact = [r for r in records if r.count_method in EXACT and r.token_counts]
    unknown = [r for r in records if r.count_method is None and r.token_counts]
    methods = {r.count_method for r in exact}
    if not unknown:
        if methods <= {USAGE}:
            return Accounting(USAGE)
        method = FINAL_USAGE if FINAL_USAGE in methods else MAX_TOKENS
        how = "final usage" if method == FINAL_USAGE else "max_tokens at finish_reason length"
        return Accounting(method, Flag(FlagKind.TOKENS, f"{how}, spread over chunks"))
    basis = [r for r in exact if r.count_method != USAGE] or exact
    if not basis and all(r.tokenized is not None for r in unknown):
        for r in unknown:
            r.token_counts = spread(r.tokenized or 0, len(r.token_counts))
            r.count_method = TOKENIZE
        return Accounting(
            TOKENIZE,
            Flag(
                FlagKind.TOKENS,
                f"{_unknown_words(unknown)} counted with the server's tokenizer on the text "
                "received (no usage, no request finished at max_tokens)",
            ),
        )
    if not basis:
        for r in unknown:
            r.count_method = CHUNK_COUNT
        return Accounting(
            CHUNK_COUNT,
            Flag(
                FlagKind.TOKENS,
                "ONE TOKEN PER CHUNK ASSUMED (no usage, no request finished at max_tokens, "
                "no tokenize route to count the text): "
                "an estimate that undercounts multi-token chunks",
            ),
        )
    per_request = [r.n_tokens / r.chunks for r in basis]
    ratio = sum(r.n_tokens for r in basis) / sum(r.chunks for r in basis)
    rel = 0.0
    if len(per_request) >= 2 and ratio > 0:
        rel = statistics.stdev(per_request) / math.sqrt(len(per_request)) / ratio
    for r in unknown:
        k = len(r.token_counts)
        r.token_counts = spread(round(k * ratio), k)
        r.count_method = RATIO
    how = (
        f"{_unknown_words(unknown)} estimated at {ratio:.2f} "
        f"tokens per chunk (±{rel:.1%}, from {len(basis)} request(s) whose totals are exact)"
    )
    return Accounting(RATIO, Flag(FlagKind.TOKENS, how), ratio, rel)


def _unknown_words(unknown: list[StreamRecord]) -> str:
    """The requests whose totals were not known, in words: cut at the window's end, or ended
    before max_tokens on a server that sends no usage (an early end of generation)."""
    ended = sum(r.finished for r in unknown)
    cut = len(unknown) - ended
    if not ended:
        return f"{cut} request(s) cut at the window's end"
    early = f"{ended} request(s) that ended before max_tokens (no usage)"
    return early if not cut else f"{cut} request(s) cut at the window's end and {early}"


def counter_disagreement(result: DecodeResult) -> str | None:
    """The server's generation counter as a referee (docs/metrics.md, docs/trust.md): when it
    cannot be squared with the tokens received, why the cell's figures cannot be trusted, in
    one line that says which way the counts differ and what it means; None when it agrees,
    the server has no counter, or the gap has a harmless cause.

    - A token is generated before it is received: the counter's rise from the read before the
      cell's first request to the window's close read is at least every token received before
      that read (``counter_floor``). Below it, the client credited tokens the server did not
      generate (its usage says more than it sent), whatever the server's speed.
    - Over the window, a counter above the tokens received is tokens generated and not yet
      streamed (vLLM counts a token when its API server takes it from the engine: a
      CPU-starved API server streams seconds behind, +5 to +15 % at c1-c8 on vLLM's CPU build
      beside other work): a lag, the cell's notes say so. It has a bound, what the requests
      open at the close could still generate (``counter_room``, N × max output where not
      known); past it the counter counts tokens that were never streamed. A counter below the
      tokens received over the window is tokens generated before it opened, at most what the
      requests open at its start could have generated then; past it, tokens credited that the
      server did not generate.
    - Tokens the cell had to estimate (chunks counted without usage) that the counter
      contradicts, and a counter above what we received while the server ran more requests
      than ours (median of its running + waiting gauges above N: another client), fail too.
    - A counter that fell over the window or went back between two of its reads (a counter
      never falls; a server that restarted breaks the streams too) is not to be trusted, and
      the cell cannot be refereed."""
    span = result.received_span
    delta = result.generation_tokens_delta
    back = result.server is not None and "generation_tokens" in result.server.reset
    if span is not None and delta is not None and (delta < 0 or back):
        lo, hi = span
        how = f"fell by {-delta:,.0f} tokens" if delta < 0 else "went back inside the window"
        return (
            f"the server's generation counter {how} while {lo:,}–{hi:,} tokens were "
            "received: a counter never falls, so the server's counter is not to be trusted "
            "(the cell cannot be refereed)"
        )
    n = result.concurrency
    floor = result.counter_floor
    if floor is not None and not back and floor[0] >= 0:
        risen, got = floor
        if risen < got - COUNTER_TOLERANCE * got - COUNTER_SLACK_PER_STREAM * n:
            why = (
                "the cell's estimate counted tokens the server did not generate"
                if result.token_accounting in (CHUNK_COUNT, RATIO, TOKENIZE)
                else "the server's usage counts more tokens than it sent"
            )
            return (
                f"the server's generation counter rose by {risen:,.0f} tokens from before the "
                f"cell's first request to the window's close, while {got:,} were received "
                f"before it ({risen / got - 1:+.1%}): fewer generated than received, and a "
                f"token is generated before it is streamed, so {why}: the figures are not to "
                "be trusted"
            )
    gap = counter_gap(delta, span, n)
    if gap is None or span is None or delta is None:
        return None
    lo, hi = span
    figures = (
        f"the server's generation counter rose by {delta:,.0f} tokens over the window while "
        f"{lo:,}–{hi:,} were received ({gap:+.1%})"
    )
    if result.token_accounting in (CHUNK_COUNT, RATIO, TOKENIZE):
        cause = (
            "chunks that carry several tokens, counted without usage"
            if gap > 0
            else "tokens counted that the server did not generate (check the token accounting)"
        )
        return f"{figures}: likely {cause}"
    others = result.median_in_server
    if gap > 0 and others is not None and others > n + 0.5:
        return (
            f"{figures}, and the server ran {others:g} requests at the median, "
            f"{n} of them ours: likely another client sharing the server"
        )
    held = n * result.max_output
    if result.counter_room is None:
        below = above = held
        how = f"{n} × {result.max_output:,} = {held:,} tokens"
        room_below = room_above = how
    else:
        below, above = result.counter_room
        room_below = f"{below:,} tokens: each one's max output less what it had received"
        room_above = f"{above:,} tokens: each one's max output less what it had received"
    # the bracket's own slack (counter_gap's) on top of what the requests could hold
    slack = COUNTER_TOLERANCE * hi + COUNTER_SLACK_PER_STREAM * n
    if delta > hi + above + slack:
        return (
            f"{figures}: more than the requests open at the window's close could still have "
            f"generated and not sent ({room_above}), so not tokens on their way (not a "
            "lagging server): the server counted tokens it never streamed (its usage counts "
            "fewer than it sent, or its counter is not to be trusted): the figures are not to "
            "be trusted"
        )
    if delta < lo - below - slack:
        return (
            f"{figures}: fewer generated than received, by more than the requests open at the "
            f"window's start could have generated before it ({room_below}): the client "
            "credited tokens the server did not generate (its usage counts more than it "
            "sent): the figures are not to be trusted"
        )
    return None


def ended_early(rec: StreamRecord, max_output: int) -> bool:
    """A finished request that really ended before max output: a finish reason other than
    ``length``, or (no finish reason) fewer tokens than asked, counted exactly."""
    if rec.finish_reason is not None:
        return rec.finish_reason != "length"
    return rec.count_method in EXACT and rec.n_tokens < max_output


def server_queued(waiting: Sequence[float], running: Sequence[float], n: int) -> bool:
    """Did the server queue our requests during the window (effective concurrency below N)?

    From the 1 Hz samples of the server's gauges: requests waited in at least a quarter of the
    samples, or the median sample ran fewer than N. Medians and fractions, not means: a restart
    leaves a slot empty for the moment the new request spends in the server's front end, and
    vLLM admits a burst of new requests over two scheduler steps, so single samples below N are
    normal and are not queueing (a mean of 7.4 at N = 8 was flagged by an earlier rule).
    """
    if waiting and sum(1 for w in waiting if w > 0) >= max(1, len(waiting) // 4):
        return True
    return bool(running) and statistics.median(running) < n


def _short(error: str) -> str:
    """An error kind for the cell's summary: every known secret redacted before the cut."""
    error = redact_known(error)
    return error if len(error) <= 160 else error[:157] + "..."
