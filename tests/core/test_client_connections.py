"""Pooled keep-alive connections that the server closed while they sat idle.

uvicorn (under vLLM and SGLang) closes an idle keep-alive connection after 5 s; a request
written on it at that moment fails before the server sees it. The client sends such a request
again, once, on a new connection; it never resends a request the server answered, and a server
that is down is still reported as unreachable."""

import asyncio

import pytest

from pytest_llmspeed.core.client import Connection, stream_request
from pytest_llmspeed.core.errors import ServerUnreachable

pytestmark = pytest.mark.asyncio

SSE = (
    b'data: {"choices":[{"index":0,"text":"hi"}],"usage":{"prompt_tokens":3,'
    b'"completion_tokens":1,"total_tokens":4}}\n\ndata: [DONE]\n\n'
)


class DroppingServer:
    """Answers the first request of each connection, keeps the connection open, and closes it
    without an answer when a second request comes on it (the keep-alive race)."""

    def __init__(self) -> None:
        self.connections = 0
        self.answered = 0

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        served = 0
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":")[1])
                await reader.readexactly(length)
                if served:
                    break  # the server's idle timeout fired as this request arrived
                stream = head.startswith(b"POST /v1/completions")
                body = SSE if stream else b'{"ok": true}'
                kind = b"text/event-stream" if stream else b"application/json"
                writer.write(
                    b"HTTP/1.1 200 OK\r\nContent-Type: " + kind + b"\r\nContent-Length: "
                    + str(len(body)).encode() + b"\r\nConnection: keep-alive\r\n\r\n" + body
                )  # fmt: skip
                await writer.drain()
                served += 1
                self.answered += 1
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        writer.close()


async def test_request_on_a_connection_the_server_dropped_is_sent_again():
    fake = DroppingServer()
    server = await asyncio.start_server(fake.handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    conn = Connection.open(f"http://127.0.0.1:{port}", None, 5)
    try:
        assert (await conn.post_json("/tokenize", {"prompt": "x"})) == {"ok": True}
        # the pooled connection is reused, dropped by the server, and the request goes again
        assert (await conn.post_json("/tokenize", {"prompt": "y"})) == {"ok": True}
        rec = await stream_request(conn, "/v1/completions", {"prompt": "z", "stream": True})
        assert rec.error is None and rec.status == 200 and rec.t_first is not None
        assert fake.answered == 3 and fake.connections == 3
    finally:
        await conn.close()
        server.close()
        await server.wait_closed()


async def test_server_that_is_down_is_unreachable_at_once():
    server = await asyncio.start_server(lambda r, w: w.close(), "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    server.close()
    await server.wait_closed()
    conn = Connection.open(f"http://127.0.0.1:{port}", None, 5)
    try:
        with pytest.raises(ServerUnreachable, match="cannot reach the LLM server"):
            await conn.get("/v1/models")
    finally:
        await conn.close()


async def test_the_second_try_goes_on_a_new_connection_not_another_pooled_one():
    # Two pooled connections, both closed by the server by the time they are reused. The
    # retry used to take the pool's next connection, as stale as the first: the request
    # failed ("Can not write request body", real vLLM beside other work). It now goes on a
    # new connection, and the pool's stale ones are found and dropped one by one.
    fake = DroppingServer()
    server = await asyncio.start_server(fake.handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    conn = Connection.open(f"http://127.0.0.1:{port}", None, 5)
    try:
        await conn.warm_pool(2)  # two connections, each served once: both stale from now on
        assert fake.connections == 2 and fake.answered == 2
        for prompt in ("a", "b", "c"):
            assert (await conn.post_json("/tokenize", {"prompt": prompt})) == {"ok": True}
        assert fake.answered == 5
    finally:
        await conn.close()
        server.close()
        await server.wait_closed()
