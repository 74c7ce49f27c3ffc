"""Prompt construction against the simulator's tokenizer (real HTTP on loopback)."""

import json

import pytest

from pytest_llmspeed.core.client import Connection
from pytest_llmspeed.core.prompts import Prompt, PromptFactory
from pytest_llmspeed.sim import SimOptions, running_simulator

pytestmark = pytest.mark.asyncio


@pytest.fixture(scope="module")
def tiny_sim():
    with running_simulator(SimOptions(profile="tiny", speed=4)) as url:
        yield url


async def _tokens(conn, **body):
    data = await conn.post_json("/tokenize", {"model": "tiny", **body})
    return data["tokens"]


@pytest.mark.parametrize("api", ["completions", "chat"])
@pytest.mark.parametrize("context", [100, 1024, 4096])
async def test_text_prompts_are_exact_and_share_the_prefix(tiny_sim, api, context):
    """Text prompts (completions with text=True, chat always) are exactly C tokens as the server
    counts them, and prompts of one context share their first C − s tokens (the cached P(C))."""
    conn = Connection.open(tiny_sim, None, 30)
    try:
        factory = PromptFactory(conn, "tiny", api=api, text=True)
        prompts = [await factory.prompt(context, i) for i in range(3)]
        if api == "completions":
            assert all(isinstance(p.body["prompt"], str) for p in prompts)
            ids = [await _tokens(conn, prompt=p.body["prompt"]) for p in prompts]
        else:
            ids = [await _tokens(conn, messages=p.body["messages"]) for p in prompts]
        assert [len(x) for x in ids] == [context] * 3
        shared = context - 32 - (8 if api == "chat" else 0)  # the template's tail comes last
        assert ids[0][:shared] == ids[1][:shared] == ids[2][:shared]
        assert len({tuple(x) for x in ids}) == 3  # unique suffixes
        fields = {"model": "tiny", "max_tokens": 4, "stream": True}
        for p in prompts:  # the fast encoding (shared head's JSON reused) is the plain one
            assert p.head_json is not None
            assert json.loads(p.encode(fields)) == {**p.body, **fields}
        assert factory.cheap(context) and not factory.notes  # the sim's words add up
        many = {str((await factory.prompt(context, i)).body) for i in range(200)}
        assert len(many) == 200
        # a fresh salt, a fresh prefix: no run hits the cache of another
        other = await PromptFactory(conn, "tiny", api=api, text=True).prompt(context, 0)
        other_text = other.body.get("prompt") or other.body["messages"][0]["content"]
        first_text = prompts[0].body.get("prompt") or prompts[0].body["messages"][0]["content"]
        assert other_text[:40] != first_text[:40]
    finally:
        await conn.close()


async def test_id_prompts_are_exact_and_share_the_prefix(tiny_sim):
    conn = Connection.open(tiny_sim, None, 30)
    try:
        factory = PromptFactory(conn, "tiny")
        prompts = [await factory.prompt(2048, i) for i in range(3)]
        ids = [p.body["prompt"] for p in prompts]
        assert [len(x) for x in ids] == [2048] * 3
        assert ids[0][:2016] == ids[1][:2016] == ids[2][:2016]
        assert ids[0][2016:] != ids[1][2016:]
        data = await conn.post_json(
            "/v1/completions", {"model": "tiny", "prompt": ids[0], "max_tokens": 1}
        )
        assert data["usage"]["prompt_tokens"] == 2048
    finally:
        await conn.close()


async def test_text_prompts_are_built_before_the_cell_not_at_each_restart(tiny_sim):
    """Sizing a text prompt takes several /tokenize round trips: a decode cell builds its pool
    of text prompts before its first stream and reuses them, so restarts stay immediate."""
    import time

    from pytest_llmspeed.core.protocol import negotiate, run_decode

    conn = Connection.open(tiny_sim, None, 30)
    try:
        factory = PromptFactory(conn, "tiny", text=True)
        dialect = await negotiate(conn, factory, "tiny", "completions")
        calls: list[float] = []
        tokenizer = factory.tokenizer
        tokenize = tokenizer._post_tokens

        async def counted(path, body):
            calls.append(time.perf_counter())
            return await tokenize(path, body)

        tokenizer._post_tokens = counted  # type: ignore[method-assign]  # a spy
        texts: list[str] = []
        make = factory.prompt

        async def recorded(context, index):
            prompt = await make(context, index)
            texts.append(prompt.body["prompt"])
            return prompt

        factory.prompt = recorded  # type: ignore[method-assign]  # a spy
        result = await run_decode(conn, factory, dialect, "tiny", 512, 2, 16, 1.0)
        first_send = min(r.t_send for r in result.records)
        assert len(result.records) > 2 * 2 + 8  # more requests than the pool holds
        # none while the streams run (the text re-count's come after the window: recount.py)
        assert calls and not any(first_send <= c < result.window[1] for c in calls)
        assert factory.cheap(512) and not factory.notes
        # every request its own prompt (a repeated one would hit the prefix cache whole)
        assert len(texts) >= len(result.records) and len(set(texts)) == len(texts)
    finally:
        await conn.close()


class _UnevenWords(PromptFactory):
    """Slot words that do not add the same number of tokens: what a tokenizer that does not
    split at spaces would make of equal words."""

    async def slot_words(self):
        return [
            "river",
            "mountain range of the north",
            "sea",
            "ice and fire",
            "a",
            "b",
            "c",
            "the quick brown fox",
        ], 1


@pytest.mark.parametrize("api", ["completions", "chat"])
async def test_without_additive_words_text_prompts_are_still_exact(tiny_sim, api):
    conn = Connection.open(tiny_sim, None, 30)
    try:
        factory = _UnevenWords(conn, "tiny", api=api, text=True)
        prompts = [await factory.prompt(1024, i) for i in range(3)]
        assert not factory.cheap(1024)
        assert factory.notes and "reuses its 2N + 8 prompts" in factory.notes[0]
        for p in prompts:
            if api == "completions":
                ids = await _tokens(conn, prompt=p.body["prompt"])
            else:
                ids = await _tokens(conn, messages=p.body["messages"])
            assert len(ids) == 1024
    finally:
        await conn.close()


@pytest.mark.parametrize("api", ["completions", "chat"])
async def test_text_encoding_joins_escapes(api):  # async only for the module's asyncio mark
    """A text prompt's body is its head's JSON (made once) + its tail's: the same bytes'
    meaning as encoding the whole body, with quotes, backslashes, newlines and non-ASCII."""
    head, tail = 'run 7: "quoted" \\ back\nslash é 𝄞 tab\t', ' river "x" \u2028 end'
    text = head + tail
    body = (
        {"prompt": text}
        if api == "completions"
        else {"messages": [{"role": "user", "content": text}]}
    )
    prompt = Prompt(body, 10, head_json=json.dumps(head)[:-1].encode(), tail=tail)
    fields = {"model": "m", "max_tokens": 3, "stream": True, "stream_options": {"a": True}}
    assert json.loads(prompt.encode(fields)) == {**body, **fields}
