"""Open-loop rate cells on real vLLM (CPU build), issue 33's "an arrival-rate cell's queueing
agrees with vLLM's queue-time histogram": a server the plugin launches with ``--max-num-seqs 1``
(one request runs, the rest wait) is sent 1 and 20 requests a second. At 20 a second it cannot
keep up, and the requests' TTFT counted from their scheduled send is mostly time spent queued,
which vLLM's own ``vllm:request_queue_time_seconds`` histogram records for every request that
finished in the cell. Each request asks for 64 tokens, so that one takes about 0.1 s even on a
quiet machine (a CI run with 16 tokens met a vLLM that served one in 29 ms: 20 a second then
hardly queued, 9 ms).

Measured here (64 tokens a request, a quiet machine): rate[1K-r20] 74 requests, the mean TTFT
from the schedule 1,871.7 ms, vLLM's mean queue time 1,862.5 ms and prefill time 2.9 ms; rate[1K-r1]
6 requests, 56.0 ms against 44.6 + 4.3 ms; 20 a second offered, 9.6 done."""

import json
import statistics

import pytest

from engines.home import Layout, vllm_home
from engines.servers import NOT_SET_UP
from tests.vllm.test_explain_vllm import one_at_a_time

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

VLLM = Layout(vllm_home())


def test_a_rate_cells_queueing_agrees_with_vllms_queue_time_histogram(pytester):
    if not VLLM.installed():
        pytest.fail(NOT_SET_UP)
    result = pytester.runpytest(
        f"--llm-serve={one_at_a_time()}", "--llm-serve-timeout=300", "--llm-contexts=1K",
        "--llm-rates=1,20", "--llm-duration=4", "--llm-max-output=64", "-m", "rate",
        "-p", "no:benchmark", "-p", "no:randomly", "--llm-results=out.json",
    )  # fmt: skip
    assert result.ret == 0, result.stdout.str()
    doc = json.loads((pytester.path / "out.json").read_text())
    cells = {c["id"]: c for c in doc["cells"] if c["phase"] == "rate"}
    low, high = cells["rate[1K-r1]"], cells["rate[1K-r20]"]
    for cell in (low, high):
        server = cell["server"]
        # the histogram counted every request of the cell (each finished inside it)
        assert server["requests"] == cell["open_completed"] == cell["open_requests"], server
    server = high["server"]
    client = statistics.fmean(high["samples"]["ttft_ms"])  # from the scheduled send
    engine = (server["queue_time_mean_s"] + server["prefill_time_mean_s"]) * 1000
    # the server's record is part of what the client saw, and most of it when requests queue
    assert engine <= client * 1.05 + 5, (engine, client)
    # a large part of it, but not all: requests wait in vLLM's API server too (tokenizing,
    # streaming the others) before the engine's queue counts them.
    # Chance: the engine's share was 0.99 quiet and 0.53 on a busy CI machine with 46 in
    # flight (1,412 ms of the client's 2,684 ms). Load slows the engine's one running request
    # as much as the API server's work, and the queue behind it grows with every slower
    # request, so the share falls with load far more slowly than load grows: a quarter would
    # need the API server's wait three times the busy machine's, with the engine's unchanged
    assert engine >= client * 0.25, (engine, client)
    assert high["server_queue_ms"] == pytest.approx(server["queue_time_mean_s"] * 1000, abs=0.01)
    # one request at a time, twenty a second: the queue grows over the cell
    queued = (low["server_queue_ms"], high["server_queue_ms"])
    assert queued[1] > max(300.0, 3 * queued[0]), queued
    assert high["achieved_rate"] < high["offered_rate"]
