"""The conversation cell's pure parts (docs/workloads.md, "Conversations"): its id, each user's
own tokens, the answer read from a stream (text and the server's own token ids), the share of
a prompt a prefix cache should hit, and a turn's figures."""

from __future__ import annotations

import json

import pytest

from pytest_llmspeed.core.client import StreamRecord
from pytest_llmspeed.core.conversation import (
    ConversationResult,
    Sent,
    block_size_from_metrics,
    conversation_id,
    expected_cached,
    parse_answer,
    turn_figures,
    user_tokens,
)
from pytest_llmspeed.core.errors import MalformedAnswer
from pytest_llmspeed.results import ServerFigures


def _event(text: str, ids: list[int] | None = None, **extra: object) -> bytes:
    choice: dict[str, object] = {"index": 0, "text": text, "finish_reason": None}
    if ids is not None:
        choice["token_ids"] = ids
    return b"data: " + json.dumps({"id": "cmpl-1", "choices": [choice], **extra}).encode() + b"\n\n"


def test_the_id_names_the_first_prompt_the_users_and_the_turns():
    assert conversation_id(8192, 4, 3) == "8K-u4-t3"
    assert conversation_id(1500, 1, 2) == "1500-u1-t2"


def test_each_user_and_turn_has_its_own_tokens_from_the_pool_the_same_on_each_draw():
    pool = list(range(1000, 1100))
    a = user_tokens(7, pool, 0, 1, 64)
    assert a == user_tokens(7, pool, 0, 1, 64)  # the same salt, user and turn: the same ids
    assert len(a) == 64 and set(a) <= set(pool)
    assert a != user_tokens(7, pool, 1, 1, 64)  # another user
    assert a != user_tokens(7, pool, 0, 2, 64)  # another turn
    assert a != user_tokens(8, pool, 0, 1, 64)  # another run's salt
    # --llm-prompt-text: 4 salted ids, then a run of the text's ids (repeated past its end)
    text = list(range(1000, 1037))
    t = user_tokens(7, pool, 0, 1, 64, text)
    assert t == user_tokens(7, pool, 0, 1, 64, text) and len(t) == 64
    assert t != user_tokens(8, pool, 0, 1, 64, text)  # another run's salt
    start = text.index(t[4])
    assert t[4:] == (text * 3)[start : start + 60]
    assert all(isinstance(i, int) for i in a)


def test_an_answer_is_its_text_joined_across_reads_and_its_ids_where_every_chunk_gave_them():
    stream = _event("Hello", [11, 12]) + _event(" world", [13]) + _event("", [], usage={})
    stream += b"data: [DONE]\n\n" + _event("after the end", [99])
    # cut anywhere: the reads are joined before the events are read
    reads = [(0.1, stream[:17]), (0.2, stream[17:90]), (0.3, stream[90:])]
    answer = parse_answer(reads)
    assert answer.text == "Hello world"
    assert answer.token_ids == (11, 12, 13)
    assert answer.id_note is None


def test_a_chunk_with_output_but_no_ids_leaves_the_answer_without_ids():
    stream = _event("Hello", [11]) + _event(" world") + b"data: [DONE]\n\n"
    answer = parse_answer([(0.0, stream.replace(b"\n", b"\r\n"))])  # \r\n lines too
    assert answer.text == "Hello world"
    assert answer.token_ids is None


@pytest.mark.parametrize("ids", [[True], [-1], [2**31], ["5"], "12"])
def test_ids_that_are_not_token_ids_are_refused_and_said(ids: object):
    stream = _event("Hi", ids) + b"data: [DONE]\n\n"  # type: ignore[arg-type]
    answer = parse_answer([(0.0, stream)])
    assert answer.token_ids is None
    assert answer.id_note is not None and "choices[].token_ids" in answer.id_note


def test_a_choice_that_is_not_an_object_is_a_malformed_answer():
    with pytest.raises(MalformedAnswer):
        parse_answer([(0.0, b'data: {"choices": [5]}\n\n')])


def test_the_cache_should_hold_the_previous_prompts_whole_blocks():
    # turn 1: nothing to hit
    assert expected_cached(1024, None, None, 16) == 0
    # 100 tokens before: 6 whole blocks of 16 (96 tokens); the block of token 100 was partial
    assert expected_cached(100 + 32 + 64, 100, None, 16) == 96
    # a server that caches its answers: 100 + 32 − 1 computed tokens, 8 whole blocks
    assert expected_cached(100 + 32 + 64, 100, 32, 16) == 128
    # never the block of the prompt's last token: a prompt of 97 tokens hits 6 blocks at most
    assert expected_cached(97, 96, 40, 16) == 96
    assert expected_cached(96, 96, None, 16) == 80


def _record(t_send, t_first, times, counts, prompt_tokens, error=None) -> StreamRecord:
    rec = StreamRecord(t_send=t_send, t_first=t_first, prompt_tokens=prompt_tokens, error=error)
    rec.token_times, rec.token_counts = times, counts
    return rec


def test_a_turns_figures_are_over_its_users_with_the_servers_cache_beside_the_expected_share():
    block = 16
    # turn 2 of two users: 100 tokens before, 32 answered, 64 new (196 in all)
    a = _record(10.0, 10.05, [10.05, 10.35], [1, 31], 196)  # 50 ms, then 30 tokens in 0.3 s
    b = _record(10.0, 10.10, [10.10, 10.40], [1, 20], 196)  # ended early: 21 of 32
    sent = [Sent(0, 196, 100, 32, 32, a), Sent(1, 196, 100, None, 32, b)]
    server = ServerFigures(duration_s=1.0, prefix_cache_queries=392, prefix_cache_hits=192)
    t = turn_figures(2, sent, block, server)
    assert t.users == 2 and t.new_tokens == (96, 96)
    assert t.ttft_ms == pytest.approx((50.0, 100.0))
    assert t.new_prefill_tok_s == pytest.approx((96 / 0.05, 96 / 0.10))
    assert t.output_tok_s == pytest.approx((31 / 0.3, 20 / 0.3))
    assert t.early_stops == 1 and t.failed == 0 and not t.wrong_lengths
    assert t.hit_rate == pytest.approx(192 / 392)
    assert t.expected_hit_share == pytest.approx(2 * 96 / 392)
    # user 2's answer was carried as tokenized text: no answers-cached share for the turn
    assert t.expected_hit_share_answers is None
    d = t.as_dict()
    assert d["ttft_ms"] == pytest.approx(75.0) and d["prompt_tokens"] == 196


def test_a_turn_counts_other_prompt_lengths_and_failures_and_no_block_size_no_share():
    a = _record(0.0, 0.02, [0.02], [1], 1030)  # the server counted 1,030 of 1,024
    b = _record(0.0, None, [], [], None, error="connection failed")
    t = turn_figures(1, [Sent(0, 1024, None, None, 8, a), Sent(1, 1024, None, None, 8, b)], None)
    assert t.wrong_lengths == {1030: 1}
    assert t.failed == 1 and t.early_stops == 1  # one token of 8, then ended
    assert t.new_tokens == (1024, 1024) and t.ttft_ms == pytest.approx((20.0,))
    assert t.expected_hit_share is None and t.hit_rate is None


def test_the_cells_figures_are_over_the_turns_that_should_hit():
    def turn(k: int, ttft: float, hits: int, queries: int, prev: int | None):
        rec = _record(0.0, ttft / 1e3, [ttft / 1e3], [1], 200)
        server = ServerFigures(duration_s=1.0, prefix_cache_queries=queries, prefix_cache_hits=hits)
        return turn_figures(k, [Sent(0, 200, prev, None, 1, rec)], 16, server)

    result = ConversationResult([turn(1, 500.0, 0, 200, None), turn(2, 40.0, 96, 200, 100)])
    result.turns.append(turn(3, 60.0, 144, 200, 150))
    assert result.conv_ttft_ms == pytest.approx(50.0)  # turn 1's cold prefill left out
    assert result.conv_hit_rate == pytest.approx((96 + 144) / 400)
    assert result.conv_expected_hit_share == pytest.approx((96 + 144) / 400)


def test_the_block_size_is_vllms_cache_config_label_the_same_on_every_engine():
    def info(*sizes: str) -> dict[str, list[tuple[dict[str, str], float]]]:
        return {
            "vllm:cache_config_info": [
                ({"block_size": s, "engine": str(i)}, 1.0) for i, s in enumerate(sizes)
            ]
        }

    assert block_size_from_metrics(info("16")) == 16
    assert block_size_from_metrics(info("16", "16")) == 16
    assert block_size_from_metrics(info("16", "32")) is None  # engines that differ
    assert block_size_from_metrics(info("-16")) is None
    assert block_size_from_metrics(info("1e3")) is None
    assert block_size_from_metrics({}) is None and block_size_from_metrics(None) is None


# -- the cell in the results model -------------------------------------------------------------


def test_conversation_ids_round_trip_and_refuse_what_is_not_one():
    from pytest_llmspeed.results import CellId, Phase

    cid = CellId.parse("conversation[8K-u4-t3]")
    assert cid == CellId.conversation(8192, 4, 3)
    assert cid.phase is Phase.CONVERSATION and cid.concurrency == 4 and cid.turns == 3
    assert str(cid) == "conversation[8K-u4-t3]" and cid.param_id == conversation_id(8192, 4, 3)
    assert str(CellId.parse("conversation[1500-u1-t1]")) == "conversation[1500-u1-t1]"
    for bad in ("conversation[8K-u0-t3]", "conversation[8K-u4]", "conversation[8K-t3-u4]"):
        with pytest.raises(ValueError, match="conversation\\[8K-u4-t3\\]"):
            CellId.parse(bad)
    with pytest.raises(ValueError, match="1 turn or more"):
        CellId(Phase.CONVERSATION, 8192, 4, turns=0)
    with pytest.raises(ValueError, match="1 turn or more"):
        CellId(Phase.DECODE, 8192, 4, turns=2)


def _result() -> ConversationResult:
    def turn(k: int, ttft: float, hits: int, prev: int | None):
        recs = [_record(0.0, ttft / 1e3, [ttft / 1e3, ttft / 1e3 + 0.1], [1, 7], 200 + 10 * k)]
        server = ServerFigures(duration_s=1.0, prefix_cache_queries=200, prefix_cache_hits=hits)
        sent = [Sent(0, 200 + 10 * k, prev, None, 8, recs[0])]
        return turn_figures(k, sent, 16, server)

    return ConversationResult(
        [turn(1, 500.0, 0, None), turn(2, 40.0, 192, 100), turn(3, 60.0, 96, 150)],
        notes=["answers: tokenized text"],
        answers="tokenized text",
    )


def test_a_conversation_record_round_trips_through_the_file_junit_and_the_schema():
    import jsonschema

    from pytest_llmspeed.core.records import conversation_record
    from pytest_llmspeed.results import CellId, Results, RunInfo, Status, loads
    from tests.conftest import SCHEMA

    cid = CellId.conversation(8192, 1, 3)
    record = conversation_record(cid, _result(), context_tokens=8192)
    assert record.status is Status.VALID and record.measured
    assert record.conv_ttft_ms == pytest.approx(50.0) and record.conv_turns == 3
    assert record.turn_ttft_ms == pytest.approx((500.0, 40.0, 60.0))
    assert record.turn_hit_rate == pytest.approx((0.0, 0.96, 0.48))
    assert record.conv_hit_rate == pytest.approx((192 + 96) / 400)
    assert record.turn_expected_hit_share_answers == (0.0, None, None)
    assert record.samples is not None and len(record.samples.ttft_ms) == 2  # turns 2 and 3
    run = RunInfo("pytest-llmspeed", "2026-12-01T00:00:00+00:00", "sim:tiny")
    doc = Results(run, (record,)).dumps()
    jsonschema.Draft202012Validator(SCHEMA).validate(json.loads(doc))
    written = json.loads(doc)["cells"][0]
    assert written["id"] == "conversation[8K-u1-t3]" and written["concurrency"] == 1
    assert written["turn_expected_hit_share_answers"] == [0.0, None, None]
    back = loads(doc).cells[0]
    assert back == record
    props = dict(record.properties())
    assert props["phase"] == "conversation" and props["conv_ttft_ms"] == record.conv_ttft_ms
    assert "turn_ttft_ms" not in props and "total_tok_s" not in props


def test_a_conversation_cell_fails_on_other_prompt_lengths_or_too_many_errors():
    from pytest_llmspeed.core.conversation import conversation_status
    from pytest_llmspeed.results import Status

    assert conversation_status(_result(), 0.05).status is Status.VALID
    wrong = _record(0.0, 0.02, [0.02], [1], 1030)
    bad = turn_figures(1, [Sent(0, 1024, None, None, 1, wrong)], None)
    status = conversation_status(ConversationResult([bad]), 0.05)
    assert status.status is Status.FAILED and "1,030 (1×)" in (status.reason or "")
    failed = _record(0.0, None, [], [], None, error="HTTP 500")
    lost = turn_figures(1, [Sent(0, 1024, None, None, 1, failed)], None)
    status = conversation_status(ConversationResult([lost]), 0.05)
    assert status.status is Status.FAILED and "1 of 1 requests failed" in (status.reason or "")
    none = conversation_status(ConversationResult([], notes=["user 1's conversation ended"]), 0)
    assert none.status is Status.ERROR and none.reason == "user 1's conversation ended"


def test_a_conversation_cell_is_compared_by_its_later_turns_ttft():
    from pytest_llmspeed import figures

    assert figures.headline("conversation").key == "conv_ttft_ms"
    assert figures.by_key("conv_ttft_ms").gate is figures.Gate.CEILING


def test_a_conversation_cell_shows_in_all_measurements_the_page_and_compare():
    from pytest_llmspeed.core.records import conversation_record
    from pytest_llmspeed.report.compare import headline
    from pytest_llmspeed.report.page import render_page
    from pytest_llmspeed.report.terminal import render
    from pytest_llmspeed.results import CellId, Results, RunInfo

    record = conversation_record(CellId.conversation(8192, 1, 3), _result(), context_tokens=8192)
    text = "\n".join(render([record], 160, True, []))
    # the per-turn table: one row per turn, the hit rate beside the share it should hit
    assert "Conversations (users in step; per turn the medians over its users" in text
    turns = [line.split() for line in text.splitlines() if "ms" in line and "%" in line]
    assert [t[0] for t in turns[:3]] == ["conversation[8K-u1-t3]", "2", "3"]
    assert turns[1][-4:] == ["96.0%", "43.6%", "/", "—"]  # answers carried as text: no share
    row = next(line for line in text.splitlines() if line.startswith("Conversation "))
    assert "50 ms" in row  # the TTFT of turns 2 and 3
    assert "server's prefix-cache hit rate after the first turn" in text  # More figures
    assert "72.0%" in text and "53.3%" in text  # the hit rate beside the share it should hit
    html = render_page(Results(RunInfo("pytest-llmspeed", "2026-12-01", "sim:tiny"), (record,)))
    assert "Conversation" in html.html
    # the page's per-turn table: the hit rate beside the share it should hit
    assert '<h3 id="conversations">Conversations, turn by turn</h3>' in html.html
    assert "<td>96.0%</td><td>43.6% / —</td>" in html.html
    assert headline(record) == ("conv_ttft_ms", 50.0)
