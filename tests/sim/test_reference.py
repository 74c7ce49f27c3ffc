"""The reference profile against the reference matrix (issue 2's acceptance), at --speed 1."""

from __future__ import annotations

import random

import aiohttp
import pytest

from benchmarks.reference_fit import report
from pytest_llmspeed.sim import SimOptions, running_simulator
from pytest_llmspeed.sim.profiles import get_profile

from .sse_client import stream
from .test_server import metrics, value

PROFILE = "h200-qwen3.5-27b-int4"


@pytest.mark.asyncio
async def test_8k_prefill_ttft_prefix_hit_and_single_stream_decode() -> None:
    prefix = [random.Random(8).randrange(300, 32000) for _ in range(8192 - 32)]
    suffix = [random.Random(9).randrange(300, 32000) for _ in range(32)]
    with running_simulator(SimOptions(profile=PROFILE, speed=1.0)) as url:
        async with aiohttp.ClientSession() as s:
            before = await metrics(s, url)
            cold = await stream(
                s, url + "/v1/completions", {"prompt": prefix + suffix, "max_tokens": 1}
            )
            await stream(s, url + "/v1/completions", {"prompt": prefix + suffix, "max_tokens": 1})
            after = await metrics(s, url)
            other = [random.Random(10).randrange(300, 32000) for _ in range(32)]
            decode = await stream(
                s,
                url + "/v1/completions",
                {"prompt": prefix + other, "max_tokens": 600, "ignore_eos": True},
            )
            async with s.get(url + "/sim/trace") as resp:
                trace = (await resp.json())["requests"]
    assert cold.final_usage["prompt_tokens"] == 8192
    assert abs(cold.ttft / 0.815 - 1) <= 0.10, cold.ttft
    hits = value(after, "vllm:prefix_cache_hits_total") - value(
        before, "vllm:prefix_cache_hits_total"
    )
    assert hits == 8176  # all of the prompt but its last block
    # the same prompt again, then another suffix on the prefix: hits, as the server reports
    # each request's (every full block of the prefix; the last prompt token is computed)
    assert [r["cached_tokens"] for r in trace] == [0, 8176, 8160]
    incs = decode.token_increments()
    rate = (sum(n for _, n in incs) - incs[0][1]) / (incs[-1][0] - incs[0][0])
    assert abs(rate / 148.2 - 1) <= 0.05, rate


def test_over_capacity_cells_match_the_reference() -> None:
    cap = get_profile(PROFILE).kv_capacity_tokens
    k = 1024
    contexts = [8 * k, 16 * k, 32 * k, 64 * k, 128 * k, 251 * k]
    valid_up_to = {8 * k: 64, 16 * k: 64, 32 * k: 32, 64 * k: 16, 128 * k: 8, 251 * k: 4}
    over = 0
    for c in contexts:
        for n in (1, 2, 4, 8, 16, 32, 64, 128):
            is_over = n * (c + 4096) > cap
            assert is_over == (n > valid_up_to[c]), (c, n)
            over += is_over
    assert over == 16
    assert cap % get_profile(PROFILE).block_size == 0


def test_fit_within_ten_percent() -> None:
    """Every valid reference cell, predicted on a virtual clock (benchmarks/reference_fit.py)."""
    text, worst = report(get_profile(PROFILE), 0)
    assert worst <= 0.10, text
    assert "Over-capacity cells: 16 (reference: 16)" in text
    assert "cells agreeing with the reference: 48 of 48" in text
