"""What the server is: model, max_model_len, engine and version, KV capacity, queue state."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from . import server_figures
from .client import Connection
from .errors import LLMSpeedError, ModelNotFound, NotAnOpenAIServer


@dataclass
class ServerInfo:
    """Identity and limits of the server under test."""

    base_url: str
    model: str
    models: list[str]
    max_model_len: int | None
    engine: str  # "vllm", "sglang", "llmspeed-sim" or "unknown"
    version: str | None
    kv_capacity: int | None
    kv_capacity_source: str  # where kv_capacity came from, in words
    has_metrics: bool
    notes: tuple[str, ...] = ()  # what the probe had to work around
    replicas: tuple[str, ...] = ()  # base URLs of the replicas, when several (core/replicas.py)
    metrics_urls: tuple[str, ...] = ()  # where /metrics was read, when not from the endpoints
    replica_count: int = 1  # replicas for the capacity arithmetic (kv_capacity: one replica's)

    def describe(self) -> str:
        cap = f"{self.kv_capacity:,} tokens" if self.kv_capacity else "unknown"
        mml = f"{self.max_model_len:,}" if self.max_model_len else "unknown"
        where = self.base_url
        if len(self.replicas) > 1:
            where = f"{len(self.replicas)} replicas ({', '.join(self.replicas)})"
        return (
            f"server: {where} · engine {self.engine} {self.version or '?'} · "
            f"model {self.model} · max_model_len {mml} · KV capacity {cap} "
            f"({self.kv_capacity_source})"
        )


@dataclass
class MetricsSnapshot:
    """The few /metrics values the protocol watches (summed over engines)."""

    running: float | None = None
    waiting: float | None = None
    generation_tokens: float | None = None
    prompt_tokens: float | None = None


#: the metric families a snapshot reads (the 1 Hz samples of a decode cell)
SNAPSHOT_FAMILIES = frozenset(
    {
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:generation_tokens",
        "vllm:prompt_tokens",
        "sglang:num_running_reqs",
        "sglang:num_queue_reqs",
    }
)


def only_families(text: str, families: frozenset[str]) -> str:
    """The lines of a Prometheus text that belong to ``families`` (samples, a histogram's
    ``_sum`` and ``_count`` but never its buckets, and their # HELP / # TYPE lines). vLLM's
    /metrics is ~50 KB of histograms; prometheus_client parses it in 14-19 ms of CPU, which a
    decode cell's once-a-second sample would take from a server that shares the machine;
    filtered, 0.5 ms (benchmarks/metrics_parse_cost.py). One rule with the server's figures'
    (:func:`~.server_figures.only_families`), so that one parse serves both."""
    return server_figures.only_families(text, families)


def parse_metrics(
    text: str, families: frozenset[str] | None = None
) -> dict[str, list[tuple[dict[str, str], float]]]:
    """Prometheus text → {sample name: [(labels, value), ...]} using prometheus_client
    (only ``families``, when given)."""
    if families is not None:
        text = only_families(text, families)
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out.setdefault(sample.name, []).append((dict(sample.labels), float(sample.value)))
    return out


def kv_capacity_from_metrics(samples: dict[str, list[tuple[dict[str, str], float]]]) -> int | None:
    """vLLM ``cache_config_info{kv_cache_size_tokens}`` summed over engines, else
    ``num_gpu_blocks × block_size``; SGLang ``max_total_num_tokens``."""
    infos = samples.get("vllm:cache_config_info") or samples.get("vllm:cache_config_info_info")
    if infos:
        by_engine: dict[str, int] = {}
        for labels, _ in infos:
            engine = labels.get("engine", "0")
            size = labels.get("kv_cache_size_tokens")
            if size and size.isdigit():
                by_engine[engine] = int(size)
                continue
            blocks, block = labels.get("num_gpu_blocks"), labels.get("block_size")
            if blocks and block and blocks.isdigit() and block.isdigit():
                by_engine[engine] = int(blocks) * int(block)
        if by_engine:
            return sum(by_engine.values())
    sg = samples.get("sglang:max_total_num_tokens")
    if sg:
        return int(sum(v for _, v in sg))
    return None


def snapshot(samples: dict[str, list[tuple[dict[str, str], float]]]) -> MetricsSnapshot:
    def total(*names: str) -> float | None:
        for name in names:
            if name in samples:
                return sum(v for _, v in samples[name])
        return None

    return MetricsSnapshot(
        running=total("vllm:num_requests_running", "sglang:num_running_reqs"),
        waiting=total("vllm:num_requests_waiting", "sglang:num_queue_reqs"),
        generation_tokens=total("vllm:generation_tokens_total", "vllm:generation_tokens"),
        prompt_tokens=total("vllm:prompt_tokens_total", "vllm:prompt_tokens"),
    )


async def metrics_text(conn: Connection, path: str = "/metrics") -> str | None:
    """The /metrics text as read, unparsed, or None: no answer, or not HTTP 200."""
    try:
        status, body = await conn.get(path)
    except LLMSpeedError:
        return None
    return body if status == 200 else None


async def read_metrics(
    conn: Connection, families: frozenset[str] | None = None, path: str = "/metrics"
) -> dict[str, list[tuple[dict[str, str], float]]] | None:
    """Parsed /metrics (only ``families``, when given), or None when the server has none (404)
    or it does not parse."""
    status, body = await conn.get(path)
    if status != 200:
        return None
    try:
        return parse_metrics(body, families)
    except ValueError:
        return None


async def probe(
    conn: Connection,
    model: str | None,
    kv_capacity: int | None,
    kv_capacity_source: str = "given",
    max_model_len: int | None = None,
) -> ServerInfo:
    """Ask the server what it is. Raises LLMSpeedError with a user-facing message.

    ``kv_capacity`` given by the caller wins over the server's; ``kv_capacity_source`` says
    where it came from."""
    notes: list[str] = []
    status, body = await conn.get("/v1/models")
    if status in (401, 403):
        raise conn.http_error(status, body, "/v1/models")
    try:
        data, models = _models(conn, status, body)
    except LLMSpeedError as exc:
        if model is None:
            raise
        # some servers answer /v1/models badly (transformers serve offline: HTTP 500) but serve
        # the model they are asked for: go on with the name the user gave
        data, models = [], [model]
        notes.append(f"warning: {exc.message}; going on with the model given ({model})")
    chosen = model or models[0]
    if chosen not in models:
        raise ModelNotFound(
            f"model {chosen!r} is not served by {conn.base_url}; it serves: {', '.join(models)}."
        )
    mml = next((m.get("max_model_len") for m in data if m.get("id") == chosen), None)
    if max_model_len is not None:
        mml = max_model_len
    elif mml is None:
        mml = await _max_model_len_from_tokenize(conn, chosen)
        if mml is not None:
            notes.append(f"max_model_len {mml:,} from the server's /tokenize answer")

    engine, version = "unknown", None
    status, body = await conn.get("/version")
    if status == 200:
        try:
            version = json.loads(body).get("version")
        except (ValueError, AttributeError):
            version = None
    samples = await read_metrics(conn)
    if samples is not None:
        engine = engine_of(samples)

    cap: int | None
    if kv_capacity is not None:
        cap, source = kv_capacity, kv_capacity_source
    else:
        cap = kv_capacity_from_metrics(samples) if samples else None
        source = "server /metrics" if cap else "unknown: every cell runs"
        if cap is None:
            cap = await _sglang_capacity(conn)
            if cap is not None:
                source, engine = "SGLang server_info", "sglang"
    return ServerInfo(
        base_url=conn.base_url,
        model=chosen,
        models=models,
        max_model_len=int(mml) if mml else None,
        engine=engine,
        version=version,
        kv_capacity=cap,
        kv_capacity_source=source,
        has_metrics=samples is not None,
        notes=tuple(notes),
    )


def engine_of(samples: dict[str, list[tuple[dict[str, str], float]]]) -> str:
    """The engine whose metric names a /metrics page shows."""
    names = samples.keys()
    if any(n.startswith("llmspeed_sim") for n in names):
        return "llmspeed-sim"
    if any(n.startswith("vllm:") for n in names):
        return "vllm"
    if any(n.startswith("sglang:") for n in names):
        return "sglang"
    return "unknown"


def _models(conn: Connection, status: int, body: str) -> tuple[list[dict[str, Any]], list[str]]:
    """The model entries and ids of a /v1/models answer; typed errors when it is not one."""
    if status != 200:
        raise NotAnOpenAIServer(
            f"{conn.base_url}/v1/models answered HTTP {status}: is this an OpenAI-compatible "
            "server?"
        )
    try:
        data = json.loads(body).get("data") or []
    except (ValueError, AttributeError):
        raise NotAnOpenAIServer(f"{conn.base_url}/v1/models did not answer JSON") from None
    entries = [m for m in data if isinstance(m, dict)]
    models = [str(m["id"]) for m in entries if m.get("id")]
    if not models:
        raise ModelNotFound(f"{conn.base_url} serves no model (/v1/models is empty)")
    return entries, models


async def _max_model_len_from_tokenize(conn: Connection, model: str) -> int | None:
    """vLLM's /tokenize answers carry max_model_len: ask with one short prompt."""
    try:
        answer = await conn.post_json("/tokenize", {"model": model, "prompt": "a"})
    except LLMSpeedError:
        return None
    value = answer.get("max_model_len") if isinstance(answer, dict) else None
    return value if isinstance(value, int) and value > 0 else None


async def _sglang_capacity(conn: Connection) -> int | None:
    for path in ("/server_info", "/get_server_info"):
        try:
            status, body = await conn.get(path)
        except LLMSpeedError:
            return None
        if status == 200:
            try:
                value = json.loads(body).get("max_total_num_tokens")
            except (ValueError, AttributeError):
                continue
            if isinstance(value, int):
                return value
    return None
