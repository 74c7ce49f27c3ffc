"""Counting streams as they arrive (``wire.StreamTally``: most reads counted from their last
usage value, without a JSON parse) gives the figures a full parse of every event gives, on
real streams: a decode cell against the simulator with multi-token chunks, its raw reads kept
(``keep_reads``) and parsed here event by event, as the client did before it counted on the
hot path."""

import json

import numpy as np
import pytest

from pytest_llmspeed.core.recount import RECOUNT_SAMPLE
from pytest_llmspeed.core.stats import RequestTrace, decode_stats
from pytest_llmspeed.sim import SimOptions, running_simulator_process

from .truth import measure

pytestmark = [pytest.mark.asyncio, pytest.mark.slow]


def parsed_event_by_event(reads):
    """Every event's usage rise, at the time of the read that completed the event."""
    times, counts, buf, prev = [], [], b"", 0
    for t, data in reads:
        buf += data
        *lines, buf = buf.split(b"\n")
        for line in lines:
            payload = line.strip().removeprefix(b"data:").strip()
            if not payload.startswith(b"{"):
                continue
            usage = json.loads(payload).get("usage") or {}
            ct = usage.get("completion_tokens")
            if ct is not None and ct > prev:
                times.append(t)
                counts.append(ct - prev)
                prev = ct
    return times, counts


@pytest.fixture(scope="module")
def mtp_sim():
    # the reference profile streams ~2 tokens a chunk (MTP); at 10x, 16 streams' chunks often
    # arrive several to a read, and reads end inside events
    with running_simulator_process(SimOptions(profile="h200-qwen3.5-27b-int4", speed=10)) as url:
        yield url


async def test_counting_as_reads_arrive_gives_the_figures_of_a_full_parse(mtp_sim):
    result, _ = await measure(mtp_sim, max_output=512, duration=3.0, concurrency=16)
    w0, w1 = result.window
    records = [r for r in result.records if r.reads]
    assert records and all(r.count_method == "usage" for r in records if r.chunks)
    # the text re-count's sample (the cell's first requests: core/recount.py) is parsed event
    # by event, whatever its usage; every other stream took the shortcut but for the rare one
    # that sent nothing before the window closed
    sample = [r for r in records if r.tally.recount]
    assert len(sample) <= RECOUNT_SAMPLE and not any(r.tally.fast for r in sample)
    rest = [r for r in records if not r.tally.recount]
    counted = sum(1 for r in rest if r.tally.fast)
    assert counted >= 0.9 * len(rest)  # the shortcut was taken
    several = sum(1 for r in records for _, d in r.reads if d.count(b"data:") > 1)
    assert several > 0  # some reads carried several chunks
    traces, chunks = [], 0
    for rec in records:
        times, counts = parsed_event_by_event(rec.reads)
        chunks += len(counts)
        assert sum(counts) == rec.n_tokens
        # the parse's entries, merged by read, are the tally's
        merged: dict[float, int] = {}
        for t, c in zip(times, counts, strict=True):
            merged[t] = merged.get(t, 0) + c
        assert list(merged) == list(dict.fromkeys(rec.token_times))
        done = rec.finished and not rec.cancelled and not rec.error
        end = rec.t_end if rec.t_end is not None else w1
        traces.append(RequestTrace(rec.t_send, end, times, counts, done, rec.error))
    assert result.received_chunks == chunks
    parsed = decode_stats(traces, w0, w1, result.concurrency)
    s = result.stats
    assert s.output_tokens == parsed.output_tokens > 0
    assert s.total_tok_s == parsed.total_tok_s
    for name in ("ttft_samples_ms", "tbt_samples_ms", "per_request_samples", "per_second_tok"):
        assert getattr(s, name) == getattr(parsed, name), name
    for name in ("total_ci", "per_request_ci"):
        a, b = getattr(s, name), getattr(parsed, name)
        assert a is not None and b is not None, name
        assert np.allclose((a.low, a.high), (b.low, b.high), rtol=1e-9, atol=0), name
