"""Goodput (docs/slo.md) against the simulator's own record of what it sent (``/sim/trace``):
the output tokens inside the window of the requests that met the per-request bounds, counted
from the server's chunks, request by request (tests/core/truth.py), within 1 % of the
client's figure."""

import pytest

from pytest_llmspeed.core.stats import RequestBounds, RequestTrace, goodput
from pytest_llmspeed.sim import SimOptions, running_simulator_process

from .truth import measure

pytestmark = [pytest.mark.asyncio, pytest.mark.slow]


async def test_goodput_counts_the_in_window_tokens_of_the_requests_that_met_the_bounds():
    # 2 of 4 requests run at once: the others queue behind them, so TTFTs spread from a few
    # ms to a whole request's run (128 tokens)
    options = SimOptions(profile="tiny", speed=2.0, max_num_seqs=2)
    bound_ms = 40.0
    with running_simulator_process(options) as url:
        result, matched = await measure(
            url, 128, 3.0, 4, request_bounds=RequestBounds(ttft_ms=bound_ms)
        )
    w0, w1 = result.window

    def from_the_trace(bound: float) -> float:
        """Goodput counted from the server's chunks: the in-window tokens of the requests
        whose TTFT (the server's, plus the two measured trips) met the bound."""
        met = [m for m in matched if m.server_ttft_ms() + m.ttft_delay_ms() <= bound]
        return sum(m.tokens_inside(w0, w1)[0] for m in met) / (w1 - w0)

    # the cell's own figure, at the bound it ran with (how many met depends on the machine:
    # on a busy one every request may queue past 40 ms)
    assert result.goodput_tok_s is not None
    assert result.goodput_tok_s == pytest.approx(from_the_trace(bound_ms), rel=0.01, abs=1e-9)
    # and at a bound that splits the requests whatever the machine: the median TTFT
    ttfts = sorted(m.server_ttft_ms() + m.ttft_delay_ms() for m in matched)
    split = (ttfts[len(ttfts) // 2 - 1] + ttfts[len(ttfts) // 2]) / 2
    traces = [
        RequestTrace(r.t_send, r.t_end if r.t_end is not None else w1, r.token_times,
                     r.token_counts, r.finished and not r.cancelled and not r.error)
        for r in result.records
    ]  # fmt: skip
    got = goodput(traces, w0, w1, RequestBounds(ttft_ms=split))
    expected = from_the_trace(split)
    assert 0 < expected < result.stats.total_tok_s * 0.99, (expected, ttfts)
    assert got == pytest.approx(expected, rel=0.01)
