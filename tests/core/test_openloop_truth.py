"""The open loop (docs/workloads.md) against the simulator's own record (``/sim/trace``):
TTFT from the schedule holds the server's queue time request by request, the server's
queue-time histogram read over the cell agrees with the record, the closed loop at the same
server reports less, and a replayed trace's shared blocks hit the simulator's prefix cache
exactly."""

from __future__ import annotations

import json

import numpy as np
import pytest

from pytest_llmspeed.core.client import Connection
from pytest_llmspeed.core.openloop import (
    OpenLoopResult,
    Sent,
    Trace,
    expected_hit_share,
    parse_trace,
    rate_plan,
    rate_schedule,
    run_open_loop,
    shared_tokens,
    trace_plan,
)
from pytest_llmspeed.core.probe import probe
from pytest_llmspeed.core.prompts import PromptFactory
from pytest_llmspeed.core.protocol import negotiate, run_decode, run_prefill
from pytest_llmspeed.sim import SimOptions, running_simulator_process

from .truth import CLOCK_SLACK_S, TRACE_LIMIT, _client_chunks

pytestmark = [pytest.mark.asyncio, pytest.mark.slow]

#: one request at a time, 32 tokens each: about 8 requests a second on the tiny profile
ONE_AT_A_TIME = SimOptions(profile="tiny", speed=1.0, max_num_seqs=1)
OUTPUT = 32


async def _open(url: str):
    conn = Connection.open(url, None, 60)
    server = await probe(conn, None, None)
    factory = PromptFactory(conn, server.model)
    dialect = await negotiate(conn, factory, server.model, "completions")
    return conn, server, factory, dialect


async def _trace_of(conn: Connection) -> dict[str, dict]:
    status, body = await conn.get("/sim/trace", limit=TRACE_LIMIT)
    assert status == 200
    return {r["id"]: r for r in json.loads(body)["requests"]}


def _by_request(result: OpenLoopResult, records: dict[str, dict]) -> list[tuple[Sent, dict]]:
    """Each request the client sent, with the simulator's record of it (by the response id)."""
    out = []
    for sent in result.sent:
        rid, _, _ = _client_chunks(sent.rec.reads)
        assert rid is not None, sent.rec.error
        out.append((sent, records[rid]))
    return out


async def test_ttft_from_the_schedule_holds_the_servers_queue_and_the_closed_loop_reports_less():
    with running_simulator_process(ONE_AT_A_TIME) as url:
        conn, server, factory, dialect = await _open(url)
        try:
            await run_prefill(conn, factory, dialect, server.model, 1024, 16)
            # the closed loop at this server's whole capacity (one request at a time)
            closed = await run_decode(conn, factory, dialect, server.model, 1024, 1, OUTPUT, 1.5)
            served = closed.stats.completed / closed.stats.measured_s  # requests/s it served
            await conn.session.delete(conn.url("/sim/trace"))
            # the open loop offering three times that: a queue builds whatever the machine
            times = rate_schedule(3 * served, 1.5, seed=1)
            plan = await rate_plan(factory, dialect, server.model, 1024, OUTPUT, times)
            result = await run_open_loop(conn, dialect, plan, 1.5, keep_reads=True)
            records = await _trace_of(conn)
        finally:
            await conn.close()
    f = result.figures
    assert f.requests == len(times) >= 6 and f.failed == 0 and f.completed == f.requests
    pairs = _by_request(result, records)
    for sent, rec in pairs:
        client_first = sent.rec.t_first
        assert client_first is not None
        first_written = rec["chunks"][0][0]
        # TTFT from the schedule is the server's first write minus the due time plus the
        # chunk's trip out: it holds the client's send lag, the trip in, the front end, the
        # engine's queue and the prefill
        sched = (client_first - sent.due) * 1e3
        assert client_first >= first_written - CLOCK_SLACK_S
        assert sched >= (first_written - sent.due) * 1e3 - 0.01
        assert sched >= rec["queue_time"] * 1e3  # the queue is inside it, request by request
        assert rec["arrival"] >= sent.rec.t_send - CLOCK_SLACK_S
    queue_ms = [rec["queue_time"] * 1e3 for _, rec in pairs]
    assert np.median(queue_ms) > 100  # the server queued: three times what it serves
    # the figure: the median of the per-request TTFTs from the schedule
    assert np.median(f.sched_ttft) == pytest.approx(
        np.median([((s.rec.t_first or 0.0) - s.due) * 1e3 for s, _ in pairs])
    )
    # the server's queue-time histogram, read at the cell's start and end: the mean of the
    # engine's own queue times of these requests
    assert result.server_queue_ms == pytest.approx(np.mean(queue_ms), rel=1e-6)
    # the closed loop never lets a queue build: its TTFT leaves out the wait an arriving user
    # sees; the open loop at the load it could not serve reports it
    assert closed.stats.ttft_ms is not None
    assert np.median(f.sched_ttft) > 5 * closed.stats.ttft_ms
    assert np.median(f.sched_ttft) > np.median(queue_ms) > closed.stats.ttft_ms


B = 512
#: requests far enough apart that each one's prefill is done before the next arrives
SHARING_TRACE = [
    {"timestamp": 0, "input_length": 3 * B + 64, "output_length": 2, "hash_ids": [1, 2, 3, 4]},
    {"timestamp": 400, "input_length": 3 * B + 64, "output_length": 2, "hash_ids": [1, 2, 7, 8]},
    {"timestamp": 800, "input_length": 3 * B + 100, "output_length": 2, "hash_ids": [1, 2, 3, 9]},
    # a partial last block of its own id (11): a later request's block 6 is other tokens
    {"timestamp": 1200, "input_length": 700, "output_length": 2, "hash_ids": [5, 11]},
    {"timestamp": 1600, "input_length": 2 * B + 1, "output_length": 2, "hash_ids": [5, 6, 10]},
    {"timestamp": 2000, "input_length": 300, "output_length": 2},
    {"timestamp": 2400, "input_length": 2 * B, "output_length": 2, "hash_ids": [9, 2]},
]


async def test_a_replayed_traces_shared_blocks_hit_the_simulators_prefix_cache_exactly():
    trace: Trace = parse_trace([json.dumps(r) for r in SHARING_TRACE], "sharing.jsonl")
    expected = shared_tokens(trace)
    assert expected == (0, 2 * B, 3 * B, 0, B, 0, 0)
    with running_simulator_process(SimOptions(profile="tiny", speed=4.0)) as url:
        conn, server, factory, dialect = await _open(url)
        try:
            await conn.session.delete(conn.url("/sim/trace"))
            plan = await trace_plan(factory, dialect, server.model, trace, speed=2.0)
            result = await run_open_loop(conn, dialect, plan, trace.span_s / 2, keep_reads=True)
            records = await _trace_of(conn)
        finally:
            await conn.close()
    pairs = _by_request(result, records)
    assert [s.planned.prompt_tokens for s, _ in pairs] == [r.input_length for r in trace.requests]
    for (sent, rec), want in zip(pairs, expected, strict=True):
        assert rec["prompt_tokens"] == sent.planned.prompt_tokens
        assert rec["cached_tokens"] == want, (rec["id"], rec["cached_tokens"], want)
        assert rec["cached_blocks"] * rec["block_size"] == want
    # the same requests, the same prompts: the first and the third share their three blocks
    # and nothing after (their tails are their own)
    assert len({rec["prompt_hash"] for _, rec in pairs}) == len(pairs)
    # the server's prefix-cache counters over the cell: exactly the share the trace names
    assert result.server is not None
    assert result.server.prefix_cache_hit_rate == pytest.approx(expected_hit_share(trace))
    assert result.figures.failed == 0 and result.figures.completed == len(pairs)
