"""The wait for an idle server before a decode window (issue 29, docs/trust.md "Bounds in
time"): bounded by min(timeout, 10 s), said in the cell's notes when the server stayed busy,
gauges that are not counts taken as unknown. /metrics from small aiohttp.web servers on
loopback; the cell's streams from the simulator."""

from __future__ import annotations

import asyncio
import time

import pytest
from aiohttp import web

from pytest_llmspeed.core import protocol
from pytest_llmspeed.core.client import Connection
from pytest_llmspeed.core.probe import MetricsSnapshot, probe
from pytest_llmspeed.core.prompts import PromptFactory
from pytest_llmspeed.core.protocol import _wait_idle, negotiate, run_decode
from pytest_llmspeed.core.status import cell_status
from pytest_llmspeed.results import FlagKind, Status
from pytest_llmspeed.sim import SimOptions, running_simulator

from .test_probe_values import Handler, models, server, text_answer

pytestmark = pytest.mark.asyncio


def busy_metrics(running: str, waiting: str = "0") -> str:
    return (
        "# TYPE vllm:num_requests_running gauge\n"
        f'vllm:num_requests_running{{engine="0"}} {running}\n'
        "# TYPE vllm:num_requests_waiting gauge\n"
        f'vllm:num_requests_waiting{{engine="0"}} {waiting}\n'
    )


async def wait_idle(
    metrics: str | Handler, bound: float, timeout: float = 5.0
) -> tuple[str | None, float]:
    """The busy flag in words, and how long the wait took."""
    handler = metrics if callable(metrics) else text_answer(metrics)
    async with server(models({"id": "m"}), {"/metrics": handler}) as url:
        conn = Connection.open(url, None, timeout)
        try:
            started = time.perf_counter()
            flag = await _wait_idle(conn, bound)
            return (None if flag is None else flag.text()), time.perf_counter() - started
        finally:
            await conn.close()


async def test_a_server_that_never_gets_idle_is_waited_for_within_the_bound_and_said():
    note, took = await wait_idle(busy_metrics("3", "2"), 1.0)
    assert 0.9 <= took < 3
    assert note is not None
    assert note.startswith("server busy at the window's start: 3 running, 2 waiting after waiting ")
    assert note.endswith(" s")


@pytest.mark.parametrize(("running", "waiting"), [("NaN", "0"), ("-3", "0"), ("+Inf", "1")])
async def test_gauges_that_are_not_counts_are_unknown_not_busy(running, waiting):
    note, took = await wait_idle(busy_metrics(running, waiting), 5.0)
    assert note is None and took < 2


async def test_a_metrics_that_trickles_does_not_stretch_the_wait():
    async def trickle(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse()
        await resp.prepare(request)
        for _ in range(100):
            await resp.write(b"#")
            await asyncio.sleep(0.5)
        return resp

    note, took = await wait_idle(trickle, 1.5, timeout=30)
    assert note is None and took < 4


async def test_a_cell_on_a_busy_server_runs_valid_with_the_note(monkeypatch):
    # the simulator serves the streams; its gauges are read as busy at every read before the
    # window (the wait's and the referee's first read): the cell runs, valid, with the note
    async def busy(conn: object) -> MetricsSnapshot:
        return MetricsSnapshot(running=2.0, waiting=1.0)

    with running_simulator(SimOptions(profile="tiny", speed=20)) as url:
        conn = Connection.open(url, None, 2.0)  # the wait: min(2 s, 10 s)
        try:
            info = await probe(conn, None, None)
            factory = PromptFactory(conn, info.model)
            dialect = await negotiate(conn, factory, info.model, "completions")
            monkeypatch.setattr(protocol, "_metrics", busy)
            started = time.perf_counter()
            result = await run_decode(conn, factory, dialect, info.model, 64, 1, 32, 1.0)
        finally:
            await conn.close()
    assert time.perf_counter() - started >= 2.0
    (flag,) = [f for f in result.flags if f.kind is FlagKind.SERVER_BUSY]
    assert flag.text().startswith(
        "server busy at the window's start: 2 running, 1 waiting after waiting 2."
    )
    assert cell_status(result).status is Status.VALID
