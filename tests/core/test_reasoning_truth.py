"""Reasoning and answer (docs/metrics.md, "Reasoning and answer"), against the simulator's own
record of each chat request (``GET /sim/trace``): its reasoning tokens, when it wrote its first
answer token, the tool-call deltas it wrote.

The ``tiny`` profile reasons for its first 8 output tokens and drafts 2 tokens a step, so its
chunks carry 1 to 3 tokens and some requests have a chunk that carries both the reasoning's
last tokens and the answer's first: the stream cannot tell how many of that chunk's tokens
were reasoning. The rule the client follows (that chunk's tokens count as answer, the request
is marked ``estimate``) is checked exactly, chunk by chunk, and the server's
``completion_tokens_details.reasoning_tokens`` makes every finished request exact.

The time to the first answer token is checked for equality, not within a tolerance: the
client's first answer time is the arrival of the read that carried the chunk the simulator
stamped as its first answer chunk (both ends' clocks are one CLOCK_MONOTONIC); the simulator's
own figure from the request's arrival is below it by the trip in and that chunk's trip out,
each measured and never negative (tests/core/truth.py).
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import numpy as np
import pytest

from pytest_llmspeed.core.client import Connection, StreamRecord, account_tokens, stream_request
from pytest_llmspeed.sim import SimOptions, running_simulator_process

from .test_wire_trust import raw, streaming
from .truth import CLOCK_SLACK_S, Matched, measure

__all__ = ["raw"]  # the fixture, used by name

pytestmark = [pytest.mark.asyncio, pytest.mark.slow]

REASONING = 8  # the tiny profile's reasoning tokens


@pytest.fixture(scope="module")
def chat_sim() -> Iterator[str]:
    with running_simulator_process(SimOptions(profile="tiny", speed=2)) as url:
        yield url


@pytest.fixture(scope="module")
def chat_sim_no_details() -> Iterator[str]:
    options = SimOptions(profile="tiny", speed=2, quirks="no-reasoning-details")
    with running_simulator_process(options) as url:
        yield url


def parsed_split(reads: list[tuple[float, bytes]]) -> tuple[int, bool, int | None, bool]:
    """The reasoning tokens the stream shows, by these few lines' own parse of every event:
    a usage rise counts as reasoning when its chunk carries reasoning text and no answer (text
    or tool call), or no text while the stream reasons; as answer otherwise (a chunk that
    carries both: straddled). Also the index of the first chunk with answer text, and whether
    a chunk without text came before the reasoning's first (its tokens counted as answer)."""
    buf, prev, reasoning, reasoned, answered, straddled = b"", 0, 0, False, False, False
    blind = False
    first_answer, index = None, 0
    for _, data in reads:
        buf += data
        *events, buf = buf.split(b"\n\n")
        for event in events:
            payload = event.strip().removeprefix(b"data:").strip()
            if not payload.startswith(b"{"):
                continue
            obj = json.loads(payload)
            delta = (obj["choices"] or [{}])[0].get("delta", {})
            r_text = bool(delta.get("reasoning_content") or delta.get("reasoning"))
            a_text = bool(delta.get("content") or delta.get("tool_calls"))
            rise = (obj.get("usage") or {}).get("completion_tokens", prev) - prev
            prev += rise
            if obj["choices"] and "role" not in delta:
                if a_text and first_answer is None:
                    first_answer = index
                index += 1
            if rise and not (r_text or a_text or reasoned or answered):
                blind = True
            if r_text and a_text:
                straddled = True
            elif not a_text and (r_text or (reasoned and not answered)):
                reasoning += rise
            reasoned, answered = reasoned or r_text, answered or a_text
    return reasoning, straddled, first_answer, blind


def server_answer_chunk(m: Matched) -> int | None:
    """The index of the simulator's first chunk with answer text (None: none reached us)."""
    times = [t for t, _ in m.sent]
    at = m.server["answer_time"] if m.server else None
    return times.index(at) if at in times else None


def check_split(matched: list[Matched], details: bool) -> tuple[int, int]:
    """Every request's reasoning and answer tokens against the simulator's; the totals."""
    reasoning_total = answer_total = agreed = 0
    for m in matched:
        rec, server = m.record, m.server
        assert server is not None and rec.n_tokens == m.tokens, m.rid
        streamed, straddled, first_answer, blind = parsed_split(rec.reads)
        assert first_answer == server_answer_chunk(m), m.rid
        if m.complete and details:
            assert rec.reasoning_tokens == server["reasoning_tokens"] == min(REASONING, m.tokens)
            assert rec.reasoning_from == "server", m.rid
        else:
            assert rec.reasoning_tokens == streamed, m.rid
            assert rec.reasoning_from == ("estimate" if straddled else "stream"), m.rid
        # where no chunk straddled the boundary, the reasoning's first token and the answer's
        # had text, the stream's split is the simulator's
        done = boundary = 0
        for i, (_, n) in enumerate(m.sent):
            if done < REASONING + 1 <= done + n:
                boundary = i
            done += n
        if m.complete and not straddled and not blind and first_answer == boundary:
            assert streamed == server["reasoning_tokens"], m.rid
            agreed += 1
        assert rec.answer_tokens == m.tokens - rec.reasoning_tokens, m.rid
        reasoning_total += rec.reasoning_tokens
        answer_total += rec.answer_tokens
    assert agreed >= 1  # the exact case was met
    return reasoning_total, answer_total


def check_answer_time(matched: list[Matched], w1: float) -> list[float]:
    """Each request's first answer time is the arrival of the chunk the simulator stamped as
    its first answer chunk; the waits the cell's median is taken over."""
    waits = []
    for m in matched:
        rec, server = m.record, m.server
        assert server is not None
        k = server_answer_chunk(m)
        if k is None:
            assert rec.t_answer is None, m.rid  # no answer chunk reached the client
            continue
        assert rec.t_answer == m.got[k], m.rid
        server_wait = server["answer_time"] - server["arrival"]
        client_wait = rec.t_answer - rec.t_send
        delay = m.trip_in + m.trips_out[k]
        assert -CLOCK_SLACK_S <= client_wait - server_wait <= delay + CLOCK_SLACK_S, m.rid
        if rec.t_answer < w1:
            waits.append((rec.t_answer - rec.t_send) * 1e3)
    return waits


@pytest.mark.parametrize("details", [True, False], ids=["details", "from-stream"])
async def test_reasoning_and_answer_tokens_and_the_first_answer_token(
    details, chat_sim, chat_sim_no_details
):
    url = chat_sim if details else chat_sim_no_details
    result, matched = await measure(url, max_output=48, duration=1.5, concurrency=4, api="chat")
    assert len(matched) >= 8 and any(m.complete for m in matched)
    # the reads after the first answer text were counted without a parse (but in the text
    # re-count's sample, the cell's first requests, parsed event by event: core/recount.py)
    rest = [m for m in matched if not m.record.tally.recount]
    assert sum(m.record.tally.fast for m in rest) >= len(rest) // 2
    reasoning, answer = check_split(matched, details)
    r = result.reasoning
    assert r is not None
    # the cell's figures are the requests' (all received, window or not)
    assert (r.reasoning_tokens, r.answer_tokens) == (reasoning, answer)
    assert r.reasoning_tokens + r.answer_tokens == result.received_tokens
    waits = check_answer_time(matched, result.window[1])
    assert r.answer_ttft_ms == pytest.approx(float(np.median(waits)), abs=1e-9)
    # the first answer token comes after the first token (its reasoning)
    assert r.answer_ttft_ms is not None and result.stats.ttft_ms is not None
    assert r.answer_ttft_ms > result.stats.ttft_ms
    assert result.tool_call_deltas is None


async def test_tool_call_deltas_are_counted(chat_sim):
    result, matched = await measure(
        chat_sim, max_output=48, duration=1.5, concurrency=4, api="chat", tools=True
    )
    total = 0
    for m in matched:
        assert m.server is not None
        done, answer_chunks = 0, 0  # the chunks the client got that carried answer tokens
        for _, n in m.sent:
            answer_chunks += done + n > REASONING
            done += n
        assert m.record.tool_call_deltas == answer_chunks, m.rid
        if m.complete:
            assert m.record.tool_call_deltas == m.server["tool_call_deltas"] > 0, m.rid
        total += m.record.tool_call_deltas
    assert result.tool_call_deltas == total > 0
    # a tool call is the answer: its first delta is the first answer token
    r = result.reasoning
    assert r is not None and r.answer_ttft_ms is not None
    check_answer_time(matched, result.window[1])


def chat_chunk(n: int, field: str, text: str = "x", finish: str | None = None) -> bytes:
    event = {
        "id": "chatcmpl-1",
        "choices": [{"index": 0, "delta": {field: text}, "finish_reason": finish}],
        "usage": {"prompt_tokens": 3, "completion_tokens": n, "total_tokens": 3 + n},
    }
    return b"data: " + json.dumps(event, separators=(",", ":")).encode() + b"\n\n"


def final_usage(n: int, reasoning: object) -> bytes:
    event = {
        "id": "chatcmpl-1",
        "choices": [],
        "usage": {
            "prompt_tokens": 3,
            "completion_tokens": n,
            "total_tokens": 3 + n,
            "completion_tokens_details": {"reasoning_tokens": reasoning},
        },
    }
    return b"data: " + json.dumps(event, separators=(",", ":")).encode() + b"\n\n"


STREAM = [
    chat_chunk(1, "reasoning_content"),
    chat_chunk(2, "reasoning_content"),
    chat_chunk(3, "reasoning_content"),
    chat_chunk(4, "content"),
    chat_chunk(5, "content", finish="length"),
]


async def one_chat(url: str) -> StreamRecord:
    conn = Connection.open(url, None, 2.0)
    try:
        body = {"model": "m", "messages": [], "max_tokens": 5, "stream": True}
        return await stream_request(conn, "/v1/chat/completions", body)
    finally:
        await conn.close()


@pytest.mark.parametrize(
    ("value", "words"),
    [
        ("3", '"3" (a string), not a whole number of tokens'),
        (-1, "-1 (a whole number), outside 0"),
        (6, "is 6, more than the 5 completion_tokens"),
        (2.0, "2.0 (a number with a fraction)"),
    ],
    ids=["string", "negative", "over-completion", "float"],
)
async def test_a_malformed_reasoning_count_fails_the_request(raw, value, words):
    server, url = raw
    server.respond = streaming([*STREAM, final_usage(5, value), b"data: [DONE]\n\n"])
    rec = await one_chat(url)
    assert rec.error is not None, rec
    assert "usage.completion_tokens_details.reasoning_tokens" in rec.error
    assert words in rec.error and "/v1/chat/completions" in rec.error


async def test_a_well_formed_reasoning_count_is_taken(raw):
    server, url = raw
    server.respond = streaming([*STREAM, final_usage(5, 2), b"data: [DONE]\n\n"], gap=0.02)
    rec = account_tokens(await one_chat(url), 5)
    assert rec.error is None
    # the server's count wins over the stream's three reasoning chunks
    assert (rec.reasoning_tokens, rec.answer_tokens, rec.reasoning_from) == (2, 3, "server")
    assert rec.t_answer is not None and rec.t_first is not None
    assert rec.t_answer > rec.t_first  # three reasoning chunks came first
