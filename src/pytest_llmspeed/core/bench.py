"""One benchmark run against one server: its event loop, connection, identity and warm-ups.

Synchronous facade over the async core, so the pytest layer (plain test items) can drive it.
No pytest import here.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, TypeVar
from urllib.parse import urlsplit

from ..results import CellId, CellRecord
from .bandwidth import MemoryModel
from .client import Connection
from .conversation import ConversationResult, block_size_from_metrics, run_conversations
from .errors import CellCut, LLMSpeedError
from .heartbeat import LoopLag
from .matrix import Limits, resolve_context
from .openloop import (
    OpenLoopResult,
    Trace,
    expected_hit_share,
    fitting,
    rate_plan,
    rate_schedule,
    run_open_loop,
    trace_plan,
)
from .probe import ServerInfo, probe
from .prompt_text import PromptText
from .prompts import PromptFactory
from .protocol import (
    DecodeResult,
    DecodeTick,
    PrefillResult,
    median_prefill,
    negotiate,
    run_decode,
    run_prefill,
)
from .records import (
    conversation_record,
    decode_record,
    open_record,
    prefill_record,
    unmeasured_record,
)
from .replicas import ReplicaSet, per_replica_tok_s, probe_replicas
from .stats import RequestBounds
from .status import MAX_ERROR_RATE, cell_status
from .text import Secret, secret
from .wire import Dialect

T = TypeVar("T")

#: after a run is stopped by an exception from outside its loop (a signal handler's, e.g. a
#: timeout plugin's): how long the tasks it left get to end once cancelled
CANCEL_GRACE_S = 5.0

#: --llm-client-processes=auto
AUTO = "auto"
#: ... adds a process for the next cells when a cell's client used more of a core than this
AUTO_CPU_SHARE = 0.8


def more_processes(current: int, lag: LoopLag | None, cores: int) -> str | None:
    """With ``--llm-client-processes=auto``: why the next cells need one more client process
    than the ``current`` one(s) (the busiest used more than AUTO_CPU_SHARE of a core over the
    window, or its event loop fell behind), in words; None when they do not, or when there is
    no core for one more."""
    if lag is None or current >= cores:
        return None
    if lag.cpu_share is not None and lag.cpu_share > AUTO_CPU_SHARE:
        return f"used {lag.cpu_share:.0%} of a core"
    return "fell behind" if lag.behind else None


def was_interrupted(runner: asyncio.Runner) -> bool:
    """Did Ctrl-C reach this runner?

    On Ctrl-C, asyncio.Runner cancels the task and raises KeyboardInterrupt only if the
    cancellation comes back out; one absorbed on the way (Python 3.11's wait_for can, when its
    inner future finishes at the same moment) would let the run go on. The Runner keeps its
    count of SIGINTs in a private attribute and offers no public way to read it: this is the
    one place that reads it (tests/unit/test_private_access.py fails if it goes away)."""
    return bool(getattr(runner, "_interrupt_count", 0))


@dataclass(frozen=True)
class Deadline:
    """When the runs of a cell must stop (``time.perf_counter()``), and what stopped them, in
    words (``cut after 10 s by pytest-timeout``): the caller's limit, not the server's."""

    at: float
    words: str


async def _until(coro: Coroutine[Any, Any, T], deadline: Deadline) -> T:
    """``coro``, cancelled at the deadline (its ``finally`` blocks close its streams); raises
    CellCut then. A TimeoutError of the coroutine's own passes as it is."""
    remaining = deadline.at - time.perf_counter()
    if remaining <= 0:
        coro.close()
        raise CellCut(deadline.words)
    limit = asyncio.timeout(remaining)
    try:
        async with limit:
            return await coro
    except TimeoutError:
        if limit.expired():
            raise CellCut(deadline.words) from None
        raise


def _cancel_left(loop: asyncio.AbstractEventLoop) -> None:
    """Cancel the tasks a run left on the loop (an exception from a signal handler stopped
    ``run_until_complete`` with the cell's streams still reading) and let them end, within
    CANCEL_GRACE_S: the next run of the loop must not resume them."""
    left = [t for t in asyncio.all_tasks(loop) if not t.done()]
    if not left:
        return
    for task in left:
        task.cancel()
    loop.run_until_complete(asyncio.wait(left, timeout=CANCEL_GRACE_S))


@dataclass
class BenchConfig:
    base_url: str
    #: the API key: its repr is <redacted> (a traceback with locals shows no key); revealed
    #: only in the Authorization header
    api_key: Secret | None
    model: str | None
    api: str
    max_output: int
    duration: float
    timeout: float
    kv_capacity: int | None
    kv_capacity_source: str = "given"  # in words, for the report (the option that set it)
    max_model_len: int | None = None  # given by the user: wins over the server's
    prefill_repeats: int = 1  # cold requests per prefill cell; the figure is their median
    text_prompts: bool = False  # completions prompts as text sized with /tokenize, not ids
    prompt_text: PromptText | None = None  # --llm-prompt-text: the prompts' material
    precision: float | None = None  # end a decode window early at this interval half-width
    min_duration: float = 5.0  # ... but not before this many seconds
    endpoints: tuple[str, ...] = ()  # the replicas of one model, when several (base_url first)
    metrics_urls: tuple[str, ...] = ()  # where /metrics lives, when not on the endpoints
    max_error_rate: float = MAX_ERROR_RATE  # failed requests a decode cell allows (a fraction)
    #: --llm-slo's per-request bounds: a decode cell's goodput counts the requests that met them
    request_bounds: RequestBounds | None = None
    #: what the distance to the bandwidth bound needs (the model's bytes, the GPU's peak)
    memory: MemoryModel | None = None
    #: client processes that read a decode cell's streams, or AUTO (one, and one more for
    #: the next cells when a cell's busiest process used more than AUTO_CPU_SHARE of a core or
    #: fell behind)
    client_processes: int | str = 1
    #: chat requests offer one function with tool_choice "required" (``--llm-tools``)
    tools: bool = False

    def __post_init__(self) -> None:
        self.api_key = secret(self.api_key)  # a plain string from a script: a Secret too
        _check_addresses(self)


def is_sim_spec(url: str) -> bool:
    """``sim`` or ``sim:PROFILE?key=value&...``: the built-in simulator, started by
    :meth:`Bench.start`."""
    return url == "sim" or url.startswith("sim:")


def _check_addresses(cfg: BenchConfig) -> None:
    """A ValueError, in one line, for an address the client cannot use: raised when the
    config is made, before anything is opened."""
    if is_sim_spec(cfg.base_url):
        from ..sim import parse_sim_spec  # light: the server is imported when it starts

        parse_sim_spec(cfg.base_url)  # a bad profile or option, named
        if cfg.endpoints:
            raise ValueError(
                f"BenchConfig: base_url {cfg.base_url!r} is the built-in simulator, one "
                "endpoint: leave endpoints out (simulated replicas: 'sim:PROFILE?replicas=2')"
            )
        return
    named = [("base_url", cfg.base_url)]
    named += [("endpoints", u) for u in cfg.endpoints]
    named += [("metrics_urls", u) for u in cfg.metrics_urls]
    for name, url in named:
        try:
            parts = urlsplit(url)
            usable = parts.scheme in ("http", "https") and bool(parts.hostname)
        except ValueError:
            usable = False
        if not usable:
            raise ValueError(
                f"BenchConfig: {name} {url!r} is not an http(s) URL: give the server's, "
                "e.g. http://127.0.0.1:8000, or 'sim' / 'sim:PROFILE?speed=10' to start "
                "the built-in simulator"
            )


@dataclass
class Bench:
    """Owns one event loop (``asyncio.Runner``) and one aiohttp session for the whole run;
    for a ``sim`` spec, the simulator too. A context manager: ``with Bench(config) as
    bench:`` closes it at the end (:meth:`close`)."""

    config: BenchConfig
    runner: asyncio.Runner = field(default_factory=asyncio.Runner)
    conn: Connection | None = None  # the server; with several replicas, the first
    replicas: ReplicaSet | None = None  # several replicas, or /metrics elsewhere
    server: ServerInfo | None = None
    factory: PromptFactory | None = None
    dialect: Dialect | None = None
    prefills: dict[int, PrefillResult] = field(default_factory=dict)
    #: the simulator's base URLs, one per replica, while it runs (a sim spec as base_url)
    sim_urls: tuple[str, ...] = field(default=(), init=False)
    #: the simulator's processes, when the base URL is a sim spec (stopped by close())
    _simulators: contextlib.ExitStack | None = field(default=None, init=False, repr=False)
    _auto: int = 1  # with client_processes AUTO: the processes the next decode cell uses
    #: when the runs of the cell now measured must stop (a caller's time limit), else None
    deadline: Deadline | None = None

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """``coro`` on the bench's loop, within ``deadline`` when one is set (CellCut past it).
        Stopped from outside (Ctrl-C, an exception from a signal handler), the run leaves no
        task behind: what it started is cancelled, its streams closed, before this raises."""
        if self.deadline is not None:
            coro = _until(coro, self.deadline)
        try:
            result = self.runner.run(coro)
        except BaseException:
            _cancel_left(self.runner.get_loop())
            raise
        if was_interrupted(self.runner):
            raise KeyboardInterrupt
        return result

    def start(self) -> ServerInfo:
        """Connect, probe the server and negotiate the request dialect. A ``sim`` spec as
        the base URL starts the built-in simulator first, each replica a child process
        (``running_simulator_processes``). Raises LLMSpeedError; what it opened (the
        connection, the simulator) is closed again then."""
        try:
            self.sim_urls = self._simulator()
            self.run(self._start())
        except BaseException:
            self._release()
            raise
        assert self.server is not None
        return self.server

    def _simulator(self) -> tuple[str, ...]:
        """For a ``sim`` spec as the base URL: start the simulator, return its base URLs;
        else nothing."""
        cfg = self.config
        if not is_sim_spec(cfg.base_url):
            return ()
        from ..sim import parse_sim_spec, running_simulator_processes

        self._simulators = contextlib.ExitStack()
        simulators = running_simulator_processes(parse_sim_spec(cfg.base_url))
        try:
            return tuple(self._simulators.enter_context(simulators))
        except RuntimeError as exc:  # it did not start: its last lines of stderr
            raise LLMSpeedError(str(exc)) from None

    async def _start(self) -> None:
        cfg = self.config

        async def ask(conn: Connection) -> ServerInfo:
            return await probe(
                conn, cfg.model, cfg.kv_capacity, cfg.kv_capacity_source, cfg.max_model_len
            )

        sim = self.sim_urls  # the simulator's, when the base URL is a sim spec
        base_url = sim[0] if sim else cfg.base_url
        endpoints = sim if len(sim) > 1 else cfg.endpoints
        if len(endpoints) > 1 or cfg.metrics_urls:
            urls = endpoints or (base_url,)
            self.replicas = ReplicaSet.open(urls, cfg.api_key, cfg.timeout, cfg.metrics_urls)
            self.conn = self.replicas.primary
            self.server = await probe_replicas(self.replicas, ask, cfg.kv_capacity is not None)
        else:
            self.conn = Connection.open(base_url, cfg.api_key, cfg.timeout)
            self.server = await ask(self.conn)
        self.factory = PromptFactory(
            self.conn,
            self.server.model,
            api=cfg.api,
            text=cfg.text_prompts,
            material=cfg.prompt_text,
        )
        self.dialect = await negotiate(self.conn, self.factory, self.server.model, cfg.api)
        self.dialect.tools = cfg.tools and cfg.api == "chat"

    def close(self) -> None:
        """Close the connection, stop the simulator this bench started, end the event
        loop. Once is enough; again does nothing."""
        try:
            self._release()
        finally:
            self.runner.close()

    def _release(self) -> None:
        """Close the connection and stop the simulator, each once; the loop stays."""
        try:
            if self.conn is not None:
                conn, self.conn = self.conn, None
                self.run(conn.close())
        finally:
            if self._simulators is not None:
                simulators, self._simulators = self._simulators, None
                simulators.close()

    def __enter__(self) -> Bench:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    @property
    def limits(self) -> Limits:
        s = self.server
        if s is None:
            return Limits(None, None)
        return Limits(s.kv_capacity, s.max_model_len, s.replica_count)

    def resolve(self, context: int | str, max_output: int | None = None) -> int | None:
        budget = self.config.max_output if max_output is None else max_output
        return resolve_context(context, self.limits.max_model_len, budget)

    def prefill(self, context: int, max_tokens: int) -> PrefillResult:
        """The prefill cell at ``context`` (cold cache); it also warms the shared prefix.

        A context is measured once per run: a second call returns the first result, since the
        cache is warm by then and the figure would be wrong.
        """
        if context not in self.prefills:
            assert self.conn and self.factory and self.dialect and self.server
            first = self.run(
                run_prefill(
                    self.conn,
                    self.factory,
                    self.dialect,
                    self.server.model,
                    context,
                    max_tokens,
                    watch_metrics=self.server.has_metrics,
                    metrics_from=self.replicas,
                )
            )
            self._warm_other_replicas(context, max_tokens)
            more = [self._cold(context, max_tokens) for _ in range(self.config.prefill_repeats - 1)]
            self.prefills[context] = median_prefill([first, *more])
        return self.prefills[context]

    def rewarm(self, context: int, max_tokens: int) -> None:
        """After a restart of the server: warm the shared prefix of ``context`` again, on
        every replica (one request each, not measured), so the cells that follow find it
        cached. The prefill cell keeps the figure measured before."""
        assert self.conn and self.factory and self.dialect and self.server
        self.run(
            run_prefill(
                self.conn,
                self.factory,
                self.dialect,
                self.server.model,
                context,
                max_tokens,
                watch_metrics=False,
            )
        )
        self._warm_other_replicas(context, max_tokens)

    def prefill_again(self, context: int, max_tokens: int) -> PrefillResult:
        """Measure the prefill cell once more (``prefill_repeats`` cold requests), each on a new
        cold prefix (a fresh salt)."""
        return median_prefill(
            [self._cold(context, max_tokens) for _ in range(self.config.prefill_repeats)]
        )

    def _warm_other_replicas(self, context: int, max_tokens: int) -> None:
        """Every replica but the first (which the prefill cell warmed) gets the prefill cell's
        prompt, so each holds P(C) before a decode window opens; not measured."""
        if self.replicas is None or len(self.replicas.connections) < 2:
            return
        assert self.factory and self.dialect and self.server
        factory, dialect, model = self.factory, self.dialect, self.server.model

        async def warm_all() -> None:
            await asyncio.gather(
                *(
                    run_prefill(
                        conn, factory, dialect, model, context, max_tokens, watch_metrics=False
                    )
                    for conn in self.replicas.connections[1:]  # type: ignore[union-attr]
                )
            )

        self.run(warm_all())

    def _cold(self, context: int, max_tokens: int) -> PrefillResult:
        """One cold request at ``context`` on a prefix never sent before (a fresh salt)."""
        assert self.conn and self.factory and self.dialect and self.server
        factory = self.factory.fresh()
        return self.run(
            run_prefill(
                self.conn,
                factory,
                self.dialect,
                self.server.model,
                context,
                max_tokens,
                watch_metrics=self.server.has_metrics,
                metrics_from=self.replicas,
            )
        )

    def decode(
        self,
        context: int,
        concurrency: int,
        on_tick: Callable[[DecodeTick], None] | None = None,
    ) -> DecodeResult:
        """One sustained-decode cell; ``on_tick`` sees the window about once a second."""
        assert self.conn and self.factory and self.dialect and self.server
        cfg = self.config
        asked = cfg.client_processes if isinstance(cfg.client_processes, int) else self._auto
        result = self.run(
            run_decode(
                self.replicas or self.conn,
                self.factory,
                self.dialect,
                self.server.model,
                context,
                concurrency,
                cfg.max_output,
                cfg.duration,
                watch_metrics=self.server.has_metrics,
                precision=cfg.precision,
                min_duration=cfg.min_duration,
                on_tick=on_tick,
                request_bounds=cfg.request_bounds,
                processes=asked,
            )
        )
        notes = list(result.notes)
        if result.client_processes < asked:
            why = "one per stream at most" if self.replicas is None else "several replicas"
            notes.append(f"client processes: {asked} asked, {result.client_processes} used ({why})")
        if cfg.client_processes == AUTO and asked == self._auto:
            more = more_processes(asked, result.client_lag, os.cpu_count() or 1)
            if more is not None:
                self._auto += 1
                notes.append(f"client processes: {asked} {more}: the next cells use {self._auto}")
        result = dataclasses.replace(result, notes=tuple(notes))
        if self.replicas is not None and len(self.replicas.connections) > 1:
            split = per_replica_tok_s(result.records, result.window, len(self.replicas.connections))
            result = dataclasses.replace(result, replica_tok_s=split)
        return result

    def prefill_cell(self, context: int | str, max_tokens: int) -> CellRecord:
        """The prefill cell at ``context`` (8192 or "max") as the pytest layer records it: its
        figures, or why it failed (:func:`~.status.cell_status`). Warms the shared prefix."""
        cid = CellId.prefill(context)
        tokens = self._tokens(context)
        try:
            result = self.prefill(tokens, max_tokens)
        except LLMSpeedError as exc:
            return _stopped(cid, exc, tokens)
        return prefill_record(context, result)

    def decode_cell(
        self,
        context: int | str,
        concurrency: int,
        on_tick: Callable[[DecodeTick], None] | None = None,
    ) -> CellRecord:
        """The decode cell (``context``, ``concurrency``) as the pytest layer records it: its
        figures and its status (:func:`~.status.cell_status`, with ``config.max_error_rate``).
        Warm its prefix first (:meth:`prefill_cell`)."""
        cid = CellId.decode(context, concurrency)
        tokens = self._tokens(context)
        try:
            result = self.decode(tokens, concurrency, on_tick)
        except LLMSpeedError as exc:
            return _stopped(cid, exc, tokens)
        return decode_record(context, result, self.config.max_error_rate, self.config.memory)

    def rate(
        self,
        context: int,
        rate: float,
        burstiness: float = 1.0,
        seed: int = 0,
        cold: bool = False,
    ) -> OpenLoopResult:
        """One rate cell (docs/workloads.md): requests at ``context`` tokens arriving at
        ``rate`` per second (gamma gaps of shape ``burstiness``; 1: Poisson) for the config's
        duration, each with the config's max output, sent whatever the server does. Warm the
        context's prefix first (:meth:`prefill`): its requests share it, as a decode cell's;
        ``cold``: each request a prompt of its own, none of it cached (new users)."""
        assert self.conn and self.factory and self.dialect and self.server
        cfg = self.config
        times = rate_schedule(rate, cfg.duration, burstiness, seed)
        factory, dialect, model = self.factory, self.dialect, self.server.model

        async def cell() -> OpenLoopResult:
            plan = await rate_plan(factory, dialect, model, context, cfg.max_output, times, cold)
            target = self.replicas or self.conn
            assert target is not None
            return await run_open_loop(
                target, dialect, plan, cfg.duration, watch_metrics=self.server_has_metrics
            )

        return self.run(cell())

    def replay(self, trace: Trace, speed: float = 1.0) -> OpenLoopResult:
        """One trace cell: ``trace``'s requests at its times divided by ``speed``, their
        prompts sharing the blocks their hash ids name (token-id prompts only). The requests
        that do not fit in the server's max_model_len are left out, said in the cell's notes
        (none fits: a :class:`~.openloop.TraceError` naming the first's line), beside what
        reading the file left out (:attr:`~.openloop.Trace.notes`)."""
        assert self.conn and self.factory and self.dialect and self.server
        trace, left_out = fitting(trace, self.limits.max_model_len)
        factory, dialect, model = self.factory.fresh(), self.dialect, self.server.model

        async def cell() -> OpenLoopResult:
            plan = await trace_plan(factory, dialect, model, trace, speed)
            target = self.replicas or self.conn
            assert target is not None
            return await run_open_loop(
                target, dialect, plan, trace.span_s / speed, watch_metrics=self.server_has_metrics
            )

        result = self.run(cell())
        # what reading the file left out (rows of 0 tokens, lines past its bounds), then what
        # the server's context does
        notes = (*result.notes, *trace.notes, *((left_out,) if left_out else ()))
        return dataclasses.replace(
            result, expected_hit_share=expected_hit_share(trace), notes=notes
        )

    def converse(
        self,
        context: int,
        users: int,
        turns: int,
        message_tokens: int = 256,
        answer_tokens: int = 256,
        think_s: float = 1.0,
    ) -> ConversationResult:
        """One conversation cell (docs/workloads.md, "Conversations"): ``users`` conversations
        of ``turns`` turns in step, the first prompt of ``context`` tokens, each later one the
        whole history and a new message of ``message_tokens``, answers of ``answer_tokens``,
        ``think_s`` between turns. Cold: a fresh salt, so no earlier cell's prompts are
        cached. The server's answer ids are asked where it is vLLM (``return_token_ids``,
        ignored by a vLLM before 0.10.2) or the simulator; the KV block size comes from
        ``/metrics`` (unknown: no expected share)."""
        assert self.conn and self.factory and self.dialect and self.server
        factory, dialect, model = self.factory.fresh(), self.dialect, self.server.model
        conn, limit = self.conn, self.limits.max_model_len
        own_ids = self.server.engine in ("vllm", "llmspeed-sim")
        watch = self.server_has_metrics

        async def cell() -> ConversationResult:
            block = None
            if watch:
                from .probe import read_metrics

                block = block_size_from_metrics(await read_metrics(conn))
            return await run_conversations(
                conn, factory, dialect, model, context, users, turns, message_tokens,
                answer_tokens, think_s, max_model_len=limit, block_size=block,
                return_token_ids=own_ids, watch_metrics=watch,
            )  # fmt: skip

        return self.run(cell())

    def conversation_cell(
        self,
        context: int | str,
        users: int,
        turns: int,
        message_tokens: int = 256,
        answer_tokens: int = 256,
        think_s: float = 1.0,
    ) -> CellRecord:
        """The conversation cell ``conversation[C-uU-tT]`` as the pytest layer records it."""
        cid = CellId.conversation(context, users, turns)
        tokens = self._tokens(context)
        try:
            result = self.converse(tokens, users, turns, message_tokens, answer_tokens, think_s)
        except LLMSpeedError as exc:
            return _stopped(cid, exc, tokens)
        return conversation_record(cid, result, self.config.max_error_rate, tokens)

    @property
    def server_has_metrics(self) -> bool:
        return self.server is not None and self.server.has_metrics

    def rate_cell(
        self,
        context: int | str,
        rate: float,
        burstiness: float = 1.0,
        seed: int = 0,
        cold: bool = False,
    ) -> CellRecord:
        """The rate cell (``context``, ``rate``) as the pytest layer records it; its prefix
        warmed here when it is not yet (the prefill cell's request)."""
        cid = CellId.at_rate(context, rate)
        tokens = self._tokens(context)
        try:
            self.prefill(tokens, min(self.config.max_output, 16))
            result = self.rate(tokens, rate, burstiness, seed, cold)
        except LLMSpeedError as exc:
            return _stopped(cid, exc, tokens)
        return open_record(cid, result, self.config.max_error_rate, tokens)

    def trace_cell(self, trace: Trace, speed: float = 1.0) -> CellRecord:
        """The trace cell ``trace[NAME]`` as the pytest layer records it."""
        cid = CellId.trace(trace.name)
        try:
            result = self.replay(trace, speed)
        except LLMSpeedError as exc:
            return _stopped(cid, exc, 0)
        return open_record(cid, result, self.config.max_error_rate)

    def _tokens(self, context: int | str) -> int:
        tokens = self.resolve(context)
        if tokens is None or tokens < 1:
            raise LLMSpeedError(
                f"the context {context!r} resolves to no prompt length on this server "
                f"(max_model_len {self.limits.max_model_len})",
                setting="max_model_len",
            )
        return tokens

    def healthy(self) -> bool:
        """Does the server still answer?"""
        assert self.conn is not None
        if self.replicas is not None:
            return self.run(self.replicas.healthy())
        try:
            status, _ = self.run(self.conn.get("/v1/models"))
        except LLMSpeedError:
            return False
        return status == 200


def _stopped(cid: CellId, exc: LLMSpeedError, tokens: int) -> CellRecord:
    """The record of a cell an error stopped, with the status :func:`~.status.cell_status`
    gives it (a refused prompt fails the cell; other errors are errors)."""
    status = cell_status(exc)
    return unmeasured_record(cid, status.status, status.message or exc.message, tokens)
