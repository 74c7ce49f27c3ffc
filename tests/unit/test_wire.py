"""What a server streams and answers, parsed in one module (``core.wire``); the accounting built
on it is in test_accounting.py."""

import json

import pytest

from pytest_llmspeed.core.wire import (
    answer_prompt_tokens,
    error_message,
    first_token_in,
    live_tokens,
    parse_stream,
    stream_text,
)


def event(obj) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


ROLE = event({"choices": [{"index": 0, "delta": {"role": "assistant"}}]})  # no token yet
TOKEN = event({"choices": [{"index": 0, "text": "a"}], "usage": {"completion_tokens": 1}})


def test_the_first_token_is_found_in_the_read_that_completes_its_event():
    pending = bytearray()
    assert not first_token_in(pending, ROLE)  # an event without output
    assert not first_token_in(pending, TOKEN[:20])  # an event cut by the read's end
    assert first_token_in(pending, TOKEN[20:])
    # usage alone counts: a byte-level model's first token may stream no text
    empty = event({"choices": [{"index": 0, "text": ""}], "usage": {"completion_tokens": 1}})
    assert first_token_in(bytearray(), empty)
    assert not first_token_in(bytearray(), b"data: [DONE]\n\n: keep-alive\n\n")


def test_live_tokens_count_events_and_read_the_last_usage():
    two = event({"usage": {"completion_tokens": 7}}) + event({"usage": {"completion_tokens": 9}})
    assert live_tokens(two) == (2, 9)
    assert live_tokens(two + b"data: [DONE]\n\n") == (2, 9)
    assert live_tokens(event({"choices": [{"text": "a"}]})) == (1, None)
    assert live_tokens(b'data: {"usage": {"completion_tokens": ') == (1, None)  # cut


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
    assert parsed.text_times == [1.0, 3.0]
    assert (parsed.usage_times, parsed.usage_counts) == ([1.0, 2.0, 3.0], [2, 1, 1])
    assert stream_text(reads) == "abc"


def test_error_events_and_chat_deltas():
    reads = [
        (1.0, event({"choices": [{"delta": {"reasoning_content": "hm"}}]})),
        (1.5, event({"choices": [{"delta": {"content": "hi"}}]})),
        (2.0, event({"error": {"message": "boom", "type": "InternalServerError"}})),
        (2.1, event({"error": "second"})),
    ]
    parsed = parse_stream(reads)
    assert parsed.error == "boom"  # the first
    assert parsed.text_times == [1.0, 1.5] and not parsed.done
    assert stream_text(reads) == "hmhi"


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
