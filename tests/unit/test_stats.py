"""The metric definitions of docs/metrics.md on hand-made timelines."""

import numpy as np
import pytest

from pytest_llmspeed.core.stats import RequestTrace, decode_stats


def steady(t_send, t_first, n_chunks, dt, per_chunk=1, finished=False, t_end=None):
    times = [t_first + i * dt for i in range(n_chunks)]
    return RequestTrace(
        t_send=t_send,
        t_end=t_end if t_end is not None else times[-1],
        token_times=times,
        token_counts=[per_chunk] * n_chunks,
        finished=finished,
    )


def test_single_stream_total_equals_per_request():
    # 100 tok/s from t=1 to beyond the window [1, 11)
    tr = steady(0.0, 1.0, 2000, 0.01, t_end=30.0)
    s = decode_stats([tr], 1.0, 11.0)
    assert s.output_tokens == 1000
    assert s.total_tok_s == pytest.approx(100.0)
    assert s.per_request_tok_s == pytest.approx(100.0, rel=1e-6)
    assert s.ttft_ms == pytest.approx(1000.0)
    assert s.tbt_ms == pytest.approx(10.0)
    assert s.avg_active == pytest.approx(1.0)
    assert s.completed == 0
    assert s.measured_s == pytest.approx(10.0)


def test_multi_token_chunks_share_their_arrival_time():
    # 3 tokens per chunk every 30 ms = 100 tok/s; TBT over tokens = span/(tokens-1)
    tr = steady(0.0, 0.5, 11, 0.03, per_chunk=3)
    s = decode_stats([tr], 0.5, 0.8)
    assert s.output_tokens == 30  # chunks at 0.5 .. 0.77 inside [0.5, 0.8)
    assert s.tbt_ms == pytest.approx(300.0 / 32)


def test_completed_counts_last_token_inside_window_only():
    done_inside = steady(0.0, 0.1, 10, 0.1, finished=True)  # last token 1.0
    done_before = steady(0.0, 0.1, 3, 0.1, finished=True)  # last token 0.3
    cancelled = steady(0.0, 0.1, 50, 0.1, finished=False)
    s = decode_stats([done_inside, done_before, cancelled], 0.5, 2.5)
    assert s.completed == 1


def test_average_active_is_time_weighted():
    a = steady(0.0, 0.1, 100, 0.1, t_end=10.0)
    b = steady(5.0, 5.1, 10, 0.1, t_end=10.0)  # active half of the window [0, 10)
    s = decode_stats([a, b], 0.0, 10.0)
    assert s.avg_active == pytest.approx(1.5)


def test_per_request_rate_is_token_weighted_mean():
    fast = steady(0.0, 0.0, 201, 0.005, t_end=1.0)  # 200 tok/s, 200 tokens in [0,1)
    slow = steady(0.0, 0.0, 51, 0.02, t_end=1.0)  # 50 tok/s, 50 tokens in [0,1)
    s = decode_stats([fast, slow], 0.0, 1.0)
    rates = {200: (200 - 1) / (199 * 0.005), 50: (50 - 1) / (49 * 0.02)}
    expected = (200 * rates[200] + 50 * rates[50]) / 250
    assert s.per_request_tok_s == pytest.approx(expected)


def test_ttft_only_for_first_tokens_before_window_end():
    early = steady(0.0, 0.2, 5, 0.1)
    late = steady(0.5, 3.0, 5, 0.1)  # first token after the window closed
    s = decode_stats([early, late], 0.2, 2.0)
    assert s.ttft_samples_ms == [pytest.approx(200.0)]


def test_per_second_throughput_and_stability():
    tr = steady(0.0, 0.0, 1000, 0.01, t_end=10.0)
    s = decode_stats([tr], 0.0, 10.0)
    assert s.per_second_tok == [100] * 10
    assert s.stability_cv == pytest.approx(0.0, abs=1e-9)


def test_empty_window():
    s = decode_stats([], 0.0, 1.0)
    assert s.output_tokens == 0 and s.ttft_ms is None and s.per_request_tok_s is None


def test_inter_token_latency_is_every_gap_between_arrivals_inside_the_window():
    """Chunks read together are one arrival (no gap); a gap counts where its later arrival
    lies in the window; p90 needs 10 gaps, p99 100; a gap of 10 × the median is a stall."""
    from pytest_llmspeed.core.stats import Latencies, arrival_gaps_ms, least_for

    times = np.array([0.0, 0.01, 0.01, 0.02, 0.5, 0.51])
    assert arrival_gaps_ms(times, 0.0, 1.0).round(6).tolist() == [10.0, 10.0, 480.0, 10.0]
    assert arrival_gaps_ms(times, 0.015, 0.51).round(6).tolist() == [10.0, 480.0]
    assert (least_for(90), least_for(99)) == (10, 100)
    few = Latencies.of(np.array([10.0] * 9 + [480.0]), stalls=True)
    assert few is not None and few.p90_ms is not None and few.p99_ms is None
    assert (few.median_ms, few.max_ms, few.n, few.stalls) == (10.0, 480.0, 10, 1)
    assert Latencies.of(np.array([10.0] * 9)).p90_ms is None  # type: ignore[union-attr]
    assert Latencies.of(np.empty(0)) is None
