"""The measurement core against the simulator's own record of what it sent (`/sim/trace`).

The simulator runs in a child process, as a real server would (its own interpreter, so it does
not share the client's GIL and garbage collector). On Linux ``time.perf_counter`` reads
CLOCK_MONOTONIC, one clock for every process, so its stamps and the client's compare directly.

TTFT as METRICS.md defines it includes the request's trip (client write, loopback, the
server's front end before it stamps arrival), which the server's own record leaves out: 2-6 ms
for 8K-token bodies sent eight at a time on this 2-core machine, 12 ms once under CI load. With
the reference profile at speed 1 an 8K cell's TTFT is ~150 ms, so that trip alone is up to 8 %.
These tests check the protocol's accounting, not loopback, so the simulated GPU runs at half
speed (TTFT ~300 ms): the trip stays well inside the 5 % they assert (measured: plugin / server
record 1.004-1.032 over 18 runs at c=8, 8 of them beside a busy core).
"""

import json

import numpy as np
import pytest

from pytest_llmspeed.core.client import Connection
from pytest_llmspeed.core.probe import probe
from pytest_llmspeed.core.prompts import PromptFactory
from pytest_llmspeed.core.protocol import negotiate, run_decode, run_prefill
from pytest_llmspeed.sim import SimOptions, running_simulator_process

pytestmark = [pytest.mark.asyncio, pytest.mark.slow]


@pytest.fixture(scope="module")
def reference_sim():
    options = SimOptions(profile="h200-qwen3.5-27b-int4", speed=0.5)
    with running_simulator_process(options) as url:
        yield url


async def _trace(conn):
    status, body = await conn.get("/sim/trace")
    assert status == 200
    return json.loads(body)["requests"]


def _server_truth(requests, w0, w1):
    tokens = 0
    ttfts, tbts = [], []
    for r in requests:
        chunks = r["chunks"]
        tokens += sum(n for t, n in chunks if w0 <= t < w1)
        if r["first_token_time"] is not None and r["first_token_time"] < w1:
            ttfts.append((r["first_token_time"] - r["arrival"]) * 1e3)
        total = sum(n for _, n in chunks)
        if total >= 2 and chunks[-1][0] > chunks[0][0]:
            tbts.append((chunks[-1][0] - chunks[0][0]) / (total - 1) * 1e3)
    return tokens, float(np.median(ttfts)), float(np.median(tbts))


@pytest.mark.parametrize("concurrency", [1, 8])
async def test_decode_cell_agrees_with_the_servers_own_record(reference_sim, concurrency):
    conn = Connection.open(reference_sim, None, 60)
    try:
        server = await probe(conn, None, None)
        factory = PromptFactory(conn, server.model)
        dialect = await negotiate(conn, factory, server.model, "completions")
        await run_prefill(conn, factory, dialect, server.model, 8192, 16)
        await conn.session.delete(conn.url("/sim/trace"))
        result = await run_decode(
            conn, factory, dialect, server.model, 8192, concurrency, 4096, 4.0
        )
        requests = await _trace(conn)
    finally:
        await conn.close()
    stats = result.stats
    tokens, ttft_ms, tbt_ms = _server_truth(requests, *result.window)
    assert stats.output_tokens == pytest.approx(tokens, rel=0.02)
    assert stats.total_tok_s == pytest.approx(tokens / 4.0, rel=0.02)
    assert stats.ttft_ms == pytest.approx(ttft_ms, rel=0.05)
    assert stats.tbt_ms == pytest.approx(tbt_ms, rel=0.05)
    assert result.token_accounting == "usage"
    lo, hi = result.received_span
    assert lo * 0.98 <= result.generation_tokens_delta <= hi * 1.02


async def test_prefill_ttft_and_exact_prompt_length(reference_sim):
    conn = Connection.open(reference_sim, None, 60)
    try:
        server = await probe(conn, None, None)
        factory = PromptFactory(conn, server.model)
        dialect = await negotiate(conn, factory, server.model, "completions")
        await conn.session.delete(conn.url("/sim/trace"))
        result = await run_prefill(conn, factory, dialect, server.model, 8192, 16)
        (req,) = await _trace(conn)
    finally:
        await conn.close()
    assert req["prompt_tokens"] == 8192 and req["cached_tokens"] == 0
    server_ttft = (req["first_token_time"] - req["arrival"]) * 1e3
    assert result.ttft_ms == pytest.approx(server_ttft, rel=0.05)
    assert result.prompt_tok_s == pytest.approx(8192 / result.ttft_ms * 1e3)
