"""A prefill cell of several cold requests keeps the server's figures of its median one."""

from pytest_llmspeed.core.protocol import PrefillResult, median_prefill
from pytest_llmspeed.core.server_figures import ServerFigures


def cell(ttft: float) -> PrefillResult:
    return PrefillResult(
        context=1024,
        prompt_tokens=1024,
        ttft_ms=ttft,
        prompt_tok_s=1024 / ttft * 1e3,
        max_tokens=16,
        server=ServerFigures(duration_s=ttft / 1e3, prefill_time_mean_s=ttft / 2e3),
    )


def test_several_cold_requests_keep_the_server_figures_of_the_median_one():
    three = median_prefill([cell(30.0), cell(10.0), cell(20.0)])
    assert three.ttft_ms == 20.0
    assert three.server == cell(20.0).server
    four = median_prefill([cell(40.0), cell(10.0), cell(30.0), cell(20.0)])
    assert four.ttft_ms == 25.0
    assert four.server == cell(20.0).server  # the lower middle
    assert median_prefill([cell(10.0)]).server == cell(10.0).server
