"""Conversations (docs/workloads.md, "Conversations") against the simulator's own record
(``/sim/trace``): each turn's prompt holds the earlier turns exactly, so the simulator's
prefix cache finds the previous prompt's whole blocks cached, request by request; each
turn's hit rate read from the server's counters is that record; and a conversation that
outgrows the server's context ends and says so; with the server's own answer ids, each
prompt is the whole history token for token. Real servers, loopback, real streams."""

from __future__ import annotations

import json

import pytest

from pytest_llmspeed.core.client import Connection
from pytest_llmspeed.core.conversation import (
    OWN_IDS,
    TOKENIZED,
    block_size_from_metrics,
    expected_cached,
    parse_answer,
    run_conversations,
    user_tokens,
)
from pytest_llmspeed.core.probe import probe, read_metrics
from pytest_llmspeed.core.prompts import PromptFactory
from pytest_llmspeed.core.protocol import negotiate
from pytest_llmspeed.sim import SimOptions, running_simulator_process
from pytest_llmspeed.sim.server import prompt_hash

from .truth import CLOCK_SLACK_S, TRACE_LIMIT, _client_chunks

pytestmark = pytest.mark.slow

CONTEXT = 1000  # not a whole number of blocks: the last block of each prompt is partial
MESSAGE = 100
ANSWER = 24


async def _open(url: str):
    conn = Connection.open(url, None, 60)
    server = await probe(conn, None, None)
    factory = PromptFactory(conn, server.model)
    dialect = await negotiate(conn, factory, server.model, "completions")
    return conn, server, factory, dialect


async def _records(conn: Connection) -> dict[str, dict]:
    status, body = await conn.get("/sim/trace", limit=TRACE_LIMIT)
    assert status == 200
    return {r["id"]: r for r in json.loads(body)["requests"]}


@pytest.mark.asyncio
async def test_each_turns_hit_rate_is_the_simulators_cache_record_and_the_expected_share():
    with running_simulator_process(SimOptions(profile="tiny", speed=4.0)) as url:
        conn, server, factory, dialect = await _open(url)
        try:
            block = block_size_from_metrics(await read_metrics(conn))
            assert block is not None and block > 1
            await conn.session.delete(conn.url("/sim/trace"))
            result = await run_conversations(
                conn, factory, dialect, server.model, CONTEXT, 3, 4, MESSAGE, ANSWER, 0.05,
                max_model_len=server.max_model_len, block_size=block, keep_reads=True,
            )  # fmt: skip
            records = await _records(conn)
        finally:
            await conn.close()
    assert [t.users for t in result.turns] == [3, 3, 3, 3]
    assert f"answers: {TOKENIZED}" in result.notes  # the simulator gives no token ids
    for turn, sent in zip(result.turns, result.sent, strict=True):
        cached = queries = 0
        for s in sent:
            rid, _, done = _client_chunks(s.rec.reads)
            assert rid is not None and done, s.rec.error
            rec = records[rid]
            assert rec["prompt_tokens"] == s.prompt_tokens == s.rec.prompt_tokens
            assert rec["block_size"] == block
            # the simulator found the previous prompt's whole blocks cached, exactly: the
            # history was sent token for token (the simulator caches prompt blocks only)
            want = expected_cached(s.prompt_tokens, s.prev_prompt, None, block)
            assert rec["cached_blocks"] * block == want
            if s.prev_prompt is not None:
                assert s.prompt_tokens > s.prev_prompt + MESSAGE  # the answer is in it
                assert want == block * (s.prev_prompt // block) > 0
            # the client's TTFT holds the server's own time from the request's arrival to
            # its first token's write (one clock: perf_counter is the machine's)
            assert s.rec.t_first is not None
            server_ttft = rec["first_token_time"] - rec["arrival"]
            assert s.rec.t_first - s.rec.t_send >= server_ttft - CLOCK_SLACK_S
            cached += rec["cached_blocks"] * block
            queries += rec["prompt_tokens"]
        # the server's counters read before and after the turn are its requests' record
        assert (turn.hits, turn.queries) == (cached, queries)
        assert turn.expected_tokens == cached
        assert turn.hit_rate == pytest.approx(turn.expected_hit_share)
        # Chance: a request's output rate needs two token times apart; on a loaded machine
        # its whole answer can come in one read (measured: 1 rate of 3 requests), so rates
        # are at most one a request, each positive
        assert len(turn.ttft_ms) == 3 and len(turn.output_tok_s) <= 3
        assert all(r > 0 for r in turn.output_tok_s)
        assert turn.failed == 0 and turn.early_stops == 0 and not turn.wrong_lengths
    assert result.turns[0].hit_rate == 0
    assert result.conv_hit_rate == pytest.approx(result.conv_expected_hit_share)
    assert result.conv_hit_rate is not None and result.conv_hit_rate > 0.7


@pytest.mark.asyncio
async def test_a_conversation_that_outgrows_the_context_ends_and_says_so():
    options = SimOptions(profile="tiny", speed=4.0, max_model_len=CONTEXT + 300)
    with running_simulator_process(options) as url:
        conn, server, factory, dialect = await _open(url)
        try:
            assert server.max_model_len == CONTEXT + 300
            result = await run_conversations(
                conn, factory, dialect, server.model, CONTEXT, 2, 5, MESSAGE, ANSWER, 0.0,
                max_model_len=server.max_model_len, watch_metrics=False,
            )  # fmt: skip
        finally:
            await conn.close()
    # turn 2 (about 1,124 tokens + 24) fits 1,300; turn 3 (about 1,248 + 24) fits; turn 4 not
    kept = len(result.turns)
    last = result.sent[-1][0]
    assert last.prompt_tokens + ANSWER <= CONTEXT + 300
    assert last.prompt_tokens + ANSWER + MESSAGE + ANSWER > CONTEXT + 300
    ended = [n for n in result.notes if "conversation ended" in n]
    assert len(ended) == 2  # each user's
    assert f"ended after turn {kept} of 5: turn {kept + 1}'s prompt of" in ended[0]
    assert "> the server's max_model_len 1,300" in ended[0]
    assert all(t.users == 2 and t.hits is None for t in result.turns)
    # the streams' raw reads are dropped once their answers were read: memory is the prompts'
    assert all(not s.rec.reads for sent in result.sent for s in sent)


@pytest.mark.asyncio
async def test_with_the_servers_own_ids_each_prompt_is_the_whole_history_token_for_token():
    with running_simulator_process(SimOptions(profile="tiny", speed=4.0)) as url:
        conn, server, factory, dialect = await _open(url)
        try:
            block = block_size_from_metrics(await read_metrics(conn))
            assert block is not None
            pool = await factory.id_pool()
            await conn.session.delete(conn.url("/sim/trace"))
            result = await run_conversations(
                conn, factory, dialect, server.model, CONTEXT, 2, 3, MESSAGE, ANSWER, 0.0,
                max_model_len=server.max_model_len, block_size=block, return_token_ids=True,
                keep_reads=True,
            )  # fmt: skip
            records = await _records(conn)
        finally:
            await conn.close()
    assert f"answers: {OWN_IDS}" in result.notes
    # rebuild each user's prompts from its own tokens and the ids its answers streamed: the
    # simulator's fingerprint of every prompt it received is the rebuilt one's
    prompts = {u: user_tokens(factory.salt, pool, u, 1, CONTEXT) for u in range(2)}
    for k, sent in enumerate(result.sent, start=1):
        for s in sent:
            rid, _, _ = _client_chunks(s.rec.reads)
            assert rid is not None
            rec = records[rid]
            assert rec["prompt_hash"] == prompt_hash(prompts[s.user])
            assert rec["cached_blocks"] * block == expected_cached(
                s.prompt_tokens, s.prev_prompt, None, block
            )
            answer = parse_answer(s.rec.reads).token_ids
            assert answer is not None and len(answer) == ANSWER
            if k > 1:
                assert s.prev_prompt is not None and s.prev_answer == ANSWER
                assert s.prompt_tokens == s.prev_prompt + ANSWER + MESSAGE
            prompts[s.user] = (
                prompts[s.user]
                + list(answer)
                + user_tokens(factory.salt, pool, s.user, k + 1, MESSAGE)
            )
    # the simulator caches prompt blocks only: it hits the prompts-cached share, below what a
    # server that caches its answers' blocks too should hit
    for turn in result.turns[1:]:
        assert turn.hit_rate == pytest.approx(turn.expected_hit_share)
        assert turn.expected_hit_share_answers is not None
        assert turn.expected_hit_share is not None
        assert turn.expected_hit_share_answers > turn.expected_hit_share


def test_a_script_gets_the_conversation_cell_with_the_servers_own_ids_and_its_block_size():
    from pytest_llmspeed.core.bench import Bench, BenchConfig
    from pytest_llmspeed.results import Status

    with running_simulator_process(SimOptions(profile="tiny", speed=4.0)) as url:
        bench = Bench(BenchConfig(url, None, None, "completions", 64, 2.0, 60, None))
        try:
            bench.start()
            record = bench.conversation_cell(1024, 2, 3, MESSAGE, ANSWER, 0.0)
            again = bench.conversation_cell(1024, 2, 3, MESSAGE, ANSWER, 0.0)
        finally:
            bench.close()
    assert str(record.id) == "conversation[1K-u2-t3]" and record.status is Status.VALID
    assert record.conv_answers == OWN_IDS and record.turn_users == (2, 2, 2)
    assert record.turn_prompt_tokens == (
        1024,
        1024 + ANSWER + MESSAGE,
        1024 + 2 * (ANSWER + MESSAGE),
    )
    # the block size came from /metrics: the expected shares are known, and the hit rate is
    # the prompts-cached share (the simulator caches prompt blocks only)
    assert record.turn_hit_rate is not None and record.turn_expected_hit_share is not None
    assert record.turn_hit_rate[0] == 0 and record.turn_expected_hit_share[0] == 0
    assert record.turn_hit_rate[1:] == record.turn_expected_hit_share[1:]
    assert record.conv_hit_rate is not None and record.conv_hit_rate > 0.8
    answers = record.turn_expected_hit_share_answers
    assert answers is not None and all(a is not None for a in answers)
    # a second measurement starts cold (a fresh salt): its first turn finds nothing cached
    assert again.turn_hit_rate is not None and again.turn_hit_rate[0] == 0
