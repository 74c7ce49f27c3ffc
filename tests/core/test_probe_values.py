"""Values a server sends must make sense (issue 29, docs/trust.md "Values that make sense"):
the probe against small aiohttp.web servers on loopback whose /v1/models, /version,
/metrics, /tokenize and /server_info answer absurd values."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from aiohttp import web

from pytest_llmspeed.core.client import Connection
from pytest_llmspeed.core.errors import LLMSpeedError, ModelNotFound, NotAnOpenAIServer
from pytest_llmspeed.core.probe import ServerInfo, probe

pytestmark = pytest.mark.asyncio

Handler = Callable[[web.Request], Any]


def models(*entries: dict[str, Any]) -> dict[str, Any]:
    return {"object": "list", "data": list(entries)}


def text_answer(body: str, delay: float = 0.0) -> Handler:
    async def handler(request: web.Request) -> web.Response:
        if delay:
            await asyncio.sleep(delay)
        return web.Response(text=body)

    return handler


@contextlib.asynccontextmanager
async def server(
    v1_models: Any = None, routes: dict[str, Handler] | None = None
) -> AsyncIterator[str]:
    """A loopback server answering /v1/models with ``v1_models`` (raw JSON text when a str) and
    GET ``routes``; every other path 404."""
    app = web.Application()
    body = v1_models if isinstance(v1_models, str) else json.dumps(v1_models)
    app.router.add_get("/v1/models", text_answer(body))
    for path, handler in (routes or {}).items():
        if path == "/tokenize":
            app.router.add_post(path, handler)
        else:
            app.router.add_get(path, handler)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]  # set by start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


async def probed(v1_models: Any, routes: dict[str, Handler] | None = None, timeout: float = 5,
                 model: str | None = None) -> ServerInfo:  # fmt: skip
    async with server(v1_models, routes) as url:
        conn = Connection.open(url, None, timeout)
        try:
            return await probe(conn, model, None)
        finally:
            await conn.close()


async def probe_error(v1_models: Any) -> LLMSpeedError:
    with pytest.raises(LLMSpeedError) as info:
        await probed(v1_models)
    return info.value


@pytest.mark.parametrize(
    ("raw", "named"),
    [
        ("1e30", "1e+30"),
        ("-5", "-5"),
        ("0", "0"),
        ("true", "true"),
        ('"4096"', '"4096"'),
        ("4096.5", "4096.5"),
        ("NaN", "NaN"),
        ("Infinity", "Infinity"),
        ("3000000000", "3000000000"),
    ],
)
async def test_a_max_model_len_that_is_not_a_length_is_unknown_with_a_note(raw, named):
    body = '{"data": [{"id": "m", "max_model_len": ' + raw + "}]}"
    info = await probed(body)
    assert info.max_model_len is None
    assert any(f"max_model_len {named} from /v1/models" in n for n in info.notes), info.notes


async def test_a_whole_max_model_len_is_kept():
    info = await probed(models({"id": "m", "max_model_len": 8192}))
    assert info.max_model_len == 8192 and info.notes == ()


async def test_tokenize_max_model_len_is_checked_too():
    async def tokenize(request: web.Request) -> web.Response:
        return web.json_response({"tokens": [1], "max_model_len": True})

    info = await probed(models({"id": "m"}), {"/tokenize": tokenize})
    assert info.max_model_len is None
    assert any("max_model_len true from /tokenize" in n for n in info.notes), info.notes


def cache_info(**labels: str) -> str:
    inner = ",".join(f'{k}="{v}"' for k, v in labels.items())
    return (
        "# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig\n"
        "# TYPE vllm:cache_config_info gauge\n"
        f'vllm:cache_config_info{{engine="0",{inner}}} 1.0\n'
        "# TYPE vllm:num_requests_running gauge\n"
        'vllm:num_requests_running{engine="0"} 0.0\n'
    )


@pytest.mark.parametrize(
    "labels",
    [
        {"kv_cache_size_tokens": "0"},
        {"kv_cache_size_tokens": "-5"},
        {"kv_cache_size_tokens": "1e30"},
        {"kv_cache_size_tokens": "99999999999"},
        {"kv_cache_size_tokens": "²"},
        {"num_gpu_blocks": "0", "block_size": "16"},
        {"num_gpu_blocks": "999999999", "block_size": "1024"},
    ],
)
async def test_a_kv_capacity_that_is_not_a_count_is_unknown_with_a_note(labels):
    info = await probed(models({"id": "m"}), {"/metrics": text_answer(cache_info(**labels))})
    assert info.kv_capacity is None
    assert info.kv_capacity_source.startswith("unknown")
    assert any(n.startswith("KV capacity ") and "taken as unknown" in n for n in info.notes)
    assert info.has_metrics  # the rest of /metrics is there


async def test_a_whole_kv_capacity_is_kept():
    metrics = cache_info(num_gpu_blocks="100", block_size="16")
    info = await probed(models({"id": "m"}), {"/metrics": text_answer(metrics)})
    assert info.kv_capacity == 1600 and info.notes == ()


@pytest.mark.parametrize("value", ["NaN", "-4.0", "+Inf", "1e30"])
async def test_sglang_capacity_from_metrics_is_checked(value):
    metrics = (
        "# TYPE sglang:max_total_num_tokens gauge\n"
        f'sglang:max_total_num_tokens{{model_name="m"}} {value}\n'
    )
    info = await probed(models({"id": "m"}), {"/metrics": text_answer(metrics)})
    assert info.kv_capacity is None
    assert any("sglang:max_total_num_tokens" in n for n in info.notes), info.notes


async def test_sglang_server_info_capacity_is_checked():
    async def server_info(request: web.Request) -> web.Response:
        return web.json_response({"max_total_num_tokens": True})

    info = await probed(models({"id": "m"}), {"/server_info": server_info})
    assert info.kv_capacity is None
    assert any("/server_info" in n for n in info.notes), info.notes


@pytest.mark.parametrize(
    ("body", "kind"),
    [
        ('{"data": 5}', NotAnOpenAIServer),
        ("[1, 2]", NotAnOpenAIServer),
        ('{"data": [5]}', NotAnOpenAIServer),
        ('{"data": [{"id": 5}]}', NotAnOpenAIServer),
        ('{"data": [{"name": "m"}]}', NotAnOpenAIServer),
        ('{"data": {"id": "m"}}', NotAnOpenAIServer),
        ('"models"', NotAnOpenAIServer),
        ("not json", NotAnOpenAIServer),
        ('{"data": []}', ModelNotFound),
    ],
)
async def test_a_models_answer_of_another_shape_is_one_line(body, kind):
    error = await probe_error(body)
    assert type(error) is kind
    assert "\n" not in error.message and len(error.message) < 300


@pytest.mark.parametrize(
    ("model_id", "words"),
    [("m" * 1025, "1,025 characters"), ("m\x1b[2J\x1b]0;pwned\x07", "control characters"),
     ("m\n::error title=x::y", "control characters")],
)  # fmt: skip
async def test_a_model_id_too_long_or_with_control_characters_is_refused(model_id, words):
    error = await probe_error(models({"id": model_id}))
    assert isinstance(error, NotAnOpenAIServer) and words in error.message
    assert "\x1b" not in error.message and "\n" not in error.message
    assert len(error.message) < 300


async def test_a_model_not_served_names_what_is_served_safely():
    with pytest.raises(ModelNotFound) as info:
        await probed(models({"id": "a\x1b[31m" + "x" * 5000}), model="b")
    assert "\x1b" not in info.value.message and len(info.value.message) < 400


@pytest.mark.parametrize(
    ("answer", "version"),
    [
        ({"version": 5}, None),
        ({"version": ["1"]}, None),
        ({"version": None}, None),
        ([1], None),
        ({"version": "0.9.1"}, "0.9.1"),
    ],
)
async def test_version_must_be_a_string(answer, version):
    info = await probed(models({"id": "m"}), {"/version": text_answer(json.dumps(answer))})
    assert info.version == version


async def test_a_long_version_is_cut_to_200_characters():
    answer = json.dumps({"version": "1." + "9" * 100_000 + "\x1b[2J"})
    info = await probed(models({"id": "m"}), {"/version": text_answer(answer)})
    assert info.version is not None and len(info.version) <= 200
    assert info.version.startswith("1.99")


async def test_a_slow_metrics_at_the_probe_means_no_server_figures_not_unreachable():
    slow = {"/metrics": text_answer("x 1\n", delay=4)}
    async with server(models({"id": "m"}), slow) as url:
        conn = Connection.open(url, None, 1.0)
        try:
            started = time.perf_counter()
            info = await probe(conn, None, None)
            took = time.perf_counter() - started
        finally:
            await conn.close()
    assert took < 3
    assert not info.has_metrics
    (note,) = [n for n in info.notes if "/metrics" in n]
    assert note.startswith("no server figures in this run") and "cannot reach" not in note


@pytest.mark.parametrize(
    ("metrics", "line"),
    [
        ("garbage here\n", "line 1"),
        (
            '# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{a="x\ny"} 1\n',
            "line 2",
        ),
    ],
)
async def test_metrics_that_do_not_parse_are_said_once_with_the_line(metrics, line):
    info = await probed(models({"id": "m"}), {"/metrics": text_answer(metrics)})
    assert not info.has_metrics
    (note,) = [n for n in info.notes if "/metrics" in n]
    assert f"/metrics did not parse ({line}: " in note
