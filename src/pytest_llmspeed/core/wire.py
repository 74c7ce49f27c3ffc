"""What goes over the wire: the request's fields as the negotiated dialect allows, and what a
server streams back (SSE events: text, usage, finish reason, error events) and answers (error
bodies, a non-streamed answer's usage). The one module that knows the OpenAI JSON shapes.

Parsing is split by when it may run. :func:`first_token_in` runs in the client's hot path, on
each raw read until a stream's first token, and :func:`live_tokens` on the event loop while the
window is open; both are one call per read. Everything else parses a stream's recorded reads
after the cell (:func:`parse_stream`, :func:`stream_text`).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

# -- what is sent -------------------------------------------------------------------------------


@dataclass
class Dialect:
    """What the server accepted: negotiated once per run with a tiny request."""

    api: str = "completions"  # or "chat"
    vendor_fields: bool = True  # ignore_eos / min_tokens accepted
    stream_options: bool = True  # include_usage / continuous_usage_stats accepted
    notes: list[str] = field(default_factory=list)

    @property
    def path(self) -> str:
        return "/v1/completions" if self.api == "completions" else "/v1/chat/completions"


def request_fields(model: str, max_tokens: int, dialect: Dialect) -> dict[str, Any]:
    """Every field of a streamed request except the prompt."""
    body: dict[str, Any] = {"model": model, "max_tokens": max_tokens, "stream": True}
    if dialect.vendor_fields:
        body["ignore_eos"] = True
        body["min_tokens"] = max_tokens
    if dialect.stream_options:
        body["stream_options"] = {"include_usage": True, "continuous_usage_stats": True}
    return body


# -- what comes back: server-sent events --------------------------------------------------------

DONE = b"[DONE]"


def split_events(reads: list[tuple[float, bytes]]) -> list[tuple[float, bytes]]:
    """SSE ``data:`` payloads with the time of the read that completed them."""
    events: list[tuple[float, bytes]] = []
    buf = b""
    for t, data in reads:
        buf += data
        if b"\n" not in data:
            continue
        *lines, buf = buf.split(b"\n")
        for line in lines:
            line = line.strip()
            if line.startswith(b"data:"):
                events.append((t, line[5:].strip()))
    tail = buf.strip()
    if tail.startswith(b"data:") and reads:
        events.append((reads[-1][0], tail[5:].strip()))
    return events


def _object(payload: bytes) -> dict[str, Any] | None:
    """An event's JSON object; None for ``[DONE]`` and anything else that is not one."""
    try:
        obj = json.loads(payload)
    except ValueError:
        return None
    return obj if isinstance(obj, dict) else None


def _output_chars(choice: dict[str, Any]) -> int:
    """Characters of output (text, content, reasoning) a choice carries; a tool call counts
    one."""
    n = len(choice.get("text") or "")
    delta = choice.get("delta")
    if delta:
        n += len(delta.get("content") or "")
        n += len(delta.get("reasoning_content") or "")
        n += len(delta.get("reasoning") or "")
        if delta.get("tool_calls"):
            n += 1
    return n


def _carries_token(obj: dict[str, Any]) -> bool:
    usage = obj.get("usage")
    if usage and (usage.get("completion_tokens") or 0) > 0:
        return True
    return any(_output_chars(c) > 0 for c in obj.get("choices") or ())


def first_token_in(pending: bytearray, data: bytes) -> bool:
    """Hot path, before a stream's first token: add a raw read to ``pending`` and parse the
    complete events in it until one carries a token (True: this read brought the first)."""
    pending.extend(data)
    while True:
        idx = pending.find(b"\n")
        if idx < 0:
            return False
        line = bytes(pending[:idx]).strip()
        del pending[: idx + 1]
        if not line.startswith(b"data:"):
            continue
        payload = line[5:].strip()
        if payload == DONE:
            continue
        obj = _object(payload)
        if obj is not None and _carries_token(obj):
            return True


_COMPLETION_TOKENS = re.compile(rb'"completion_tokens":\s*(\d+)')


def live_tokens(data: bytes) -> tuple[int, int | None]:
    """One raw read, while the window is open, without parsing its JSON: its events (``[DONE]``
    not counted), and the last ``usage.completion_tokens`` in it, if it has one (a stream's
    usage only rises, so the last is the newest; a number cut by the read's end is corrected
    by the next read's)."""
    events = data.count(b"data:") - data.count(DONE)
    at = data.rfind(b'"completion_tokens":')
    if at < 0:
        return events, None
    found = _COMPLETION_TOKENS.match(data, at)
    return events, int(found.group(1)) if found else None


@dataclass
class StreamParse:
    """A stream's recorded reads, parsed (after the cell)."""

    done: bool = False  # ``data: [DONE]`` came
    error: str | None = None  # the first error event's message
    finish_reason: str | None = None  # the last one a choice gave
    prompt_tokens: int | None = None  # usage.prompt_tokens, the last given
    completion_tokens: int | None = None  # usage.completion_tokens, the last given
    chunks: int = 0  # events that carry choices
    usage_chunks: int = 0  # ... of them with usage.completion_tokens
    text_times: list[float] = field(default_factory=list)  # events whose choices carry output
    usage_times: list[float] = field(default_factory=list)  # events where usage rose ...
    usage_counts: list[int] = field(default_factory=list)  # ... and by how much


def parse_stream(reads: list[tuple[float, bytes]]) -> StreamParse:
    """Everything a stream said, from its recorded reads: text chunks and their times, usage
    and its rises, the finish reason, ``[DONE]``, error events."""
    out = StreamParse()
    prev = 0
    for t, payload in split_events(reads):
        if payload == DONE:
            out.done = True
            continue
        obj = _object(payload)
        if obj is None:
            continue
        if "error" in obj and not obj.get("choices"):
            if out.error is None:
                err = obj["error"]
                out.error = str(err.get("message", err) if isinstance(err, dict) else err)
            continue
        choices = obj.get("choices") or ()
        for c in choices:
            if c.get("finish_reason"):
                out.finish_reason = c["finish_reason"]
        if choices:
            out.chunks += 1
            if any(_output_chars(c) > 0 for c in choices):
                out.text_times.append(t)
        usage = obj.get("usage")
        if usage:
            out.prompt_tokens = usage.get("prompt_tokens", out.prompt_tokens)
            ct = usage.get("completion_tokens")
            if ct is not None:
                if choices:
                    out.usage_chunks += 1
                if ct > prev:
                    out.usage_times.append(t)
                    out.usage_counts.append(ct - prev)
                    prev = ct
                out.completion_tokens = ct
    return out


def stream_text(reads: list[tuple[float, bytes]]) -> str:
    """The output text a stream received (text, content, reasoning), reassembled from its
    events: for counting its tokens with the server's tokenizer, after the cell."""
    parts: list[str] = []
    for _, payload in split_events(reads):
        obj = _object(payload)
        for c in (obj or {}).get("choices") or ():
            parts.append(c.get("text") or "")
            delta = c.get("delta") or {}
            parts.append(delta.get("reasoning_content") or delta.get("reasoning") or "")
            parts.append(delta.get("content") or "")
    return "".join(parts)


# -- what comes back: plain answers -------------------------------------------------------------


def error_message(body: str) -> str:
    """The human part of an OpenAI/vLLM error body, or the body itself, shortened."""
    try:
        data = json.loads(body)
    except ValueError:
        return body.strip()[:300] or "(empty body)"
    if isinstance(data, dict):
        err = data.get("error", data)
        if isinstance(err, dict):
            msg = err.get("message") or err.get("detail") or err.get("msg")
            if msg:
                return str(msg)[:500]
        if isinstance(err, str):
            return err[:500]
        detail = data.get("detail")
        if detail:
            return str(detail)[:500]
    return body.strip()[:300]


def answer_prompt_tokens(answer: Any) -> int | None:
    """``usage.prompt_tokens`` of a non-streamed answer, if it has one."""
    usage = answer.get("usage") if isinstance(answer, dict) else None
    count = usage.get("prompt_tokens") if isinstance(usage, dict) else None
    return count if isinstance(count, int) else None
