"""Exact token counts when chunks carry several tokens and the stream has no per-chunk usage
(issue 13), against the simulator's own record of what it sent (``/sim/trace``), request by
request, within bounds made of what the client could know and the loopback delays measured
for those requests (tests/core/truth.py)."""

import pytest

from pytest_llmspeed.core.protocol import counter_disagreement
from pytest_llmspeed.sim import SimOptions, running_simulator_process

from .truth import measure, tbt_bounds, token_bounds

pytestmark = [pytest.mark.asyncio, pytest.mark.slow]


@pytest.mark.parametrize("quirks", ["final-usage-only", "no-stream-usage"])
async def test_three_tokens_per_chunk_are_counted_exactly(quirks):
    options = SimOptions(profile="tiny", speed=2.0, stream_interval=3, quirks=quirks)
    with running_simulator_process(options) as url:
        # 96-token outputs: many requests finish inside the window, and give the ratio
        result, matched = await measure(url, max_output=96)
    stats = result.stats
    # finished requests: exact totals (final usage, or max_tokens at finish_reason length);
    # the few cut at the window's end: the cell's tokens per chunk
    assert result.token_accounting == "ratio", result.token_note
    fewest, most = token_bounds(matched, *result.window, exact=False)
    assert fewest <= stats.output_tokens <= most
    lo, hi, shift = tbt_bounds(matched, exact=False)  # per token, not per chunk
    assert stats.tbt_ms is not None
    assert lo <= stats.tbt_ms <= hi, f"TBT {stats.tbt_ms:.4f} ms, shifts up to {shift:.4f} ms"
    assert result.early_stops == 0  # every request that finished reached max_tokens
    assert counter_disagreement(result) is None


async def test_with_no_request_finished_the_servers_tokenizer_counts_the_text_received():
    # no usage, and outputs so long that no request finishes inside the window: the text each
    # request received is counted with the server's /tokenize after the cell
    options = SimOptions(profile="tiny", speed=2.0, stream_interval=3, quirks="no-stream-usage")
    with running_simulator_process(options) as url:
        result, matched = await measure(url, max_output=4096, duration=2.0)
    assert not any(m.complete for m in matched)
    assert result.token_accounting == "tokenize"
    assert "counted with the server's tokenizer on the text received" in (result.token_note or "")
    inside = sum(m.tokens_inside(*result.window)[0] for m in matched)
    received = sum(m.tokens for m in matched)
    assert abs(result.stats.output_tokens / inside - 1) < 0.01, (result.stats.output_tokens, inside)
    assert abs(result.received_tokens / received - 1) < 0.01, (result.received_tokens, received)
    assert counter_disagreement(result) is None


async def test_one_token_per_chunk_is_said_and_the_counter_refutes_it():
    # no usage, outputs so long that no request finishes inside the window, and no tokenize
    # route to count the text: nothing tells the tokens per chunk, so one per chunk is
    # assumed, and the server's counter says 3x more
    options = SimOptions(
        profile="tiny", speed=2.0, stream_interval=3, quirks="no-stream-usage,no-tokenize"
    )
    with running_simulator_process(options) as url:
        result, matched = await measure(url, max_output=4096, duration=2.0)
    tokens = sum(m.tokens_inside(*result.window)[0] for m in matched)
    assert result.token_accounting == "chunk-count"
    # one per chunk the client received inside the window, exactly
    assert token_bounds(matched, *result.window, exact=False) == (result.stats.output_tokens,) * 2
    assert "ONE TOKEN PER CHUNK ASSUMED" in (result.token_note or "")
    assert 2.5 < tokens / result.stats.output_tokens < 3.5  # a third of the truth
    problem = counter_disagreement(result)
    assert problem is not None and "chunks that carry several tokens" in problem
