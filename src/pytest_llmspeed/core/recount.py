"""The text re-count: a referee of the usage field that needs no ``/metrics`` (docs/trust.md,
"The text re-count").

A cell's first :data:`RECOUNT_SAMPLE` requests keep their output text (``StreamTally.recount``:
each of their events parsed, none counted by the fast path). After the cell, where the server
has a tokenize route, its own tokenizer counts each one's text, and the tokens its usage
credited are held against what the stream carried.

A usage that says a chunk carried two tokens where it carried one is what this referee finds
(the usage counted twice, or by another tokenizer, and no ``/metrics`` counter to catch it):
where the text re-counts to about one token a chunk (from :data:`RECOUNT_BELOW` below the
chunks to :data:`RECOUNT_TOLERANCE` above, give or take :data:`RECOUNT_SLACK` tokens), the usage
must be within the same bound above them; a usage above them beyond the
same bound credits tokens the stream did not carry, and the cell is not valid. (A usage below
the chunks with output is refused at the stream's end already: each such chunk carries a
token, ``StreamTally.close``.)

Where the text does not re-count to about one token a chunk, the request is not judged: a
stream of several tokens a chunk (speculative decoding, a server that sends chunks at an
interval) re-counts to its usage when the model's tokens are the tokenizer's own reading of
their text, and to anything when they are not: a random-weight test model's text re-counts to
1.4–1.5× its tokens (the project's tiny vLLM model), a byte token repeated to 3×, a repeated
piece that merges to fewer. A usage of one token a chunk is never beyond the bound, whatever
its text re-counts to. What remains ambiguous: several tokens a chunk whose text, re-read,
merges back to about one a chunk (a model repeating a piece its tokenizer merges, every draft
accepted): the line names the counts, so a person can tell (docs/trust.md).

No pytest.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from .client import StreamRecord
from .errors import LLMSpeedError
from .tokenize import ServerTokenizer

#: the requests of a cell whose text is kept and re-counted: its first ones (a server that
#: lies in every request is caught by the first; one that lies in one request of three is
#: caught with probability 1 − (2/3)^8 = 96 %)
RECOUNT_SAMPLE = 8
#: how far from the chunks a text may re-count and still be "one token a chunk", and how far
#: above them a usage may be: a quarter (tokens of one chunk each re-count within a few per
#: cent on real models) ...
RECOUNT_TOLERANCE = 0.25
#: ... and a few tokens a request (special tokens left out of the text, a held-back character)
RECOUNT_SLACK = 4
#: how far below the chunks a text may re-count and still be "one token a chunk": a tenth
#: (pieces merged on a re-read, an end of sequence not in the text)
RECOUNT_BELOW = 0.1


@dataclass(frozen=True)
class Recounted:
    """One request of the sample: what its usage credited, what its stream carried."""

    credited: int  # usage.completion_tokens (the last the stream sent)
    recounted: int  # the server's tokenizer on the text received
    chunks: int  # chunks that carried output


@dataclass(frozen=True)
class Recount:
    """The sample's outcome: the requests re-counted and, where the usage credited more than
    the streams carried, the line that says so (None: it agrees)."""

    requests: tuple[Recounted, ...]
    disagreement: str | None = None

    @property
    def credited(self) -> int:
        return sum(r.credited for r in self.requests)

    @property
    def recounted(self) -> int:
        return sum(r.recounted for r in self.requests)


def one_a_chunk(r: Recounted) -> bool:
    """Does the text re-count to about one token a chunk (so that the usage must too)? At
    most :data:`RECOUNT_BELOW` and the slack below the chunks (a text of pieces merged on a
    re-read counts fewer: not judged), at most the bound above them."""
    low = r.chunks * (1 - RECOUNT_BELOW) - RECOUNT_SLACK
    return low <= r.recounted <= r.chunks * (1 + RECOUNT_TOLERANCE) + RECOUNT_SLACK


def beyond(r: Recounted) -> bool:
    """Does the usage credit more than the stream carried, beyond the bound?"""
    top = max(r.chunks, r.recounted)
    return one_a_chunk(r) and r.credited > top * (1 + RECOUNT_TOLERANCE) + RECOUNT_SLACK


def judge(requests: Sequence[Recounted]) -> str | None:
    """The line that says a usage credits tokens its stream did not carry, for the request
    furthest beyond the bound; None when every request is within it."""
    over = [r for r in requests if beyond(r)]
    if not over:
        return None
    worst = max(over, key=lambda r: r.credited / max(r.chunks, r.recounted, 1))
    ratio = worst.credited / max(worst.chunks, worst.recounted, 1)
    return (
        f"the server's usage credited {worst.credited:,} tokens to a request of "
        f"{worst.chunks:,} chunks whose text its own tokenizer counts as {worst.recounted:,} "
        f"tokens ({ratio:.2f}×; {len(over)} of {len(requests)} requests re-counted, beyond "
        f"{RECOUNT_TOLERANCE:.0%} + {RECOUNT_SLACK} tokens): the usage counts more tokens "
        "than the stream carried, so the figures are not to be trusted"
    )


def sample(records: Sequence[StreamRecord]) -> list[StreamRecord]:
    """The records of the sample that can be re-counted: text kept, an exact usage count,
    output chunks, no tool calls (their arguments are not in the text)."""
    return [
        r
        for r in records
        if r.tally.recount
        and r.tally.completion_tokens is not None
        and r.tally.output_chunks
        and not r.tally.tool_deltas
        and r.error is None
    ]


async def recount(records: Sequence[StreamRecord], tokenizer: ServerTokenizer) -> Recount | None:
    """The sample's text counted by the server's tokenizer, after the cell. None where there is
    nothing to re-count or no tokenize route (the run's notes say how prompts were sized).
    Raises :class:`LLMSpeedError` when the route answered before and fails now."""
    chosen = sample(records)
    if not chosen or not await tokenizer.has_ids():
        return None
    out = []
    for rec in chosen:
        count = await tokenizer.count_text(rec.tally.output_text())
        if count is None:
            return None
        assert rec.tally.completion_tokens is not None
        out.append(Recounted(rec.tally.completion_tokens, count, rec.tally.output_chunks))
    return Recount(tuple(out), judge(out))


async def recount_or_why(
    records: Sequence[StreamRecord], tokenizer: ServerTokenizer
) -> tuple[Recount | None, str | None]:
    """:func:`recount`, or why it could not run (a note on the cell, never silence)."""
    try:
        return await recount(records, tokenizer), None
    except LLMSpeedError as exc:
        return None, f"the server's tokenizer failed on the text received: {exc.message}"
