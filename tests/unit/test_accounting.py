"""Token accounting over recorded SSE bytes (the parser half of the client)."""

import json
from typing import Any

from pytest_llmspeed.core.client import StreamRecord, account_tokens, spread
from pytest_llmspeed.core.protocol import complete_accounting, ended_early


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
    obj: dict[str, Any] = {"choices": [choice]}
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
    assert list(rec.token_counts) == [1, 1, 3]
    assert list(rec.token_times) == [1.0, 1.0, 2.0]
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
    assert list(rec.token_counts) == [1, 1]  # the empty chunk cannot be seen without usage


def test_event_split_across_reads_takes_time_of_completing_read():
    raw = sse(chunk("a", 1))
    rec = StreamRecord(reads=[(1.0, raw[:10]), (1.5, raw[10:])])
    account_tokens(rec)
    assert list(rec.token_times) == [1.5]


def test_error_event_midstream():
    rec = StreamRecord(
        reads=[(1.0, sse(chunk("a", 1), {"error": {"message": "boom", "code": 500}}))]
    )
    account_tokens(rec)
    assert rec.error == "error event: boom"
    assert rec.n_tokens == 1


# -- streams without per-chunk usage (issue 13): exact totals where the stream allows them ---

FINAL = {"choices": [], "usage": {"prompt_tokens": 10, "completion_tokens": 9}}


def test_final_usage_is_exact_and_spread_over_the_chunks():
    rec = StreamRecord(
        reads=[(1.0, sse(chunk("abc"), chunk("def"), chunk("ghi", finish="length"), FINAL))]
    )
    account_tokens(rec, 9)
    assert rec.count_method == "final-usage" and rec.n_tokens == 9
    assert list(rec.token_counts) == [3, 3, 3]


def test_no_usage_but_finished_at_length_counts_max_tokens():
    rec = StreamRecord(reads=[(1.0, sse(chunk("ab"), chunk("cd"), chunk("e", finish="length")))])
    account_tokens(rec, 8)
    assert rec.count_method == "max-tokens" and list(rec.token_counts) == [2, 3, 3]


def test_no_usage_and_an_early_stop_is_unknown_for_now():
    rec = StreamRecord(reads=[(1.0, sse(chunk("ab"), chunk("c", finish="stop")))])
    account_tokens(rec, 8)
    assert rec.count_method is None and list(rec.token_counts) == [1, 1]


def test_spread_keeps_the_total():
    assert spread(10, 3) == [3, 3, 4] and sum(spread(4095, 1366)) == 4095 and spread(5, 0) == []


def cut(chunks):  # a stream cancelled at the window's end: no usage, no finish reason
    rec = StreamRecord(reads=[(1.0, sse(*[chunk("xyz")] * chunks, done=False))], cancelled=True)
    return account_tokens(rec, 4096)


def finished(chunks, tokens):
    rec = StreamRecord(
        reads=[(1.0, sse(*[chunk("xyz")] * (chunks - 1), chunk("x", finish="length")))]
    )
    return account_tokens(rec, tokens)


def test_cut_requests_take_the_cells_tokens_per_chunk():
    records = [finished(10, 30), finished(20, 60), cut(5), cut(7)]
    acc = complete_accounting(records)
    assert acc.method == "ratio" and acc.ratio == 3.0 and acc.ratio_rel_error == 0.0
    assert [r.n_tokens for r in records[2:]] == [15, 21]
    assert acc.note is not None
    assert "2 request(s) cut at the window's end estimated at 3.00 tokens per chunk" in acc.note


def early_stop(chunks):  # no usage, finish_reason stop (llama-cpp-python's end of generation)
    rec = StreamRecord(
        reads=[(1.0, sse(*[chunk("xyz")] * (chunks - 1), chunk("x", finish="stop")))]
    )
    return account_tokens(rec, 4096)


def test_early_stops_without_usage_are_estimated_and_not_called_cut():
    records = [finished(10, 30), finished(20, 60), cut(5), early_stop(4), early_stop(6)]
    acc = complete_accounting(records)
    assert acc.method == "ratio" and [r.n_tokens for r in records[2:]] == [15, 12, 18]
    assert acc.note is not None and acc.note.startswith(
        "tokens: 1 request(s) cut at the window's end and 2 request(s) that ended before "
        "max_tokens (no usage) estimated at 3.00 tokens per chunk"
    )
    only_early = complete_accounting([finished(10, 30), early_stop(4)])
    assert only_early.note is not None and only_early.note.startswith(
        "tokens: 1 request(s) that ended before max_tokens (no usage) estimated at 3.00"
    )


def test_nothing_known_assumes_one_token_per_chunk_and_says_so_loudly():
    records = [cut(5), cut(7)]
    acc = complete_accounting(records)
    assert acc.method == "chunk-count" and acc.note is not None
    assert "ONE TOKEN PER CHUNK ASSUMED" in acc.note
    assert [r.n_tokens for r in records] == [5, 7]


def test_continuous_usage_is_plain_usage():
    rec = StreamRecord(reads=[(1.0, sse(chunk("a", 1), chunk("b", 2)))])
    account_tokens(rec, 2)
    acc = complete_accounting([rec])
    assert acc.method == "usage" and acc.note is None


def test_a_request_that_reached_length_did_not_end_early():
    rec = StreamRecord(reads=[(1.0, sse(chunk("abc"), chunk("d", finish="length")))])
    account_tokens(rec, 4096)
    assert not ended_early(rec, 4096)  # 2 chunks, but the server says it reached max_tokens
    stop = StreamRecord(reads=[(1.0, sse(chunk("abc", 3), chunk("d", 4, finish="stop")))])
    account_tokens(stop, 4096)
    assert ended_early(stop, 4096)
