"""Exact token counts when chunks carry several tokens and the stream has no per-chunk usage
(issue 13), against the simulator's own record of what it sent (``/sim/trace``)."""

import json

import numpy as np
import pytest

from pytest_llmspeed.core.client import Connection
from pytest_llmspeed.core.probe import probe
from pytest_llmspeed.core.prompts import PromptFactory
from pytest_llmspeed.core.protocol import counter_disagreement, negotiate, run_decode, run_prefill
from pytest_llmspeed.sim import SimOptions, running_simulator_process

pytestmark = [pytest.mark.asyncio, pytest.mark.slow]


async def measure(url, max_output, duration=3.0, concurrency=4):
    conn = Connection.open(url, None, 60)
    try:
        server = await probe(conn, None, None)
        factory = PromptFactory(conn, server.model)
        dialect = await negotiate(conn, factory, server.model, "completions")
        await run_prefill(conn, factory, dialect, server.model, 1024, 16)
        await conn.session.delete(conn.url("/sim/trace"))
        result = await run_decode(
            conn, factory, dialect, server.model, 1024, concurrency, max_output, duration
        )
        status, body = await conn.get("/sim/trace")
        assert status == 200
    finally:
        await conn.close()
    return result, json.loads(body)["requests"]


def truth(requests, w0, w1):
    tokens = sum(n for r in requests for t, n in r["chunks"] if w0 <= t < w1)
    tbts = []
    for r in requests:
        total = sum(n for _, n in r["chunks"])
        if total >= 2 and r["chunks"][-1][0] > r["chunks"][0][0]:
            tbts.append((r["chunks"][-1][0] - r["chunks"][0][0]) / (total - 1) * 1e3)
    return tokens, float(np.median(tbts))


@pytest.mark.parametrize("quirks", ["final-usage-only", "no-stream-usage"])
async def test_three_tokens_per_chunk_are_counted_exactly(quirks):
    options = SimOptions(profile="tiny", speed=2.0, stream_interval=3, quirks=quirks)
    with running_simulator_process(options) as url:
        # 96-token outputs: many requests finish inside the window, and give the ratio
        result, requests = await measure(url, max_output=96)
    stats = result.stats
    tokens, tbt_ms = truth(requests, *result.window)
    # finished requests: exact totals (final usage, or max_tokens at finish_reason length);
    # the few cut at the window's end: the cell's tokens per chunk
    assert result.token_accounting == "ratio", result.token_note
    assert stats.output_tokens == pytest.approx(tokens, rel=0.01)
    assert stats.tbt_ms == pytest.approx(tbt_ms, rel=0.05)  # per token, not per chunk
    assert result.early_stops == 0  # every request that finished reached max_tokens
    assert counter_disagreement(result) is None


async def test_one_token_per_chunk_is_said_and_the_counter_refutes_it():
    # no usage, and outputs so long that no request finishes inside the window: nothing tells
    # the tokens per chunk, so one per chunk is assumed, and the server's counter says 3x more
    options = SimOptions(profile="tiny", speed=2.0, stream_interval=3, quirks="no-stream-usage")
    with running_simulator_process(options) as url:
        result, requests = await measure(url, max_output=4096, duration=2.0)
    tokens, _ = truth(requests, *result.window)
    assert result.token_accounting == "chunk-count"
    assert "ONE TOKEN PER CHUNK ASSUMED" in result.token_note
    assert 2.5 < tokens / result.stats.output_tokens < 3.5  # a third of the truth
    problem = counter_disagreement(result)
    assert problem is not None and "chunks that carry several tokens" in problem
