"""The server's figures of a cell (``DecodeResult.server``, ``PrefillResult.server``) against
the simulator's own ``/metrics``: the very texts the cell read (recorded by wrapping
``protocol._read``), parsed whole here with prometheus_client, by none of the code under test.
The simulator runs in its own process (docs/simulator.md, "One factor at a time" for the
options)."""

from __future__ import annotations

import itertools

import pytest

from pytest_llmspeed.core import protocol
from pytest_llmspeed.core.client import Connection
from pytest_llmspeed.core.probe import parse_metrics, probe
from pytest_llmspeed.core.prompts import PromptFactory
from pytest_llmspeed.core.protocol import (
    DecodeResult,
    MetricsRead,
    counter_disagreement,
    negotiate,
    run_decode,
    run_prefill,
)
from pytest_llmspeed.core.replicas import ReplicaSet
from pytest_llmspeed.core.status import cell_status
from pytest_llmspeed.sim import SimOptions, running_simulator_process, running_simulator_processes

pytestmark = [pytest.mark.asyncio, pytest.mark.slow]

CONTEXT = 1024


async def measure(
    url: str, monkeypatch: pytest.MonkeyPatch, concurrency: int, max_output: int, duration: float
) -> tuple[DecodeResult, list[MetricsRead]]:
    """A decode cell after its prefill cell, and every /metrics read the decode cell made."""
    reads: list[MetricsRead] = []
    real = protocol._read

    async def recording(conn: object) -> MetricsRead:
        read = await real(conn)  # type: ignore[arg-type]
        reads.append(read)
        return read

    conn = Connection.open(url, None, 60)
    try:
        server = await probe(conn, None, None)
        factory = PromptFactory(conn, server.model)
        dialect = await negotiate(conn, factory, server.model, "completions")
        await run_prefill(conn, factory, dialect, server.model, CONTEXT, 16)
        monkeypatch.setattr(protocol, "_read", recording)
        result = await run_decode(
            conn, factory, dialect, server.model, CONTEXT, concurrency, max_output, duration
        )
    finally:
        await conn.close()
    return result, reads


def window_reads(result: DecodeResult, reads: list[MetricsRead]) -> list[MetricsRead]:
    """The reads of the window: from the first that began after it opened (the open) to the
    last (the close)."""
    inside = [r for r in reads if r.t0 >= result.window[0]]
    assert len(inside) >= 3, "an open, a poll and a close"
    return inside


def full(read: MetricsRead) -> dict[str, float]:
    """Every sample of a read, parsed whole, summed over label sets (one engine)."""
    (text,) = read.texts
    assert text is not None
    return {name: sum(v for _, v in rows) for name, rows in parse_metrics(text).items()}


def rise(name: str, open_: MetricsRead, close: MetricsRead) -> float:
    return full(close)[name] - full(open_)[name]


def gauge_mean(name: str, reads: list[MetricsRead]) -> float:
    """The time-weighted mean through the reads (trapezoids at each read's midpoint)."""
    points = [((r.t0 + r.t1) / 2, full(r)[name]) for r in reads]
    area = sum((t1 - t0) * (a + b) / 2 for (t0, a), (t1, b) in itertools.pairwise(points))
    return area / (points[-1][0] - points[0][0])


async def test_decode_figures_are_the_simulators_counters_over_the_window(monkeypatch):
    # 4096-token outputs and a 3 s window: no request ends, none starts inside it (a step at
    # ~4 ms makes ~2 tokens per request): a decode-only window, where the counters are exact
    # mfu_metrics: every series the figures read is exposed; tiny's profile has no bytes, so
    # the read-bytes counter stays at 0, as vLLM's CPU build's does
    options = SimOptions(profile="tiny", mfu_metrics=True)
    with running_simulator_process(options) as url:
        result, reads = await measure(url, monkeypatch, 4, 4096, 3.0)
    got = result.server
    assert got is not None
    inside = window_reads(result, reads)
    open_, close = inside[0], inside[-1]
    mid = (close.t0 + close.t1) / 2 - (open_.t0 + open_.t1) / 2
    assert got.duration_s == pytest.approx(mid, rel=1e-12)

    steps = rise("vllm:iteration_tokens_total_count", open_, close)
    assert steps > 0
    assert got.steps == steps
    # the simulator's own step counter: every step of a decode-only window produced output
    assert rise("llmspeed_sim_steps_total", open_, close) == steps
    assert got.steps_per_s == pytest.approx(steps / mid, rel=1e-12)
    generated = rise("vllm:generation_tokens_total", open_, close)
    assert got.generation_tokens == generated
    assert got.step_tokens == rise("vllm:iteration_tokens_total_sum", open_, close) == generated
    assert got.tokens_per_step == pytest.approx(generated / steps, rel=1e-12)
    # the referee's counter comes from the same reads, parsed once for both
    assert result.generation_tokens_delta == generated

    # acceptance from the spec decode counters: each running request drafts once a step
    drafts = rise("vllm:spec_decode_num_drafts_total", open_, close)
    accepted = rise("vllm:spec_decode_num_accepted_tokens_total", open_, close)
    draft_tokens = rise("vllm:spec_decode_num_draft_tokens_total", open_, close)
    assert (got.spec_drafts, got.spec_accepted_tokens) == (drafts, accepted)
    assert got.acceptance_length == pytest.approx(1 + accepted / drafts, rel=1e-12)
    assert got.acceptance_rate == pytest.approx(accepted / draft_tokens, rel=1e-12)
    assert drafts == 4 * steps and generated == drafts + accepted
    # so output tokens per step = running requests x acceptance length, exactly here
    assert got.acceptance_length is not None
    assert got.output_tokens_per_step == pytest.approx(4 * got.acceptance_length, rel=1e-12)
    # the profile's acceptance (0.7, 0.5): 1 + 0.7 + 0.35 drafts' tokens per step; the
    # simulator walks a low-discrepancy sequence, so a window of hundreds of steps is near it
    assert got.acceptance_length == pytest.approx(2.05, abs=0.02)

    # the gauges, time-weighted through the open, the polls and the close
    assert got.running_mean == pytest.approx(gauge_mean("vllm:num_requests_running", inside))
    assert got.running_mean == got.running_max == 4
    assert got.waiting_mean == got.waiting_max == 0
    assert got.kv_usage_mean == pytest.approx(gauge_mean("vllm:kv_cache_usage_perc", inside))
    assert got.preemptions == 0
    assert got.missing == () and got.reset == ()
    assert rise("vllm:estimated_read_bytes_per_gpu_total", open_, close) == 0
    assert got.read_bytes_per_s is None  # a counter at 0 while steps ran counts nothing
    assert cell_status(result).valid
    assert counter_disagreement(result) is None


async def test_a_cap_on_running_requests_shows_as_waiting(monkeypatch):
    # max_num_seqs=2 at concurrency 4: two run, the others wait; 64-token outputs, so that
    # requests end and the waiting ones get their first tokens (the window opens)
    with running_simulator_process(SimOptions(profile="tiny", max_num_seqs=2)) as url:
        result, reads = await measure(url, monkeypatch, 4, 64, 3.0)
    got = result.server
    assert got is not None and result.aborted is None
    inside = window_reads(result, reads)
    assert got.running_mean == pytest.approx(gauge_mean("vllm:num_requests_running", inside))
    assert got.waiting_mean == pytest.approx(gauge_mean("vllm:num_requests_waiting", inside))
    assert got.running_max == 2  # the cap
    # below 2 only while three of the four requests are between the server's scheduler and
    # the client (a request's end and its restart): moments
    assert got.running_mean is not None and 1.5 < got.running_mean <= 2
    assert got.waiting_mean is not None and got.waiting_mean > 0
    assert got.waiting_by_reason is not None
    reasons = {reason: mean for reason, mean, _ in got.waiting_by_reason}
    assert reasons["capacity"] == pytest.approx(got.waiting_mean)
    # the requests that finished in the window waited to be scheduled
    assert got.requests and got.queue_time_mean_s is not None and got.queue_time_mean_s > 0
    assert result.queued  # the queue check of the old reads says the same


async def test_a_lower_acceptance_shows_in_the_acceptance_rate(monkeypatch):
    with running_simulator_process(SimOptions(profile="tiny", accept=0.25)) as url:
        result, reads = await measure(url, monkeypatch, 4, 4096, 3.0)
    got = result.server
    assert got is not None
    inside = window_reads(result, reads)
    accepted = rise("vllm:spec_decode_num_accepted_tokens_total", inside[0], inside[-1])
    draft_tokens = rise("vllm:spec_decode_num_draft_tokens_total", inside[0], inside[-1])
    assert got.acceptance_rate == pytest.approx(accepted / draft_tokens, rel=1e-12)
    # the low-discrepancy walk of each request: hundreds of steps each come close to the rate
    assert got.acceptance_rate == pytest.approx(0.25, abs=0.01)
    assert got.acceptance_length == pytest.approx(1 + 2 * 0.25, abs=0.02)


async def test_a_server_without_metrics_gives_no_server_figures_and_a_valid_cell():
    with running_simulator_process(SimOptions(profile="tiny", quirks="no-metrics")) as url:
        conn = Connection.open(url, None, 60)
        try:
            server = await probe(conn, None, None)
            assert not server.has_metrics
            factory = PromptFactory(conn, server.model)
            dialect = await negotiate(conn, factory, server.model, "completions")
            # as if the caller did not know: the reads answer 404 and give nothing
            prefill = await run_prefill(conn, factory, dialect, server.model, CONTEXT, 16)
            result = await run_decode(conn, factory, dialect, server.model, CONTEXT, 2, 4096, 2.0)
        finally:
            await conn.close()
    assert prefill.server is None
    assert result.server is None
    assert result.generation_tokens_delta is None
    assert result.stats.output_tokens > 0
    assert cell_status(result).valid
    assert cell_status(prefill).valid


async def test_a_prefill_cell_has_its_queue_and_prefill_times(monkeypatch):
    with running_simulator_process(SimOptions(profile="tiny")) as url:
        conn = Connection.open(url, None, 60)
        try:
            server = await probe(conn, None, None)
            factory = PromptFactory(conn, server.model)
            dialect = await negotiate(conn, factory, server.model, "completions")
            result = await run_prefill(conn, factory, dialect, server.model, 8192, 16)
        finally:
            await conn.close()
    got = result.server
    assert got is not None
    assert got.requests == 1  # the cell's one request, counted when it finished
    assert got.prompt_tokens == 8192
    # a cold prefix: every prompt token computed, none from the cache
    assert (got.prefix_cache_queries, got.prefix_cache_hits) == (8192, 0)
    assert got.prefix_cache_counter == "by source"
    assert got.queue_time_mean_s is not None and got.prefill_time_mean_s is not None
    assert got.prefill_time_mean_s > 0
    # the server's queue and prefill are inside the client's TTFT (send → first token)
    assert (got.queue_time_mean_s + got.prefill_time_mean_s) * 1e3 <= result.ttft_ms
    assert got.generation_tokens == 16


async def test_several_replicas_are_combined_read_by_read(monkeypatch):
    reads: list[MetricsRead] = []
    real = protocol._read

    async def recording(conn: object) -> MetricsRead:
        read = await real(conn)  # type: ignore[arg-type]
        reads.append(read)
        return read

    with running_simulator_processes(SimOptions(profile="tiny", replicas=2)) as urls:
        replicas = ReplicaSet.open(urls, None, 60)
        try:
            conn = replicas.primary
            server = await probe(conn, None, None)
            factory = PromptFactory(conn, server.model)
            dialect = await negotiate(conn, factory, server.model, "completions")
            for one in replicas.connections:
                await run_prefill(one, factory, dialect, server.model, CONTEXT, 16)
            monkeypatch.setattr(protocol, "_read", recording)
            result = await run_decode(
                replicas, factory, dialect, server.model, CONTEXT, 4, 4096, 3.0
            )
        finally:
            await replicas.close()
    got = result.server
    assert got is not None
    inside = window_reads(result, reads)
    open_, close = inside[0], inside[-1]
    assert all(len(r.texts) == 2 for r in inside)  # one read: both replicas' texts

    def replica_rise(name: str, i: int) -> float:
        a, b = (parse_metrics(r.texts[i] or "")[name] for r in (open_, close))
        return sum(v for _, v in b) - sum(v for _, v in a)

    steps = [replica_rise("vllm:iteration_tokens_total_count", i) for i in (0, 1)]
    assert all(s > 0 for s in steps)
    assert got.steps == sum(steps)  # counters summed over the replicas
    generated = sum(replica_rise("vllm:generation_tokens_total", i) for i in (0, 1))
    assert got.generation_tokens == generated == result.generation_tokens_delta
    assert got.running_mean == got.running_max == 4  # two streams on each, summed
    # KV usage is each cache's fraction: averaged over the replicas, not summed
    kv = [
        sum(sum(v for _, v in parse_metrics(t or "")["vllm:kv_cache_usage_perc"]) for t in r.texts)
        / 2
        for r in inside
    ]
    assert got.kv_usage_max == pytest.approx(max(kv), rel=1e-12)
    assert got.kv_usage_max is not None and got.kv_usage_max > 0
