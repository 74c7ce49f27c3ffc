"""The simulator's deterministic tokenizer."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

from pytest_llmspeed.sim.tokenizer import (
    CHAT_GENERATION_PROMPT_TOKENS,
    CHAT_TOKENS_PER_MESSAGE,
    Tokenizer,
)

TEXT = "The quick brown fox, née Zoë, jumps over 12 lazy dogs!\n\n  snake_case 😀 end"


def test_deterministic_across_processes() -> None:
    ids = Tokenizer().encode(TEXT)
    code = (
        f"from pytest_llmspeed.sim.tokenizer import Tokenizer;print(Tokenizer().encode({TEXT!r}))"
    )
    env = {"PYTHONHASHSEED": "123", "PYTHONPATH": ":".join(sys.path)}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env
    )
    assert out.stdout.strip() == str(ids)


def test_known_words_round_trip_and_every_id_in_vocab() -> None:
    tok = Tokenizer(32000)
    assert len(tok.vocab) == len(set(tok.vocab)) == 32000
    text = "the river and the mountain, 42 day."
    ids = tok.encode(text)
    assert tok.decode(ids) == text
    assert all(0 <= i < 32000 for i in tok.encode(TEXT))
    assert tok.out_of_vocab([1, 2, 32000]) == 32000
    assert tok.out_of_vocab([5, -1]) == -1


def test_byte_tokens_decode_as_utf8() -> None:
    tok = Tokenizer()
    e = "é".encode()
    assert tok.decode([16 + e[0], 16 + e[1]]) == "é"


def test_chat_template_adds_documented_tokens() -> None:
    tok = Tokenizer()
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": [{"type": "text", "text": "hello there"}]},
    ]
    content = len(tok.encode("be brief")) + len(tok.encode("hello there"))
    n = len(tok.apply_chat_template(messages))
    assert n == content + 2 * CHAT_TOKENS_PER_MESSAGE + CHAT_GENERATION_PROMPT_TOKENS
    assert len(tok.apply_chat_template(messages, add_generation_prompt=False)) == n - 3
