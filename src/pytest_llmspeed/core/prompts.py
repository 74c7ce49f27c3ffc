"""Exact-length prompts, sized by the server's own tokenizer (never a downloaded one).

Completions API: prompts are token ids drawn from ids the server's tokenizer returned, so
their length is exact by construction; or, with ``text=True`` (the text prompt form), text
sized with the server's tokenizer, for servers that take no token ids and to send what
text-only peers send. Chat API: text sized the same way (with the chat template applied).
The tokenizer is reached by whichever route the server has (``core/tokenize.py``: vLLM's
``/tokenize``, llama-cpp-python's ``/extras/tokenize``, llama.cpp's ``/tokenize`` with
``content``, else ``usage.prompt_tokens`` of small requests). Text prompts are checked against
``usage.prompt_tokens`` by the protocol.

Every run draws a fresh salt, so no run reuses a cache left by an earlier one. Requests of one
context share a prefix P(C) of C − s tokens and end in a unique suffix of s tokens.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import re
from dataclasses import dataclass, field
from typing import Any

from .client import Connection
from .errors import LLMSpeedError
from .prompt_text import PromptText
from .tokenize import ROUTE_WORDS, TOKENIZE, ServerTokenizer

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


#: characters of the prompt text sent to the tokenizer in one request (cut at a space)
MATERIAL_PIECE_CHARS = 32_768
#: the salted head of a token-id prompt made of the user's text: it keeps each run's P(C) cold
MATERIAL_HEAD_TOKENS = 8
#: random ids that open each unique suffix of such a prompt (the text may repeat itself, so
#: text alone could give two requests the same suffix)
MATERIAL_SUFFIX_SALT = 4

_WORD = re.compile(r"\S+")


@dataclass
class Material:
    """``--llm-prompt-text``'s text, tokenized and split into words as far as prompts need it;
    shared by a factory and its :meth:`PromptFactory.fresh` copies (one tokenization a run)."""

    text: PromptText
    notes: list[str]
    ids: list[int] = field(default_factory=list)
    tokenized: int = 0  # characters of the text tokenized so far
    words: list[str] = field(default_factory=list)
    _word_iter: Any = None
    _said: bool = False

    @property
    def complete(self) -> bool:
        return self.tokenized >= len(self.text.text)

    async def token_ids(self, tokenizer: ServerTokenizer, needed: int) -> list[int]:
        """At least ``needed`` of the text's token ids (all of them when it has fewer), asked
        of the server's tokenizer in pieces of :data:`MATERIAL_PIECE_CHARS` characters."""
        text = self.text.text
        while len(self.ids) < needed and not self.complete:
            end = min(len(text), self.tokenized + MATERIAL_PIECE_CHARS)
            if end < len(text):  # cut before a space: the next piece starts with it
                space = text.rfind(" ", self.tokenized + 1, end)
                end = space if space > self.tokenized else end
            self.ids.extend(await tokenizer.ids(text[self.tokenized : end]))
            self.tokenized = end
        if not self.ids:
            raise PromptError(
                f"--llm-prompt-text {self.text.source}: the server's tokenizer gave no token ids "
                "for its text",
                setting="prompt_text",
            )
        self.say(len(self.ids), needed, "tokens")
        return self.ids

    def word(self, i: int) -> str:
        """The text's word ``i``, the text repeated from its start past its last word."""
        while len(self.words) <= i and self._word_iter is not False:
            if self._word_iter is None:
                self._word_iter = _WORD.finditer(self.text.text)
            found = next(self._word_iter, None)
            if found is None:
                self._word_iter = False
            else:
                self.words.append(found.group())
        return self.words[i % len(self.words)]

    def say(self, have: int, needed: int, unit: str) -> None:
        """The note of what was read, once a run (when the first prompt is made of it):
        ``have`` tokens or words of the text, of which prompts needed ``needed``."""
        if self._said:
            return
        self._said = True
        t = self.text
        joined = f", {t.pieces:,} prompts joined" if t.pieces > 1 else ""
        whole = self.complete if unit == "tokens" else self._word_iter is False
        if unit == "words":
            have = len(self.words)
        size = f"{have:,} {unit} by the server's tokenizer" if unit == "tokens" else ""
        if unit == "words":
            size = f"{have:,} words{'' if whole else ' read so far'}, in order"
        if not whole:
            size = f"its first {size}"
        repeat = "; prompts longer than it repeat it" if whole and needed > have else ""
        self.notes.append(
            f"prompt text {t.source}: {t.characters:,} characters{joined}; {size}{repeat}"
        )


class _Draw:
    """Words for :meth:`PromptFactory._fit`: random ones from the fixed list (no material), or
    the text's words in order from ``start`` (a word given back is taken again next)."""

    def __init__(self, rng: random.Random, material: Material | None, start: int = 0):
        self.rng, self.material, self.next = rng, material, start

    def take(self) -> str:
        if self.material is None:
            return self.rng.choice(_WORDS)
        self.next += 1
        return self.material.word(self.next - 1)

    def give_back(self, n: int) -> None:
        if self.material is not None:
            self.next -= n


@dataclass
class Prompt:
    """One prompt, its exact length in tokens, and a fast JSON encoding of its request.

    Prompts keep their shared head as ready-made JSON so that a 256K-token request is not
    re-encoded for every request (a few ms of the event loop that other streams' reads would
    wait for): token ids as ``[id, id, ...`` without the closing bracket, text as the JSON
    string without its closing quote (JSON escapes character by character, so the head's and
    the tail's escapes simply join).
    """

    body: dict[str, Any]
    tokens: int
    prefix_json: bytes | None = None
    suffix: list[int] = field(default_factory=list)
    head_json: bytes | None = None  # text prompts: JSON of the shared head, no closing quote
    tail: str = ""  # text prompts: what follows the head

    def encode(self, fields: dict[str, Any]) -> bytes:
        """The whole request body: the prompt plus ``fields`` (model, max_tokens, ...)."""
        rest = json.dumps(fields)[1:].encode()
        if self.prefix_json is not None:
            suffix = b", " + json.dumps(self.suffix)[1:-1].encode() if self.suffix else b""
            return b"".join((b'{"prompt": ', self.prefix_json, suffix, b"], ", rest))
        if self.head_json is not None:  # one join: a 256K-token head is ~1.4 MB
            tail = json.dumps(self.tail)[1:].encode()
            if "prompt" in self.body:
                return b"".join((b'{"prompt": ', self.head_json, tail, b", ", rest))
            return b"".join(
                (b'{"messages": [{"role": "user", "content": ', self.head_json, tail, b"}], ", rest)
            )
        return json.dumps({**self.body, **fields}).encode()


@dataclass
class PromptFactory:
    """Builds the prompts of one run (one salt) for one API (``completions`` or ``chat``).

    ``text``: completions prompts as text (sized with the server's tokenizer) instead of token
    ids; chat prompts are always text. ``material``: the user's text (``--llm-prompt-text``)
    that prompts are made of instead of the fixed list's words (None: the fixed list).
    """

    conn: Connection
    model: str
    api: str = "completions"
    text: bool = False
    salt: int = field(default_factory=lambda: int.from_bytes(os.urandom(8), "big"))
    suffix_tokens: int = SUFFIX_TOKENS
    _pool: list[int] = field(default_factory=list)
    _prefix_ids: dict[int, tuple[list[int], bytes]] = field(default_factory=dict)
    _prefix_text: dict[int, str] = field(default_factory=dict)
    _slot_words: tuple[list[str], int] | None = None
    _templates: dict[int, tuple[str, int] | None] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    _head_json: dict[int, bytes] = field(default_factory=dict)
    _issued: dict[int, int] = field(default_factory=dict)
    _tokenizer: ServerTokenizer | None = None
    material: PromptText | None = None
    _material: Material | None = None

    def __post_init__(self) -> None:
        if self.material is not None and self._material is None:
            self._material = Material(self.material, self.notes)

    @property
    def uses_ids(self) -> bool:
        """Prompts are token ids: a new one costs no request to the server."""
        return self.api == "completions" and not self.text

    def fresh(self) -> PromptFactory:
        """A factory with a new salt (so its prefixes are cold on the server) that shares what
        this one learned of the tokenizer (token-id pool, slot words)."""
        return PromptFactory(
            self.conn,
            self.model,
            api=self.api,
            text=self.text,
            suffix_tokens=self.suffix_tokens,
            _pool=self._pool,
            _slot_words=self._slot_words,
            _tokenizer=self.tokenizer,
            material=self.material,
            _material=self._material,
        )

    def cheap(self, context: int) -> bool:
        """A new unique prompt at ``context`` costs no request to the server (token ids, or
        text whose template is built): a decode cell makes a fresh one for every restart."""
        return self.uses_ids or self._templates.get(context) is not None

    @property
    def tokenizer(self) -> ServerTokenizer:
        """The server's tokenizer (its route found once, shared with :meth:`fresh` copies)."""
        if self._tokenizer is None:
            self._tokenizer = ServerTokenizer(self.conn, self.model, api=self.api)
        return self._tokenizer

    async def route(self) -> str:
        """Find the tokenize route once; say how prompts are sized when it is not vLLM's."""
        tok = self.tokenizer
        route = await tok.find_route()
        if tok.note and not tok.note_said:  # once per run, by whichever factory asked first
            tok.note_said = True
            self.notes.append(tok.note)
        return route

    async def id_pool(self) -> list[int]:
        """Token ids the server's tokenizer really produces (valid for any vocabulary size)."""
        if not self._pool:
            ids = await self.tokenizer.ids(_SEED_TEXT)
            self._pool = sorted(set(ids))
            if len(self._pool) < 8:
                raise PromptError("the server's tokenizer gave fewer than 8 distinct token ids")
        return self._pool

    async def material_ids(self, needed: int) -> list[int] | None:
        """The user's text (``--llm-prompt-text``) as the server's token ids, at least
        ``needed`` of them where it has them (at most :data:`MATERIAL_PIECE_TOKENS` asked);
        None without it."""
        if self._material is None:
            return None
        needed = min(needed, MATERIAL_PIECE_TOKENS)
        return await self._material.token_ids(self.tokenizer, needed)

    def _rng(self, *key: int) -> random.Random:
        return random.Random(hash((self.salt, *key)))

    def next_index(self, context: int) -> int:
        """An index at ``context`` that no earlier call gave (from 1; 0 is the warm-up's), so
        that every decode request of the run, in whichever cell, ends in its own suffix."""
        self._issued[context] = index = self._issued.get(context, 0) + 1
        return index

    async def prompt(self, context: int, index: int) -> Prompt:
        """Prompt ``index`` at ``context`` tokens: shared prefix P(C) + unique suffix."""
        await self.route()
        s = min(self.suffix_tokens, max(context - 1, 0))
        if self.uses_ids:
            pool = await self.id_pool()
            if self._material is not None:
                return await self._material_ids(context, index, s, pool)
            if context not in self._prefix_ids:
                prefix_rng = self._rng(context)
                ids = [prefix_rng.choice(pool) for _ in range(context - s)]
                self._prefix_ids[context] = (ids, json.dumps(ids)[:-1].encode())
            ids, encoded = self._prefix_ids[context]
            suffix_rng = self._rng(context, index + 1)
            suffix = [suffix_rng.choice(pool) for _ in range(s)]
            return Prompt({"prompt": ids + suffix}, context, encoded, suffix)
        head, tail = await self._text(context, index)
        text = head + tail
        if head and context not in self._head_json:
            self._head_json[context] = json.dumps(head)[:-1].encode()
        head_json = self._head_json.get(context) if head else None
        if self.api == "completions":
            return Prompt({"prompt": text}, context, head_json=head_json, tail=tail)
        body = {"messages": [{"role": "user", "content": text}]}
        return Prompt(body, context, head_json=head_json, tail=tail)

    async def _material_ids(self, context: int, index: int, s: int, pool: list[int]) -> Prompt:
        """Token-id prompt ``index`` made of the user's text: P(C) is a salted head of
        :data:`MATERIAL_HEAD_TOKENS` random ids (cold on the server every run) and the text's
        tokens from its start; the suffix is :data:`MATERIAL_SUFFIX_SALT` random ids and the
        text's tokens at an offset that moves with ``index`` (the text repeated past its end)."""
        assert self._material is not None
        text = await self._material.token_ids(self.tokenizer, context)
        if context not in self._prefix_ids:
            rng = self._rng(context)
            head = [rng.choice(pool) for _ in range(min(MATERIAL_HEAD_TOKENS, context - s))]
            ids = head + _cycle(text, 0, context - s - len(head))
            self._prefix_ids[context] = (ids, json.dumps(ids)[:-1].encode())
        ids, encoded = self._prefix_ids[context]
        rng = self._rng(context, index + 1)
        salt = [rng.choice(pool) for _ in range(min(MATERIAL_SUFFIX_SALT, s))]
        suffix = salt + _cycle(text, context + index * s, s - len(salt))
        return Prompt({"prompt": ids + suffix}, context, encoded, suffix)

    # -- text prompts: sized with the server's tokenizer ----------------------------------------

    async def _count(self, content: str) -> int:
        """Prompt tokens of ``content`` as the server counts them in ``usage.prompt_tokens``:
        with the chat template for chat, with the special tokens (BOS) for completions."""
        return await self.tokenizer.prompt_tokens(content)

    async def _fit(
        self, head: str, target: int, rng: random.Random, sep: str, draw: _Draw | None = None
    ) -> str:
        """``head`` + words so that the prompt has exactly ``target`` tokens (``draw``: where
        the words come from; None: random words of the fixed list).

        Words first, to get close; then, from below, short fillers whose token count the
        server's ``/tokenize`` tells: a word can be two tokens or more (small byte-level
        vocabularies), so words alone may step over an odd target again and again.
        """
        base = await self._count(head)
        if base > target:
            raise PromptError(f"the prompt's head alone exceeds {target} tokens")
        draw = draw or _Draw(rng, None)
        words = [draw.take() for _ in range(max(0, target - base) // 2)]

        def text() -> str:
            return head + (sep + " ".join(words) if words else "")

        count = await self._count(text())
        for _ in range(16):
            if 0 <= target - count <= 8:  # close enough: fillers do the rest, from below
                break
            per_word = (count - base) / len(words) if words else 1.0
            step = round((target - count) / max(per_word, 0.5))
            if step == 0:
                step = 1 if count < target else -1
            if step > 0:
                words.extend(draw.take() for _ in range(step))
            else:
                draw.give_back(len(words[step:]))
                del words[step:]
            count = await self._count(text())
        while count > target and words:  # from below, so that fillers can close the gap
            draw.give_back(1)
            del words[-1]
            count = await self._count(text())
        fill = await self._close(text(), "", target, count)
        if fill is not None:
            return text() + fill
        fix = "token-id prompts" if self.api == "completions" else "the completions API"
        raise PromptError(
            f"could not size a text prompt to exactly {target} tokens with "
            f"{ROUTE_WORDS[self.tokenizer.route or TOKENIZE]} "
            f"(got {count}); use {fix}",
            setting="prompt_form" if self.api == "completions" else "api",
        )

    async def slot_words(self) -> tuple[list[str], int]:
        """Words that each add the same number of tokens after a space, and that number.

        Swapping one of them for another keeps a prompt's length, with the tokenizers that split
        words at spaces before merging (BPE of GPT-2, Llama 3, Qwen; SentencePiece): so one
        prompt sized with /tokenize gives any number of unique prompts of the same length."""
        if self._slot_words is None:
            groups: dict[int, list[str]] = {}
            for word in _WORDS:
                n = await self.tokenizer.count_piece(" " + word)
                groups.setdefault(n, []).append(word)
            per, words = max(groups.items(), key=lambda kv: (len(kv[1]), -kv[0]))
            self._slot_words = (words if len(words) >= 8 else [], per)
        return self._slot_words

    async def _prefix(self, context: int) -> str:
        """P(C) as text: the run's salt, then words (the user's text in order, where given),
        sized to C − s tokens."""
        s = min(self.suffix_tokens, max(context - 8, 0))
        if context not in self._prefix_text:
            rng = self._rng(context)
            head = f"run {self.salt % 10**8}:"
            m = self._material
            draw = _Draw(rng, m) if m is not None else None
            self._prefix_text[context] = await self._fit(head, context - s, rng, " ", draw)
            if m is not None and draw is not None:
                m.say(draw.next, draw.next, "words")
        return self._prefix_text[context]

    async def _template(self, context: int) -> tuple[str, int] | None:
        """P(C), a newline and fillers: the head of every text prompt at ``context``, and the
        number k of slot words that close it to exactly ``context`` tokens; None if the
        tokenizer does not count the slot words additively there (four random choices)."""
        if context in self._templates:
            return self._templates[context]
        words, per = await self.slot_words()
        head = await self._prefix(context) + "\n"
        template = None
        base = await self._count(head)
        k = (context - base) // per if words else 0
        if k >= 1:
            rng = self._rng(context, -1)
            choices = [[rng.choice(words) for _ in range(k)] for _ in range(4)]
            fill = await self._close(head, "".join(" " + w for w in choices[0]), context)
            if fill is not None:
                counts = [
                    await self._count(head + fill + "".join(" " + w for w in c))
                    for c in choices[1:]
                ]
                if counts == [context] * 3:
                    template = (head + fill, k)
        if template is None:
            self.notes.append(
                f"text prompts at {context} tokens: the server's tokenizer does not count "
                "words additively, so each decode cell reuses its 2N + 8 prompts in turn (a "
                "repeated prompt may hit the prefix cache)"
            )
        self._templates[context] = template
        return template

    async def _close(
        self, head: str, tail: str, target: int, count: int | None = None
    ) -> str | None:
        """Fillers between ``head`` and ``tail`` so that the prompt has ``target`` tokens
        (``count``: the tokens of head + tail, when known); None if they cannot."""
        fill = ""
        if count is None:
            count = await self._count(head + tail)
        while count < target:
            for filler in _FILLERS:
                got = await self._count(head + fill + filler + tail)
                if count < got <= target:
                    fill, count = fill + filler, got
                    break
            else:
                return None
        return fill if count == target else None

    async def _text(self, context: int, index: int) -> tuple[str, str]:
        """Text prompt ``index`` as (shared head, the rest): the template and slot words drawn
        for this index (unique), or, where there is no template, ("", a whole prompt) sized
        with /tokenize on its own."""
        template = await self._template(context)
        rng = self._rng(context, index + 1)
        if template is not None:
            head, k = template
            words, _ = await self.slot_words()
            return head, "".join(" " + rng.choice(words) for _ in range(k))
        m = self._material
        draw = _Draw(rng, m, start=index * 8) if m is not None else None
        return "", await self._fit(await self._prefix(context) + "\n", context, rng, "", draw)


#: the most of the user's text tokenized for a trace's or a conversation's pieces (they are
#: drawn at offsets into it: more text, more variety, but every piece a slice of it)
MATERIAL_PIECE_TOKENS = 1 << 17


def material_piece(key: str, pool: list[int], text: list[int], n: int) -> list[int]:
    """``n`` token ids made of the user's text for one piece of a trace or a conversation (a
    shared block, a request's own tail, a user's message): :data:`MATERIAL_SUFFIX_SALT` ids of
    ``pool`` drawn from ``key`` (which holds the run's salt: no other piece, and no other run,
    starts alike), then the text's ids from an offset drawn from ``key`` (the text repeated
    past its end). The same key, the same ids."""
    seed = int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big")
    rng = random.Random(seed)
    salt = [pool[rng.randrange(len(pool))] for _ in range(min(MATERIAL_SUFFIX_SALT, n))]
    return salt + _cycle(text, rng.randrange(len(text)), n - len(salt))


def _cycle(ids: list[int], start: int, n: int) -> list[int]:
    """``n`` ids of ``ids`` from ``start``, from its beginning again past its end."""
    out: list[int] = []
    start %= len(ids)
    while len(out) < n:
        take = min(len(ids) - start, n - len(out))
        out.extend(ids[start : start + take])
        start = 0
    return out
