"""Several client processes for one decode cell (``--llm-client-processes``).

The cell's slots are split over worker processes, each with its own event loop and connection
pool (:class:`~.streams.Streams` on its share of the slots, prompts from its own copy of the
run's prompt factory: the same prompts, indices apart). ``time.perf_counter`` is
CLOCK_MONOTONIC on Linux, one clock for every process, so the parent opens and closes the
window on it as for one process: a worker says when each of its slots has had a first token
(the window opens at the last of them), and reads nothing after the stop time the parent sets.
At the close each worker sends its streams' records (their counted arrays, 12 bytes a read)
and its heartbeat; the parent concatenates them, and the cell's figures are computed on them
exactly as on one process's records (docs/client-at-scale.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import dataclasses
import math
import multiprocessing
import time
from array import array
from dataclasses import dataclass, field
from multiprocessing.connection import Connection as Pipe
from typing import Any

from .client import Connection, StreamRecord
from .errors import KeyRejected, LLMSpeedError
from .heartbeat import Heartbeat
from .prompts import PromptFactory
from .streams import PromptSource, Streams
from .text import Secret

#: how often a worker looks at the parent's stop and close (and says how many slots have a
#: first token)
POLL_S = 0.005
#: bytes of a worker's reason to stop early, shared with the parent
REASON_BYTES = 512
#: prompt indices of worker ``i`` start at ``(i + 1) × INDEX_SPAN`` above the parent's
INDEX_SPAN = 10_000_000
#: seconds beyond the connection timeout a worker has to send its streams after the close
CLOSE_GRACE_S = 30.0


def split(slots: int, processes: int) -> list[list[int]]:
    """Slots 0 … slots−1 over ``processes`` shares, in turn (sizes differ by one at most)."""
    return [list(range(i, slots, processes)) for i in range(processes)]


def portable(factory: PromptFactory, index: int) -> PromptFactory:
    """A copy of the run's prompt factory a worker can receive (no connection) and whose
    prompt indices do not meet the parent's or another worker's."""
    tokenizer = factory.tokenizer
    out = copy.copy(factory)
    out.conn = None  # type: ignore[assignment]  # the worker's own, at attach()
    out._tokenizer = dataclasses.replace(tokenizer, conn=None)  # type: ignore[arg-type]
    out._issued = {c: k + (index + 1) * INDEX_SPAN for c, k in factory._issued.items()}
    return out


def attach(factory: PromptFactory, conn: Connection) -> PromptFactory:
    factory.conn = conn
    if factory._tokenizer is not None:
        factory._tokenizer.conn = conn
    return factory


@dataclass
class WorkerSpec:
    """What a worker needs to run its share of a cell (sent to it once, pickled)."""

    index: int
    base_url: str
    api_key: Secret | None
    timeout: float
    path: str
    slots: list[int]
    n: int  # the cell's whole concurrency
    factory: PromptFactory
    context: int
    fields: dict[str, Any]
    keep_reads: bool = False


@dataclass
class WorkerResult:
    """What a worker sends back at the close."""

    records: list[StreamRecord] = field(default_factory=list)
    beat_times: array[float] = field(default_factory=lambda: array("d"))
    beat_lates: array[float] = field(default_factory=lambda: array("d"))
    beat_cpu: array[float] = field(default_factory=lambda: array("d"))
    key_rejected: str | None = None
    error: str | None = None  # the worker itself failed (not the server)


class Shared:
    """The values parent and workers share: each worker's window-open time (0: not yet), its
    slots with a first token, its reason to stop early; the stop time (reads after it are not
    counted) and the close."""

    def __init__(self, ctx: Any, processes: int) -> None:
        self.ready = ctx.Array("d", processes, lock=False)
        self.have = ctx.Array("i", processes, lock=False)
        self.reasons = [ctx.Array("c", REASON_BYTES, lock=False) for _ in range(processes)]
        self.stop_at = ctx.Value("d", math.inf, lock=False)
        self.close = ctx.Value("i", 0, lock=False)


def worker_main(spec: WorkerSpec, shared: Shared, pipe: Pipe) -> None:
    """A worker process: its share of the cell's slots until the parent closes the window."""
    try:
        result = asyncio.run(_run(spec, shared))
    except KeyboardInterrupt:  # Ctrl-C reaches the whole process group: the parent says it
        result = WorkerResult()
    except BaseException as exc:  # sent, not raised: the parent says it in one line
        what = str(exc) if isinstance(exc, LLMSpeedError) else f"{type(exc).__name__}: {exc}"
        result = WorkerResult(error=what)
    with contextlib.suppress(OSError):
        pipe.send(result)
        pipe.close()


async def _run(spec: WorkerSpec, shared: Shared) -> WorkerResult:
    conn = Connection.open(spec.base_url, spec.api_key, spec.timeout)
    i = spec.index
    try:
        factory = attach(spec.factory, conn)
        prompts = PromptSource(factory, spec.context, spec.fields, 2 * len(spec.slots) + 8)
        await prompts.build()
        await conn.warm_pool(len(spec.slots))

        def on_open(t: float) -> None:
            shared.ready[i] = t

        def on_abort() -> None:
            reason = (streams.aborted or "stopped").encode()[: REASON_BYTES - 1]
            shared.reasons[i].value = reason

        streams = Streams(
            conn, spec.path, prompts, spec.slots, spec.n, on_open, on_abort, spec.keep_reads
        )
        heart = Heartbeat()
        loop = asyncio.get_running_loop()
        beat = loop.create_task(heart.run())
        streams.start()
        while not shared.close.value:
            shared.have[i] = streams.with_token
            streams.stop.set(shared.stop_at.value)
            await asyncio.sleep(POLL_S)
        beat.cancel()
        await asyncio.gather(beat, return_exceptions=True)
        result = WorkerResult(beat_times=heart.times, beat_lates=heart.lates, beat_cpu=heart.cpu)
        try:
            await streams.close(shared.stop_at.value)
        except KeyRejected as exc:
            result.key_rejected = str(exc)
        if streams.failure is not None:
            result.error = streams.failure
        result.records = streams.records
        return result
    finally:
        await conn.close()


class ProcessStreams:
    """A cell's slots run by worker processes, seen from the parent as one set of streams."""

    def __init__(self, specs: list[WorkerSpec]) -> None:
        ctx = multiprocessing.get_context("spawn")
        self.timeout = max(spec.timeout for spec in specs)
        self.shared = Shared(ctx, len(specs))
        self.pipes: list[Pipe] = []
        self.processes = []
        for spec in specs:
            here, there = ctx.Pipe(duplex=False)
            proc = ctx.Process(target=worker_main, args=(spec, self.shared, there), daemon=True)
            self.pipes.append(here)
            self.processes.append(proc)
        self.records: list[StreamRecord] = []
        self.heartbeats: list[Heartbeat] = []
        self.stop = _SharedStop(self.shared)
        self._closed = False

    def start(self) -> None:
        for proc in self.processes:
            proc.start()

    async def wait_open(self, timeout: float) -> float | None:
        """When the last worker's slots all had a first token; None: not within ``timeout``
        seconds, or a worker stopped early."""
        deadline = time.perf_counter() + timeout
        while time.perf_counter() < deadline and self.aborted is None:
            ready = [float(t) for t in self.shared.ready]
            if all(t > 0 for t in ready):
                return max(ready)
            if any(not p.is_alive() for p in self.processes):
                return None
            await asyncio.sleep(POLL_S)
        return None

    @property
    def with_token(self) -> int:
        return sum(self.shared.have)

    @property
    def aborted(self) -> str | None:
        for reason in self.shared.reasons:
            if reason.value:
                return str(reason.value.decode(errors="replace"))
        if not self._closed:
            for proc in self.processes:
                if proc.exitcode is not None:
                    return f"a client process ended early (exit code {proc.exitcode})"
        return None

    async def close(self, at: float | None = None) -> None:
        """Stop every worker's streams, collect their records (ordered by their sends) and
        heartbeats; re-raise a rejected key; a worker that failed is one line."""
        if self._closed:
            return
        self._closed = True
        self.stop.set(time.perf_counter() if at is None else at)
        self.shared.close.value = 1
        loop = asyncio.get_running_loop()
        deadline = time.perf_counter() + self.timeout + CLOSE_GRACE_S
        results = await asyncio.gather(
            *(loop.run_in_executor(None, _receive, pipe, proc, deadline) for pipe, proc in zip(
                self.pipes, self.processes, strict=True
            ))
        )  # fmt: skip
        for proc in self.processes:
            proc.join(5)
            if proc.is_alive():
                proc.kill()
        records: list[StreamRecord] = []
        for res in results:
            records += res.records
            heart = Heartbeat()
            heart.times, heart.lates, heart.cpu = res.beat_times, res.beat_lates, res.beat_cpu
            self.heartbeats.append(heart)
        self.records[:] = sorted(records, key=lambda r: r.t_send)
        for res in results:
            if res.key_rejected:
                raise KeyRejected(res.key_rejected)
        failed = [res.error for res in results if res.error]
        if failed:
            raise WorkerFailed(f"a client process failed: {failed[0]}")


class WorkerFailed(LLMSpeedError):
    """A client process failed (not the server): the cell's error, in one line."""


def _receive(pipe: Pipe, proc: Any, deadline: float) -> WorkerResult:
    """A worker's result (blocking: run in a thread); a worker that died sends none, and one
    that has not sent it by ``deadline`` is stopped."""
    while time.perf_counter() < deadline:
        if pipe.poll(0.1):
            try:
                result: WorkerResult = pipe.recv()
            except EOFError:
                break
            return result
        if not proc.is_alive() and not pipe.poll(0):
            break
    else:
        proc.kill()
        return WorkerResult(error="it did not send its streams within its timeout: stopped")
    return WorkerResult(error=f"it ended (exit code {proc.exitcode}) before sending its streams")


class _SharedStop:
    """The stop time, set by the parent, read by every worker."""

    def __init__(self, shared: Shared) -> None:
        self.shared = shared

    def set(self, t: float) -> None:
        self.shared.stop_at.value = min(self.shared.stop_at.value, t)
