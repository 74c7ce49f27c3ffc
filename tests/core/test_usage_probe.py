"""The dialect's usage probe on a stream with a single chunk (issue 13).

``transformers serve`` sends usage only at the end of a stream, on its last chunk (the one with
``finish_reason``), and streams no text for a token that is part of a character: the probe's
two tokens of a byte-level model with random weights are both such parts for about one prompt
in seven (the run's salt draws it), and the stream is then that last chunk alone, usage on
every chunk it has. The probe must not take that for continuous usage (it did: the note "usage
only at the end" then went missing, 14 probes of 100). A loopback server of that shape."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator

import pytest
from aiohttp import web

from pytest_llmspeed.core.client import Connection
from pytest_llmspeed.core.prompts import PromptFactory
from pytest_llmspeed.core.protocol import PROBE_MORE_TOKENS, negotiate

pytestmark = pytest.mark.asyncio

FINAL_ONLY = "tokens: the server sends usage only at the end of a stream*"


def _event(obj: dict) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


@contextlib.asynccontextmanager
async def server() -> AsyncIterator[tuple[str, list[int]]]:
    """(base URL, max_tokens of each streamed request): a server that streams no text for
    requests of 2 tokens or fewer, 2 tokens per text chunk otherwise, and its usage on the last
    chunk only (no ``[DONE]``), as ``transformers serve`` does; ``/tokenize`` one token a byte."""
    asked: list[int] = []

    async def tokenize(request: web.Request) -> web.Response:
        body = await request.json()
        return web.json_response({"tokens": list(body["prompt"].encode())})

    async def completions(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        n = body["max_tokens"]
        asked.append(n)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        if n > 2:
            for _ in range(n // 2):
                await resp.write(_event({"choices": [{"index": 0, "text": " ab"}]}))
        usage = {"prompt_tokens": len(body["prompt"]), "completion_tokens": n}
        last = {"index": 0, "text": "", "finish_reason": "length"}
        await resp.write(_event({"choices": [last], "usage": usage}))
        await resp.write_eof()
        return resp

    app = web.Application()
    app.router.add_post("/tokenize", tokenize)
    app.router.add_post("/v1/completions", completions)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]  # set by start()
    try:
        yield f"http://127.0.0.1:{port}", asked
    finally:
        await runner.cleanup()


async def test_a_single_last_chunk_with_usage_is_asked_again():
    async with server() as (url, asked):
        conn = Connection.open(url, None, 10)
        try:
            dialect = await negotiate(conn, PromptFactory(conn, "m"), "m", "completions")
        finally:
            await conn.close()
    # the 2-token stream was its last chunk alone: asked again, with more tokens
    assert asked == [2, PROBE_MORE_TOKENS]
    assert len([n for n in dialect.notes if n.startswith(FINAL_ONLY[:-1])]) == 1, dialect.notes
