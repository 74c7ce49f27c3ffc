"""The text re-count's judgement (core/recount.py, docs/trust.md "The text re-count"): a usage
that says a chunk carried two tokens where its text is one a chunk is a lie; what a correct
server sends is never one, whatever its model's text re-counts to."""

from __future__ import annotations

import asyncio

import pytest

from pytest_llmspeed.core.errors import LLMSpeedError
from pytest_llmspeed.core.recount import (
    RECOUNT_SAMPLE,
    RECOUNT_SLACK,
    RECOUNT_TOLERANCE,
    Recounted,
    beyond,
    judge,
    recount_or_why,
)
from pytest_llmspeed.core.wire import StreamTally


def test_a_usage_twice_the_chunks_of_a_one_token_a_chunk_text_is_named():
    line = judge([Recounted(credited=64, recounted=32, chunks=32)])
    assert line is not None
    assert "credited 64 tokens to a request of 32 chunks" in line
    assert "counts as 32 tokens (2.00×; 1 of 1 requests" in line
    assert "more tokens than the stream carried" in line


@pytest.mark.parametrize(
    ("credited", "recounted", "chunks", "what"),
    [
        (4096, 4096, 4096, "one token a chunk, re-counted exactly"),
        (4096, 3980, 4096, "pieces merged on a re-read (−3 %)"),
        (4096, 5940, 4096, "a random-weight model's text re-counts to 1.45×"),
        (4096, 0, 4096, "tokens without text (special tokens)"),
        (4096, 4096, 1950, "speculative decoding, 2.1 tokens a chunk, text agrees"),
        (4096, 6000, 1950, "speculative decoding on a random-weight model"),
        (4096, 2048, 1280, "a repeated piece merged in pairs, 3.2 tokens a chunk"),
        (4096, 1024, 1280, "a repeated piece merged by four"),
        (9, 5, 5, "a short request: within the slack"),
    ],
)
def test_what_a_correct_server_sends_is_never_a_lie(credited, recounted, chunks, what):
    """Either the text is not one token a chunk (so the request is not judged) or the usage is
    within the bound of the chunks: a correct server's usage equals its tokens, which are at
    least its chunks."""
    assert not beyond(Recounted(credited, recounted, chunks)), what
    assert judge([Recounted(credited, recounted, chunks)]) is None


def test_a_lie_on_a_real_models_text_is_named_though_the_re_read_merged_some_pieces():
    """One token a chunk, 4 % of the pieces merged on the re-read and the end of sequence
    not in the text; the usage says two a chunk."""
    assert beyond(Recounted(credited=2 * 4096, recounted=3931, chunks=4096))


def test_the_bound_is_a_quarter_and_four_tokens_above_what_the_stream_carried():
    top = 100 * (1 + RECOUNT_TOLERANCE) + RECOUNT_SLACK
    assert not beyond(Recounted(int(top), 100, 100))
    assert beyond(Recounted(int(top) + 1, 100, 100))


def test_one_lying_request_among_good_ones_is_named_with_the_count():
    good = [Recounted(50, 50, 50)] * 5
    line = judge([*good, Recounted(100, 50, 50), *good])
    assert line is not None and "1 of 11 requests re-counted" in line


class _Failing:
    """A tokenizer whose route answered the probe and fails now."""

    async def has_ids(self) -> bool:
        return True

    async def count_text(self, text: str) -> int:
        raise LLMSpeedError("http://127.0.0.1:1/tokenize answered HTTP 500")


class _Record:
    def __init__(self, tally: StreamTally) -> None:
        self.tally, self.error = tally, None


def _tally(recount: bool) -> StreamTally:
    tally = StreamTally()
    tally.recount = recount
    tally.feed(1.0, b'data: {"choices":[{"text":"a b"}],"usage":{"completion_tokens":2}}\n\n')
    return tally


def test_a_tokenizer_that_fails_is_a_note_not_silence():
    records = [_Record(_tally(True))]
    got, why = asyncio.run(recount_or_why(records, _Failing()))  # type: ignore[arg-type]
    assert got is None
    assert why == (
        "the server's tokenizer failed on the text received: "
        "http://127.0.0.1:1/tokenize answered HTTP 500"
    )


def test_only_the_sample_keeps_its_text():
    assert RECOUNT_SAMPLE == 8
    kept, dropped = _tally(True), _tally(False)
    for tally in (kept, dropped):
        tally.feed(2.0, b'data: {"choices":[{"text":" c","finish_reason":"length"}],'
                        b'"usage":{"completion_tokens":3}}\n\ndata: [DONE]\n\n')  # fmt: skip
        tally.close()
    assert kept.output_text() == "a b c"
    assert dropped.output_text() == ""
