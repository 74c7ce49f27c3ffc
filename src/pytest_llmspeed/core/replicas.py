"""Several replicas of one model: one identity, streams spread over them, /metrics from each.

A decode cell's N streams go to the replicas by least load: each start and each restart goes
to the replica with the fewest streams in flight (ties: the first), so N streams over k
replicas put ceil(N / k) on the busiest. The prefill cell is measured on the first replica;
each other replica is then warmed with the same prompt, so every replica holds P(C) before a
decode window opens. The server's counters and gauges are read from every replica (or from
the metrics URLs given for a router that has no /metrics) and summed.
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from .client import Connection, Stop, StreamRecord, stream_request
from .errors import LLMSpeedError, ModelNotFound
from .probe import (
    SNAPSHOT_FAMILIES,
    MetricsSnapshot,
    ServerInfo,
    engine_of,
    kv_capacity_checked,
    metrics_text,
    read_metrics,
    snapshot,
)
from .text import Secret

Samples = dict[str, list[tuple[dict[str, str], float]]]


@dataclass
class MetricsSource:
    """Where one replica's /metrics lives."""

    conn: Connection
    path: str = "/metrics"

    @property
    def url(self) -> str:
        return self.conn.url(self.path)

    async def read(self, families: frozenset[str] | None = None) -> Samples | None:
        """Parsed metrics (only ``families``, when given), or None: no answer, not 200, or
        text that does not parse."""
        try:
            return await read_metrics(self.conn, families, self.path)
        except LLMSpeedError:
            return None

    async def text(self) -> str | None:
        """The metrics text, unparsed, or None: no answer, or not 200."""
        return await metrics_text(self.conn, self.path)


def metrics_source(url: str, session_of: Connection) -> MetricsSource:
    """A ``--llm-metrics-url`` value: a full URL of a metrics page (``http://h:8000/metrics``),
    or a server's base URL (``/metrics`` is added). No API key is sent there."""
    parts = urlsplit(url.rstrip("/"))
    base = f"{parts.scheme}://{parts.netloc}"
    path = parts.path or "/metrics"
    if parts.query:
        path += "?" + parts.query
    return MetricsSource(
        Connection(base, None, session_of.timeout, session_of.session, session_of.fresh), path
    )


@dataclass
class ReplicaSet:
    """The replicas of one model (one pooled aiohttp session for all), and where their
    /metrics live. Quacks like a :class:`Connection` where the decode protocol needs it
    (``timeout``, ``warm_pool``); streams go through :func:`stream_to`."""

    connections: list[Connection]
    sources: list[MetricsSource]
    in_flight: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.in_flight = [0] * len(self.connections)

    @classmethod
    def open(
        cls,
        urls: Sequence[str],
        api_key: str | Secret | None,
        timeout: float,
        metrics_urls: Sequence[str] = (),
    ) -> ReplicaSet:
        """Create inside the event loop that will use it."""
        first = Connection.open(urls[0], api_key, timeout)
        conns = [first] + [
            Connection(u.rstrip("/"), first.api_key, timeout, first.session, first.fresh)
            for u in urls[1:]
        ]
        if metrics_urls:
            sources = [metrics_source(u, first) for u in metrics_urls]
        else:
            sources = [MetricsSource(c) for c in conns]
        return cls(conns, sources)

    @property
    def primary(self) -> Connection:
        return self.connections[0]

    @property
    def timeout(self) -> float:
        return self.primary.timeout

    @property
    def count(self) -> int:
        """Replicas for the capacity arithmetic: the endpoints, or behind one endpoint (a
        router) the metrics URLs, one per replica behind it."""
        return len(self.connections) if len(self.connections) > 1 else len(self.sources)

    def acquire(self) -> int:
        """The replica with the fewest streams in flight (ties: the first), now one busier."""
        i = min(range(len(self.in_flight)), key=self.in_flight.__getitem__)
        self.in_flight[i] += 1
        return i

    def release(self, i: int) -> None:
        self.in_flight[i] -= 1

    async def warm_pool(self, n: int) -> None:
        """Open the pooled connections N streams spread over the replicas will use."""
        per = math.ceil(n / len(self.connections))
        await asyncio.gather(*(c.warm_pool(per) for c in self.connections))

    async def samples(self, families: frozenset[str] | None = None) -> list[Samples | None]:
        """Every replica's /metrics at once (the counter is read over the same moment)."""
        return list(await asyncio.gather(*(s.read(families) for s in self.sources)))

    async def texts(self) -> list[str | None]:
        """Every replica's /metrics text at once, unparsed (a decode window's reads: parsed
        after the window, by ``core/protocol.py``)."""
        return list(await asyncio.gather(*(s.text() for s in self.sources)))

    async def snapshot(self) -> MetricsSnapshot | None:
        """The watched gauges and counters summed over the replicas; None when a replica's
        /metrics did not answer (a sum without it would be wrong)."""
        read = await self.samples(SNAPSHOT_FAMILIES)
        if any(s is None for s in read):
            return None
        return sum_snapshots([snapshot(s) for s in read if s is not None])

    async def healthy(self) -> bool:
        for conn in self.connections:
            try:
                status, _ = await conn.get("/v1/models")
            except LLMSpeedError:
                return False
            if status != 200:
                return False
        return True

    async def close(self) -> None:
        for conn in self.connections[1:]:
            await conn.end_drains()  # each connection's own reads after [DONE]
        await self.primary.close()  # the one session every connection shares


def sum_snapshots(snaps: Sequence[MetricsSnapshot]) -> MetricsSnapshot:
    """Each figure summed over the replicas; None where any replica lacks it."""

    def total(name: str) -> float | None:
        values = [getattr(s, name) for s in snaps]
        return None if any(v is None for v in values) else float(sum(values))

    return MetricsSnapshot(**{f.name: total(f.name) for f in dataclasses.fields(MetricsSnapshot)})


async def stream_to(
    target: Connection | ReplicaSet,
    path: str,
    payload: dict[str, Any] | bytes,
    rec: StreamRecord,
    on_first_token: Callable[[StreamRecord], None] | None = None,
    stop: Stop | None = None,
) -> StreamRecord:
    """One stream to one server, or to the least-loaded replica (``rec.replica`` says which)."""
    if isinstance(target, Connection):
        return await stream_request(target, path, payload, rec, on_first_token, stop)
    i = target.acquire()
    rec.replica = i
    try:
        conn = target.connections[i]
        return await stream_request(conn, path, payload, rec, on_first_token, stop)
    finally:
        target.release(i)


def per_replica_tok_s(
    records: Sequence[StreamRecord], window: tuple[float, float], replicas: int
) -> tuple[float, ...]:
    """Each replica's output tokens inside the window [w0, w1) / the window's length: the
    total tok/s of docs/metrics.md, split by the replica that served each stream."""
    w0, w1 = window
    tokens = [0] * replicas
    for rec in records:
        tokens[rec.replica] += sum(
            c for t, c in zip(rec.token_times, rec.token_counts, strict=True) if w0 <= t < w1
        )
    measured = w1 - w0
    return tuple(t / measured if measured > 0 else 0.0 for t in tokens)


async def probe_replicas(
    replicas: ReplicaSet,
    probe_one: Callable[[Connection], Awaitable[ServerInfo]],
    capacity_given: bool = False,
) -> ServerInfo:
    """Probe every replica (``probe_one``); one identity for all. Replicas that serve
    different models or max_model_len are an error naming both; different versions, a warning
    note. KV capacity is one replica's: the smallest (given: the value given, per replica)."""
    infos = [await probe_one(c) for c in replicas.connections]
    first = infos[0]
    for other in infos[1:]:
        if other.model != first.model:
            raise ModelNotFound(
                f"the replicas serve different models: {first.base_url} serves "
                f"{first.model!r}, {other.base_url} serves {other.model!r}; give the endpoints "
                "of one model"
            )
        if other.max_model_len != first.max_model_len:
            raise LLMSpeedError(
                f"the replicas differ in max_model_len: {first.base_url} has "
                f"{first.max_model_len}, {other.base_url} has {other.max_model_len}; give "
                "replicas started alike",
                setting="endpoint",
            )
    notes = [n for info in infos for n in info.notes]
    versions = {i.version for i in infos}
    if len(versions) > 1:
        notes.append(
            "warning: the replicas run different versions: "
            + ", ".join(f"{i.base_url} {i.version or '?'}" for i in infos)
        )
    engine = first.engine
    uses_urls = replicas.sources[0].conn not in replicas.connections
    if uses_urls:
        read = await replicas.samples()
        has_metrics = all(s is not None for s in read)
        checked = [kv_capacity_checked(s) if s else (None, []) for s in read]
        capacities = [cap for cap, _ in checked]
        notes += [n for _, found in checked for n in found if n not in notes]
        if engine == "unknown" and read[0] is not None:
            engine = engine_of(read[0])
    else:
        has_metrics = all(i.has_metrics for i in infos)
        capacities = [i.kv_capacity for i in infos]
    where = f"{replicas.count} replicas"
    if capacity_given:
        cap: int | None = first.kv_capacity
        source = f"{first.kv_capacity_source}, per replica"
    elif capacities and all(c is not None for c in capacities):
        cap = min(c for c in capacities if c is not None)
        origin = "metrics URLs" if uses_urls else "server /metrics"
        source = f"{origin}, per replica: the smallest of {where}"
    else:
        cap, source = None, "unknown: every cell runs"
        if any(c is not None for c in capacities):
            notes.append(
                f"KV capacity read from {sum(c is not None for c in capacities)} of {where} "
                "only: every cell runs"
            )
    return dataclasses.replace(
        first,
        engine=engine,
        kv_capacity=cap,
        kv_capacity_source=source,
        has_metrics=has_metrics,
        notes=tuple(notes),
        replicas=tuple(c.base_url for c in replicas.connections),
        metrics_urls=tuple(s.url for s in replicas.sources) if uses_urls else (),
        replica_count=replicas.count,
    )
