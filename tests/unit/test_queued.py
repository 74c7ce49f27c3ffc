"""When is a decode cell marked as queued (effective concurrency below N)? METRICS.md: the
server's `num_requests_waiting` > 0, or running < N, judged over the window's 1 Hz samples."""

from pytest_llmspeed.core.protocol import server_queued


def test_full_slots_and_nothing_waiting_is_not_queued():
    assert not server_queued([0] * 10, [8] * 10, 8)


def test_restart_gaps_and_burst_admission_are_not_queueing():
    # seen on real vLLM at N = 8: a burst of new requests admitted over two steps leaves a few
    # samples below N (mean 7.4 < N - 0.5), while nothing ever waits
    running = [8, 8, 5, 8, 8, 6, 8, 8, 4, 8]
    assert sum(running) / len(running) < 7.5
    assert not server_queued([0] * 10, running, 8)


def test_requests_waiting_in_a_quarter_of_the_samples_is_queued():
    assert server_queued([0, 0, 3, 0, 0, 0, 2, 0], [8] * 8, 8)
    assert not server_queued([0, 0, 3, 0, 0, 0, 0, 0, 0], [8] * 9, 8)


def test_server_capped_below_n_is_queued_even_without_a_waiting_gauge():
    assert server_queued([], [4, 4, 4, 5, 4], 8)
    assert server_queued([5, 5, 5], [3, 3, 3], 8)


def test_no_samples_says_nothing():
    assert not server_queued([], [], 8)
