"""The wire trusts nothing a server sends (docs/trust.md): each misbehaviour is a small raw
server on loopback (byte-level control: trickles, lines without an end, huge headers), and the
client's outcome is asserted: a malformed stream is a failed request naming the field, every
wait is bounded by the timeout (not restarted by bytes that are not tokens), every answer by
its cap, and no redirect is followed."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
import pytest_asyncio

from pytest_llmspeed.core.client import Connection, StreamRecord, stream_request
from pytest_llmspeed.core.errors import (
    AnswerTooLarge,
    MalformedAnswer,
    Redirected,
    ServerUnreachable,
)
from pytest_llmspeed.core.protocol import wire_flags
from pytest_llmspeed.core.replicas import ReplicaSet
from pytest_llmspeed.core.streams import PromptSource, Streams
from pytest_llmspeed.core.wire import StreamTally
from pytest_llmspeed.results import Flag, FlagKind

pytestmark = pytest.mark.asyncio

Writer = Callable[[asyncio.StreamWriter], Awaitable[None]]
BODY = json.dumps({"model": "m", "prompt": "p", "max_tokens": 8, "stream": True}).encode()


def chunk(n: int, text: str = "x", **extra: object) -> bytes:
    """One SSE event as vLLM writes it (compact JSON, continuous usage)."""
    event = {
        "choices": [{"index": 0, "text": text, "finish_reason": None}],
        "usage": {"prompt_tokens": 3, "completion_tokens": n, "total_tokens": 3 + n},
        **extra,
    }
    return b"data: " + json.dumps(event, separators=(",", ":")).encode() + b"\n\n"


class RawServer:
    """Answers every request with what ``respond`` writes (the status line and headers
    included), then closes the connection unless ``respond`` returns without closing."""

    def __init__(self) -> None:
        self.respond: Writer | None = None
        self.requests = 0

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            length = 0
            for line in head.split(b"\r\n"):
                if line.lower().startswith(b"content-length:"):
                    length = int(line.split(b":")[1])
            if length:
                await reader.readexactly(length)
            self.requests += 1
            assert self.respond is not None
            await self.respond(writer)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()


@pytest_asyncio.fixture
async def raw() -> AsyncIterator[tuple[RawServer, str]]:
    server = RawServer()
    srv = await asyncio.start_server(server.handle, "127.0.0.1", 0)
    port = srv.sockets[0].getsockname()[1]
    yield server, f"http://127.0.0.1:{port}"
    srv.close()


def sse_head(extra: bytes = b"") -> bytes:
    return (
        b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
        b"Transfer-Encoding: chunked\r\n" + extra + b"\r\n"
    )


def piece(data: bytes) -> bytes:
    """One HTTP chunk."""
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


def streaming(events: list[bytes], gap: float = 0.0, end: bool = True) -> Writer:
    async def respond(writer: asyncio.StreamWriter) -> None:
        writer.write(sse_head())
        for event in events:
            writer.write(piece(event))
            await writer.drain()
            if gap:
                await asyncio.sleep(gap)
        if end:
            writer.write(b"0\r\n\r\n")
            await writer.drain()

    return respond


async def one_stream(url: str, timeout: float = 2.0) -> tuple[StreamRecord, float]:
    conn = Connection.open(url, None, timeout)
    try:
        t0 = time.perf_counter()
        rec = await stream_request(conn, "/v1/completions", BODY)
        return rec, time.perf_counter() - t0
    finally:
        await conn.close()


GOOD = [chunk(1), chunk(2), chunk(3)]


@pytest.mark.parametrize(
    ("bad", "words"),
    [
        (chunk(4).replace(b'"completion_tokens":4', b'"completion_tokens":"7"'), "a string"),
        (chunk(4).replace(b'"completion_tokens":4', b'"completion_tokens":5.0'), "fraction"),
        (chunk(4).replace(b'"completion_tokens":4', b'"completion_tokens":1e30'), "fraction"),
        (chunk(4).replace(b'"completion_tokens":4', b'"completion_tokens":true'), "boolean"),
        (chunk(4).replace(b'"completion_tokens":4', b'"completion_tokens":99999999999'), "2^31"),
        (chunk(1), "fell from 3 to 1"),
        (b'data: {"choices":[{"text":"x"}],"usage":[1,2]}\n\n', "usage is"),
        (b'data: {"choices":{"text":"x"}}\n\n', "choices is"),
        (b'data: {"choices":[{"delta":"x"}]}\n\n', "choices[].delta is"),
        (b'data: {"choices":[{"text":5}]}\n\n', "choices[].text is"),
        (b'data: {"choices":["x"]}\n\n', "a choice is"),
        (b"data: not json at all\n\n", "not a JSON object"),
    ],
    ids=lambda v: v if isinstance(v, str) else None,
)
async def test_a_malformed_event_fails_its_request_naming_the_field(raw, bad, words):
    """After three good chunks (the fast path has begun counting without a parse), the bad
    one: the request fails with its route, field and value; the good chunks before it stay
    counted (each was checked), nothing after it is."""
    server, url = raw
    server.respond = streaming([*GOOD, bad, chunk(9)], gap=0.05)  # reads apart
    rec, _ = await one_stream(url)
    assert rec.error is not None
    assert "/v1/completions" in rec.error and words in rec.error, rec.error
    assert rec.tally.completion_tokens == 3
    assert sum(rec.tally.usage_counts) == 3


@pytest.mark.parametrize(
    "bad",
    [
        b'data: {"choices":[{"text":"x"}],"usage":{"completion_tokens":"1"}}\n\n',
        b'data: {"choices":{"text":"x"}}\n\n',
        b'data: {"choices":[{"delta":"x"}]}\n\n',
        b'data: {"choices":[{"text":"x"}],"usage":[1]}\n\n',
        b'data: {"choices":[{"text":"x"}],"usage":{"prompt_tokens":-3}}\n\n',
    ],
)
async def test_a_malformed_first_event_fails_its_request_not_the_run(raw, bad):
    server, url = raw
    server.respond = streaming([bad])
    rec, _ = await one_stream(url)
    assert rec.error is not None and "/v1/completions" in rec.error
    assert rec.t_first is None


async def test_well_formed_streams_are_counted_as_before(raw):
    server, url = raw
    server.respond = streaming([*GOOD, chunk(5), b"data: [DONE]\n\n"])
    rec, _ = await one_stream(url)
    assert rec.error is None and rec.tally.done
    assert sum(rec.tally.usage_counts) == 5 and rec.tally.usage_chunks == 4


async def test_comments_and_keepalives_do_not_restart_the_first_token_bound(raw):
    """`: ping` every 0.3 s and never a token: the request fails at its 1 s bound, not when
    the server stops (it never would)."""
    server, url = raw
    server.respond = streaming([b": ping\n\n"] * 40, gap=0.3)
    rec, took = await one_stream(url, timeout=1.0)
    assert rec.error is not None and "no first token within 1 s" in rec.error
    assert rec.error_setting == "timeout"
    assert took < 2.5


async def test_a_trickle_after_the_first_token_is_bounded_by_the_gap(raw):
    server, url = raw
    server.respond = streaming([chunk(1), *([b"\n"] * 40)], gap=0.3)
    rec, took = await one_stream(url, timeout=1.0)
    assert rec.error is not None and "no token for 1 s after the last one" in rec.error
    assert rec.t_first is not None
    assert took < 2.5


async def test_done_ends_the_stream_when_the_server_keeps_it_open(raw):
    server, url = raw
    server.respond = streaming([*GOOD, b"data: [DONE]\n\n", *([b": ping\n\n"] * 40)], gap=0.2)
    rec, took = await one_stream(url, timeout=5.0)
    assert rec.error is None
    assert rec.tally.done and rec.tally.completion_tokens == 3
    assert took < 3.0


async def test_done_ends_the_request_there_and_a_held_stream_is_counted(raw):
    """[DONE], then the response held open (8 s of pings): the request ends at its [DONE]
    (not in flight while the server holds it), and the rest is read off the request's clock,
    closed after DONE_GRACE_S and counted once."""
    server, url = raw
    server.respond = streaming([*GOOD, b"data: [DONE]\n\n", *([b": ping\n\n"] * 40)], gap=0.2)
    conn = Connection.open(url, None, 5.0)
    try:
        rec = await stream_request(conn, "/v1/completions", BODY, StreamRecord(keep_reads=True))
        assert rec.error is None and rec.tally.done
        # it ended with the read that brought [DONE] (~0.6 s), not when the server let go
        (t_done,) = [t for t, data in rec.reads if b"[DONE]" in data]
        assert rec.t_end == t_done and rec.reads[-1][0] == t_done
        assert conn.held_open == 0 and len(conn.drains) == 1  # being read off the clock
        await asyncio.gather(*conn.drains)
        assert conn.held_open == 1 and not conn.drains
    finally:
        await conn.close()


async def test_done_then_the_bodys_end_gives_the_connection_back(raw):
    server, url = raw
    server.respond = streaming([*GOOD, b"data: [DONE]\n\n"])
    conn = Connection.open(url, None, 5.0)
    try:
        rec = await stream_request(conn, "/v1/completions", BODY)
        assert rec.error is None and rec.tally.done
        await asyncio.gather(*conn.drains)
        assert conn.held_open == 0
    finally:
        await conn.close()


async def test_what_the_streams_did_is_said_in_the_cells_flags():
    conn = Connection.open("http://127.0.0.1:9", None, 1.0)
    try:
        early, plain = StreamRecord(), StreamRecord()
        early.tally.announced = 1
        assert wire_flags([plain], conn) == []
        conn.held_open = 2
        first = wire_flags([early, plain, early], conn)
        assert first == [
            Flag(FlagKind.USAGE_BEFORE_TOKENS, "2 token(s) in 2 of 3 requests"),
            Flag(FlagKind.HELD_AFTER_DONE, "2 stream(s), for 0.5 s each"),
        ]
        held = first[1].text()
        assert held.startswith("the server held streams open after their data: [DONE]: 2 stream")
        assert "each request ended at its [DONE]" in first[1].text()
        conn.held_open = 5
        assert wire_flags([plain], conn) == []  # the hold is said once a run
    finally:
        await conn.close()


async def test_closing_replicas_stops_every_connections_reads_after_done():
    replicas = ReplicaSet.open(["http://127.0.0.1:9", "http://127.0.0.1:10"], None, 1.0)
    held = asyncio.get_running_loop().create_task(asyncio.sleep(60))
    replicas.connections[1].drains.add(held)
    await replicas.close()
    assert held.cancelled()


async def test_a_line_without_an_end_is_capped(raw):
    """4 MiB of one event and no newline: refused once past 1 MiB, not read to the end."""
    server, url = raw
    server.respond = streaming([chunk(1), b'data: {"choices":[{"text":"' + b"a" * (4 << 20)])
    rec, _ = await one_stream(url)
    assert rec.error is not None and "longer than 1 MiB" in rec.error
    assert len(rec.tally.carry) == 0


async def test_a_huge_header_fails_the_request_in_one_line(raw):
    server, url = raw

    async def respond(writer: asyncio.StreamWriter) -> None:
        writer.write(sse_head(b"X-Big: " + b"a" * (1 << 20) + b"\r\n"))
        await writer.drain()

    server.respond = respond
    rec, _ = await one_stream(url)
    assert rec.error is not None and "header larger than 64 KiB" in rec.error


def plain(status: str, body: bytes, headers: bytes = b"") -> Writer:
    async def respond(writer: asyncio.StreamWriter) -> None:
        writer.write(
            f"HTTP/1.1 {status}\r\nContent-Length: {len(body)}\r\n".encode()
            + headers
            + b"Content-Type: application/json\r\n\r\n"
            + body
        )
        await writer.drain()

    return respond


async def test_a_redirect_is_not_followed(raw):
    server, url = raw
    server.respond = plain("307 Temporary Redirect", b"", b"Location: http://127.0.0.9:1/x\r\n")
    conn = Connection.open(url, None, 2.0)
    try:
        with pytest.raises(Redirected, match=r"HTTP 307, a redirect to http://127\.0\.0\.9:1/x"):
            await conn.get("/v1/models")
        rec = await stream_request(conn, "/v1/completions", BODY)
    finally:
        await conn.close()
    assert rec.error is not None and "redirect" in rec.error
    assert server.requests == 2  # one each: nothing was sent to where it pointed


async def test_a_trickling_answer_is_bounded_by_the_timeout(raw):
    server, url = raw

    async def respond(writer: asyncio.StreamWriter) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n")
        for _ in range(100):
            writer.write(b"{")
            await writer.drain()
            await asyncio.sleep(0.3)

    server.respond = respond
    conn = Connection.open(url, None, 1.0)
    t0 = time.perf_counter()
    try:
        with pytest.raises(ServerUnreachable, match="whole answer within 1 s"):
            await conn.get("/v1/models")
    finally:
        await conn.close()
    assert time.perf_counter() - t0 < 2.5


@pytest.mark.parametrize("announced", [True, False])
async def test_an_answer_over_its_cap_is_refused(raw, announced):
    server, url = raw
    body = b" " * (5 << 20)

    async def respond(writer: asyncio.StreamWriter) -> None:
        length = f"Content-Length: {len(body)}\r\n".encode() if announced else b""
        writer.write(b"HTTP/1.1 200 OK\r\n" + length + b"Connection: close\r\n\r\n")
        writer.write(body)
        await writer.drain()

    server.respond = respond
    conn = Connection.open(url, None, 5.0)
    try:
        with pytest.raises(AnswerTooLarge, match="4 MiB"):
            await conn.get("/v1/models")
    finally:
        await conn.close()


async def test_a_json_answer_that_is_not_an_object_is_refused(raw):
    server, url = raw
    server.respond = plain("200 OK", b"[1, 2]")
    conn = Connection.open(url, None, 2.0)
    try:
        with pytest.raises(MalformedAnswer, match="/tokenize: answered list"):
            await conn.post_json("/tokenize", {"prompt": "a"})
    finally:
        await conn.close()


async def test_an_error_body_is_redacted_before_it_is_cut(raw):
    """The key straddles the 500th character of the message: none of it shows."""
    server, url = raw
    key = "sk-secret-abcdef123456"
    message = "x" * 490 + key + "y" * 100
    server.respond = plain("400 Bad Request", json.dumps({"error": {"message": message}}).encode())
    conn = Connection.open(url, key, 2.0)
    try:
        rec = await stream_request(conn, "/v1/completions", BODY)
    finally:
        await conn.close()
    assert rec.error is not None
    assert "sk-secret" not in rec.error and "abcdef" not in rec.error


class _Prompts(PromptSource):
    """Bodies without a prompt factory; ``fail`` raises in ``next`` (a bug in the client)."""

    def __init__(self, fail: bool = False) -> None:
        self.fail = fail

    async def next(self) -> bytes:
        if self.fail:
            raise RuntimeError("prompt factory broke")
        return BODY


@pytest.mark.parametrize("where", ["prompts", "feed", "first-token"])
async def test_no_exception_of_a_stream_task_is_lost(raw, monkeypatch, where):
    """An exception raised anywhere a stream task runs (its prompt, its reads, its first-token
    callback) stops the cell with the exception's words, never a silent dead slot."""
    server, url = raw
    server.respond = streaming([*GOOD, chunk(8)], gap=0.05)
    if where == "feed":

        def feed(self: StreamTally, t: float, data: bytes) -> bool:
            raise ValueError("tally broke")

        monkeypatch.setattr(StreamTally, "feed", feed)
    conn = Connection.open(url, None, 2.0)
    streams = Streams(conn, "/v1/completions", _Prompts(where == "prompts"), [0, 1], 2)
    if where == "first-token":

        def broken(slot: int) -> Callable[[StreamRecord], None]:
            def callback(rec: StreamRecord) -> None:
                raise KeyError("callback broke")

            return callback

        monkeypatch.setattr(streams, "_first_token", broken)
    try:
        streams.start()
        await streams.wait_open(3.0)
        await streams.close()
    finally:
        await conn.close()
    assert streams.aborted is not None
    assert "a stream failed inside the client" in streams.aborted
    assert {"prompts": "RuntimeError", "feed": "ValueError", "first-token": "KeyError"}[
        where
    ] in streams.aborted
