"""Exact-length prompts, sized by the server's own tokenizer (never a downloaded one).

Completions API: prompts are token ids drawn from ids the server's ``/tokenize`` returned, so
their length is exact by construction. Chat API: text sized with ``/tokenize`` (with the chat
template applied), then checked against ``usage.prompt_tokens`` by the protocol.

Every run draws a fresh salt, so no run reuses a cache left by an earlier one. Requests of one
context share a prefix P(C) of C − s tokens and end in a unique suffix of s tokens.
"""

from __future__ import annotations

import json
import os
import random
from dataclasses import dataclass, field
from typing import Any

from .client import Connection, LLMSpeedError

SUFFIX_TOKENS = 32

_SEED_TEXT = (
    "The quick brown fox jumps over the lazy dog while seven wizards quietly judge boxing. "
    "Pack my box with five dozen liquor jugs; sphinx of black quartz, judge my vow! "
    "0 1 2 3 4 5 6 7 8 9 10 42 256 1024 alpha beta gamma delta epsilon zeta eta theta iota "
    "kappa lambda river mountain forest ocean desert valley island harbor bridge tower garden "
    "engine kernel tensor matrix vector scalar cache token prompt decode prefill batch stream "
)

#: short pieces that close the last few tokens of a chat prompt (each adds one token or two)
_FILLERS = (" a", ".", " 1", "a", "1", ",", " x", "-", " the")

_WORDS = [
    "river",
    "mountain",
    "forest",
    "ocean",
    "desert",
    "valley",
    "island",
    "harbor",
    "bridge",
    "tower",
    "garden",
    "engine",
    "kernel",
    "tensor",
    "matrix",
    "vector",
    "scalar",
    "cache",
    "token",
    "prompt",
    "decode",
    "prefill",
    "batch",
    "stream",
    "alpha",
    "beta",
    "gamma",
    "delta",
    "epsilon",
    "zeta",
    "theta",
    "kappa",
    "lambda",
    "sigma",
    "omega",
    "north",
    "south",
    "east",
    "west",
    "red",
    "green",
    "blue",
    "amber",
    "silver",
    "golden",
    "quiet",
    "rapid",
    "bright",
    "calm",
]


class PromptError(LLMSpeedError):
    pass


@dataclass
class Prompt:
    """One prompt, its exact length in tokens, and a fast JSON encoding of its request.

    Completions prompts keep the shared prefix as ready-made JSON (``[id, id, ...`` without the
    closing bracket) so that a 256K-token request is not re-encoded for every request.
    """

    body: dict[str, Any]
    tokens: int
    prefix_json: bytes | None = None
    suffix: list[int] = field(default_factory=list)

    def encode(self, fields: dict[str, Any]) -> bytes:
        """The whole request body: the prompt plus ``fields`` (model, max_tokens, ...)."""
        if self.prefix_json is None:
            return json.dumps({**self.body, **fields}).encode()
        ids = self.prefix_json
        if self.suffix:
            ids += b", " + json.dumps(self.suffix)[1:-1].encode()
        return b'{"prompt": ' + ids + b"], " + json.dumps(fields)[1:].encode()


@dataclass
class PromptFactory:
    """Builds the prompts of one run (one salt) for one API (``completions`` or ``chat``)."""

    conn: Connection
    model: str
    api: str = "completions"
    salt: int = field(default_factory=lambda: int.from_bytes(os.urandom(8), "big"))
    suffix_tokens: int = SUFFIX_TOKENS
    _pool: list[int] = field(default_factory=list)
    _prefix_ids: dict[int, tuple[list[int], bytes]] = field(default_factory=dict)
    _prefix_text: dict[int, str] = field(default_factory=dict)

    async def _tokenize(self, **body: Any) -> list[int]:
        body.setdefault("model", self.model)
        data = await self.conn.post_json("/tokenize", body)
        tokens = data.get("tokens")
        if not isinstance(tokens, list):
            raise PromptError(f"/tokenize on {self.conn.base_url} did not return token ids")
        return tokens

    async def id_pool(self) -> list[int]:
        """Token ids the server's tokenizer really produces (valid for any vocabulary size)."""
        if not self._pool:
            ids = await self._tokenize(prompt=_SEED_TEXT, add_special_tokens=False)
            self._pool = sorted(set(ids))
            if len(self._pool) < 8:
                raise PromptError("the server's tokenizer gave fewer than 8 distinct token ids")
        return self._pool

    def _rng(self, *key: int) -> random.Random:
        return random.Random(hash((self.salt, *key)))

    async def prompt(self, context: int, index: int) -> Prompt:
        """Prompt ``index`` at ``context`` tokens: shared prefix P(C) + unique suffix."""
        s = min(self.suffix_tokens, max(context - 1, 0))
        if self.api == "completions":
            pool = await self.id_pool()
            if context not in self._prefix_ids:
                prefix_rng = self._rng(context)
                ids = [prefix_rng.choice(pool) for _ in range(context - s)]
                self._prefix_ids[context] = (ids, json.dumps(ids)[:-1].encode())
            ids, encoded = self._prefix_ids[context]
            suffix_rng = self._rng(context, index + 1)
            suffix = [suffix_rng.choice(pool) for _ in range(s)]
            return Prompt({"prompt": ids + suffix}, context, encoded, suffix)
        text = await self._chat_text(context, index)
        return Prompt({"messages": [{"role": "user", "content": text}]}, context)

    # -- chat: size text with /tokenize ---------------------------------------------------

    async def _count_chat(self, content: str) -> int:
        return len(await self._tokenize(messages=[{"role": "user", "content": content}]))

    async def _fit(self, head: str, target: int, rng: random.Random, sep: str) -> str:
        """``head`` + words so that the chat prompt has exactly ``target`` tokens.

        Words first, to get close; then, from below, short fillers whose token count the
        server's ``/tokenize`` tells: a word can be two tokens or more (small byte-level
        vocabularies), so words alone may step over an odd target again and again.
        """
        base = await self._count_chat(head)
        if base > target:
            raise PromptError(f"chat template alone exceeds {target} tokens")
        words = [rng.choice(_WORDS) for _ in range(max(0, target - base) // 2)]

        def text() -> str:
            return head + (sep + " ".join(words) if words else "")

        count = await self._count_chat(text())
        for _ in range(16):
            if 0 <= target - count <= 8:  # close enough: fillers do the rest, from below
                break
            per_word = (count - base) / len(words) if words else 1.0
            step = round((target - count) / max(per_word, 0.5))
            if step == 0:
                step = 1 if count < target else -1
            if step > 0:
                words.extend(rng.choice(_WORDS) for _ in range(step))
            else:
                del words[step:]
            count = await self._count_chat(text())
        while count > target and words:  # from below, so that fillers can close the gap
            del words[-1]
            count = await self._count_chat(text())
        body, tail = text(), ""
        while count < target:
            for filler in _FILLERS:
                got = await self._count_chat(body + tail + filler)
                if count < got <= target:
                    tail, count = tail + filler, got
                    break
            else:
                break
        if count == target:
            return body + tail
        raise PromptError(
            f"could not size a chat prompt to exactly {target} tokens with /tokenize "
            f"(got {count}); use --llm-api=completions"
        )

    async def _chat_text(self, context: int, index: int) -> str:
        s = min(self.suffix_tokens, max(context - 8, 0))
        if context not in self._prefix_text:
            rng = self._rng(context)
            head = f"run {self.salt % 10**8}:"
            self._prefix_text[context] = await self._fit(head, context - s, rng, " ")
        return await self._fit(
            self._prefix_text[context] + "\n", context, self._rng(context, index + 1), ""
        )
