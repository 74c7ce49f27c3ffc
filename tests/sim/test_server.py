"""The HTTP server, driven by the tests' own aiohttp client: endpoints and token accounting."""

from __future__ import annotations

import asyncio
import random
from typing import Any

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from pytest_llmspeed.sim import SimOptions, running_simulator
from pytest_llmspeed.sim.tokenizer import CHAT_GENERATION_PROMPT_TOKENS, CHAT_TOKENS_PER_MESSAGE

from .sse_client import stream


def ids(n: int, seed: int) -> list[int]:
    r = random.Random(seed)
    return [r.randrange(300, 32000) for _ in range(n)]


async def get_json(session: aiohttp.ClientSession, url: str) -> Any:
    async with session.get(url) as resp:
        assert resp.status == 200, await resp.text()
        return await resp.json()


async def post_json(session: aiohttp.ClientSession, url: str, body: Any) -> tuple[int, Any]:
    async with session.post(url, json=body) as resp:
        return resp.status, await resp.json(content_type=None)


async def metrics(session: aiohttp.ClientSession, base: str) -> dict[str, Any]:
    """Samples by name (+ label tuple for labelled ones) parsed with prometheus_client."""
    async with session.get(base + "/metrics") as resp:
        assert resp.status == 200
        text = await resp.text()
    out: dict[str, Any] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out.setdefault(s.name, []).append(s)
    return out


def value(samples: dict[str, Any], name: str) -> float:
    return samples[name][0].value


@pytest.mark.asyncio
async def test_health_version_models(tiny_url: str) -> None:
    async with aiohttp.ClientSession() as s:
        async with s.get(tiny_url + "/health") as resp:
            assert resp.status == 200
        assert "version" in await get_json(s, tiny_url + "/version")
        models = await get_json(s, tiny_url + "/v1/models")
        assert models["object"] == "list"
        assert models["data"][0]["id"] == "tiny"
        assert models["data"][0]["max_model_len"] == 32768


@pytest.mark.asyncio
async def test_metrics_names_and_cache_config(tiny_url: str) -> None:
    async with aiohttp.ClientSession() as s:
        m = await metrics(s, tiny_url)
    for name in (
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:kv_cache_usage_perc",
        "vllm:prompt_tokens_total",
        "vllm:generation_tokens_total",
        "vllm:prefix_cache_queries_total",
        "vllm:prefix_cache_hits_total",
        "vllm:time_to_first_token_seconds_bucket",
        "vllm:time_to_first_token_seconds_count",
        "vllm:inter_token_latency_seconds_sum",
        "llmspeed_sim_info",
        "llmspeed_sim_late_steps_total",
    ):
        assert name in m, name
    info = m["vllm:cache_config_info"][0].labels
    assert info["kv_cache_size_tokens"] == "131072"
    assert int(info["num_gpu_blocks"]) * int(info["block_size"]) == 131072
    assert info["engine"] == "0"


@pytest.mark.asyncio
async def test_tokenize_detokenize_and_prompt_tokens_agree(tiny_url: str) -> None:
    text = "The river flows past the mountain, 42 times; naïve café 😀!"
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": text}]
    async with aiohttp.ClientSession() as s:
        status, tok = await post_json(
            s, tiny_url + "/tokenize", {"prompt": text, "return_token_strs": True}
        )
        assert status == 200
        assert set(tok) == {"count", "max_model_len", "tokens", "token_strs"}
        assert tok["count"] == len(tok["tokens"]) == len(tok["token_strs"])
        assert tok["max_model_len"] == 32768
        status, detok = await post_json(s, tiny_url + "/detokenize", {"tokens": tok["tokens"]})
        assert status == 200 and isinstance(detok["prompt"], str)
        # text prompt, token-id prompt and /tokenize agree
        status, body = await post_json(
            s, tiny_url + "/v1/completions", {"prompt": text, "max_tokens": 3}
        )
        assert body["usage"]["prompt_tokens"] == tok["count"]
        status, body = await post_json(
            s, tiny_url + "/v1/completions", {"prompt": tok["tokens"], "max_tokens": 3}
        )
        assert body["usage"]["prompt_tokens"] == tok["count"]
        # chat: /tokenize of messages == usage.prompt_tokens
        status, chat_tok = await post_json(s, tiny_url + "/tokenize", {"messages": messages})
        content = (
            tok["count"]
            + (await post_json(s, tiny_url + "/tokenize", {"prompt": "Be brief."}))[1]["count"]
        )
        assert chat_tok["count"] == (
            content + 2 * CHAT_TOKENS_PER_MESSAGE + CHAT_GENERATION_PROMPT_TOKENS
        )
        status, body = await post_json(
            s, tiny_url + "/v1/chat/completions", {"messages": messages, "max_tokens": 3}
        )
        assert status == 200
        assert body["usage"]["prompt_tokens"] == chat_tok["count"]
        res = await stream(
            s, tiny_url + "/v1/chat/completions", {"messages": messages, "max_tokens": 3}
        )
        assert res.final_usage["prompt_tokens"] == chat_tok["count"]


@pytest.mark.asyncio
async def test_non_streaming_shapes(tiny_url: str) -> None:
    async with aiohttp.ClientSession() as s:
        status, body = await post_json(
            s,
            tiny_url + "/v1/completions",
            {"model": "tiny", "prompt": ids(50, 1), "max_tokens": 20, "ignore_eos": True},
        )
        assert status == 200 and body["object"] == "text_completion"
        choice = body["choices"][0]
        assert choice["finish_reason"] == "length" and choice["text"]
        assert body["usage"] == {
            "prompt_tokens": 50,
            "completion_tokens": 20,
            "total_tokens": 70,
            "prompt_tokens_details": None,
        }
        status, body = await post_json(
            s,
            tiny_url + "/v1/chat/completions",
            {
                "messages": [{"role": "user", "content": "hi"}],
                "max_completion_tokens": 30,
                "ignore_eos": True,
            },
        )
        assert status == 200 and body["object"] == "chat.completion"
        message = body["choices"][0]["message"]
        assert message["role"] == "assistant" and message["content"]
        assert message["reasoning_content"] == message["reasoning"] != ""
        assert body["usage"]["completion_tokens"] == 30


@pytest.mark.asyncio
async def test_streaming_accounting_is_exact(tiny_url: str) -> None:
    """usage per chunk, final usage, the trace and /metrics counters agree to the token."""
    async with aiohttp.ClientSession() as s:
        await s.delete(tiny_url + "/sim/trace")
        before = await metrics(s, tiny_url)
        bodies: list[dict[str, Any]] = [
            {"prompt": ids(100 + i, 100 + i), "max_tokens": 200 + 37 * i, "ignore_eos": True}
            for i in range(6)
        ]
        results = await asyncio.gather(
            *(stream(s, tiny_url + "/v1/completions", b) for b in bodies)
        )
        after = await metrics(s, tiny_url)
        trace = await get_json(s, tiny_url + "/sim/trace")
    total_out = total_in = 0
    for body, res in zip(bodies, results, strict=True):
        assert res.status == 200 and res.events[-1].data == "[DONE]"
        incs = res.token_increments()
        assert sum(n for _, n in incs) == body["max_tokens"]
        assert res.final_usage == {
            "prompt_tokens": len(body["prompt"]),
            "completion_tokens": body["max_tokens"],
            "total_tokens": len(body["prompt"]) + body["max_tokens"],
        }
        assert res.chunks[-1].data["choices"][0]["finish_reason"] == "length"
        assert all(c.data["choices"][0]["finish_reason"] is None for c in res.chunks[:-1])
        total_out += body["max_tokens"]
        total_in += len(body["prompt"])
        rec = next(r for r in trace["requests"] if r["id"] == res.chunks[0].data["id"])
        assert [n for _, n in rec["chunks"]] == [n for _, n in incs]
        assert rec["completion_tokens"] == body["max_tokens"]
        assert rec["finish_reason"] == "length"
        # server emission precedes client arrival, by little
        for (ts, _), (tc, _) in zip(rec["chunks"], incs, strict=True):
            assert ts <= tc < ts + 0.5
    for name, expected in (
        ("vllm:generation_tokens_total", total_out),
        ("vllm:prompt_tokens_total", total_in),
        ("vllm:prefix_cache_queries_total", total_in),
        ("vllm:time_to_first_token_seconds_count", 6),
    ):
        assert value(after, name) - value(before, name) == expected, name
    assert value(after, "vllm:num_requests_running") == 0
    assert trace["clock"] == "perf_counter"


@pytest.mark.asyncio
async def test_multi_token_chunks_and_empty_text_chunks(tiny_url: str) -> None:
    async with aiohttp.ClientSession() as s:
        res = await stream(
            s,
            tiny_url + "/v1/completions",
            {"prompt": ids(20, 7), "max_tokens": 2000, "ignore_eos": True},
        )
    incs = [n for _, n in res.token_increments()]
    assert max(incs) == 3 and min(incs) == 1  # MTP: 1 + up to 2 accepted drafts
    assert sum(1 for n in incs if n > 1) > len(incs) / 3
    empty = [c for c in res.chunks if c.text() == "" and c.usage_tokens]
    assert empty, "byte-level style chunks with a token but no text"


@pytest.mark.asyncio
async def test_return_token_ids_gives_each_chunk_its_tokens_ids(tiny_url: str) -> None:
    """vLLM's ``return_token_ids``: every completions chunk names its tokens' ids, as many as
    its usage rose by, and they are the text's own (detokenized, the text streamed)."""
    body: dict[str, Any] = {"prompt": ids(40, 3), "max_tokens": 300, "ignore_eos": True}
    async with aiohttp.ClientSession() as s:
        res = await stream(s, tiny_url + "/v1/completions", {**body, "return_token_ids": True})
        plain = await stream(s, tiny_url + "/v1/completions", dict(body))
        got = [c.data["choices"][0]["token_ids"] for c in res.chunks]
        assert [len(g) for g in got] == [n for _, n in res.token_increments()]
        all_ids = [i for g in got for i in g]
        assert len(all_ids) == 300
        status, detok = await post_json(s, tiny_url + "/detokenize", {"tokens": all_ids})
    assert status == 200
    assert detok["prompt"] == "".join(c.text() for c in res.chunks)
    assert all("token_ids" not in c.data["choices"][0] for c in plain.chunks)  # not asked


@pytest.mark.asyncio
async def test_no_usage_unless_asked(tiny_url: str) -> None:
    async with aiohttp.ClientSession() as s:
        res = await stream(
            s,
            tiny_url + "/v1/completions",
            {"prompt": ids(20, 8), "max_tokens": 50, "stream_options": None},
        )
        assert all("usage" not in e.data for e in res.events if isinstance(e.data, dict))
        res = await stream(
            s,
            tiny_url + "/v1/completions",
            {
                "prompt": ids(20, 8),
                "max_tokens": 50,
                "ignore_eos": True,
                "stream_options": {"include_usage": True},
            },
        )
        assert all("usage" not in c.data for c in res.chunks)
        assert res.final_usage["completion_tokens"] == 50
        assert res.events[-2].data["choices"] == []


@pytest.mark.asyncio
async def test_chat_reasoning_then_content(tiny_url: str) -> None:
    body = {
        "messages": [{"role": "user", "content": "think"}],
        "max_tokens": 40,
        "ignore_eos": True,
    }
    async with aiohttp.ClientSession() as s:
        res = await stream(s, tiny_url + "/v1/chat/completions", body)
        plain = await stream(
            s,
            tiny_url + "/v1/chat/completions",
            {**body, "chat_template_kwargs": {"enable_thinking": False}},
        )
    first = res.chunks[0].data["choices"][0]["delta"]
    assert first == {"role": "assistant", "content": ""}
    seen_content = False
    for c in res.chunks[1:]:
        delta = c.data["choices"][0]["delta"]
        assert delta.get("reasoning_content") == delta.get("reasoning")
        if "reasoning" in delta:
            assert not seen_content, "reasoning after content"
        if "content" in delta:
            if not seen_content:
                # tokens up to the previous chunk were all reasoning: at most R = 8 of them
                prev = res.chunks[res.chunks.index(c) - 1].usage_tokens
                assert prev is not None and c.usage_tokens is not None
                assert prev <= 8 < c.usage_tokens
            seen_content = True
    assert seen_content
    assert all("reasoning" not in c.data["choices"][0]["delta"] for c in plain.chunks)


@pytest.mark.asyncio
async def test_prefix_cache_hit() -> None:
    prompt = ids(16000, 9)
    with running_simulator(SimOptions(speed=4)) as url:
        async with aiohttp.ClientSession() as s:
            before = await metrics(s, url)
            for _ in range(2):
                await stream(s, url + "/v1/completions", {"prompt": prompt, "max_tokens": 2})
            after = await metrics(s, url)
            cold, warm = (await get_json(s, url + "/sim/trace"))["requests"]
    name = "vllm:prefix_cache_hits_total"
    # every full block but the last: the last prompt token is always computed
    assert value(after, name) - value(before, name) == 15984
    # the hit as the server reports it per request, not as a guess from how fast it answered
    assert (cold["cached_tokens"], warm["cached_tokens"]) == (0, 15984)


@pytest.mark.asyncio
async def test_errors_400_404(tiny_url: str) -> None:
    async with aiohttp.ClientSession() as s:
        status, body = await post_json(
            s, tiny_url + "/v1/completions", {"prompt": ids(30000, 1), "max_tokens": 4096}
        )
        assert status == 400
        err = body["error"]
        assert err["code"] == 400 and err["type"] == "BadRequestError"
        assert "maximum context length is 32768 tokens" in err["message"]
        assert "4096 output tokens and your prompt contains 30000 input tokens" in err["message"]
        status, body = await post_json(
            s, tiny_url + "/v1/completions", {"prompt": "hi", "max_tokens": 40000}
        )
        assert status == 400
        assert (
            "max_tokens=40000 cannot be greater than max_model_len=32768"
            in (body["error"]["message"])
        )
        status, body = await post_json(
            s, tiny_url + "/v1/completions", {"prompt": ids(32768, 1), "max_tokens": 1}
        )
        assert status == 400 and "maximum context length" in body["error"]["message"]
        for bad in ([1, 2, 32000], [-1], [5, "x"]):
            status, body = await post_json(s, tiny_url + "/v1/completions", {"prompt": bad})
            assert status == 400, bad
        status, body = await post_json(s, tiny_url + "/v1/completions", {"prompt": [1, 2, 32000]})
        assert "Token id 32000 is out of vocabulary" in body["error"]["message"]
        status, body = await post_json(
            s, tiny_url + "/v1/completions", {"prompt": "x", "max_tokens": 5, "min_tokens": 9}
        )
        assert status == 400
        status, body = await post_json(s, tiny_url + "/v1/chat/completions", {"messages": []})
        assert status == 400
        status, body = await post_json(
            s, tiny_url + "/v1/completions", {"model": "gpt-4", "prompt": "x"}
        )
        assert status == 404 and "gpt-4" in body["error"]["message"]
        async with s.post(tiny_url + "/v1/completions", data=b"{not json") as resp:
            assert resp.status == 400
        status, body = await post_json(s, tiny_url + "/detokenize", {"tokens": [99999]})
        assert status == 400


@pytest.mark.asyncio
async def test_client_disconnect_frees_the_request(tiny_url: str) -> None:
    async with aiohttp.ClientSession() as s:
        async with s.post(
            tiny_url + "/v1/completions",
            json={
                "prompt": ids(100, 3),
                "max_tokens": 20000 - 100,
                "stream": True,
                "ignore_eos": True,
            },
        ) as resp:
            await resp.content.readline()
        for _ in range(100):
            m = await metrics(s, tiny_url)
            if value(m, "vllm:num_requests_running") == 0:
                break
            await asyncio.sleep(0.02)
        assert value(m, "vllm:num_requests_running") == 0
        assert value(m, "vllm:kv_cache_usage_perc") == 0


@pytest.mark.asyncio
async def test_trace_clear() -> None:
    with running_simulator(SimOptions(speed=50)) as url:
        async with aiohttp.ClientSession() as s:
            for prompt in ([400, 500], [400, 500], [400, 501]):
                await post_json(s, url + "/v1/completions", {"prompt": prompt, "max_tokens": 4})
            trace = await get_json(s, url + "/sim/trace")
            assert len(trace["requests"]) == 3
            rec = trace["requests"][0]
            assert set(rec) >= {
                "id",
                "arrival",
                "prompt_tokens",
                "prompt_hash",
                "max_tokens",
                "cached_tokens",
                "first_token_time",
                "chunks",
                "finish_reason",
                "completion_tokens",
            }
            assert rec["arrival"] < rec["first_token_time"]
            assert rec["max_tokens"] == 4 and rec["prompt_tokens"] == 2
            same, other = trace["requests"][1:]
            assert same["prompt_hash"] == rec["prompt_hash"] != other["prompt_hash"]
            async with s.delete(url + "/sim/trace") as resp:
                assert resp.status == 200
            assert (await get_json(s, url + "/sim/trace"))["requests"] == []


@pytest.mark.asyncio
async def test_quirks_make_a_less_vllm_like_server() -> None:
    """``--quirks``: 422 on vendor fields, no usage in streams, no /metrics, no token ids."""
    with running_simulator(
        SimOptions(
            profile="tiny",
            speed=20.0,
            quirks=",".join(["no-vendor-fields", "no-stream-usage", "no-metrics", "text-only"]),
        )
    ) as url:
        async with aiohttp.ClientSession() as s:
            status, body = await post_json(
                s,
                url + "/v1/completions",
                {"prompt": "hello world", "max_tokens": 4, "ignore_eos": True},
            )
            assert status == 422 and body["error"]["param"] == "ignore_eos"
            status, body = await post_json(
                s, url + "/v1/completions", {"prompt": ids(20, 1), "max_tokens": 4}
            )
            assert status == 400 and "'prompt' must be a string" in body["error"]["message"]
            res = await stream(
                s, url + "/v1/completions", {"prompt": "hello world there", "max_tokens": 8}
            )
            assert res.status == 200 and res.chunks
            assert all("usage" not in e.data for e in res.events if isinstance(e.data, dict))
            async with s.get(url + "/metrics") as resp:
                assert resp.status == 404
            status, body = await post_json(s, url + "/tokenize", {"prompt": "hello world"})
            assert status == 200 and body["count"] >= 2
