"""What a server streams and answers, parsed in one module (``core.wire``); the accounting built
on it is in test_accounting.py."""

import json

import pytest

from pytest_llmspeed.core.errors import MalformedAnswer
from pytest_llmspeed.core.wire import (
    StreamTally,
    answer_prompt_tokens,
    error_message,
    parse_stream,
)


def event(obj, compact: bool = False) -> bytes:
    text = json.dumps(obj, separators=(",", ":") if compact else None)
    return b"data: " + text.encode() + b"\n\n"


ROLE = event({"choices": [{"index": 0, "delta": {"role": "assistant"}}]})  # no token yet
TOKEN = event({"choices": [{"index": 0, "text": "a"}], "usage": {"completion_tokens": 1}})


def test_the_first_token_is_found_in_the_read_that_completes_its_event():
    tally = StreamTally()
    assert not tally.feed(1.0, ROLE)  # an event without output
    assert not tally.feed(2.0, TOKEN[:20])  # an event cut by the read's end
    assert tally.feed(3.0, TOKEN[20:])
    assert list(tally.usage_times) == [3.0]  # it counts with the read that ends it
    assert not tally.feed(4.0, TOKEN)  # the first only once
    # usage alone counts: a byte-level model's first token may stream no text
    empty = event({"choices": [{"index": 0, "text": ""}], "usage": {"completion_tokens": 1}})
    assert StreamTally().feed(1.0, empty)
    assert not StreamTally().feed(1.0, b"data: [DONE]\n\n: keep-alive\n\n")


def test_a_stream_parsed_after_the_cell():
    reads = [
        (1.0, event({"choices": [{"text": "ab"}], "usage": {"prompt_tokens": 8,
                                                             "completion_tokens": 2}})),
        (2.0, event({"choices": [{"text": ""}], "usage": {"prompt_tokens": 8,
                                                           "completion_tokens": 3}})),
        (3.0, event({"choices": [{"text": "c", "finish_reason": "length"}]})),
        (3.0, event({"choices": [], "usage": {"prompt_tokens": 8, "completion_tokens": 4}})),
        (3.5, b"data: [DONE]\n\n"),
    ]  # fmt: skip
    parsed = parse_stream(reads)
    assert parsed.done and parsed.error is None and parsed.finish_reason == "length"
    assert (parsed.prompt_tokens, parsed.completion_tokens) == (8, 4)
    assert (parsed.chunks, parsed.usage_chunks) == (3, 2)
    assert list(parsed.text_times) == [1.0, 3.0]
    assert (list(parsed.usage_times), list(parsed.usage_counts)) == ([1.0, 2.0, 3.0], [2, 1, 1])
    assert parsed.output_text() == ""  # the final usage made the total exact: the text went
    no_usage = [(t, event({"choices": [{"text": x}]})) for t, x in ((1.0, "ab"), (2.0, "c"))]
    assert parse_stream(no_usage).output_text() == "abc"  # kept: no total known


def test_error_events_and_chat_deltas():
    reads = [
        (1.0, event({"choices": [{"delta": {"reasoning_content": "hm"}}]})),
        (1.5, event({"choices": [{"delta": {"content": "hi"}}]})),
        (2.0, event({"error": {"message": "boom", "type": "InternalServerError"}})),
        (2.1, event({"error": "second"})),
    ]
    parsed = parse_stream(reads)
    assert parsed.error == "boom"  # the first
    assert list(parsed.text_times) == [1.0, 1.5] and not parsed.done
    assert parsed.output_text() == "hmhi"


def _usage_stream(n: int, per_read: int, compact: bool) -> list[tuple[float, bytes]]:
    """A vLLM-like stream of ``n`` one-token chunks with continuous usage, ``per_read`` chunks
    a read, each read cut 7 bytes before its end (the rest comes with the next read)."""
    events = [
        event({"id": "x", "choices": [{"index": 0, "text": " a", "finish_reason": None}],
               "usage": {"prompt_tokens": 5, "completion_tokens": c}}, compact)
        for c in range(1, n)
    ]  # fmt: skip
    events.append(
        event({"id": "x", "choices": [{"index": 0, "text": " a", "finish_reason": "length"}],
               "usage": {"prompt_tokens": 5, "completion_tokens": n}}, compact)
    )  # fmt: skip
    final = {"id": "x", "choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": n}}
    events.append(event(final, compact))
    events.append(b"data: [DONE]\n\n")
    raw = [b"".join(events[i : i + per_read]) for i in range(0, len(events), per_read)]
    reads, carry = [], b""
    for i, data in enumerate(raw):
        data = carry + data
        cut = len(data) - 7 if i < len(raw) - 1 else len(data)
        reads.append((float(i), data[:cut]))
        carry = data[cut:]
    return reads


@pytest.mark.parametrize("compact", [True, False])
@pytest.mark.parametrize("per_read", [1, 3])
def test_counting_without_a_parse_gives_what_the_parse_gives(compact, per_read):
    """Once a stream shows usage on every chunk, compact reads are counted without JSON; the
    counts, times and finish are those the event-by-event parse gives."""
    reads = _usage_stream(40, per_read, compact)
    tally = parse_stream(reads)
    assert tally.fast == compact  # the shortcut only for the compact JSON it knows
    assert tally.done and tally.finish_reason == "length" and tally.usage_per_chunk
    assert (tally.chunks, tally.usage_chunks, tally.completion_tokens) == (40, 40, 40)
    assert tally.token_chunks == 40 and sum(tally.usage_counts) == 40
    # each chunk counts at the read that completed it; the parse keeps an entry a chunk, the
    # count an entry a read (the figures spread a read's tokens as one: equal either way)
    arrivals: dict[float, int] = {}
    ended = 0
    for t, data in reads:
        done = min(data.count(b"\n\n"), 40 - ended)  # token chunks completed by this read
        ended += done
        if done:
            arrivals[t] = arrivals.get(t, 0) + done
    got: dict[float, int] = {}
    for t, c in zip(tally.usage_times, tally.usage_counts, strict=True):
        got[t] = got.get(t, 0) + c
    assert got == arrivals
    assert tally.text is None  # usage on every chunk: no text kept


def test_a_stream_that_stops_sending_usage_keeps_its_chunks():
    with_usage = [
        (
            float(c),
            event(
                {
                    "choices": [{"index": 0, "text": "a", "finish_reason": None}],
                    "usage": {"completion_tokens": c},
                },
                True,
            ),
        )
        for c in range(1, 6)
    ]  # fmt: skip  (5 chunks with usage: all but the first counted without a parse) ...
    tail = event({"choices": [{"index": 0, "text": "b", "finish_reason": None}]}, True)
    tally = parse_stream([*with_usage, (9.0, tail)])  # ... then one without
    assert not tally.usage_per_chunk and not tally.fast
    assert len(tally.text_times) == len(tally.usage_times) + 1 == 6  # 5 with usage, 1 without


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ('{"error": {"message": "too long", "type": "BadRequestError"}}', "too long"),
        ('{"detail": "Not Found"}', "Not Found"),
        ('{"error": "plain"}', "plain"),
        ("Internal Server Error", "Internal Server Error"),
        ("", "(empty body)"),
    ],
)
def test_error_bodies_give_their_human_part(body, message):
    assert error_message(body) == message


def test_a_non_streamed_answers_prompt_tokens():
    assert answer_prompt_tokens({"usage": {"prompt_tokens": 12, "completion_tokens": 1}}) == 12
    assert answer_prompt_tokens({"usage": None}) is None
    assert answer_prompt_tokens({"choices": []}) is None
    assert answer_prompt_tokens([]) is None


def _compact(text: str, n: int) -> bytes:
    obj = {"choices": [{"index": 0, "text": text}], "usage": {"completion_tokens": n}}
    return event(obj, compact=True)


@pytest.mark.parametrize(
    "raw", [b"\x00", b"\x1b[2J", b"\xff\xfe\xc3"], ids=["nul", "esc", "not-utf8"]
)
def test_a_counted_stream_still_refuses_an_event_json_cannot_hold(raw):
    """Usage on every chunk: later reads are counted without a parse, but a raw control byte
    or bytes that are not UTF-8 in one of them fail the stream (it was timing that decided:
    a hostile server's NUL passed when the event came in its own read)."""
    tally = StreamTally()
    assert tally.feed(1.0, _compact(" a", 1))
    assert not tally.feed(2.0, _compact(" b", 2))
    assert tally.fast  # the counting path is the one under test
    bad = _compact(" c", 3).replace(b" c", raw + b"c", 1)
    with pytest.raises(MalformedAnswer):
        tally.feed(3.0, bad)


def test_a_counted_stream_of_text_beyond_ascii_is_counted():
    """Raw UTF-8 (vLLM writes it so) is well formed: still counted without a parse."""
    tally = StreamTally()
    tally.feed(1.0, _compact(" a", 1))
    tally.feed(2.0, _compact(" b", 2))
    raw = b"".join(
        b"data: " + json.dumps(
            {"choices": [{"index": 0, "text": w}], "usage": {"completion_tokens": n}},
            separators=(",", ":"), ensure_ascii=False,
        ).encode() + b"\n\n"
        for n, w in ((3, "\u00e9"), (4, "\u65e5\u672c"))
    )  # fmt: skip
    assert not raw.isascii()
    tally.feed(3.0, raw)
    assert tally.fast and tally.completion_tokens == 4
    assert list(tally.usage_counts) == [1, 1, 2]  # one entry a read


def chat_event(n: int, **delta: object) -> bytes:
    """A chat chunk as vLLM writes it (compact JSON, continuous usage)."""
    choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": None}
    return event({"choices": [choice], "usage": {"completion_tokens": n}}, compact=True)


def chat_tally(reads: list[bytes], tools: bool = False) -> StreamTally:
    tally = StreamTally()
    tally.chat, tally.tools = True, tools
    for i, data in enumerate(reads):
        tally.feed(float(i + 1), data)
    tally.close()
    return tally


def test_reasoning_and_answer_are_told_apart_on_the_fast_path():
    """Reasoning, its answer, reasoning again, a tool call: the reads counted without a parse
    (most of them) give the split a parse of every event gives, and the first answer's time."""
    reads = [
        chat_event(1, reasoning_content="a"),
        chat_event(2, reasoning_content="b"),
        chat_event(4, reasoning_content="cd"),
        chat_event(5, content=""),  # a token without text while reasoning: the reasoning's
        chat_event(6, content="e"),
        chat_event(8, content="fg"),
        chat_event(9, reasoning="h"),  # reasoning after the answer began: parsed, counted
        chat_event(10, content="i"),
        chat_event(11, tool_calls=[{"index": 0, "function": {"arguments": "{"}}]),
        chat_event(12, content="j"),
    ]
    tally = chat_tally(reads, tools=True)
    assert tally.fast and tally.broken is None
    assert tally.reasoning_rise == 6 and tally.completion_tokens == 12
    assert tally.answer_time == 5.0 and tally.tool_deltas == 1
    together = chat_tally([b"".join(reads[:4]), b"".join(reads[4:])], tools=True)
    assert together.reasoning_rise == 6  # read together: the same split
    assert together.answer_time == 2.0 and together.tool_deltas == 1


def test_a_chunk_with_reasoning_and_answer_counts_as_answer():
    tally = chat_tally(
        [chat_event(1, reasoning_content="a"), chat_event(3, reasoning_content="b", content="c")]
    )
    assert (tally.reasoning_rise, tally.mixed_chunks, tally.answer_time) == (1, 1, 2.0)


@pytest.mark.parametrize(
    ("calls", "words"),
    [("x", "not a list"), (["x"], 'choices[].delta.tool_calls[] is "x" (a string)')],
)
def test_a_tool_call_that_is_not_an_object_breaks_the_stream(calls, words):
    with pytest.raises(MalformedAnswer) as err:
        chat_tally([chat_event(1, content="a"), chat_event(2, tool_calls=calls)], tools=True)
    assert words in f"{err.value.field} {err.value.what}"


# -- usage that says something else than what the stream carried (docs/trust.md) -------------


def text_event(text: str, count: int | None, compact: bool = True) -> bytes:
    obj: dict[str, object] = {"choices": [{"index": 0, "text": text, "finish_reason": None}]}
    if count is not None:
        obj["usage"] = {"prompt_tokens": 4, "completion_tokens": count}
    return event(obj, compact)


USAGE_ONLY = event({"choices": [], "usage": {"prompt_tokens": 4, "completion_tokens": 1}}, True)


def test_a_usage_only_first_chunk_moves_no_clock():
    # a usage-only chunk (no choice) that counts a token, its text 0.3 s later: the first
    # token is the chunk that carried it, and the count said before it is kept (for a note)
    tally = StreamTally()
    assert not tally.feed(1.0, USAGE_ONLY)
    assert not tally.seen_token and tally.announced == 1
    assert tally.feed(1.3, text_event("a", 2))
    assert (list(tally.usage_times), list(tally.usage_counts)) == ([1.3], [2])
    # the same, parsed after the cell: the record's first token is at 1.3
    parsed = parse_stream([(1.0, USAGE_ONLY), (1.3, text_event("a", 2)), (1.4, text_event("b", 3))])
    assert (list(parsed.usage_times), list(parsed.usage_counts)) == ([1.3, 1.4], [2, 1])
    assert parsed.announced == 1 and parsed.broken is None


def test_a_chunk_with_a_choice_and_no_text_still_carries_its_token():
    # a byte of a character (byte-level tokenizers): an empty text with a rise is a token
    # (docs/metrics.md), and announces nothing
    tally = parse_stream([(1.0, text_event("", 1)), (1.2, text_event("ab", 2))])
    assert (list(tally.usage_times), list(tally.usage_counts)) == ([1.0, 1.2], [1, 1])
    assert tally.announced == 0


def test_a_usage_chunk_after_the_last_text_counts_at_that_texts_time():
    reads = [
        (1.0, text_event("a", None)),
        (2.0, text_event("b", None)),
        (2.1, USAGE_ONLY.replace(b'"completion_tokens":1', b'"completion_tokens":2')),
    ]
    tally = parse_stream(reads)
    assert (list(tally.usage_times), list(tally.usage_counts)) == ([2.0], [2])
    assert tally.announced == 0 and tally.completion_tokens == 2


@pytest.mark.parametrize("per_read", [1, 3])
def test_usage_below_the_chunks_with_output_breaks_the_stream(per_read):
    # half the tokens sent (each chunk carries one): counted or parsed, the stream is refused
    # at its end, naming what its usage did not count
    events = [text_event(f"w{i}", (i + 2) // 2) for i in range(12)]
    tally = StreamTally()
    for i in range(0, len(events), per_read):
        tally.feed(float(i), b"".join(events[i : i + per_read]))
    assert tally.broken is None  # a count may lag its chunks until the end
    tally.close()
    assert tally.broken is not None and tally.broken.field == "usage.completion_tokens"
    assert "fewer than the 12 chunks with output" in tally.broken.what


def test_usage_of_several_tokens_a_chunk_is_not_refused():
    events = b"".join(text_event(f"w{i}", 2 * (i + 1)) for i in range(6))
    tally = parse_stream([(1.0, events[: len(events) // 2]), (2.0, events[len(events) // 2 :])])
    assert tally.broken is None and tally.completion_tokens == 12


def test_a_usage_only_chunk_mid_stream_counts_with_the_next_chunk_that_carries_one():
    tally = StreamTally()
    for i in range(3):
        tally.feed(float(i), text_event(f"w{i}", i + 1))
    assert tally.fast  # counted without a parse from here on
    later = USAGE_ONLY.replace(b'"completion_tokens":1', b'"completion_tokens":4')
    tally.feed(3.0, later)
    tally.feed(3.5, text_event("w3", 5))
    assert list(tally.usage_times)[-1] == 3.5 and list(tally.usage_counts)[-1] == 2
    assert 3.0 not in tally.usage_times and tally.announced == 0
