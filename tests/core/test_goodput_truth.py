"""Goodput (docs/slo.md) against the simulator's own record of what it sent (``/sim/trace``):
the output tokens inside the window of the requests that met the per-request bounds, counted
from the server's chunks, request by request (tests/core/truth.py), within 1 % of the
client's figure."""

import pytest

from pytest_llmspeed.core.stats import RequestBounds
from pytest_llmspeed.sim import SimOptions, running_simulator_process

from .truth import measure

pytestmark = [pytest.mark.asyncio, pytest.mark.slow]


async def test_goodput_counts_the_in_window_tokens_of_the_requests_that_met_the_bounds():
    # 2 of 4 requests run at once: the others queue behind them, so TTFTs spread from a few
    # ms to a whole request's run (128 tokens); the bound splits them
    options = SimOptions(profile="tiny", speed=2.0, max_num_seqs=2)
    bound_ms = 40.0
    with running_simulator_process(options) as url:
        result, matched = await measure(
            url, 128, 3.0, 4, request_bounds=RequestBounds(ttft_ms=bound_ms)
        )
    w0, w1 = result.window
    # the server's TTFT plus the two measured trips is when the client saw the first token
    met = [m for m in matched if m.server_ttft_ms() + m.ttft_delay_ms() <= bound_ms]
    missed = [m for m in matched if m not in met]
    good = sum(m.tokens_inside(w0, w1)[0] for m in met)
    assert met and any(m.tokens_inside(w0, w1)[0] for m in missed), "the bound splits nobody"
    assert result.goodput_tok_s is not None
    expected = good / (w1 - w0)
    assert result.goodput_tok_s == pytest.approx(expected, rel=0.01)
    assert result.goodput_tok_s < result.stats.total_tok_s * 0.99
