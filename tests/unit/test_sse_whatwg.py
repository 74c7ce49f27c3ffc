"""Streams parsed as WHATWG's HTML standard specifies server-sent events: an event's ``data:``
lines joined by newlines and dispatched at a blank line (what sse-starlette writes for a payload
that holds newlines), and any line end — ``\\r\\n``, ``\\n`` or a bare ``\\r`` — at any point of
the stream, whatever its reads' boundaries. Each stream is compared with a reference parser
written from the standard's "event stream interpretation" (below): the same events, so the
same tokens and text."""

import json
import random

import pytest

from pytest_llmspeed.core.errors import AnswerTooLarge, MalformedAnswer
from pytest_llmspeed.core.wire import StreamTally, parse_stream


def reference_events(stream: bytes) -> list[str]:
    """WHATWG HTML § 9.2.6: lines split at CRLF, LF or CR; a blank line dispatches the data
    buffer (its last LF removed) when it is not empty; ``field: value`` with one leading space
    of the value removed; ``data`` appends the value and a LF; comments and other fields are
    not data."""
    text = stream.decode("utf-8")
    lines = text.replace("\r\n", "\n").replace("\r", "\n").split("\n")
    events, buffer = [], ""
    for line in lines:
        if line == "":
            if buffer:
                events.append(buffer[:-1])
            buffer = ""
            continue
        if line.startswith(":"):
            continue
        name, _, value = line.partition(":")
        value = value[1:] if value.startswith(" ") else value
        if name == "data":
            buffer += value + "\n"
    return events


def tokens(events: list[str]) -> tuple[int, str]:
    """The reference's count of chunks with text, and the text."""
    chunks, text = 0, ""
    for e in events:
        if e == "[DONE]":
            break
        obj = json.loads(e)
        for c in obj.get("choices", []):
            if c.get("text"):
                chunks += 1
                text += c["text"]
    return chunks, text


def chunk(i: int) -> dict[str, object]:
    return {"choices": [{"index": 0, "text": f"w{i} "}]}


def one_line(obj: object) -> str:
    return "data: " + json.dumps(obj)


def multi_line(obj: object) -> str:
    """The event's JSON pretty-printed: one ``data:`` line for each of its lines."""
    return "\n".join("data: " + ln for ln in json.dumps(obj, indent=1).split("\n"))


def stream(events: list[str], ends: tuple[str, str] = ("\n", "\n"), switch: int = 4) -> bytes:
    """Events (each one or more lines), a blank line after each, then ``[DONE]``: the lines
    of the first ``switch`` events ended by ``ends[0]``, the others' by ``ends[1]``."""
    out = ""
    for k, e in enumerate([*events, "data: [DONE]"]):
        end = ends[0] if k < switch else ends[1]
        out += "".join(ln + end for ln in [*e.split("\n"), ""])
    return out.encode()


def reads_of(data: bytes, seed: int) -> list[tuple[float, bytes]]:
    """``data`` cut into reads at random points (a \\r\\n may be cut between two reads)."""
    rng = random.Random(seed)
    cuts = sorted(rng.sample(range(1, len(data)), min(12, len(data) - 1)))
    pieces = [data[a:b] for a, b in zip([0, *cuts], [*cuts, len(data)], strict=True)]
    return [(float(i), p) for i, p in enumerate(pieces)]


@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize(
    "ends",
    [("\n", "\n"), ("\r\n", "\r\n"), ("\r", "\r"), ("\n", "\r")],
    ids=["lf", "crlf", "cr", "cr-after-the-4th-event"],
)
@pytest.mark.parametrize("shape", [one_line, multi_line], ids=["one-line", "multi-line"])
def test_a_stream_is_read_as_the_standard_reads_it(shape, ends, seed):
    events = [shape(chunk(i)) for i in range(6)]
    data = stream(events, ends)
    expected = tokens(reference_events(data))
    assert expected == (6, "".join(f"w{i} " for i in range(6)))
    tally = parse_stream(reads_of(data, seed))
    assert tally.broken is None and tally.done
    assert (tally.output_chunks, tally.output_text()) == expected


def test_an_event_over_several_lines_in_one_read_counts_once_at_its_end():
    data = stream([multi_line(chunk(0)), one_line(chunk(1))])
    tally = parse_stream([(1.0, data)])
    assert tally.output_chunks == 2 and tally.output_text() == "w0 w1 "
    assert list(tally.text_times) == [1.0, 1.0]


def test_a_server_that_leaves_out_the_blank_lines_keeps_each_line_an_event():
    """Not the standard (its client would join them into one event that is not JSON), but
    what some servers send: each line that is a JSON object by itself is its own event."""
    data = "".join(one_line(chunk(i)) + "\n" for i in range(3)) + "data: [DONE]\n\n"
    tally = parse_stream([(1.0, data.encode())])
    assert tally.output_chunks == 3 and tally.output_text() == "w0 w1 w2 "


def test_an_event_that_is_not_json_over_its_lines_still_fails_its_request():
    data = b'data: {"choices": [\ndata: {"text": "a"}\n\ndata: [DONE]\n\n'
    with pytest.raises(MalformedAnswer, match="not a JSON object"):
        parse_stream([(1.0, data)])


def test_an_event_that_never_ends_is_refused_within_its_bound():
    """A server that sends data: lines of one event and never the blank line that ends it
    (a read at a time): refused once the event passes its bound, not held and re-scanned
    for ever."""
    tally = StreamTally()
    tally.feed(0.0, b"data: {\n")
    with pytest.raises(AnswerTooLarge, match="more than 1000 data: lines"):
        for i in range(2000):
            tally.feed(float(i), b"data: x\n")
