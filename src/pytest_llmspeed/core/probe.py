"""What the server is: model, max_model_len, engine and version, KV capacity, queue state."""

from __future__ import annotations

import asyncio
import json
import math
import re
import unicodedata
from dataclasses import dataclass
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from . import server_figures
from .client import METRICS_LIMIT, Connection
from .errors import LLMSpeedError, ModelNotFound, NotAnOpenAIServer, ServerUnreachable
from .text import for_person
from .wire import loads

#: the most tokens a length or a capacity the server gives may be (2^31): more is not a figure
MAX_TOKENS = 2**31
#: the longest model id taken from a server
MAX_MODEL_ID = 1024
#: the most characters of a server's version kept
MAX_VERSION = 200
#: the most characters of a server value named in a note
SHOWN_VALUE = 60


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
        version = for_person(self.version) if self.version else "?"
        return (
            f"server: {where} · engine {self.engine} {version} · "
            f"model {for_person(self.model)} · max_model_len {mml} · KV capacity {cap} "
            f"({self.kv_capacity_source})"
        )


def shown(value: object) -> str:
    """A value a server sent, as a note names it: its JSON spelling (``true``, ``"7"``,
    ``NaN``), made safe for a person and cut to :data:`SHOWN_VALUE` characters."""
    try:
        text = json.dumps(value)
    except (TypeError, ValueError):
        text = repr(value)
    return for_person(text[: SHOWN_VALUE * 4], SHOWN_VALUE)


def whole_tokens(value: object) -> int | None:
    """``value`` as a whole number of tokens in 1 … 2^31, else None: NaN, ±Inf, negative, zero,
    non-integral, a boolean, a string (a label's digits are read by :func:`_label_tokens`)
    or more than 2^31 is not a length or a capacity."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if isinstance(value, float) and (not math.isfinite(value) or not value.is_integer()):
        return None
    number = int(value)
    return number if 1 <= number <= MAX_TOKENS else None


_DIGITS = re.compile(r"[0-9]{1,12}")


def _label_tokens(value: str | None) -> int | None:
    """A Prometheus label's value as a whole number of tokens (ASCII digits only), else None."""
    if value is None or not _DIGITS.fullmatch(value):
        return None
    return whole_tokens(int(value))


def refused(what: str, value: object, where: str) -> str:
    """The note of a length or capacity taken as unknown: what, the value, where it came from."""
    return (
        f"{what} {shown(value)} from {where} is not a whole number of tokens in "
        f"1 … {MAX_TOKENS:,}: taken as unknown"
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


#: what prometheus_client's parser raises on text that is not Prometheus text
PARSE_ERRORS = (ValueError, TypeError, IndexError, KeyError, AttributeError)


def parse_metrics(
    text: str, families: frozenset[str] | None = None
) -> dict[str, list[tuple[dict[str, str], float]]]:
    """Prometheus text → {sample name: [(labels, value), ...]} using prometheus_client
    (only ``families``, when given). Text that does not parse raises ValueError."""
    if families is not None:
        text = only_families(text, families)
    server_figures.check_lines(
        text,
        server_figures.MAX_METRICS_LINES if families is None else server_figures.MAX_FAMILY_LINES,
    )
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                out.setdefault(sample.name, []).append((dict(sample.labels), float(sample.value)))
    except PARSE_ERRORS as exc:
        if isinstance(exc, ValueError):
            raise
        raise ValueError(str(exc)) from exc
    return out


def parse_problem(text: str, families: frozenset[str] | None = None) -> str:
    """Why a /metrics text does not parse, in one line: the first line that fails alone (its
    number and its start, cut short), else the parser's words."""
    if families is not None:
        text = only_families(text, families)
    try:
        server_figures.check_lines(
            text,
            server_figures.MAX_METRICS_LINES
            if families is None
            else server_figures.MAX_FAMILY_LINES,
        )
    except server_figures.MetricsTooLarge as exc:
        return str(exc)  # not each of its lines parsed alone
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip() or line.startswith("#"):
            continue
        try:
            parse_metrics(line + "\n")
        except ValueError:
            return f"line {number}: {shown(line)}"
    try:
        parse_metrics(text)
    except ValueError as exc:
        return for_person(str(exc), SHOWN_VALUE)
    return "it parsed when read again"


def kv_capacity_from_metrics(samples: dict[str, list[tuple[dict[str, str], float]]]) -> int | None:
    """vLLM ``cache_config_info{kv_cache_size_tokens}`` summed over engines, else
    ``num_gpu_blocks × block_size``; SGLang ``max_total_num_tokens``; None when unknown or
    when a value is not a whole number of tokens in 1 … 2^31 (:func:`kv_capacity_checked`)."""
    return kv_capacity_checked(samples)[0]


def kv_capacity_checked(
    samples: dict[str, list[tuple[dict[str, str], float]]],
) -> tuple[int | None, list[str]]:
    """The KV capacity /metrics gives, and the notes of values refused: a label or a sample
    that is not a whole number of tokens in 1 … 2^31 (``kv_cache_size_tokens="0"``, NaN, a
    negative count, 1e30) makes the capacity unknown, with a note naming it (a capacity of 0
    would skip every decode cell)."""
    notes: list[str] = []
    infos = samples.get("vllm:cache_config_info") or samples.get("vllm:cache_config_info_info")
    if infos:
        by_engine: dict[str, int] = {}
        for labels, _ in infos:
            engine = labels.get("engine", "0")
            size = labels.get("kv_cache_size_tokens")
            if size is not None:
                tokens = _label_tokens(size)
                if tokens is None:
                    notes.append(refused("KV capacity", size, "/metrics kv_cache_size_tokens"))
                    return None, notes
                by_engine[engine] = tokens
                continue
            blocks, block = labels.get("num_gpu_blocks"), labels.get("block_size")
            if blocks is None or block is None:
                continue
            n_blocks, n_block = _label_tokens(blocks), _label_tokens(block)
            product = whole_tokens(n_blocks * n_block) if n_blocks and n_block else None
            if product is None:
                notes.append(
                    refused(
                        "KV capacity",
                        f"{blocks} × {block}",
                        "/metrics num_gpu_blocks × block_size",
                    )
                )
                return None, notes
            by_engine[engine] = product
        if by_engine:
            total = sum(by_engine.values())
            if whole_tokens(total) is None:
                notes.append(refused("KV capacity", total, "/metrics (summed over engines)"))
                return None, notes
            return total, notes
    sg = samples.get("sglang:max_total_num_tokens")
    if sg:
        values = [v for _, v in sg]
        bad = next((v for v in values if whole_tokens(v) is None), None)
        total_sg = whole_tokens(sum(values)) if bad is None else None
        if total_sg is None:
            value = bad if bad is not None else sum(values)
            notes.append(refused("KV capacity", value, "/metrics sglang:max_total_num_tokens"))
        return total_sg, notes
    return None, notes


def snapshot(samples: dict[str, list[tuple[dict[str, str], float]]]) -> MetricsSnapshot:
    """The watched values, each summed over engines; None where the server has none or where
    one of its values is NaN, infinite or negative (not a count: unknown, never busy)."""

    def total(*names: str) -> float | None:
        for name in names:
            if name in samples:
                values = [v for _, v in samples[name]]
                if not all(math.isfinite(v) and v >= 0 for v in values):
                    return None
                return sum(values)
        return None

    return MetricsSnapshot(
        running=total("vllm:num_requests_running", "sglang:num_running_reqs"),
        waiting=total("vllm:num_requests_waiting", "sglang:num_queue_reqs"),
        generation_tokens=total("vllm:generation_tokens_total", "vllm:generation_tokens"),
        prompt_tokens=total("vllm:prompt_tokens_total", "vllm:prompt_tokens"),
    )


async def get_within(conn: Connection, path: str, limit: int | None = None) -> tuple[int, str]:
    """``conn.get(path)`` (at most ``limit`` bytes, when given): its whole answer within the
    connection's timeout (``Connection.get`` bounds it: no answer at all is "cannot reach",
    a server that trickles its answer says so; both ServerUnreachable, ``timeout``)."""
    if limit is None:
        return await conn.get(path)
    return await conn.get(path, limit=limit)


async def metrics_text(conn: Connection, path: str = "/metrics") -> str | None:
    """The /metrics text as read, unparsed, or None: no answer (within the timeout), or not
    HTTP 200."""
    try:
        status, body = await get_within(conn, path, METRICS_LIMIT)
    except LLMSpeedError:
        return None
    return body if status == 200 else None


async def read_metrics(
    conn: Connection, families: frozenset[str] | None = None, path: str = "/metrics"
) -> dict[str, list[tuple[dict[str, str], float]]] | None:
    """Parsed /metrics (only ``families``, when given), or None when the server has none (404)
    or it does not parse. No answer within the timeout raises ServerUnreachable."""
    status, body = await get_within(conn, path, METRICS_LIMIT)
    if status != 200:
        return None
    try:
        return parse_metrics(body, families)
    except ValueError:
        return None


async def probe_metrics(
    conn: Connection, path: str = "/metrics"
) -> tuple[dict[str, list[tuple[dict[str, str], float]]] | None, str | None]:
    """/metrics at the probe: its samples, or None with the note that says why there are no
    server figures (no answer within the timeout, text that does not parse: the line). A
    server without /metrics (not HTTP 200) has no note: that is common. Never raises: only
    /v1/models failing means the server cannot be reached."""
    try:
        status, body = await get_within(conn, path, METRICS_LIMIT)
    except ServerUnreachable as exc:
        if exc.setting == "timeout":  # the endpoint answered /v1/models: /metrics is slow
            why = f"{path} did not answer within {conn.timeout:g} s"
        else:
            why = f"{path} could not be read ({exc.message})"
        return None, f"no server figures in this run: {why}"
    except LLMSpeedError as exc:
        return None, f"no server figures in this run: {exc.message}"
    if status != 200:
        return None, None
    try:
        return parse_metrics(body), None
    except ValueError:
        return None, (
            f"{path} did not parse ({parse_problem(body)}): no server figures in this run"
        )


async def probe(
    conn: Connection,
    model: str | None,
    kv_capacity: int | None,
    kv_capacity_source: str = "given",
    max_model_len: int | None = None,
) -> ServerInfo:
    """Ask the server what it is. Raises LLMSpeedError with a user-facing message.

    ``kv_capacity`` given by the caller wins over the server's; ``kv_capacity_source`` says
    where it came from. Values that make no sense (docs/trust.md, "Values that make sense")
    are taken as unknown, each with a note; only /v1/models failing stops the probe."""
    notes: list[str] = []
    status, body = await get_within(conn, "/v1/models")
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
            f"model {for_person(repr(chosen))} is not served by {conn.base_url}; it serves: "
            f"{for_person(', '.join(models))}."
        )
    _check_model_id(conn, chosen)
    mml: int | None = None
    if max_model_len is not None:
        mml = max_model_len
    else:
        entry = next((m for m in data if m.get("id") == chosen), {})
        if "max_model_len" in entry and entry["max_model_len"] is not None:
            mml = whole_tokens(entry["max_model_len"])
            if mml is None:
                notes.append(refused("max_model_len", entry["max_model_len"], "/v1/models"))
        if mml is None:
            mml, note = await _max_model_len_from_tokenize(conn, chosen)
            if note:
                notes.append(note)
            elif mml is not None:
                notes.append(f"max_model_len {mml:,} from the server's /tokenize answer")

    engine = "unknown"
    version = await _version(conn)
    samples, metrics_note = await probe_metrics(conn)
    if metrics_note:
        notes.append(metrics_note)
    if samples is not None:
        engine = engine_of(samples)

    cap: int | None
    if kv_capacity is not None:
        cap, source = kv_capacity, kv_capacity_source
    else:
        cap, cap_notes = kv_capacity_checked(samples) if samples else (None, [])
        notes += cap_notes
        source = "server /metrics" if cap else "unknown: every cell runs"
        if cap is None:
            cap, sg_note = await _sglang_capacity(conn)
            if sg_note:
                notes.append(sg_note)
            if cap is not None:
                source, engine = "SGLang server_info", "sglang"
    return ServerInfo(
        base_url=conn.base_url,
        model=chosen,
        models=models,
        max_model_len=mml,
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
    """The model entries and ids of a /v1/models answer, which must be ``{"data": [{"id":
    "..."}, ...]}``; typed errors (one line) when it is not one."""
    where = f"{conn.base_url}/v1/models"
    if status != 200:
        raise NotAnOpenAIServer(
            f"{where} answered HTTP {status}: is this an OpenAI-compatible server?"
        )
    try:
        answer = loads(body)
    except ValueError:
        raise NotAnOpenAIServer(f"{where} did not answer JSON") from None
    if not isinstance(answer, dict):
        raise NotAnOpenAIServer(
            f'{where} answered {_kind(answer)}, not an object with a list of models in "data"'
        )
    data = answer.get("data")
    if data is None:
        data = []
    if not isinstance(data, list):
        raise NotAnOpenAIServer(
            f'{where}: "data" is {shown(data)} ({_kind(data)}), not a list of models'
        )
    for i, entry in enumerate(data):
        if not isinstance(entry, dict):
            raise NotAnOpenAIServer(
                f"{where}: data[{i}] is {shown(entry)} ({_kind(entry)}), not a model object"
            )
        if not isinstance(entry.get("id"), str):
            raise NotAnOpenAIServer(
                f"{where}: data[{i}].id is {shown(entry.get('id'))}, not a model id (a string)"
            )
    models = [m["id"] for m in data if m["id"]]
    if not models:
        raise ModelNotFound(f"{conn.base_url} serves no model (/v1/models is empty)")
    return data, models


def _kind(value: object) -> str:
    """A JSON value's kind in words."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "a list"
    return "an object"


_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")


def _check_model_id(conn: Connection, model: str) -> None:
    """A model id the run will send and print: at most 1,024 characters, no control
    characters; else NotAnOpenAIServer (one line)."""
    if len(model) > MAX_MODEL_ID:
        raise NotAnOpenAIServer(
            f"{conn.base_url}/v1/models: the model id is {len(model):,} characters long "
            f"(at most {MAX_MODEL_ID:,} are taken): {shown(model)}"
        )
    if _CONTROL.search(model) or (
        not model.isascii() and any(unicodedata.category(c) == "Cf" for c in model)
    ):
        # Cf: bidirectional overrides, zero-width characters, which reorder or hide what a
        # terminal or a page shows
        raise NotAnOpenAIServer(
            f"{conn.base_url}/v1/models: the model id holds control characters or invisible format "
            f"characters: {shown(model)}"
        )


async def _version(conn: Connection) -> str | None:
    """/version's ``version``: a string, cut to 200 characters; else None (no answer within
    the timeout, not JSON, not a string)."""
    try:
        status, body = await get_within(conn, "/version")
    except LLMSpeedError:
        return None
    if status != 200:
        return None
    try:
        answer = loads(body)
    except ValueError:
        return None
    value = answer.get("version") if isinstance(answer, dict) else None
    if not isinstance(value, str) or not value:
        return None
    return for_person(value[: MAX_VERSION * 4], 10 * MAX_VERSION)[:MAX_VERSION] or None


async def _max_model_len_from_tokenize(
    conn: Connection, model: str
) -> tuple[int | None, str | None]:
    """vLLM's /tokenize answers carry max_model_len: ask with one short prompt. The value and
    the note of one refused (not a whole number of tokens in 1 … 2^31)."""
    try:
        answer = await asyncio.wait_for(
            conn.post_json("/tokenize", {"model": model, "prompt": "a"}), conn.timeout
        )
    except (LLMSpeedError, TimeoutError, ValueError):
        return None, None
    if not isinstance(answer, dict) or answer.get("max_model_len") is None:
        return None, None
    value = whole_tokens(answer["max_model_len"])
    if value is None:
        return None, refused("max_model_len", answer["max_model_len"], "/tokenize")
    return value, None


async def _sglang_capacity(conn: Connection) -> tuple[int | None, str | None]:
    """SGLang's ``max_total_num_tokens`` from /server_info or /get_server_info, and the note of
    one refused."""
    for path in ("/server_info", "/get_server_info"):
        try:
            status, body = await get_within(conn, path)
        except LLMSpeedError:
            return None, None
        if status == 200:
            try:
                answer = loads(body)
            except ValueError:
                continue
            if not isinstance(answer, dict) or answer.get("max_total_num_tokens") is None:
                continue
            value = whole_tokens(answer["max_total_num_tokens"])
            if value is None:
                return None, refused("KV capacity", answer["max_total_num_tokens"], path)
            return value, None
    return None, None
