"""``run_decode(on_tick=...)``: the window's progress about once a second, for the live line,
from a real decode cell against the simulator in its own process."""

import itertools

import pytest

from pytest_llmspeed.core.bench import Bench, BenchConfig
from pytest_llmspeed.core.protocol import DecodeTick
from pytest_llmspeed.sim import SimOptions, running_simulator_process

pytestmark = pytest.mark.slow

DURATION = 4.0
N = 4


def decode_with_ticks(options: SimOptions, max_output: int = 4096):
    """One decode cell (1K, N streams) through ``Bench.decode``, with the ticks it gave."""
    ticks: list[DecodeTick] = []
    with running_simulator_process(options) as url:
        config = BenchConfig(url, None, None, "completions", max_output, DURATION, 60, None)
        bench = Bench(config)
        try:
            bench.start()
            bench.prefill(1024, 16)
            result = bench.decode(1024, N, on_tick=ticks.append)
        finally:
            bench.close()
    return result, ticks


def tokens_before(result, elapsed_s: float) -> int:
    """The cell's own count (after the window, from the parsed streams) of the tokens that
    arrived in the window's first ``elapsed_s`` seconds."""
    w0 = result.window[0]
    return sum(
        c
        for rec in result.records
        for t, c in zip(rec.token_times, rec.token_counts, strict=True)
        if w0 <= t < w0 + elapsed_s
    )


def test_ticks_about_once_a_second_and_tokens_agree_with_the_cell():
    # tiny speculates 2 tokens: chunks carry 1 to 3 tokens, counted by their usage, not as 1
    result, ticks = decode_with_ticks(SimOptions(profile="tiny"))
    assert result.token_accounting == "usage"
    assert len(ticks) >= DURATION - 1, ticks
    elapsed = [t.elapsed_s for t in ticks]
    assert 0.85 <= elapsed[0] <= 2.0
    gaps = [b - a for a, b in itertools.pairwise(elapsed)]
    assert all(0.85 <= g <= 2.0 for g in gaps), gaps  # about a second apart, monotone
    assert elapsed[-1] < DURATION
    assert all(t.window_s == DURATION for t in ticks)
    tokens = [t.tokens for t in ticks]
    assert all(a < b for a, b in itertools.pairwise(tokens)), tokens
    for tick in ticks:
        # the live count is the cell's own count of the same span, to a cut read's slack
        assert tick.tokens == pytest.approx(tokens_before(result, tick.elapsed_s), abs=2 * N)
        assert tick.in_flight == N  # 4096-token outputs: no stream ends inside the window
    assert ticks[-1].tokens <= result.stats.output_tokens
    # the rate over the last second is the cell's rate (a steady server)
    for tick in ticks[1:]:
        assert tick.tok_s_now == pytest.approx(result.stats.total_tok_s, rel=0.25)


def test_without_per_chunk_usage_tokens_are_not_counted_twice():
    # usage only at each stream's end, 3 tokens a chunk, 96-token outputs that finish in the
    # window: a stream's events count one each until its final usage tops it up to its total,
    # so the live count lags the cell's by at most the streams in flight, never runs ahead
    options = SimOptions(profile="tiny", speed=2.0, stream_interval=3, quirks="final-usage-only")
    result, ticks = decode_with_ticks(options, max_output=96)
    assert result.token_accounting != "usage"
    assert len(ticks) >= DURATION - 1
    for tick in ticks:
        cell = tokens_before(result, tick.elapsed_s)
        assert cell - N * 96 <= tick.tokens <= cell + N * 96, (tick, cell)
    assert ticks[-1].tokens <= result.stats.output_tokens
