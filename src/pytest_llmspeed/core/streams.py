"""A decode cell's load: slots that each keep one request in flight, restarted at once.

One process runs all of a cell's slots, or each client process runs its share
(:mod:`.workers`); either way the slots are run by :class:`Streams` with prompts from
:class:`PromptSource`, so the requests are the same however many processes send them.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Sequence
from typing import Any

from .client import Connection, Stop, StreamRecord
from .errors import KeyRejected, LLMSpeedError
from .prompts import PromptFactory
from .recount import RECOUNT_SAMPLE
from .replicas import ReplicaSet, stream_to
from .text import for_person


def failure_words(exc: BaseException) -> str:
    """A stream task's unexpected exception in one line: what it was, where the client was."""
    what = for_person(str(exc) or "(no message)", 200)
    if isinstance(exc, LLMSpeedError):
        return f"a stream failed: {what}"
    return f"a stream failed inside the client: {type(exc).__name__}: {what}"


class PromptSource:
    """The request bodies of one share of a cell's slots.

    The first ``pool`` are built before any stream starts: request preparation must not delay
    the writes of streams already started (their TTFT clock is running). After these, every
    restart gets a fresh unique prompt where that costs no round trip to the server (token
    ids; text from its template); else (a tokenizer that defeats the template, a note says
    so) the pool is reused in turn, since a restart must not wait for /tokenize."""

    def __init__(
        self, factory: PromptFactory, context: int, fields: dict[str, Any], pool: int
    ) -> None:
        self.factory, self.context, self.fields, self.pool = factory, context, fields, pool
        self.bodies: list[bytes] = []
        self.sent = 0

    async def build(self) -> None:
        f = self.factory
        self.bodies = [
            (await f.prompt(self.context, f.next_index(self.context))).encode(self.fields)
            for _ in range(self.pool)
        ]

    async def next(self) -> bytes:
        self.sent += 1
        f = self.factory
        if self.sent <= self.pool or not f.cheap(self.context):
            return self.bodies[(self.sent - 1) % self.pool]
        return (await f.prompt(self.context, f.next_index(self.context))).encode(self.fields)


class Streams:
    """Slots that each keep one request in flight, restarted at once, until stopped.

    The window may open once every slot has had a first token (:meth:`wait_open`: the last
    one's arrival; ``on_open(t)`` is called then too); ``on_abort()`` is called when the
    requests fail too often in a row (``aborted`` says why) or the key is rejected. ``n`` is
    the cell's whole concurrency (the failures' back-off is per the cell's N, wherever its
    slots run)."""

    def __init__(
        self,
        conn: Connection | ReplicaSet,
        path: str,
        prompts: PromptSource,
        slots: Sequence[int],
        n: int,
        on_open: Callable[[float], None] | None = None,
        on_abort: Callable[[], None] | None = None,
        keep_reads: bool = False,
    ) -> None:
        self.conn, self.path, self.prompts = conn, path, prompts
        self.slots, self.n = list(slots), n
        self.on_open, self.on_abort, self.keep_reads = on_open, on_abort, keep_reads
        self.records: list[StreamRecord] = []
        self._with_token: set[int] = set()
        self._opened = asyncio.Event()
        self.open_at: float | None = None
        self.stop = Stop()
        self.stopping = False
        self.aborted: str | None = None
        self.consecutive_fail = 0
        self.tasks: list[asyncio.Task[None]] = []
        #: a stream task's exception that is not a request's error (the cell's reason)
        self.failure: str | None = None

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        self.tasks = [loop.create_task(self._slot(i)) for i in self.slots]

    @property
    def with_token(self) -> int:
        """Slots that have had a first token."""
        return len(self._with_token)

    async def wait_open(self, timeout: float) -> float | None:
        """When the last slot had its first token; None: not within ``timeout`` seconds, or
        the streams stopped early (``aborted``)."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._opened.wait(), timeout)
        return self.open_at if self.aborted is None else None

    async def close(self, at: float | None = None) -> None:
        """Stop every stream (reads after ``at``, default now, are not counted); re-raises a
        rejected key."""
        self.stopping = True
        self.stop.set(time.perf_counter() if at is None else at)
        for t in self.tasks:
            t.cancel()
        results = await asyncio.gather(*self.tasks, return_exceptions=True)
        for res in results:
            if isinstance(res, KeyRejected):
                raise res
        for res in results:
            # no stream task's exception is lost: one that ended in another exception (a bug,
            # not the server's fault: the server's are each request's error) is the cell's
            # reason
            if isinstance(res, Exception) and self.failure is None:
                self.failure = failure_words(res)
                self.aborted = self.aborted or self.failure

    def _first_token(self, slot: int) -> Callable[[StreamRecord], None]:
        def callback(rec: StreamRecord) -> None:
            if slot not in self._with_token:
                self._with_token.add(slot)
                if len(self._with_token) == len(self.slots) and self.open_at is None:
                    self.open_at = rec.t_first or time.perf_counter()
                    self._opened.set()
                    if self.on_open is not None:
                        self.on_open(self.open_at)

        return callback

    def _abort(self) -> None:
        self._opened.set()
        if self.on_abort is not None:
            self.on_abort()

    async def _slot(self, slot: int) -> None:
        n = self.n
        stop_at = self.stop.at
        # no request starts once the streams stop reading (the window has closed): it would
        # only be sent and dropped
        while not self.stopping and time.perf_counter() < stop_at[0]:
            try:
                body = await self.prompts.next()
                rec = StreamRecord(keep_reads=self.keep_reads)
                # the first requests keep their text for the re-count (core/recount.py)
                rec.tally.recount = len(self.records) < RECOUNT_SAMPLE
                self.records.append(rec)
                await stream_to(self.conn, self.path, body, rec, self._first_token(slot), self.stop)
            except KeyRejected:
                # the key stopped working: stop the cell now (not at the window's timeout)
                self.aborted = self.aborted or "the server rejected the API key"
                self._abort()
                raise
            except Exception as exc:
                # not a request's error (those are in its record): the cell stops, and says why
                self.failure = self.failure or failure_words(exc)
                self.aborted = self.aborted or self.failure
                self._abort()
                return
            if rec.error or (rec.t_first is None and not rec.cancelled):
                # a request that ended with no output token is one too (a server that answers
                # a finish at once): restarted at once, thousands a second, it held a record
                # each (90 MB in 15 s)
                self.consecutive_fail += 1
                if self.consecutive_fail >= 4 * n + 8:
                    why = rec.error or "the last ended with no output token"
                    self.aborted = (
                        f"the server failed {self.consecutive_fail} requests in a row: {why}"
                    )
                    self._abort()
                    return
                await asyncio.sleep(min(0.05 * self.consecutive_fail / n, 1.0))
            else:
                self.consecutive_fail = 0
