"""--llm-prompt-text's material (issue 33, "Real text"): the file read within its bounds, and
prompts made of it exact in length against the simulator's tokenizer (real HTTP on loopback),
the default prompts byte for byte as before."""

import hashlib
import json

import pytest

from pytest_llmspeed.core import prompt_text
from pytest_llmspeed.core.client import Connection
from pytest_llmspeed.core.prompt_text import PromptTextError, parse_prompt_text, read_prompt_text
from pytest_llmspeed.core.prompts import PromptFactory
from pytest_llmspeed.sim import SimOptions, running_simulator

PARAGRAPH = (
    "The committee met on Tuesday to review the budget for the coming year. After a long "
    "discussion the members agreed to fund the new library and to repair the old bridge. "
)


def test_plain_text_and_datasets_are_read():
    assert parse_prompt_text(b"  hello world \n", "a.txt").text == "hello world"
    lines = [
        json.dumps({"prompt": "first"}),
        "",
        json.dumps({"text": "second"}),
        json.dumps({"conversations": [{"from": "human", "value": "q"}, {"value": "a"}]}),
        json.dumps("fourth"),
    ]
    got = parse_prompt_text("\n".join(lines).encode(), "d.jsonl")
    assert got.text == "first\n\nsecond\n\nq\na\n\nfourth" and got.pieces == 4


@pytest.mark.parametrize(
    ("data", "name", "words"),
    [
        (b"", "a.txt", "has no text"),
        (b" \n\t", "a.txt", "has no text"),
        (b"\xff\xfe abc", "a.txt", "not UTF-8"),
        (b'{"prompt": "x"}\n{oops', "d.jsonl", "line 2 is not JSON"),
        (b'{"prompt": 3}', "d.jsonl", "line 1 has no text"),
        (b"[1, 2]", "d.jsonl", "line 1 has no text"),
    ],
)
def test_a_file_that_is_no_material_says_why_in_one_line(data, name, words):
    with pytest.raises(PromptTextError) as err:
        parse_prompt_text(data, name)
    assert words in err.value.message and "\n" not in err.value.message


def test_a_missing_or_too_large_file_is_refused(tmp_path, monkeypatch):
    with pytest.raises(PromptTextError, match="cannot be read"):
        read_prompt_text(tmp_path / "missing.txt")
    big = tmp_path / "big.txt"
    big.write_text("word " * 300)
    monkeypatch.setattr(prompt_text, "PROMPT_TEXT_MAX_BYTES", 1024)
    with pytest.raises(PromptTextError, match="more than 0 MiB"):
        read_prompt_text(big)


@pytest.fixture(scope="module")
def tiny_sim():
    with running_simulator(SimOptions(profile="tiny", speed=4)) as url:
        yield url


async def _tokens(conn, **body):
    return (await conn.post_json("/tokenize", {"model": "tiny", **body}))["tokens"]


@pytest.mark.asyncio
async def test_the_default_prompts_are_unchanged(tiny_sim):
    """No --llm-prompt-text: the prompts of a given salt are those the factory made before the
    option existed (digests taken from the code before it)."""
    conn = Connection.open(tiny_sim, None, 30)
    try:
        got = {}
        for api, text in (("completions", False), ("completions", True), ("chat", True)):
            f = PromptFactory(conn, "tiny", api=api, text=text, salt=12345)
            bodies = [(await f.prompt(c, i)).body for c in (100, 2048) for i in (0, 1)]
            got[f"{api}-{text}"] = hashlib.sha256(json.dumps(bodies).encode()).hexdigest()[:16]
        assert got == {
            "completions-False": "c6ba116096f24061",
            "completions-True": "e88fb509ddb5ec5b",
            "chat-True": "1d1e434279e9e280",
        }
    finally:
        await conn.close()


@pytest.mark.asyncio
async def test_token_id_prompts_of_the_text_are_exact_and_cold(tiny_sim):
    material = parse_prompt_text(PARAGRAPH.encode(), "p.txt")
    conn = Connection.open(tiny_sim, None, 30)
    try:
        text_ids = await _tokens(conn, prompt=material.text, add_special_tokens=False)
        factory = PromptFactory(conn, "tiny", material=material)
        prompts = [await factory.prompt(2048, i) for i in range(3)]
        ids = [p.body["prompt"] for p in prompts]
        assert [len(x) for x in ids] == [2048] * 3
        assert ids[0][:2016] == ids[1][:2016] == ids[2][:2016]
        assert len({tuple(x[2016:]) for x in ids}) == 3  # unique suffixes
        # after the salted head, the text's own tokens, repeated (the text is shorter)
        assert ids[0][8 : 8 + len(text_ids)] == text_ids
        assert ids[0][8 + len(text_ids) : 8 + 2 * len(text_ids)] == text_ids
        data = await conn.post_json(
            "/v1/completions", {"model": "tiny", "prompt": ids[0], "max_tokens": 1}
        )
        assert data["usage"]["prompt_tokens"] == 2048
        fresh = await factory.fresh().prompt(2048, 0)
        assert fresh.body["prompt"][:8] != ids[0][:8]  # a fresh salt: a cold P(C)
        (note,) = factory.notes
        assert f"{len(material.text):,} characters" in note
        assert f"{len(text_ids):,} tokens" in note and "repeat it" in note
    finally:
        await conn.close()


@pytest.mark.asyncio
@pytest.mark.parametrize("api", ["completions", "chat"])
async def test_text_prompts_of_the_text_are_exact(tiny_sim, api):
    material = parse_prompt_text(PARAGRAPH.encode(), "p.txt")
    conn = Connection.open(tiny_sim, None, 30)
    try:
        factory = PromptFactory(conn, "tiny", api=api, text=True, material=material)
        prompts = [await factory.prompt(1024, i) for i in range(3)]
        if api == "completions":
            texts = [p.body["prompt"] for p in prompts]
            ids = [await _tokens(conn, prompt=t) for t in texts]
        else:
            texts = [p.body["messages"][0]["content"] for p in prompts]
            ids = [await _tokens(conn, messages=p.body["messages"]) for p in prompts]
        assert [len(x) for x in ids] == [1024] * 3
        assert len({tuple(x) for x in ids}) == 3
        words = " ".join(PARAGRAPH.split())
        assert words + " " + words in texts[0]  # the text's words in order, repeated
        assert any("prompt text p.txt" in n for n in factory.notes)
    finally:
        await conn.close()


def _slice_of(piece: list[int], text: list[int]) -> bool:
    """Is ``piece`` a run of ``text``'s ids, the text repeated past its end?"""
    repeated = text * (len(piece) // len(text) + 2)
    return any(repeated[i : i + len(piece)] == piece for i in range(len(text)))


@pytest.mark.asyncio
async def test_a_traces_blocks_are_made_of_the_text_and_shared_exactly(tiny_sim):
    """--llm-prompt-text reaches trace cells: each shared block and each request's own tail is
    4 salted ids and a run of the text's tokens; the same block id, the same tokens; a fresh
    salt, other blocks (a cold cache every run)."""
    from pytest_llmspeed.core.openloop import BLOCK_TOKENS, parse_trace, trace_plan
    from pytest_llmspeed.core.protocol import negotiate

    material = parse_prompt_text(PARAGRAPH.encode(), "p.txt")
    conn = Connection.open(tiny_sim, None, 30)
    try:
        text_ids = await _tokens(conn, prompt=material.text, add_special_tokens=False)
        factory = PromptFactory(conn, "tiny", material=material)
        dialect = await negotiate(conn, factory, "tiny", "completions")
        rows = [
            {"timestamp": 0, "input_length": 1000, "output_length": 4, "hash_ids": [1, 2]},
            {"timestamp": 10, "input_length": 700, "output_length": 4, "hash_ids": [1, 3]},
        ]
        trace = parse_trace([json.dumps(r) for r in rows], "t.jsonl")
        plan = await trace_plan(factory, dialect, "tiny", trace)
        ids = [json.loads(p.payload())["prompt"] for p in plan]
        assert [len(x) for x in ids] == [1000, 700]
        b = BLOCK_TOKENS
        assert ids[0][:b] == ids[1][:b]  # block 1, shared token for token
        assert ids[0][b:700] != ids[1][b:700]  # blocks 2 and 3 are not
        for piece in (ids[0][4:b], ids[0][b + 4 : 1000], ids[1][b + 4 : 700]):
            assert _slice_of(piece, text_ids), piece[:8]
        fresh = await trace_plan(factory.fresh(), dialect, "tiny", trace)
        assert json.loads(fresh[0].payload())["prompt"][:b] != ids[0][:b]
        data = await conn.post_json(
            "/v1/completions", {"model": "tiny", "prompt": ids[0], "max_tokens": 1}
        )
        assert data["usage"]["prompt_tokens"] == 1000
        # without the option the blocks are drawn from the tokenizer's pool, not the text
        plain = PromptFactory(conn, "tiny")
        default = await trace_plan(plain, dialect, "tiny", trace)
        assert not _slice_of(json.loads(default[0].payload())["prompt"][4:b], text_ids)
    finally:
        await conn.close()
