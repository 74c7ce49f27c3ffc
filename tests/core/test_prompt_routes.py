"""Text prompts sized on servers without vLLM's /tokenize (issue 13): the simulator's quirks
serve llama-cpp-python's /extras/tokenize, llama.cpp's /tokenize with ``content``, or no
tokenize route at all (then ``usage.prompt_tokens`` of small requests sizes them). Real HTTP
on loopback; every prompt is checked by the count the server reports for it."""

import json

import pytest

from pytest_llmspeed.core.client import Connection
from pytest_llmspeed.core.errors import LLMSpeedError
from pytest_llmspeed.core.prompts import PromptFactory
from pytest_llmspeed.core.protocol import negotiate
from pytest_llmspeed.sim import SimOptions, running_simulator

#: the simulator's own trace is ours to read whole (not a server answer under test)
TRACE_LIMIT = 1 << 30

pytestmark = pytest.mark.asyncio

ROUTES = {
    "": ("tokenize", None),
    "tokenize-extras": ("extras-tokenize", "llama-cpp-python's /extras/tokenize"),
    "tokenize-content": ("tokenize-content", "llama.cpp's /tokenize (content)"),
    "no-tokenize": ("usage", "usage.prompt_tokens of small non-streamed requests (max_tokens 1)"),
}


async def _served_count(conn, api, prompt):
    """usage.prompt_tokens the server reports for the prompt, and the trace's own count."""
    path = "/v1/completions" if api == "completions" else "/v1/chat/completions"
    answer = await conn.post_json(path, {**prompt.body, "model": "tiny", "max_tokens": 1})
    status, body = await conn.get("/sim/trace", limit=TRACE_LIMIT)
    assert status == 200
    last = json.loads(body)["requests"][-1]
    assert last["id"] == answer["id"]
    return answer["usage"]["prompt_tokens"], last["prompt_tokens"]


@pytest.mark.parametrize("api", ["completions", "chat"])
@pytest.mark.parametrize("quirks", list(ROUTES))
async def test_text_prompts_have_exactly_c_tokens_by_every_route(quirks, api):
    route, words = ROUTES[quirks]
    with running_simulator(SimOptions(profile="tiny", speed=50, quirks=quirks or None)) as url:
        conn = Connection.open(url, None, 30)
        try:
            factory = PromptFactory(conn, "tiny", api=api, text=True)
            for context in (100, 1024):
                for index in range(3):
                    prompt = await factory.prompt(context, index)
                    assert prompt.tokens == context
                    assert await _served_count(conn, api, prompt) == (context, context)
            assert factory.tokenizer.route == route
            # the route is found once and said once, also by the fresh copies of the factory
            fresh = factory.fresh()
            assert fresh.tokenizer is factory.tokenizer
            await fresh.prompt(512, 0)
            assert not fresh.notes
            if words is None:
                assert not factory.notes
            else:
                assert [n for n in factory.notes if "prompts: text sized with" in n] == [
                    f"prompts: text sized with {words}"
                    + (": the server has no tokenize route" if route == "usage" else "")
                ]
        finally:
            await conn.close()


@pytest.mark.parametrize("quirks", ["tokenize-extras", "tokenize-content"])
async def test_token_id_prompts_from_a_foreign_tokenize_route(quirks):
    """llama.cpp-style routes give token ids too: id prompts stay exact."""
    with running_simulator(SimOptions(profile="tiny", speed=50, quirks=quirks)) as url:
        conn = Connection.open(url, None, 30)
        try:
            factory = PromptFactory(conn, "tiny")
            prompt = await factory.prompt(2048, 1)
            assert all(isinstance(t, int) for t in prompt.body["prompt"])
            assert await _served_count(conn, "completions", prompt) == (2048, 2048)
        finally:
            await conn.close()


async def test_without_any_tokenize_route_prompts_turn_to_text_and_say_so():
    with running_simulator(SimOptions(profile="tiny", speed=50, quirks="no-tokenize")) as url:
        conn = Connection.open(url, None, 30)
        try:
            factory = PromptFactory(conn, "tiny")
            dialect = await negotiate(conn, factory, "tiny", "completions")
            assert factory.text and not factory.uses_ids
            assert dialect.notes[0] == "the server has no tokenize route: prompts sent as text"
            prompt = await factory.prompt(300, 1)
            assert isinstance(prompt.body["prompt"], str)
            assert await _served_count(conn, "completions", prompt) == (300, 300)
        finally:
            await conn.close()


async def test_an_http_error_while_sizing_names_the_url_and_its_purpose():
    options = SimOptions(profile="tiny", speed=50, quirks="no-tokenize", faults="start500=1")
    with running_simulator(options) as url:
        conn = Connection.open(url, None, 30)
        try:
            factory = PromptFactory(conn, "tiny", text=True)
            with pytest.raises(LLMSpeedError) as info:
                await factory.prompt(100, 0)
        finally:
            await conn.close()
    message = str(info.value)
    assert f"{url}/v1/completions" in message
    assert "sizing a text prompt by the server's usage.prompt_tokens" in message
    assert "HTTP 500" in message
