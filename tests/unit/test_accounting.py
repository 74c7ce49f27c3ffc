"""Token accounting over recorded SSE bytes (the parser half of the client)."""

import json

from pytest_llmspeed.core.client import StreamRecord, account_tokens


def sse(*objs, done=True):
    out = b"".join(b"data: " + json.dumps(o).encode() + b"\n\n" for o in objs)
    return out + (b"data: [DONE]\n\n" if done else b"")


def chunk(text="", ct=None, pt=10, reasoning=None, finish=None, chat=False):
    choice = {"index": 0, "finish_reason": finish}
    if chat:
        delta = {"content": text}
        if reasoning is not None:
            delta = {"reasoning_content": reasoning, "content": None}
        choice["delta"] = delta
    else:
        choice["text"] = text
    obj = {"choices": [choice]}
    if ct is not None:
        obj["usage"] = {"prompt_tokens": pt, "completion_tokens": ct, "total_tokens": pt + ct}
    return obj


def test_usage_rise_counts_multi_token_and_empty_text_chunks():
    rec = StreamRecord(
        reads=[
            (1.0, sse(chunk("a", 1), chunk("", 2), done=False)),  # byte-level: empty text, 1 token
            (
                2.0,
                sse(
                    chunk("bcd", 5),
                    chunk("", 5, finish="length"),
                    {"choices": [], "usage": {"prompt_tokens": 10, "completion_tokens": 5}},
                ),
            ),
        ]
    )
    account_tokens(rec)
    assert rec.usage_per_chunk
    assert rec.token_counts == [1, 1, 3]
    assert rec.token_times == [1.0, 1.0, 2.0]
    assert rec.n_tokens == 5 and rec.prompt_tokens == 10
    assert rec.finished and rec.finish_reason == "length"


def test_reasoning_deltas_are_output_tokens():
    rec = StreamRecord(
        reads=[(0.5, sse(chunk(reasoning="think", ct=1, chat=True), chunk("hi", ct=2, chat=True)))]
    )
    account_tokens(rec)
    assert rec.n_tokens == 2 and rec.t_first == 0.5


def test_chunk_count_fallback_without_usage():
    rec = StreamRecord(reads=[(1.0, sse(chunk("a"), chunk(""), chunk("b")))])
    account_tokens(rec)
    assert not rec.usage_per_chunk
    assert rec.token_counts == [1, 1]  # the empty chunk cannot be seen without usage


def test_event_split_across_reads_takes_time_of_completing_read():
    raw = sse(chunk("a", 1))
    rec = StreamRecord(reads=[(1.0, raw[:10]), (1.5, raw[10:])])
    account_tokens(rec)
    assert rec.token_times == [1.5]


def test_error_event_midstream():
    rec = StreamRecord(
        reads=[(1.0, sse(chunk("a", 1), {"error": {"message": "boom", "code": 500}}))]
    )
    account_tokens(rec)
    assert rec.error == "error event: boom"
    assert rec.n_tokens == 1
