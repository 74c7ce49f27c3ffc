"""The server's own tokenizer, by whichever route the server has (never a downloaded one).

Routes, tried in this order once per run (the first that answers is kept):

- ``tokenize``: vLLM's and SGLang's ``POST /tokenize`` (``{"prompt": TEXT}`` or
  ``{"messages": [...]}``, the chat template applied) → ``{"tokens": [...]}``;
- ``extras-tokenize``: llama-cpp-python's ``POST /extras/tokenize`` (``{"input": TEXT}``) →
  ``{"tokens": [...]}``;
- ``tokenize-content``: llama.cpp's native ``POST /tokenize`` (``{"content": TEXT}``) →
  ``{"tokens": [...]}``;
- ``usage``: no tokenize route: ``usage.prompt_tokens`` of small non-streamed requests
  (``max_tokens: 1``) counts a prompt exactly, as the server will count it, one request each.

The two foreign routes count raw text (no chat template, and special tokens as the server
pleases): a prompt's count is their count plus an offset calibrated once, per API, with one
non-streamed request's ``usage.prompt_tokens``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .client import Connection
from .errors import KeyRejected, LLMSpeedError, RequestRejected
from .wire import answer_prompt_tokens

TOKENIZE = "tokenize"
EXTRAS = "extras-tokenize"
CONTENT = "tokenize-content"
USAGE = "usage"

#: each route in words, for the run's notes and error messages
ROUTE_WORDS = {
    TOKENIZE: "the server's /tokenize",
    EXTRAS: "llama-cpp-python's /extras/tokenize",
    CONTENT: "llama.cpp's /tokenize (content)",
    USAGE: "usage.prompt_tokens of small non-streamed requests (max_tokens 1)",
}

_PROBE_TEXT = "river mountain forest 42"
_LEAD = "run:"  # what a piece is counted after, on the usage route


class TokenizeError(LLMSpeedError):
    pass


@dataclass
class ServerTokenizer:
    """Counts and token ids from the server; one probe finds the route, then it is reused.

    ``api``: ``completions`` or ``chat``, which prompts are counted for (the chat template)."""

    conn: Connection
    model: str
    api: str = "completions"
    route: str | None = None
    note: str | None = None  # how prompts are sized, when not with vLLM's /tokenize
    note_said: bool = False  # the note is in some factory's notes already
    _empty: list[int] = field(default_factory=list)  # what the route adds to any text (BOS)
    _offset: int | None = None  # prompt tokens beyond the raw count (foreign routes)
    _lead: int | None = None  # prompt tokens of _LEAD (usage route)

    @property
    def _purpose(self) -> str:
        return f"sizing exact-length prompts with the server's own tokenizer ({self.route})"

    async def find_route(self) -> str:
        """The first route that answers with token ids; ``usage`` when none does."""
        if self.route is not None:
            return self.route
        bodies: list[tuple[str, str, dict[str, Any]]] = [
            (TOKENIZE, "/tokenize", {"prompt": _PROBE_TEXT, "add_special_tokens": False}),
            (EXTRAS, "/extras/tokenize", {"input": _PROBE_TEXT}),
            (CONTENT, "/tokenize", {"content": _PROBE_TEXT, "add_special": False}),
        ]
        for route, path, body in bodies:
            tokens = await self._try(path, {"model": self.model, **body})
            if tokens:
                self.route = route
                break
        else:
            self.route = USAGE
        if self.route in (EXTRAS, CONTENT):
            self._empty = await self._try(*self._raw_request("")) or []
        if self.route != TOKENIZE:
            self.note = f"prompts: text sized with {ROUTE_WORDS[self.route]}" + (
                "" if self.route != USAGE else ": the server has no tokenize route"
            )
        return self.route

    async def _try(self, path: str, body: dict[str, Any]) -> list[int] | None:
        """Token ids from one probe request; None when the route is missing or answers
        something else (the connection's own problems and a rejected key still raise)."""
        try:
            answer = await self.conn.post_json(path, body, "finding the server's tokenize route")
        except KeyRejected:
            raise
        except (RequestRejected, ValueError):
            return None
        tokens = answer.get("tokens") if isinstance(answer, dict) else None
        if isinstance(tokens, list) and all(isinstance(t, int) for t in tokens):
            return tokens
        return None

    def _raw_request(self, text: str) -> tuple[str, dict[str, Any]]:
        if self.route == EXTRAS:
            return "/extras/tokenize", {"model": self.model, "input": text}
        if self.route == CONTENT:
            return "/tokenize", {"model": self.model, "content": text, "add_special": False}
        return "/tokenize", {"model": self.model, "prompt": text, "add_special_tokens": False}

    async def _post_tokens(self, path: str, body: dict[str, Any]) -> list[int]:
        answer = await self.conn.post_json(path, body, self._purpose)
        tokens = answer.get("tokens") if isinstance(answer, dict) else None
        if not isinstance(tokens, list):
            raise TokenizeError(f"{self.conn.url(path)} ({self._purpose}) returned no token ids")
        return tokens

    async def has_ids(self) -> bool:
        """Does the server give token ids (so that prompts can be token ids)?"""
        return await self.find_route() != USAGE

    async def ids(self, text: str) -> list[int]:
        """Token ids of ``text``, no special tokens; a usage-only server has none."""
        if await self.find_route() == USAGE:
            raise TokenizeError(
                f"{self.conn.base_url} has no tokenize route (/tokenize, /extras/tokenize): "
                "token-id prompts need one; use text prompts",
                setting="prompt_form",
            )
        tokens = await self._post_tokens(*self._raw_request(text))
        k = len(self._empty)
        return tokens[k:] if k and tokens[:k] == self._empty else tokens

    async def count_text(self, text: str) -> int | None:
        """Tokens of a piece of output text, or None where the server has no tokenize route."""
        if await self.find_route() == USAGE:
            return None
        return len(await self.ids(text)) if text else 0

    async def count_piece(self, text: str) -> int:
        """Tokens ``text`` adds (no special tokens): on the usage route, what it adds after a
        short lead."""
        if await self.find_route() != USAGE:
            return len(await self.ids(text))
        if self._lead is None:
            self._lead = await self._usage_count(_LEAD)
        return await self._usage_count(_LEAD + text) - self._lead

    async def prompt_tokens(self, content: str) -> int:
        """Tokens of a prompt as the server counts them in ``usage.prompt_tokens``: with the
        chat template for chat, with the special tokens (BOS) for completions."""
        route = await self.find_route()
        if route == TOKENIZE:
            body: dict[str, Any] = {"model": self.model}
            if self.api == "completions":
                body["prompt"] = content
            else:
                body["messages"] = [{"role": "user", "content": content}]
            return len(await self._post_tokens("/tokenize", body))
        if route == USAGE:
            return await self._usage_count(content)
        if self._offset is None:
            usage = await self._usage(_PROBE_TEXT)
            raw = len(await self.ids(_PROBE_TEXT))
            self._offset = usage - raw if usage is not None else len(self._empty)
        return len(await self.ids(content)) + self._offset

    async def _usage_count(self, content: str) -> int:
        """``usage.prompt_tokens`` of one non-streamed request with ``max_tokens: 1``."""
        count = await self._usage(content)
        if count is None:
            raise TokenizeError(
                f"{self._usage_path} (sizing a text prompt by the server's usage.prompt_tokens) "
                "answered without usage.prompt_tokens: the server has no tokenize route either, "
                "so text prompts cannot be sized"
            )
        return count

    @property
    def _usage_path(self) -> str:
        chat = self.api != "completions"
        return self.conn.url("/v1/chat/completions" if chat else "/v1/completions")

    async def _usage(self, content: str) -> int | None:
        """``usage.prompt_tokens`` of one non-streamed request with ``max_tokens: 1``, if any."""
        body: dict[str, Any] = {"model": self.model, "max_tokens": 1}
        if self.api == "completions":
            path, body["prompt"] = "/v1/completions", content
        else:
            path = "/v1/chat/completions"
            body["messages"] = [{"role": "user", "content": content}]
        purpose = "sizing a text prompt by the server's usage.prompt_tokens"
        return answer_prompt_tokens(await self.conn.post_json(path, body, purpose))
