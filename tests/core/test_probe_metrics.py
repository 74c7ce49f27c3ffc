"""/metrics read once a second during a decode cell: only the families a snapshot needs are
parsed, and the snapshot is the same as from the whole text."""

import urllib.request

from pytest_llmspeed.core.probe import SNAPSHOT_FAMILIES, only_families, parse_metrics, snapshot
from pytest_llmspeed.sim import SimOptions, running_simulator

SGLANG = """# HELP sglang:num_running_reqs The number of running requests.
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{model_name="m"} 3.0
# HELP sglang:num_queue_reqs The number of requests in the waiting queue.
# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{model_name="m"} 1.0
# HELP sglang:e2e_request_latency_seconds Histogram of latency.
# TYPE sglang:e2e_request_latency_seconds histogram
sglang:e2e_request_latency_seconds_bucket{le="0.1",model_name="m"} 2.0
sglang:e2e_request_latency_seconds_sum{model_name="m"} 0.4
sglang:e2e_request_latency_seconds_count{model_name="m"} 2.0
"""


def test_filtered_snapshot_equals_the_full_one_on_the_simulators_metrics():
    with running_simulator(SimOptions(profile="tiny", speed=50)) as url:
        body = b'{"model": "tiny", "prompt": [5, 6, 7, 8], "max_tokens": 8}'
        request = urllib.request.Request(
            f"{url}/v1/completions", body, {"Content-Type": "application/json"}
        )
        urllib.request.urlopen(request, timeout=30).read()
        text = urllib.request.urlopen(f"{url}/metrics", timeout=30).read().decode()
    full = snapshot(parse_metrics(text))
    assert full.generation_tokens and full.generation_tokens >= 8
    assert snapshot(parse_metrics(text, SNAPSHOT_FAMILIES)) == full
    kept = only_families(text, SNAPSHOT_FAMILIES)
    assert len(kept) < len(text) / 3  # histograms and info lines are left out
    assert "vllm:generation_tokens_total" in kept and "_bucket" not in kept


def test_filtered_snapshot_reads_sglang_gauges():
    snap = snapshot(parse_metrics(SGLANG, SNAPSHOT_FAMILIES))
    assert (snap.running, snap.waiting) == (3.0, 1.0)
    assert "latency" not in only_families(SGLANG, SNAPSHOT_FAMILIES)
