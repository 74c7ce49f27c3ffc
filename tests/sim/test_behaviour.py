"""Options that change behaviour: stream interval, API key, KV pressure, faults, clean stop."""

from __future__ import annotations

import asyncio
import gc
import itertools
import logging
import random
import socket
import warnings

import aiohttp
import pytest

from pytest_llmspeed.sim import SimOptions, running_simulator

from .sse_client import stream
from .test_server import metrics, post_json, value


def ids(n: int, seed: int) -> list[int]:
    r = random.Random(seed)
    return [r.randrange(300, 32000) for _ in range(n)]


@pytest.mark.asyncio
async def test_stream_interval_buffers_tokens() -> None:
    with running_simulator(SimOptions(speed=20, stream_interval=5)) as url:
        async with aiohttp.ClientSession() as s:
            res = await stream(
                s,
                url + "/v1/completions",
                {"prompt": ids(10, 1), "max_tokens": 203, "ignore_eos": True},
            )
    incs = [n for _, n in res.token_increments()]
    assert sum(incs) == 203
    assert incs[0] == 1  # the first token is sent at once
    assert all(5 <= n <= 7 for n in incs[1:-1])  # >= K, at most K - 1 + 3 (one MTP step)
    assert 1 <= incs[-1] <= 7


@pytest.mark.asyncio
async def test_api_key() -> None:
    with running_simulator(SimOptions(speed=20, api_key="s3cret")) as url:
        async with aiohttp.ClientSession() as s:
            for path in ("/v1/models",):
                async with s.get(url + path) as resp:
                    assert resp.status == 401
                    err = (await resp.json())["error"]
                    assert {"message", "type", "code"} <= set(err) and err["code"] == 401
            async with s.post(
                url + "/v1/completions",
                json={"prompt": "hi"},
                headers={"Authorization": "Bearer wrong"},
            ) as resp:
                assert resp.status == 401
            good = {"Authorization": "Bearer s3cret"}
            async with s.get(url + "/v1/models", headers=good) as resp:
                assert resp.status == 200
            res = await stream(
                s, url + "/v1/completions", {"prompt": "hi", "max_tokens": 3}, headers=good
            )
            assert res.status == 200 and res.events[-1].data == "[DONE]"
            for path in ("/health", "/metrics", "/version"):  # as vLLM: only /v1 is guarded
                async with s.get(url + path) as resp:
                    assert resp.status == 200, path


@pytest.mark.asyncio
async def test_admission_under_kv_pressure() -> None:
    opts = SimOptions(speed=4, kv_capacity=4096, max_model_len=2048)
    with running_simulator(opts) as url:
        async with aiohttp.ClientSession() as s:
            body = {"max_tokens": 1000, "ignore_eos": True}
            tasks = [
                asyncio.create_task(
                    stream(s, url + "/v1/completions", {**body, "prompt": ids(1000, 50 + i)})
                )
                for i in range(3)
            ]
            # the three requests reach the server in their own time on a busy machine: read
            # /metrics once all three are in (running or waiting), not after a fixed sleep
            loop = asyncio.get_running_loop()
            deadline = loop.time() + 20
            while True:
                m = await metrics(s, url)
                arrived = value(m, "vllm:num_requests_running") + value(
                    m, "vllm:num_requests_waiting"
                )
                if arrived >= 3 or loop.time() > deadline:
                    break
                await asyncio.sleep(0.02)
            results = await asyncio.gather(*tasks)
    assert value(m, "vllm:num_requests_running") == 2
    assert value(m, "vllm:num_requests_waiting") == 1
    assert value(m, "vllm:kv_cache_usage_perc") > 0.9
    ends = sorted(r.token_increments()[-1][0] for r in results)
    firsts = sorted(r.token_increments()[0][0] for r in results)
    # the third started only once a slot's blocks were freed: about when the first ended.
    # Chance: these are the client's receive times, and two streams' chunks ready together are
    # read in either order (the third's first 4 ms before the first's last, beside busy
    # loops); a third admitted at once would start with the others, not half a request later
    assert firsts[2] - firsts[0] > 0.5 * (ends[0] - firsts[0]), (firsts, ends)
    assert all(r.final_usage["completion_tokens"] == 1000 for r in results)


FAULT_BODY = {"prompt": list(range(300, 340)), "max_tokens": 60, "ignore_eos": True}


@pytest.mark.asyncio
async def test_fault_start500_and_burst503() -> None:
    for spec, status in (("start500=1", 500), ("burst503=1,burst_s=5", 503)):
        with running_simulator(SimOptions(speed=20, faults=spec)) as url:
            async with aiohttp.ClientSession() as s:
                res = await stream(s, url + "/v1/completions", FAULT_BODY)
                assert res.status == status
                assert res.body["error"]["code"] == status
                code, _ = await post_json(s, url + "/v1/completions", FAULT_BODY)
                assert code == status
                async with s.get(url + "/sim/trace") as resp:
                    trace = await resp.json()
                assert trace["requests"][0]["finish_reason"] in ("start500", "burst503")


@pytest.mark.asyncio
async def test_fault_midstream_error_event() -> None:
    with running_simulator(SimOptions(speed=20, faults="midstream=1")) as url:
        async with aiohttp.ClientSession() as s:
            res = await stream(s, url + "/v1/completions", FAULT_BODY)
            code, body = await post_json(s, url + "/v1/completions", FAULT_BODY)
    assert res.status == 200
    assert res.events[-1].data == "[DONE]"
    assert "error" in res.events[-2].data and res.events[-2].data["error"]["code"] == 500
    got = sum(n for _, n in res.token_increments())
    assert 1 <= got < 60
    assert code == 500 and body["error"]["type"] == "InternalServerError"


@pytest.mark.asyncio
async def test_fault_drop_closes_the_connection() -> None:
    with running_simulator(SimOptions(speed=20, faults="drop=1")) as url:
        async with aiohttp.ClientSession() as s:
            res = await stream(s, url + "/v1/completions", FAULT_BODY)
            with pytest.raises(aiohttp.ClientError):
                await post_json(s, url + "/v1/completions", FAULT_BODY)
            m = await metrics(s, url)
    assert res.error is not None
    assert all(e.data != "[DONE]" for e in res.events)
    assert 1 <= sum(n for _, n in res.token_increments()) < 60
    assert value(m, "vllm:num_requests_running") == 0


@pytest.mark.asyncio
async def test_fault_stall_pauses_then_resumes() -> None:
    with running_simulator(SimOptions(speed=1, faults="stall=1,stall_s=0.4")) as url:
        async with aiohttp.ClientSession() as s:
            res = await stream(s, url + "/v1/completions", FAULT_BODY)
    times = [t for t, _ in res.token_increments()]
    gaps = [b - a for a, b in itertools.pairwise(times)]
    assert max(gaps) >= 0.38
    assert sorted(gaps)[-2] < 0.1
    assert res.final_usage["completion_tokens"] == 60


@pytest.mark.asyncio
async def test_stop_with_streams_in_flight_is_clean(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING)
    # earlier tests' garbage on this worker is collected first: its warnings are not this test's
    gc.collect()
    cm = running_simulator(SimOptions(speed=1))
    url = cm.__enter__()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        async with aiohttp.ClientSession() as s:
            task = asyncio.create_task(
                stream(s, url + "/v1/completions", {"prompt": ids(100, 1), "max_tokens": 20000})
            )
            await asyncio.sleep(0.3)
            await asyncio.to_thread(cm.__exit__, None, None, None)
            res = await asyncio.wait_for(task, 5)
        gc.collect()
    assert res.events and all(e.data != "[DONE]" for e in res.events)
    assert not [
        f"{w.category.__name__}: {w.message} ({w.filename}:{w.lineno})"
        for w in caught
        if "unclosed" in str(w.message).lower() or "never awaited" in str(w.message)
    ]
    assert not [r for r in caplog.records if r.name.startswith(("asyncio", "aiohttp"))], [
        r.getMessage() for r in caplog.records
    ]


def test_start_failure_is_reported() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        with (
            pytest.raises(RuntimeError, match="address already in use"),
            running_simulator(SimOptions(port=port)),
        ):
            pass
