"""A script that drives the core directly gets the statuses the pytest layer gives: a decode cell
whose requests fail above ``max_error_rate`` is failed, not valid (``Bench.decode_cell``, the
simulator in its own process, no pytest layer)."""

import json
import urllib.request

import pytest

from pytest_llmspeed.core.bench import Bench, BenchConfig
from pytest_llmspeed.core.records import decode_record
from pytest_llmspeed.results import Status
from pytest_llmspeed.sim import SimOptions, running_simulator_process

pytestmark = pytest.mark.slow

N = 2


def sim(url: str, method: str, path: str, body: dict | None = None) -> dict:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url + path, data=data, method=method)
    with urllib.request.urlopen(request) as answer:
        text = answer.read()
    return json.loads(text) if text else {}


def test_a_script_gets_failed_for_a_cell_whose_error_rate_exceeds_the_limit():
    with running_simulator_process(SimOptions(profile="tiny", speed=4.0, seed=2)) as url:
        config = BenchConfig(url, None, None, "completions", 64, 2.0, 60, None)
        assert config.max_error_rate == 0.05  # the pytest layer's default
        bench = Bench(config)
        try:
            bench.start()
            prefill = bench.prefill_cell(1024, 16)
            # once the prefix is warm: 30 % of requests answered HTTP 500 before any output
            sim(url, "PUT", "/sim/faults", {"faults": "start500=0.3"})
            sim(url, "DELETE", "/sim/trace")
            record = bench.decode_cell(1024, N)
            trace = sim(url, "GET", "/sim/trace")["requests"]
        finally:
            bench.close()
    assert prefill.status is Status.VALID and prefill.reason is None
    rejected = sum(r["finish_reason"] == "start500" for r in trace)
    # every 500 the client saw, the server sent; the server may have sent one to each stream
    # that the window's end cancelled before its answer was read
    assert record.errors is not None and record.requests and record.error_summary is not None
    assert rejected - N <= record.errors <= rejected
    assert record.errors / record.requests > 0.05
    assert record.status is Status.FAILED
    rate = record.errors / record.requests
    summary = "; ".join(f"{n}× {msg}" for msg, n in record.error_summary.items())
    assert record.reason == (
        f"{record.errors} of {record.requests} requests failed ({rate:.0%} > max_error_rate "
        f"0.05): {summary}"
    )
    assert "llmspeed-sim injected fault" in summary
    assert record.output_tokens and record.output_tokens > 0  # what was measured is kept


def test_the_limit_decides_and_reaches_the_record_from_the_config():
    # the same cell under a limit its error rate stays below: valid
    with running_simulator_process(SimOptions(profile="tiny", speed=4.0, seed=2)) as url:
        config = BenchConfig(url, None, None, "completions", 64, 2.0, 60, None, max_error_rate=1)
        bench = Bench(config)
        try:
            bench.start()
            bench.prefill_cell(1024, 16)
            sim(url, "PUT", "/sim/faults", {"faults": "start500=0.3"})
            result = bench.decode(1024, N)
            record = bench.decode_cell(1024, N)
        finally:
            bench.close()
    assert record.errors is not None and record.errors > 0
    assert record.status is Status.VALID and record.reason is None
    # the same result judged with the default limit fails
    assert decode_record(1024, result).status is Status.FAILED
    assert decode_record(1024, result, max_error_rate=1).status is Status.VALID
