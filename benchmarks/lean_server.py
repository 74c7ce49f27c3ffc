"""A lean OpenAI-compatible streaming server on loopback, for measuring clients, not servers.

It does no work but write: every response's bytes are built once per (prompt length, output
length) and sliced, so one process serves far more events a second than any client reads.
vLLM's event shape (compact JSON, continuous usage on every chunk, a finish chunk, a usage-only
chunk, ``[DONE]``); one token an event.

- ``--rate R``: each stream paced at R tokens a second (a ticker writes each stream's due
  events every ``--tick-ms``); ``--rate 0``: as fast as the socket takes them.
- Routes: ``/v1/models`` (with max_model_len), ``/version``, ``/tokenize`` (one id a word),
  ``/v1/completions`` (streamed); anything else 404 (no ``/metrics``).

    python -m benchmarks.lean_server --port 8123 --rate 2000
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import time
from dataclasses import dataclass

MAX_MODEL_LEN = 131072

_EVENT = (
    'data: {{"id":"cmpl-lean","object":"text_completion","created":1,"model":"lean",'
    '"choices":[{{"index":0,"text":" a","logprobs":null,"finish_reason":{finish},'
    '"stop_reason":null}}],"usage":{{"prompt_tokens":{p},"total_tokens":{t},'
    '"completion_tokens":{c}}}}}\n\n'
)
_USAGE = (
    'data: {{"id":"cmpl-lean","object":"text_completion","created":1,"model":"lean",'
    '"choices":[],"usage":{{"prompt_tokens":{p},"total_tokens":{t},"completion_tokens":{c}}}}}'
    "\n\n"
)
_HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"


@dataclass
class Body:
    """One response's event bytes and where each event ends (the tail after the last token
    event: finish's usage-only chunk and [DONE])."""

    data: bytes
    ends: list[int]  # ends[i]: the byte after event i (i < max_tokens); ends[-1]: everything


_BODIES: dict[tuple[int, int], Body] = {}


def body(prompt: int, max_tokens: int) -> Body:
    key = (prompt, max_tokens)
    if key not in _BODIES:
        parts, ends, at = [], [], 0
        for c in range(1, max_tokens + 1):
            finish = '"length"' if c == max_tokens else "null"
            ev = _EVENT.format(finish=finish, p=prompt, t=prompt + c, c=c).encode()
            parts.append(ev)
            at += len(ev)
            ends.append(at)
        tail = (_USAGE.format(p=prompt, t=prompt + max_tokens, c=max_tokens)).encode()
        parts.append(tail + b"data: [DONE]\n\n")
        ends[-1] = at + len(parts[-1])  # the last token's write carries the tail
        _BODIES[key] = Body(b"".join(parts), ends)
    return _BODIES[key]


def _chunk(b: bytes | memoryview) -> bytes:
    return b"%x\r\n%b\r\n" % (len(b), bytes(b))


class Paced:
    """Every paced stream's due events written once a tick."""

    def __init__(self, rate: float, tick: float) -> None:
        self.rate, self.tick = rate, tick
        self.streams: list[list] = []  # [writer, body, t0, sent events, done future]

    def add(self, writer: asyncio.StreamWriter, b: Body) -> asyncio.Future[None]:
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.streams.append([writer, b, time.perf_counter(), 0, done])
        return done

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.tick)
            now = time.perf_counter()
            keep = []
            for s in self.streams:
                writer, b, t0, sent, done = s
                if writer.is_closing():
                    done.set_result(None)
                    continue
                due = min(int((now - t0) * self.rate) + 1, len(b.ends))
                if due > sent:
                    start = b.ends[sent - 1] if sent else 0
                    writer.write(_chunk(memoryview(b.data)[start : b.ends[due - 1]]))
                    s[3] = due
                if s[3] >= len(b.ends):
                    done.set_result(None)
                else:
                    keep.append(s)
            self.streams = keep


async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, paced: Paced | None):
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            lines = head.split(b"\r\n")
            method, path = lines[0].split(b" ")[:2]
            length = 0
            for line in lines[1:]:
                if line.lower().startswith(b"content-length:"):
                    length = int(line.split(b":")[1])
            raw = await reader.readexactly(length) if length else b""
            if path == b"/v1/completions" and method == b"POST":
                req = json.loads(raw)
                prompt = req["prompt"]
                n = len(prompt) if isinstance(prompt, list) else len(str(prompt).split())
                b = body(n, int(req.get("max_tokens") or 16))
                writer.write(_HEAD)
                if paced is not None:
                    await paced.add(writer, b)
                else:
                    view = memoryview(b.data)
                    for i in range(0, len(view), 65536):
                        writer.write(_chunk(view[i : i + 65536]))
                        await writer.drain()
                writer.write(b"0\r\n\r\n")
                await writer.drain()
                continue
            answer: dict[str, object]
            if path == b"/v1/models":
                answer = {"object": "list", "data": [{"id": "lean", "object": "model",
                          "max_model_len": MAX_MODEL_LEN}]}  # fmt: skip
            elif path == b"/version":
                answer = {"version": "lean"}
            elif path == b"/tokenize" and method == b"POST":
                req = json.loads(raw)
                words = str(req.get("prompt", "")).split()
                ids = [100 + (hash(w) % 30000) for w in words]
                answer = {"tokens": ids, "count": len(ids), "max_model_len": MAX_MODEL_LEN}
            else:
                writer.write(b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n")
                continue
            out = json.dumps(answer).encode()
            writer.write(
                b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d"
                b"\r\n\r\n%b" % (len(out), out)
            )
    except (asyncio.IncompleteReadError, ConnectionError, asyncio.LimitOverrunError):
        pass
    finally:
        writer.close()


async def main_async(port: int, rate: float, tick_ms: float) -> None:
    paced = Paced(rate, tick_ms / 1e3) if rate > 0 else None
    server = await asyncio.start_server(
        lambda r, w: serve(r, w, paced), "127.0.0.1", port, limit=2**22, backlog=1024
    )
    print(f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}", flush=True)
    if paced is not None:
        asyncio.get_running_loop().create_task(paced.run())
    async with server:
        await server.serve_forever()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--rate", type=float, default=2000.0, help="tok/s per stream; 0: unpaced")
    ap.add_argument("--tick-ms", type=float, default=5.0)
    args = ap.parse_args()
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(main_async(args.port, args.rate, args.tick_ms))


if __name__ == "__main__":
    main()
