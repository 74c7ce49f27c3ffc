"""The simulator's own record (``GET /sim/trace``) matched request by request with what the
client received, and the bounds that the loopback's measured delays put on the plugin's figures.

The simulator runs in a child process. On Linux ``time.perf_counter`` reads CLOCK_MONOTONIC,
one clock for every process, so the server's stamps and the client's compare directly (the
tests check it: no delay comes out negative). For each request two delays are measured:

- the trip in: the server's arrival stamp minus the client's send stamp (the client write,
  loopback, the server's front end before it stamps arrival);
- the trip out of each chunk: the client's read that completed the chunk minus the server's
  stamp just before writing it. The client's reads are split into SSE events here, by this
  module's own few lines, not by the plugin's parser.

METRICS.md's TTFT counts from the client's send to the first token's arrival, so it is the
server's TTFT plus both trips: the plugin's figure must lie between the server's and the
server's plus the measured trips. A time between tokens moves by the difference of its first
and last chunk's trips out. On a quiet machine the trips are ~0.1-1 ms; on a loaded one they
grow, and so do the bounds, by what was measured, not by a guessed percentage.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

#: the simulator's own trace is ours to read whole (not a server answer under test)
TRACE_LIMIT = 1 << 30

if TYPE_CHECKING:
    from pytest_llmspeed.core.protocol import DecodeResult

#: float rounding (samples are kept to 1 us) and the two clock reads; nothing else
SLACK_MS = 0.01
#: a delay may come out this far below zero (two clock reads of one clock), no further
CLOCK_SLACK_S = 1e-5


@dataclass
class Matched:
    """One request as both ends saw it."""

    rid: str
    t_send: float  # client, just before the request was written
    arrival: float  # server, when its handler received the request
    sent: list[tuple[float, int]]  # server: (time written, tokens) per chunk the client got
    got: list[float]  # client: arrival of each of those chunks
    complete: bool  # the client read the whole stream ([DONE])
    record: Any = None  # the client's StreamRecord
    server: dict[str, Any] | None = None  # the simulator's record of the request

    @property
    def trip_in(self) -> float:
        return self.arrival - self.t_send

    @property
    def trips_out(self) -> list[float]:
        return [g - s for g, (s, _) in zip(self.got, self.sent, strict=True)]

    @property
    def tokens(self) -> int:
        return sum(n for _, n in self.sent)

    def server_ttft_ms(self) -> float:
        return (self.sent[0][0] - self.arrival) * 1e3

    def ttft_delay_ms(self) -> float:
        return (self.trip_in + self.trips_out[0]) * 1e3

    def server_tbt_ms(self) -> float:
        return (self.sent[-1][0] - self.sent[0][0]) / (self.tokens - 1) * 1e3

    def tbt_delay_ms(self) -> float:
        """How far the client's time between tokens may sit from the server's, either way."""
        out = self.trips_out
        return abs(out[-1] - out[0]) / (self.tokens - 1) * 1e3

    def tokens_inside(self, w0: float, w1: float) -> tuple[int, int]:
        """(tokens, chunks) the client received inside [w0, w1)."""
        inside = [n for g, (_, n) in zip(self.got, self.sent, strict=True) if w0 <= g < w1]
        return sum(inside), len(inside)


def _client_chunks(reads: list[tuple[float, bytes]]) -> tuple[str | None, list[float], bool]:
    """The response id, the arrival of each chunk that carries tokens (every ``choices`` chunk
    of a completions stream), and whether ``[DONE]`` was read."""
    rid: str | None = None
    times: list[float] = []
    done = False
    buf = b""
    for t, data in reads:
        buf += data
        *events, buf = buf.split(b"\n\n")
        for event in events:
            payload = event.strip().removeprefix(b"data:").strip()
            if payload == b"[DONE]":
                done = True
                continue
            if not payload.startswith(b"{"):
                continue
            if rid is None:
                rid = json.loads(payload)["id"]
            if b'"choices":[{' in payload and b'"delta":{"role"' not in payload:
                times.append(t)
    return rid, times, done


def match(records: list[Any], trace: list[dict[str, Any]]) -> list[Matched]:
    """Every client record that received a chunk, with the server's record of it (by the
    response's id); checks that both ends agree on the chunks and that no delay is negative."""
    by_id = {r["id"]: r for r in trace}
    out = []
    for rec in records:
        rid, got, done = _client_chunks(rec.reads)
        if rid is None or not got:
            continue
        server = by_id[rid]
        chunks = server["chunks"]
        assert len(got) <= len(chunks), (rid, len(got), len(chunks))
        if done:
            assert len(got) == len(chunks), rid
        m = Matched(
            rid, rec.t_send, server["arrival"], [(t, n) for t, n in chunks[: len(got)]], got, done,
            rec, server,
        )  # fmt: skip
        assert m.trip_in >= -CLOCK_SLACK_S, (rid, m.trip_in)
        assert min(m.trips_out) >= -CLOCK_SLACK_S, (rid, min(m.trips_out))
        out.append(m)
    return out


def _median(values: list[float]) -> float:
    return float(np.median(values))


def ttft_bounds(matched: list[Matched], w1: float) -> tuple[float, float, float]:
    """(lowest, highest) median TTFT the plugin may report, and the largest delay measured:
    each request's TTFT is its server TTFT plus its two trips, for requests whose first token
    reached the client before the window closed (METRICS.md)."""
    counted = [m for m in matched if m.got[0] < w1]
    truth = [m.server_ttft_ms() for m in counted]
    delay = [m.ttft_delay_ms() for m in counted]
    lo = _median(truth) - SLACK_MS
    hi = _median([t + d for t, d in zip(truth, delay, strict=True)]) + SLACK_MS
    return lo, hi, max(delay)


def tbt_bounds(matched: list[Matched], exact: bool) -> tuple[float, float, float]:
    """(lowest, highest) median time between tokens the plugin may report, and the largest
    shift measured. ``exact``: every chunk's tokens are known to the client (continuous usage);
    otherwise only streams read to their end have exact totals, and a stream cut at the
    window's end counts as unknown (±inf: it may sit anywhere in the ranking)."""
    lows, highs, shifts = [], [], []
    for m in matched:
        if m.tokens < 2 or m.got[-1] <= m.got[0]:
            continue  # the plugin has no time between tokens for it either
        if exact or m.complete:
            truth, d = m.server_tbt_ms(), m.tbt_delay_ms()
            lows.append(truth - d)
            highs.append(truth + d)
            shifts.append(d)
        else:
            lows.append(-math.inf)
            highs.append(math.inf)
    return _median(lows) - SLACK_MS, _median(highs) + SLACK_MS, max(shifts)


def token_bounds(matched: list[Matched], w0: float, w1: float, exact: bool) -> tuple[int, int]:
    """(fewest, most) output tokens the plugin may count inside [w0, w1) (client times).

    Known exactly: every request's when each chunk's tokens are known (``exact``), and
    otherwise a request with no chunk, or all its chunks, inside the window once its total is
    known. The others are counted by the plugin at a tokens-per-chunk share (of their own
    total, or of the cell's exact ones), which lies between the smallest and largest mean chunk
    of the streams read to the end; the bounds take both ends."""
    means = [m.tokens / len(m.sent) for m in matched if m.complete]
    lo = hi = 0
    for m in matched:
        tokens, chunks = m.tokens_inside(w0, w1)
        if exact or chunks == 0 or (m.complete and chunks == len(m.got)):
            lo += tokens
            hi += tokens
        elif means:  # a share rounded to whole tokens over this stream's chunks: ±0.5 / chunks
            lo += chunks * math.floor(min(means) - 0.5 / len(m.got))
            hi += chunks * math.ceil(max(means) + 0.5 / len(m.got))
        else:  # no total known anywhere: one token per chunk
            lo += chunks
            hi += chunks
    return lo, hi


async def measure(
    url: str,
    max_output: int,
    duration: float = 3.0,
    concurrency: int = 4,
    context: int = 1024,
    api: str = "completions",
    tools: bool = False,
    **decode: Any,
) -> tuple[DecodeResult, list[Matched]]:
    """One decode cell at ``context`` (its prefix warmed first) against the simulator at
    ``url``, and its requests matched with the simulator's trace of the cell. ``decode``: more
    of ``run_decode``'s options. ``api``: "completions" or "chat" (``tools``: --llm-tools)."""
    from pytest_llmspeed.core.client import Connection
    from pytest_llmspeed.core.probe import probe
    from pytest_llmspeed.core.prompts import PromptFactory
    from pytest_llmspeed.core.protocol import negotiate, run_decode, run_prefill

    conn = Connection.open(url, None, 60)
    try:
        server = await probe(conn, None, None)
        factory = PromptFactory(conn, server.model, api=api)
        dialect = await negotiate(conn, factory, server.model, api)
        dialect.tools = tools
        await run_prefill(conn, factory, dialect, server.model, context, 16)
        await conn.session.delete(conn.url("/sim/trace"))
        result = await run_decode(
            conn, factory, dialect, server.model, context, concurrency, max_output, duration,
            keep_reads=True, **decode,
        )  # fmt: skip
        status, body = await conn.get("/sim/trace", limit=TRACE_LIMIT)
        assert status == 200
    finally:
        await conn.close()
    return result, match(result.records, json.loads(body)["requests"])
