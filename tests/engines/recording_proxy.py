"""A recording pass-through proxy on loopback: every request is forwarded to a real server as it
came, and every answer back to the client read by read, as it came; each exchange keeps the
request's body and the bytes forwarded to the client, with their times (``perf_counter``, on
Linux the one monotonic clock of every process). What a client of the proxy read is what the
server sent, but for what was still on its way when the client hung up (a stream cancelled)."""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from aiohttp import web

from tests.forwarding import forwarding_server

FORWARDED_HEADERS = ("content-type", "authorization", "accept")


@dataclass
class Exchange:
    method: str
    path: str
    body: bytes
    t_start: float
    status: int | None = None
    reads: list[tuple[float, bytes]] = field(default_factory=list)  # forwarded to the client
    client_gone: bool = False  # the client hung up before the answer's end
    upstream_error: str | None = None  # the server broke the connection or the stream

    @property
    def server_failed(self) -> str | None:
        """What the server did wrong on this exchange (HTTP 5xx, a broken connection), or
        None."""
        if self.upstream_error:
            return f"{self.method} {self.path}: {self.upstream_error}"
        if self.status is not None and self.status >= 500:
            return f"{self.method} {self.path}: HTTP {self.status}"
        return None

    def request(self) -> dict[str, Any]:
        try:
            parsed = json.loads(self.body)
        except ValueError:
            return {}
        return parsed if isinstance(parsed, dict) else {}

    def events(self) -> list[dict[str, Any]]:
        """The answer's SSE ``data:`` objects, whole ones only (a cancelled stream may end
        inside one)."""
        return sse_events(self.reads)


def sse_events(reads: list[tuple[float, bytes]]) -> list[dict[str, Any]]:
    return [obj for _, obj in timed_sse_events(reads)]


def timed_sse_events(reads: list[tuple[float, bytes]]) -> list[tuple[float, dict[str, Any]]]:
    """Whole SSE ``data:`` objects with the time of the read that completed each."""
    out: list[tuple[float, dict[str, Any]]] = []
    buf = b""
    for t, data in reads:
        buf += data
        *whole, buf = buf.split(b"\n\n")
        for event in whole:
            for line in event.split(b"\n"):
                if line.startswith(b"data:") and line[5:].strip() != b"[DONE]":
                    out.append((t, json.loads(line[5:])))
    return out


@contextlib.contextmanager
def recording_proxy(upstream: str) -> Iterator[tuple[str, list[Exchange]]]:
    """(the proxy's base URL, its exchanges so far) while it runs in its own thread and loop."""
    exchanges: list[Exchange] = []

    async def forward(request: web.Request, session: aiohttp.ClientSession) -> web.StreamResponse:
        body = await request.read()
        ex = Exchange(request.method, request.path, body, time.perf_counter())
        exchanges.append(ex)
        headers = {k: v for k, v in request.headers.items() if k.lower() in FORWARDED_HEADERS}
        url = upstream + request.path_qs
        try:
            async with session.request(request.method, url, data=body, headers=headers) as up:
                ex.status = up.status
                response = web.StreamResponse(status=up.status)
                if "Content-Type" in up.headers:
                    response.headers["Content-Type"] = up.headers["Content-Type"]
                await response.prepare(request)
                try:
                    async for data in up.content.iter_any():
                        await response.write(data)
                        ex.reads.append((time.perf_counter(), data))
                    await response.write_eof()
                except ConnectionResetError:  # leaving the block closes the upstream stream too
                    ex.client_gone = True
        except aiohttp.ClientError as exc:  # the server's side broke: the client's breaks too
            ex.upstream_error = f"{type(exc).__name__}: {exc}"
            raise
        return response

    with forwarding_server(forward) as url:
        yield url, exchanges
