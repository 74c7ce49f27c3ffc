"""A user's own text as the material of every prompt (``--llm-prompt-text=FILE``, issue 33).

Speculative decoding (n-gram lookup above all) and prefix caching depend on what a prompt
says, not only on its length: word salad drawn from a fixed list need not accept drafts as a
user's real prompts do. The file is plain text, or a dataset of prompts as JSON Lines
(``.jsonl``): each line an object with a string ``prompt`` or ``text``, a ``conversations``
(or ``messages``) list whose items carry ``value`` or ``content`` (ShareGPT's form), or a bare
JSON string. The pieces are joined with blank lines. :class:`~.prompts.PromptFactory` sizes
prompts of this text exactly with the server's tokenizer, as it sizes its own.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

from .errors import LLMSpeedError

#: the most bytes of a prompt-text file read (a larger file is refused, not cut)
PROMPT_TEXT_MAX_BYTES = 64 << 20


class PromptTextError(LLMSpeedError):
    """The file cannot be the prompts' material; the message says why, in one line."""


@dataclass(frozen=True)
class PromptText:
    """The text every prompt is made of, and where it came from."""

    source: str
    text: str
    pieces: int = 1  # the dataset's prompts joined (1 for a plain text file)

    @property
    def characters(self) -> int:
        return len(self.text)


def _piece(value: object) -> str | None:
    """The text of one dataset line, or None when it has none."""
    if isinstance(value, str):
        return value
    if not isinstance(value, dict):
        return None
    for key in ("prompt", "text"):
        if isinstance(value.get(key), str):
            return str(value[key])
    for key in ("conversations", "messages"):
        turns = value.get(key)
        if isinstance(turns, list):
            said = [
                t.get("value", t.get("content"))
                for t in turns
                if isinstance(t, dict) and isinstance(t.get("value", t.get("content")), str)
            ]
            if said:
                return "\n".join(str(s) for s in said)
    return None


def parse_prompt_text(data: bytes, source: str) -> PromptText:
    """The material of ``data`` (the file's bytes): :class:`PromptTextError` when there is
    none, it is not UTF-8, or a ``.jsonl`` line is not JSON or carries no text."""
    try:
        raw = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise PromptTextError(
            f"{source}: not UTF-8 text (byte {exc.start:,}): give a UTF-8 text file or a "
            ".jsonl dataset"
        ) from None
    raw = raw.removeprefix("\ufeff")
    if source.endswith(".jsonl"):
        pieces: list[str] = []
        for number, line in enumerate(raw.splitlines(), 1):
            if not line.strip():
                continue
            try:
                value = json.loads(line)
            except json.JSONDecodeError as exc:
                raise PromptTextError(
                    f"{source}: line {number} is not JSON ({exc.msg}): each line is an object "
                    'with "prompt" or "text", a "conversations" list, or a JSON string'
                ) from None
            piece = _piece(value)
            if piece is None:
                raise PromptTextError(
                    f"{source}: line {number} has no text: give each line a string "
                    '"prompt" or "text", a "conversations" list of {"value": ...}, or a JSON '
                    "string"
                )
            if piece.strip():
                pieces.append(piece.strip())
        text = "\n\n".join(pieces)
    else:
        pieces = [raw]
        text = raw.strip()
    if not text.strip():
        raise PromptTextError(f"{source}: has no text: give a file with the prompts' text")
    return PromptText(source, text, len(pieces))


def read_prompt_text(path: str | os.PathLike[str]) -> PromptText:
    """The file at ``path``, read within :data:`PROMPT_TEXT_MAX_BYTES`."""
    source = str(path)
    try:
        size = os.stat(path).st_size
        if size > PROMPT_TEXT_MAX_BYTES:
            raise PromptTextError(
                f"{source}: {size:,} bytes, more than {PROMPT_TEXT_MAX_BYTES >> 20} MiB: give "
                "a part of it"
            )
        with open(path, "rb") as f:
            data = f.read(PROMPT_TEXT_MAX_BYTES + 1)
    except OSError as exc:
        raise PromptTextError(
            f"{source}: cannot be read ({exc.strerror or exc}): give a readable file"
        ) from None
    if len(data) > PROMPT_TEXT_MAX_BYTES:
        raise PromptTextError(
            f"{source}: more than {PROMPT_TEXT_MAX_BYTES >> 20} MiB: give a part of it"
        )
    return parse_prompt_text(data, source)
