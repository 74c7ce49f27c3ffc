"""The measurement core against the simulator's own record of what it sent (`/sim/trace`),
request by request, within bounds made of the loopback delays measured for those very requests
(tests/core/truth.py): exact on a quiet machine, and still right on a loaded one, where the
trips grow and the bounds with them. The simulator runs in its own process, as a real server
would (its own interpreter: it does not share the client's GIL and garbage collector).
"""

import itertools
import json

import numpy as np
import pytest

from pytest_llmspeed.core import protocol
from pytest_llmspeed.core.client import Connection, StreamRecord, stream_request
from pytest_llmspeed.core.probe import probe
from pytest_llmspeed.core.prompts import PromptFactory
from pytest_llmspeed.core.protocol import negotiate, run_prefill

from .truth import SLACK_MS, TRACE_LIMIT, match, measure, tbt_bounds, token_bounds, ttft_bounds

pytestmark = [pytest.mark.asyncio, pytest.mark.slow]


async def _trace(conn):
    status, body = await conn.get("/sim/trace", limit=TRACE_LIMIT)
    assert status == 200
    return json.loads(body)["requests"]


@pytest.mark.parametrize("concurrency", [1, 8])
async def test_decode_cell_agrees_with_the_servers_own_record(reference_sim, concurrency):
    result, matched = await measure(reference_sim, 4096, 4.0, concurrency, context=8192)
    stats = result.stats
    w0, w1 = result.window
    assert len(matched) >= concurrency
    # continuous usage: every chunk's tokens are known, so the count is exact, not approximate
    assert result.token_accounting == "usage"
    assert token_bounds(matched, w0, w1, exact=True) == (stats.output_tokens,) * 2
    assert stats.total_tok_s == pytest.approx(stats.output_tokens / 4.0, rel=1e-9)
    assert stats.ttft_ms is not None and stats.tbt_ms is not None
    lo, hi, delay = ttft_bounds(matched, w1)
    assert lo <= stats.ttft_ms <= hi, f"TTFT {stats.ttft_ms:.3f} ms, trips up to {delay:.3f} ms"
    lo, hi, shift = tbt_bounds(matched, exact=True)
    assert lo <= stats.tbt_ms <= hi, f"TBT {stats.tbt_ms:.4f} ms, shifts up to {shift:.4f} ms"
    assert result.received_span is not None and result.generation_tokens_delta is not None
    span_lo, span_hi = result.received_span
    assert span_lo * 0.98 <= result.generation_tokens_delta <= span_hi * 1.02


async def test_prefill_ttft_and_exact_prompt_length(reference_sim, monkeypatch):
    records = []

    async def recorded(conn, path, payload):  # the real request; the test keeps its record
        records.append(await stream_request(conn, path, payload, StreamRecord(keep_reads=True)))
        return records[-1]

    monkeypatch.setattr(protocol, "stream_request", recorded)
    conn = Connection.open(reference_sim, None, 60)
    try:
        server = await probe(conn, None, None)
        factory = PromptFactory(conn, server.model)
        dialect = await negotiate(conn, factory, server.model, "completions")
        await conn.session.delete(conn.url("/sim/trace"))
        result = await run_prefill(conn, factory, dialect, server.model, 8192, 16)
        trace = await _trace(conn)
    finally:
        await conn.close()
    (req,) = trace
    assert req["prompt_tokens"] == 8192 and req["cached_tokens"] == 0  # a cold prefill
    (m,) = match(records[-1:], trace)
    server_ttft = m.server_ttft_ms()
    delay = m.ttft_delay_ms()
    assert server_ttft - SLACK_MS <= result.ttft_ms <= server_ttft + delay + SLACK_MS, (
        f"TTFT {result.ttft_ms:.3f} ms, server {server_ttft:.3f} ms, trips {delay:.3f} ms"
    )
    assert result.prompt_tok_s == pytest.approx(8192 / result.ttft_ms * 1e3)


def _groups(m):
    """A matched request's arrivals as the client saw them: the chunks a read brought
    together are one arrival, at the read's time, ending with the group's last chunk."""
    out: list[tuple[float, float]] = []  # (client time, server time of its last chunk)
    for g, (s, _) in zip(m.got, m.sent, strict=True):
        if out and out[-1][0] == g:
            out[-1] = (g, s)
        else:
            out.append((g, s))
    return out


async def test_every_gap_and_end_to_end_agree_with_the_servers_own_record(reference_sim):
    """Inter-token latency over every gap (its median, p90, p99 and largest) and end-to-end
    latency against the simulator's stamps: each client gap is the server's gap between the
    same chunks plus the difference of their trips out, each end-to-end the server's plus the
    trips in and out, all measured; order statistics are monotone, so each figure lies between
    the same statistic of the server's values less and plus their trips."""
    result, matched = await measure(reference_sim, 256, 4.0, 8, context=8192)
    stats = result.stats
    w0, w1 = result.window
    lows, highs = [], []
    for m in matched:
        arrivals = _groups(m)
        for (g0, s0), (g1, s1) in itertools.pairwise(arrivals):
            if w0 <= g1 < w1:
                shift = abs((g1 - s1) - (g0 - s0))
                lows.append((s1 - s0 - shift) * 1e3)
                highs.append((s1 - s0 + shift) * 1e3)
    assert stats.itl is not None and stats.itl.n == len(lows) > 10  # quiet: about 1,000
    for q, got in ((50, stats.itl.median_ms), (90, stats.itl.p90_ms), (99, stats.itl.p99_ms)):
        if len(lows) < 100 / (100 - q):  # too few gaps for the rank: no figure
            assert got is None, (q, len(lows))
            continue
        lo, hi = np.percentile(lows, q), np.percentile(highs, q)
        assert got is not None and lo - SLACK_MS <= got <= hi + SLACK_MS, (q, lo, got, hi)
    assert max(lows) - SLACK_MS <= stats.itl.max_ms <= max(highs) + SLACK_MS
    finished = [m for m in matched if m.complete and w0 <= m.got[-1] < w1]
    assert stats.e2e is not None and stats.e2e.n == len(finished) > 0
    server = [(m.sent[-1][0] - m.arrival) * 1e3 for m in finished]
    trips = [(m.trip_in + m.trips_out[-1]) * 1e3 for m in finished]
    lo = float(np.median(server))
    hi = float(np.median([s + t for s, t in zip(server, trips, strict=True)]))
    assert lo - SLACK_MS <= stats.e2e.median_ms <= hi + SLACK_MS, (lo, stats.e2e.median_ms, hi)
