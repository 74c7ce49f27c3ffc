"""A decode cell read by two client processes (``--llm-client-processes=2``,
``core/workers.py``) measures what one process measures: its tokens exact against the
simulator's own record of every chunk it sent, its figures inside the intervals of a cell read
by one process, the window opened and closed on the one clock of both."""

import socket
from typing import Any, cast

import pytest

from pytest_llmspeed.core.prompts import PromptFactory
from pytest_llmspeed.core.tokenize import ServerTokenizer
from pytest_llmspeed.core.workers import ProcessStreams, WorkerSpec, portable, split

from .truth import measure, token_bounds, ttft_bounds

pytestmark = [pytest.mark.asyncio, pytest.mark.slow]


def free_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_two_client_processes_measure_what_one_does(reference_sim):
    one, _ = await measure(reference_sim, 4096, 6.0, 8, context=8192)
    two, matched = await measure(reference_sim, 4096, 6.0, 8, context=8192, processes=2)
    assert (one.client_processes, two.client_processes) == (1, 2)
    w0, w1 = two.window
    # every stream of both processes, chunk by chunk, against the server's record
    assert len(matched) >= 8 and {r.t_send for r in two.records} >= {m.t_send for m in matched}
    assert token_bounds(matched, w0, w1, exact=True) == (two.stats.output_tokens,) * 2
    lo, hi, delay = ttft_bounds(matched, w1)
    assert two.stats.ttft_ms is not None and lo <= two.stats.ttft_ms <= hi, (lo, hi, delay)
    assert two.stats.little_residual is not None and abs(two.stats.little_residual) < 0.05
    # the figures of one process and of two: each inside the other's 95 % interval (two
    # windows of one server: the same server, measured twice)
    for name, ci in (("total_tok_s", "total_ci"), ("per_request_tok_s", "per_request_ci")):
        a, b = getattr(one.stats, name), getattr(two.stats, name)
        ia, ib = getattr(one.stats, ci), getattr(two.stats, ci)
        assert ia.low <= b <= ia.high or ib.low <= a <= ib.high, (name, a, ia, b, ib)


async def test_more_processes_than_streams_uses_one_a_stream(reference_sim):
    result, _ = await measure(reference_sim, 256, 2.0, 2, processes=3)
    assert result.client_processes == 2
    assert result.stats.output_tokens > 0 and result.aborted is None


async def test_a_client_process_whose_requests_all_fail_stops_the_cell_with_why():
    # nothing listens on the port: every request of each process fails, each process stops
    # after as many failures in a row as one process would, and the parent says why
    factory = PromptFactory(cast(Any, None), "m", _pool=list(range(100, 200)))
    factory._tokenizer = ServerTokenizer(cast(Any, None), "m", route="tokenize")
    fields = {"model": "m", "max_tokens": 4, "stream": True}
    specs = [
        WorkerSpec(i, f"http://127.0.0.1:{free_port()}", None, 5.0, "/v1/completions", share, 2,
                   portable(factory, i), 64, fields)
        for i, share in enumerate(split(2, 2))
    ]  # fmt: skip
    streams = ProcessStreams(specs)
    streams.start()
    assert await streams.wait_open(60) is None
    assert streams.aborted is not None and "requests in a row: connection failed" in streams.aborted
    await streams.close()
    assert streams.records and all(r.error for r in streams.records)
