"""A minimal independent OpenAI streaming client for the simulator's tests (not the plugin's)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from time import perf_counter
from typing import Any

import aiohttp


@dataclass
class Event:
    """One SSE ``data:`` event with the time its bytes arrived."""

    t: float
    data: Any  # parsed JSON, or the string "[DONE]"

    @property
    def usage_tokens(self) -> int | None:
        if isinstance(self.data, dict) and isinstance(self.data.get("usage"), dict):
            return self.data["usage"]["completion_tokens"]
        return None

    def text(self) -> str:
        """Text of a choice delta (content, reasoning or completion text)."""
        if not isinstance(self.data, dict) or not self.data.get("choices"):
            return ""
        choice = self.data["choices"][0]
        if "text" in choice:
            return choice["text"]
        delta = choice.get("delta", {})
        return (delta.get("reasoning_content") or "") + (delta.get("content") or "")


@dataclass
class StreamResult:
    status: int
    start: float
    events: list[Event] = field(default_factory=list)
    body: Any = None
    error: str | None = None

    @property
    def chunks(self) -> list[Event]:
        """Events with choices (token chunks and the role chunk)."""
        return [e for e in self.events if isinstance(e.data, dict) and e.data.get("choices")]

    def token_increments(self) -> list[tuple[float, int]]:
        """(arrival, tokens) per chunk, from the rise of usage.completion_tokens."""
        out, last = [], 0
        for e in self.chunks:
            u = e.usage_tokens
            if u is not None and u > last:
                out.append((e.t, u - last))
                last = u
        return out

    @property
    def ttft(self) -> float:
        return self.token_increments()[0][0] - self.start

    @property
    def final_usage(self) -> dict[str, int]:
        """The usage of the stream's last usage-only event; a stream without one fails."""
        for e in reversed(self.events):
            if isinstance(e.data, dict) and e.data.get("usage") and not e.data.get("choices"):
                return e.data["usage"]
        raise AssertionError("the stream sent no usage-only event")


async def stream(
    session: aiohttp.ClientSession,
    url: str,
    body: dict[str, Any],
    headers: dict[str, str] | None = None,
) -> StreamResult:
    """POST a streaming request and record every event with its arrival time."""
    body = {**body, "stream": True}
    body.setdefault("stream_options", {"include_usage": True, "continuous_usage_stats": True})
    start = perf_counter()
    async with session.post(url, json=body, headers=headers) as resp:
        result = StreamResult(resp.status, start)
        if resp.status != 200:
            result.body = await resp.json(content_type=None)
            return result
        buf = b""
        try:
            async for data in resp.content.iter_any():
                t = perf_counter()
                buf += data
                while b"\n\n" in buf:
                    raw, buf = buf.split(b"\n\n", 1)
                    line = raw.decode()
                    assert line.startswith("data: "), line
                    payload = line[len("data: ") :]
                    result.events.append(
                        Event(t, payload if payload == "[DONE]" else json.loads(payload))
                    )
        except aiohttp.ClientPayloadError as exc:
            result.error = repr(exc)
    return result
