"""Stream shapes beyond issue 29's list (docs/trust.md): what a server may legally send (line
ends in ``\\r\\n`` or a bare ``\\r``, ``data:`` without its space, a BOM) is counted exactly;
what it may not (JSON nested 100,000 deep, a count of 5,000 digits, more tokens than
``max_tokens``, chunks after ``[DONE]``, usage without a choice, an ``event: error``, a stream
that ends without its end, an HTML page for a stream) fails that request in one line, never
the run, and no chunk after ``[DONE]`` is counted."""

from __future__ import annotations

import asyncio

import pytest

from pytest_llmspeed.core.client import Connection
from pytest_llmspeed.core.errors import MalformedAnswer
from pytest_llmspeed.core.wire import StreamTally, loads, parse_stream

from .test_wire_trust import GOOD, RawServer, chunk, one_stream, piece, raw, streaming

__all__ = ["raw"]  # the fixture, used by name

DONE = b"data: [DONE]\n\n"
FINISH = chunk(4).replace(b'"finish_reason":null', b'"finish_reason":"length"')


def tally_of(*reads: bytes) -> StreamTally:
    return parse_stream([(float(i + 1), r) for i, r in enumerate(reads)])


@pytest.mark.parametrize(
    ("shape", "first_only"),
    [
        pytest.param(lambda b: b.replace(b"\n", b"\r\n"), False, id="crlf"),
        pytest.param(lambda b: b.replace(b"\n", b"\r"), False, id="bare-cr"),
        pytest.param(lambda b: b.replace(b"data: ", b"data:"), False, id="no-space"),
        pytest.param(lambda b: b"\xef\xbb\xbf" + b, True, id="bom"),
    ],
)
def test_legal_sse_shapes_are_counted_exactly(shape, first_only):
    """The whole stream in each shape, one read an event: every token counted, the first at
    the first read (a BOM or a bare \\r loses no event, so no TTFT moves)."""
    events = [*GOOD, FINISH, DONE]
    reads = [shape(e) if i == 0 or not first_only else e for i, e in enumerate(events)]
    t = tally_of(*reads)
    assert t.broken is None and t.done
    assert t.completion_tokens == 4 and sum(t.usage_counts) == 4
    assert t.usage_times[0] == 1.0
    t = tally_of(b"".join(reads))  # all in one read
    assert t.completion_tokens == 4 and t.done


def test_nothing_after_done_is_counted():
    """A second stream's worth of chunks after [DONE], in the same read and in later ones."""
    t = tally_of(b"".join([*GOOD, DONE, chunk(10), chunk(20)]), chunk(30), DONE)
    assert t.done and t.completion_tokens == 3 and sum(t.usage_counts) == 3
    fast = tally_of(*GOOD, chunk(4), DONE + chunk(40), chunk(50))  # the fast path's reads
    assert fast.completion_tokens == 4 and sum(fast.usage_counts) == 4


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("bad", "words"),
    [
        (b"data: " + b"[" * 100_000 + b"\n\n", "not a JSON object"),
        (
            chunk(4).replace(b'"completion_tokens":4', b'"completion_tokens":1' + b"0" * 4999),
            "usage.completion_tokens is Infinity",
        ),
        (chunk(4).replace(b'"completion_tokens":4', b'"completion_tokens":99999'), "max_tokens"),
    ],
    ids=["json-bomb", "5000-digits", "past-max-tokens"],
)
async def test_a_count_or_payload_python_cannot_take_fails_the_request(raw, bad, words):
    """After three good chunks (the fast path counting): the request fails naming the field;
    no exception leaves the stream (a RecursionError or int()'s ValueError would)."""
    server, url = raw
    server.respond = streaming([*GOOD, bad, chunk(5), DONE], gap=0.05)
    rec, _ = await one_stream(url)
    assert rec.error is not None and "/v1/completions" in rec.error and words in rec.error
    assert rec.tally.completion_tokens == 3


def test_loads_turns_every_failure_into_a_value_error():
    with pytest.raises(ValueError):
        loads("[" * 100_000)
    assert loads('{"n": 1' + "0" * 5000 + "}") == {"n": float("inf")}
    assert loads('{"n": 12}') == {"n": 12}


def test_usage_without_any_choice_is_not_a_count():
    """choices [] on every chunk, usage rising: the server counts tokens it never sent."""
    empty = [chunk(i).replace(b'"choices":[{"index":0,"text":"x","finish_reason":null}]',
                              b'"choices":[]') for i in (1, 2, 3)]  # fmt: skip
    t = tally_of(*empty, DONE)
    assert isinstance(t.broken, MalformedAnswer) and "no choice" in t.broken.what
    assert tally_of(*GOOD, empty[2], DONE).broken is None  # a final usage-only chunk is fine


def test_an_event_error_line_makes_its_data_the_error():
    t = tally_of(chunk(1), b'event: error\ndata: {"message":"engine failure","code":500}\n\n')
    assert t.error == "engine failure"
    t = tally_of(*GOOD, chunk(4), b'event: error\ndata: {"message":"boom"}\n\n')  # fast path
    assert t.error == "boom" and t.completion_tokens == 4


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("ctype", "words"),
    [(b"text/event-stream", "(cut short)"), (b"text/html", "text/html, not an event stream")],
)
async def test_a_stream_that_ends_without_its_end_is_a_failed_request(raw, ctype, words):
    server, url = raw

    async def respond(writer: asyncio.StreamWriter) -> None:
        writer.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: " + ctype + b"\r\nTransfer-Encoding: chunked\r\n\r\n"
        )
        for event in GOOD if ctype.endswith(b"stream") else [b"<html><body>hi</body></html>"]:
            writer.write(piece(event))
        writer.write(b"0\r\n\r\n")
        await writer.drain()

    server.respond = respond
    rec, _ = await one_stream(url)
    assert rec.error is not None and "without a finish_reason or data: [DONE]" in rec.error
    assert words in rec.error


@pytest.mark.asyncio
async def test_a_stream_of_done_alone_is_a_failed_request(raw):
    server, url = raw
    server.respond = streaming([DONE])
    rec, _ = await one_stream(url)
    assert rec.error is not None and "with no output token and no finish_reason" in rec.error


@pytest.mark.asyncio
async def test_a_finish_reason_without_done_still_ends_a_stream(raw):
    """transformers serve ends so: not a failed request."""
    server, url = raw
    server.respond = streaming([*GOOD, FINISH])
    rec, _ = await one_stream(url)
    assert rec.error is None and rec.tally.completion_tokens == 4


@pytest.mark.asyncio
async def test_a_body_that_breaks_http_is_one_error_not_a_crash(raw):
    """A JSON answer whose chunked encoding is cut (the server closes mid-chunk)."""
    server, url = raw
    server_: RawServer = server

    async def respond(writer: asyncio.StreamWriter) -> None:
        writer.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n100\r\n" + b'{"data": [' + b" " * 20
        )
        await writer.drain()

    server_.respond = respond
    conn = Connection.open(url, None, 2.0)
    try:
        with pytest.raises(MalformedAnswer, match="not valid HTTP"):
            await conn.get("/v1/models")
    finally:
        await conn.close()


def test_output_after_a_finish_reason_breaks_the_stream():
    """The finish, then more tokens (the fast path is counting before it): refused; a usage
    chunk without choices and [DONE] after the finish are the stream's end, as ever."""
    usage_only = chunk(4).replace(
        b'"choices":[{"index":0,"text":"x","finish_reason":null}]', b'"choices":[]'
    )
    t = tally_of(*GOOD, FINISH, usage_only, DONE)
    assert t.broken is None and t.completion_tokens == 4 and t.done
    for tail in ([chunk(5)], [usage_only, chunk(5)]):
        with pytest.raises(MalformedAnswer, match="after its finish_reason"):
            t = StreamTally()
            for i, r in enumerate([*GOOD, FINISH, *tail]):
                t.feed(float(i), r)


def test_an_event_cut_by_the_window_is_not_a_broken_stream():
    """The client stops reading with half an event in its last read: dropped, not refused
    (a server that closes with one unfinished is refused, as ever)."""
    half = chunk(4)[:40]
    cut = tally_of(*GOOD)
    cut.feed(9.0, half)
    cut.close(cut=True)
    assert cut.broken is None and cut.completion_tokens == 3
    ended = tally_of(*GOOD, half)
    assert isinstance(ended.broken, MalformedAnswer)
