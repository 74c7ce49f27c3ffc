"""Smoke tests of the real vLLM server fixture, with plain urllib (not the plugin)."""

from __future__ import annotations

import json
import random
import re
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from engines.servers import MAX_MODEL_LEN, VllmServer

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

ServerFactory = Callable[..., VllmServer]


def get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=30) as resp:
        assert resp.status == 200
        return json.loads(resp.read())


def post_json(url: str, body: dict[str, Any]) -> Any:
    req = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=60) as resp:
        assert resp.status == 200
        return json.loads(resp.read())


def stream_events(url: str, body: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """POST with stream=true and yield each SSE `data:` JSON object until [DONE]."""
    req = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=120) as resp:
        assert resp.status == 200
        for raw in resp:
            line = raw.decode().strip()
            if not line.startswith("data:"):
                continue
            data = line[len("data:") :].strip()
            if data == "[DONE]":
                return
            event = json.loads(data)
            assert "error" not in event, event
            yield event
    raise AssertionError("stream ended without [DONE]")


def random_prompt_ids(n: int, seed: int = 0) -> list[int]:
    # Random weights make every id equally valid; stay clear of the 4 special tokens.
    rng = random.Random(seed)
    return [rng.randrange(4, 256) for _ in range(n)]


def completion_usage(server: VllmServer, prompt: list[int], max_tokens: int) -> list[dict]:
    body = {
        "model": server.model,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "temperature": 0.0,
        "stream": True,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
    }
    return [
        event["usage"]
        for event in stream_events(f"{server.url}/v1/completions", body)
        if event.get("usage")
    ]


def test_models_reports_max_model_len(vllm_server: ServerFactory) -> None:
    server = vllm_server()
    models = get_json(f"{server.url}/v1/models")
    (entry,) = models["data"]
    assert entry["id"] == server.model == "tiny"
    assert entry["max_model_len"] == server.max_model_len == MAX_MODEL_LEN


def test_tokenize(vllm_server: ServerFactory) -> None:
    server = vllm_server()
    out = post_json(
        f"{server.url}/tokenize", {"model": server.model, "prompt": "Hello tiny world 1234."}
    )
    assert out["count"] == len(out["tokens"]) > 1
    assert out["max_model_len"] == server.max_model_len
    assert all(isinstance(t, int) for t in out["tokens"])


def test_streaming_usage_counts_every_token(vllm_server: ServerFactory) -> None:
    server = vllm_server()
    ids = random_prompt_ids(100)
    usages = completion_usage(server, ids, max_tokens=64)
    assert len(usages) > 1, "continuous_usage_stats should put usage in every chunk"
    assert all(u["prompt_tokens"] == len(ids) for u in usages)
    completion = [u["completion_tokens"] for u in usages]
    assert completion == sorted(completion)
    assert completion[-1] == 64
    assert usages[-1]["total_tokens"] == len(ids) + 64


def test_metrics_report_kv_capacity(vllm_server: ServerFactory) -> None:
    server = vllm_server()
    with urllib.request.urlopen(f"{server.url}/metrics", timeout=30) as resp:
        text = resp.read().decode()
    match = re.search(r'vllm:cache_config_info\{[^}]*kv_cache_size_tokens="(\d+)"', text)
    assert match is not None
    assert int(match.group(1)) == server.kv_capacity_tokens > server.max_model_len


def test_stream_interval_gives_multi_token_chunks(vllm_server: ServerFactory) -> None:
    server = vllm_server(stream_interval=4)
    assert server.stream_interval == 4
    assert vllm_server(stream_interval=4) is server  # cached for the session
    usages = completion_usage(server, random_prompt_ids(50, seed=1), max_tokens=64)
    completion = [u["completion_tokens"] for u in usages]
    assert completion[-1] == 64
    steps = [b - a for a, b in zip([0, *completion], completion, strict=False)]
    assert max(steps) > 1, steps
    assert max(steps) <= 4, steps


def test_api_key_is_required(vllm_server: ServerFactory) -> None:
    # Same key as tests/test_vllm_plugin.py, so one session starts this server once.
    server = vllm_server(api_key="the-real-key")
    assert server.api_key == "the-real-key"
    with pytest.raises(urllib.error.HTTPError) as err:
        get_json(f"{server.url}/v1/models")
    assert err.value.code == 401
    req = urllib.request.Request(
        f"{server.url}/v1/models", headers={"Authorization": "Bearer the-real-key"}
    )
    with urllib.request.urlopen(req, timeout=30) as resp:
        assert json.loads(resp.read())["data"][0]["max_model_len"] == server.max_model_len
