"""``python -m pytest_llmspeed.sim.hostile --case NAME``: a small OpenAI-compatible server that
behaves well but for the one misbehaviour its case names (issue 29, docs/trust.md).

It is the peer of ``tests/hostile/``: each case is one way a server can lie, stall, flood or
inject, and the battery runs the plugin against it as a user would. The server is raw asyncio
HTTP/1.1 (keep-alive, chunked SSE streams) so that a case can send exactly the bytes it names:
a 1 MB header, an event with no line end, a body that trickles one byte at a time.

Well-behaved, it answers as vLLM does, and fast:

- ``GET /health``, ``GET /version``, ``GET``/``HEAD /v1/models`` (with ``max_model_len``);
- ``POST /tokenize`` (``prompt`` text or chat ``messages`` → ``tokens``; one token a word or
  a punctuation mark, no special tokens);
- ``GET /metrics`` in vLLM's names: the KV capacity (``vllm:cache_config_info``'s
  ``kv_cache_size_tokens``), the running and waiting gauges, the generation and prompt token
  counters, which count what was really sent;
- ``POST /v1/completions`` and ``/v1/chat/completions``: prompts as token ids or text;
  ``max_tokens`` honoured (``ignore_eos``: all of them, else at most 48), one token a chunk
  every 5 ms, ``usage`` on every chunk with ``stream_options.continuous_usage_stats``, a
  final usage chunk with ``include_usage``, then ``data: [DONE]``; non-streamed answers too;
- ``GET /_hostile/stats``: what the server did (requests by route, misbehaving requests,
  requests the redirect target received), for the tests; never misbehaves.

A stream case misbehaves from the ``--from-request``-th streamed request on (counted from 1
over both completion routes), so that a run can get past its first small request. Once it
listens it prints ``llmspeed-hostile listening on http://127.0.0.1:PORT (case NAME)``; it
stops when standard input closes (when stdin is a pipe, or with ``--exit-with-stdin``), on
SIGTERM or Ctrl-C.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import json
import os
import re
import signal
import stat
import sys
import threading
import time
import zlib
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

MODEL = "hostile"
VERSION = "0.26.1+hostile"
MAX_MODEL_LEN = 32_768
BLOCK = 16
KV_TOKENS = 131_072
TOKEN_S = 0.005  # seconds between a stream's tokens
NO_EOS_TOKENS = 48  # a request without ignore_eos stops here (finish_reason "stop")
ANNOUNCED_S = 0.3  # usage_first: its first token's text comes this long after its count

#: what the injection cases put in server strings: terminal escapes (clear screen, a window
#: title, colour) and a GitHub workflow command at the start of a line
INJECTED = "\x1b[2J\x1b]0;hostile-title\x07\x1b[31m red \x1b[0m\n::error title=hostile::injected"
#: Markdown and HTML a model id can carry without a control character
#: a gateway's error page: each of its lines would start a line of the terminal, the CI log
#: (``::``: a workflow command) or the job summary (a heading, a link) if printed as sent
ERROR_PAGE = (
    "<html>\n<head><title>502 Bad Gateway</title></head>\n<body>\n## hostile-heading\n"
    "[hostile-link](http://127.0.0.1:9/)\n::error title=hostile::injected\n</body>\n</html>\n"
)
MARKDOWN = (
    "hostile <img src=x onerror=alert(1)> [click](javascript:alert(1)) **bold** "
    "| a | b | <script>alert(2)</script> # heading"
)


#: a whole number of 5,000 digits (Python's json refuses to read it: past its int limit), put in
#: an answer's bytes where :func:`_digits` finds this mark
DIGITS = b"1" + b"0" * 4999
DIGITS_MARK = "__hostile_digits__"
#: an HTML page, where JSON or SSE should be
HTML = b"<!DOCTYPE html><html><head><title>Login</title></head><body><h1>Sign in</h1></body></html>"


#: a model id whose right-to-left override shows "hostile-exe.txt" as "hostile-txt.exe"
BIDI = "hostile-\u202etxt.exe\u202c\u200b-model"


def encoded_key(key: str) -> tuple[str, str]:
    """The key as key_encoded echoes it: base64 of ``Bearer KEY``, and every byte
    percent-encoded."""
    b64 = base64.b64encode(f"Bearer {key}".encode()).decode()
    return b64, "".join(f"%{b:02X}" for b in key.encode())


def _digits(body: bytes) -> bytes:
    return body.replace(b'"' + DIGITS_MARK.encode() + b'"', DIGITS)


async def bad_chunk(out: Writer, ctype: str, body: bytes) -> None:
    """``body``'s first half as a chunk, then a chunk size that is not hex."""
    out.head(200, [("Content-Type", ctype), ("Transfer-Encoding", "chunked")])
    half = body[: len(body) // 2]
    out.w.write(b"%x\r\n%s\r\nzz\r\n%s\r\n0\r\n\r\n" % (len(half), half, body[len(half) :]))
    await out.w.drain()
    raise Closed


_GZIP: dict[tuple[bytes, int], bytes] = {}
#: what the /v1/models gzip bomb inflates to: a valid answer of 100 MB
MODELS_BOMB = (
    b'{"object":"list","data":[{"id":"hostile","object":"model","max_model_len":32768}],'
    b'"padding":"',
    b"p",
    100 << 20,
    b'"}',
)
#: what the stream's gzip bomb inflates to: one event of 256 MB
BOMB_EVENT = (
    b'data: {"id":"cmpl-hostile-bomb","object":"text_completion","created":0,'
    b'"model":"hostile","choices":[{"index":0,"text":"',
    b"a",
    256 << 20,
    b'","finish_reason":null}]}\n\n',
)


def gzip_blob(head: bytes, fill: bytes, n: int, tail: bytes) -> bytes:
    """``head`` + ``fill`` × ``n`` + ``tail``, gzip-compressed (made once, kept)."""
    key = (head + fill + tail, n)
    if key not in _GZIP:
        z = zlib.compressobj(9, zlib.DEFLATED, 31)
        parts = [z.compress(head)]
        block = fill * (1 << 20)
        for _ in range(n // len(block)):
            parts.append(z.compress(block))
        parts += [z.compress(tail), z.flush()]
        _GZIP[key] = b"".join(parts)
    return _GZIP[key]


@dataclass(frozen=True)
class Case:
    """One misbehaviour: the route it is on and what it does there."""

    route: str
    does: str
    stream: bool = False  # True: a stream misbehaves, from the --from-request-th on


#: every case, by name (``good`` behaves)
CASES: dict[str, Case] = {
    "good": Case("-", "nothing wrong: a fast, well-behaved vLLM-like server"),
    # -- malformed streams -----------------------------------------------------------------
    "tokens_string": Case("/v1/completions", 'usage.completion_tokens as a string ("7")', True),
    "tokens_float": Case("/v1/completions", "usage.completion_tokens as a float (5.0)", True),
    "tokens_huge": Case("/v1/completions", "usage.completion_tokens as 1e30", True),
    "tokens_falling": Case(
        "/v1/completions", "usage.completion_tokens falls to 0 after the 4th token", True
    ),
    "usage_list": Case("/v1/completions", "usage as a list", True),
    "choices_object": Case("/v1/completions", "choices as an object, not a list", True),
    "delta_string": Case("/v1/completions", "choices[].delta as a string", True),
    "not_json": Case("/v1/completions", "a data: payload that is not JSON", True),
    "json_bomb": Case("/v1/completions", "a data: payload of 100,000 nested '['", True),
    "count_digits": Case(
        "/v1/completions", "usage.completion_tokens a whole number of 5,000 digits", True
    ),
    "tokens_10x": Case(
        "/v1/completions",
        "usage.completion_tokens 10 times the tokens sent (past max_tokens)",
        True,
    ),
    "usage_double": Case(
        "/v1/completions",
        "usage.completion_tokens twice the tokens sent (2 a chunk of one token, so it sends half "
        "of max_tokens); the generation counter counts what was sent",
        True,
    ),
    "usage_double_blind": Case(
        "/v1/completions",
        "usage.completion_tokens twice the tokens sent, as usage_double, and no /metrics (404): "
        "no generation counter to referee it, only the text the streams carried",
        True,
    ),
    "usage_half": Case(
        "/v1/completions",
        "usage.completion_tokens half the tokens sent (rounded up); the counter counts them all",
        True,
    ),
    "usage_first": Case(
        "/v1/completions",
        "a usage-only first chunk (no choice) with completion_tokens 1, its text 0.3 s later",
        True,
    ),
    "after_done": Case(
        "/v1/completions",
        "after data: [DONE], a second stream's worth of chunks (counts rising)",
        True,
    ),
    "choices_empty": Case(
        "/v1/completions", "choices [] on every chunk, usage rising, no text", True
    ),
    "event_error": Case(
        "/v1/completions", "an 'event: error' line and a data: {\"message\": ...} event", True
    ),
    "no_finish": Case(
        "/v1/completions", "the stream ends after 2 tokens: no finish_reason, no [DONE]", True
    ),
    "nul_in_stream": Case("/v1/completions", "a NUL byte inside a data: payload", True),
    "bad_utf8": Case("/v1/completions", "invalid UTF-8 bytes inside a data: payload", True),
    "after_finish": Case(
        "/v1/completions", 'finish_reason "length" on the first token, then the others', True
    ),
    "done_only": Case("/v1/completions", "data: [DONE] at once: no token, no finish_reason", True),
    "stop_at_once": Case(
        "/v1/completions", 'finish_reason "stop" at once, no token (an EOS every time)', True
    ),
    "finish_esc": Case(
        "/v1/completions", "finish_reason holding ESC sequences and '\\n::error'", True
    ),
    "stream_html": Case("/v1/completions", "HTTP 200 text/html: an HTML page, not SSE", True),
    "close_after_headers": Case(
        "/v1/completions", "HTTP 200 SSE headers, then the connection closed", True
    ),
    "stream_bad_chunk": Case(
        "/v1/completions", "a chunked-encoding chunk size that is not hex", True
    ),
    "stream_gzip_bomb": Case(
        "/v1/completions", "Content-Encoding gzip: 256 KB that inflates to one line of 256 MB", True
    ),
    "retry_after": Case("/v1/completions", "HTTP 429 with Retry-After: 86400", True),
    # -- stream shapes a well-behaved server may send (positive) ------------------------------
    "crlf": Case("/v1/completions", "SSE lines ended by \\r\\n", True),
    "cr_only": Case("/v1/completions", "SSE lines ended by a bare \\r", True),
    "data_no_space": Case("/v1/completions", "data:{...} without the space", True),
    "bom": Case("/v1/completions", "a UTF-8 BOM before the stream's first event", True),
    "http10": Case(
        "/v1/completions", "HTTP/1.0: no chunked encoding, the stream ends with the close", True
    ),
    # -- time --------------------------------------------------------------------------------
    "ping_forever": Case(
        "/v1/completions", "': ping' comments every --interval s, never a token", True
    ),
    "token_trickle": Case("/v1/completions", "one token, then one byte every --interval s", True),
    "done_keep_open": Case(
        "/v1/completions", "data: [DONE], then the connection held open (no end)", True
    ),
    "models_trickle": Case("/v1/models", "its body one byte every --interval s"),
    "metrics_slow": Case("/metrics", "answers after --delay s"),
    "two_backends": Case(
        "/v1/completions", "every other stream's chunks name another model (a second backend)", True
    ),
    "metrics_slow_mid": Case(
        "/metrics", "answers at once for the probe (its first 3 reads), after --delay s later"
    ),
    "gauges_busy": Case("/metrics", "num_requests_running never reads 0 (always 2 more)"),
    # -- size --------------------------------------------------------------------------------
    "sse_long_line": Case(
        "/v1/completions", "one event of --size bytes (no line end until its end)", True
    ),
    "models_huge": Case("/v1/models", "a valid JSON answer of --size bytes"),
    "metrics_huge": Case("/metrics", "a valid Prometheus text of --size bytes"),
    "header_huge": Case("every route", "a response header of 1 MB"),
    "model_id_huge": Case("/v1/models", "a model id of 1 MB"),
    "models_bad_chunk": Case("/v1/models", "a chunked-encoding chunk size that is not hex"),
    "models_gzip_bomb": Case("/v1/models", "Content-Encoding gzip: 100 KB that inflates to 100 MB"),
    "models_length_short": Case("/v1/models", "a Content-Length 10 bytes short of its body"),
    "models_length_long": Case("/v1/models", "a Content-Length 10 bytes past its body, held"),
    "models_html": Case("/v1/models", "HTTP 200 text/html: an HTML page"),
    "models_continue": Case("/v1/models", "an unasked HTTP 100 Continue before its answer"),
    "headers_many": Case("every route", "10,000 small response headers"),
    "header_nul": Case("every route", "a response header holding a NUL byte"),
    "metrics_bad_chunk": Case("/metrics", "a chunked-encoding chunk size that is not hex"),
    "version_list": Case("/version", "a JSON list"),
    "tokenize_huge": Case("/tokenize", "10,000,000 tokens (20 MB)"),
    "tokenize_wrong": Case("/tokenize", "twice the tokens the server counts in a prompt"),
    "version_bomb": Case("/version", "100,000 nested '['"),
    "models_bomb": Case("/v1/models", "100,000 nested '['"),
    # -- values ------------------------------------------------------------------------------
    "mml_huge": Case("/v1/models", "max_model_len 1e30"),
    "mml_negative": Case("/v1/models", "max_model_len -5"),
    "mml_bool": Case("/v1/models", "max_model_len true"),
    "models_data_int": Case("/v1/models", 'the answer {"data": 5}'),
    "mml_string": Case("/v1/models", 'max_model_len "32768" (a string)'),
    "mml_2_63": Case("/v1/models", "max_model_len 2^63"),
    "mml_digits": Case("/v1/models", "max_model_len a whole number of 5,000 digits"),
    "blocks_zero": Case("/metrics", "no kv_cache_size_tokens, num_gpu_blocks 0"),
    "metrics_many_series": Case(
        "/metrics", "vllm:num_requests_running with 200,000 series (13 MB, under the cap)"
    ),
    "metrics_timestamps": Case("/metrics", "every sample with a timestamp (valid Prometheus)"),
    "kv_string_zero": Case("/metrics", 'kv_cache_size_tokens="0"'),
    "gen_counter_nan": Case("/metrics", "vllm:generation_tokens_total NaN"),
    "gen_counter_inf": Case("/metrics", "vllm:generation_tokens_total +Inf"),
    "gauges_negative": Case("/metrics", "num_requests_running -3, num_requests_waiting -2"),
    "counter_restart": Case(
        "/metrics",
        "the generation counter restarts from 0 at the 10th token of the --from-request-th "
        "decode-sized request (max_tokens >= 32)",
    ),
    "counter_10x": Case("/metrics", "the generation counter counts 10 times the tokens sent"),
    "metrics_garbage": Case("/metrics", "a body that is not Prometheus text"),
    "metrics_label_newline": Case("/metrics", "a raw newline inside a label value"),
    # -- secrets -----------------------------------------------------------------------------
    "key_in_stream_error": Case(
        "/v1/completions", "a streamed error event that echoes the API key", True
    ),
    "key_in_error_body": Case("/v1/completions", "HTTP 500 whose body echoes the API key", True),
    "key_json_escaped": Case(
        "/v1/completions", "HTTP 500 whose JSON body holds the key as \\u escapes", True
    ),
    "key_encoded": Case(
        "/v1/completions",
        "HTTP 500 whose message holds the key base64-encoded (as 'Bearer KEY') and percent-encoded",
        True,
    ),
    "key_across_cut": Case(
        "/v1/completions",
        "HTTP 500 whose body holds the API key across its 200th and 500th characters",
        True,
    ),
    "health_trickle": Case(
        "/health", "its status line one byte every --interval s (under --llm-serve)"
    ),
    "serve_fails": Case(
        "--llm-serve", "prints its command line (the key in it) and exits 1 without serving"
    ),
    # -- output injection --------------------------------------------------------------------
    "esc_in_model_id": Case("/v1/models", "ESC sequences and a '\\n::error' line in the model id"),
    "esc_in_version": Case("/version", "ESC sequences and a '\\n::error' line in the version"),
    "esc_in_error_body": Case(
        "/v1/completions", "HTTP 500 whose message holds ESC sequences and '\\n::error'", True
    ),
    "esc_in_stream_error": Case(
        "/v1/completions", "a streamed error event with ESC sequences and '\\n::error'", True
    ),
    "markdown_in_model_id": Case("/v1/models", "Markdown and HTML in the model id"),
    "html_error_page": Case(
        "/v1/completions",
        "HTTP 502 with a proxy's HTML page whose lines start with HTML, Markdown and '::'",
        True,
    ),
    "key_in_model_id": Case("/v1/models", "the API key in the model id"),
    "bidi_in_model_id": Case(
        "/v1/models", "a right-to-left override and zero-width characters in the model id"
    ),
    # -- redirects ---------------------------------------------------------------------------
    "redirect_other_port": Case(
        "every route", "HTTP 307 to the same path on another port (a well-behaved server)"
    ),
    "redirect_loop": Case("every route", "HTTP 307 to itself"),
}


@dataclass
class Request:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes

    def json(self) -> dict[str, Any]:
        try:
            value = json.loads(self.body or b"{}")
        except ValueError:
            return {}
        return value if isinstance(value, dict) else {}


def tokenize(text: str) -> list[int]:
    """One token a word or punctuation mark (no special tokens): ids from a checksum."""
    return [zlib.crc32(w.encode()) % 32_000 for w in re.findall(r"\w+|[^\w\s]", text)]


def _dumps(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()


def key_message(key: str, at: tuple[int, ...], length: int) -> str:
    """A message of ``length`` characters with ``key`` starting at each offset in ``at``."""
    chars = list("x" * length)
    for i in at:
        chars[i : i + len(key)] = key
    return "".join(chars)[: max(length, max(at) + len(key))]


@dataclass
class Options:
    case: str = "good"
    api_key: str | None = None
    from_request: int = 1
    interval: float = 1.0
    delay: float = 25.0
    size: int = 100 * 1024 * 1024


@dataclass
class Stats:
    routes: Counter[str] = field(default_factory=Counter)
    streams: int = 0  # streamed (and non-streamed) completion requests
    misbehaved: int = 0  # of them, those the case misbehaved in
    other_port: int = 0  # requests the redirect target received
    metrics_reads: int = 0


class Writer:
    """HTTP/1.1 answers on one connection."""

    def __init__(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        extra: list[tuple[str, str]],
    ) -> None:
        self.r = reader
        self.w = writer
        self.extra = extra  # headers every answer carries (the case's)
        self.transform: Callable[[bytes], bytes] | None = None  # a stream case's SSE bytes
        self.http10 = False  # the stream's bytes as they are, its end the connection's close

    def head(self, status: int, headers: list[tuple[str, str]]) -> None:
        reason = {200: "OK", 307: "Temporary Redirect", 404: "Not Found", 429: "Too Many"}.get(
            status, "Error"
        )
        lines = [f"HTTP/1.1 {status} {reason}", *(f"{k}: {v}" for k, v in headers + self.extra)]
        self.w.write(("\r\n".join(lines) + "\r\n\r\n").encode("utf-8"))

    async def whole(
        self,
        status: int,
        body: bytes,
        ctype: str = "application/json",
        head_only: bool = False,
        headers: tuple[tuple[str, str], ...] = (),
    ) -> None:
        self.head(status, [("Content-Type", ctype), ("Content-Length", str(len(body))), *headers])
        if not head_only:
            self.w.write(body)
        await self.w.drain()

    async def sized(self, ctype: str, parts: list[tuple[bytes, int]]) -> None:
        """An answer of known length written piece by piece: (bytes, times repeated)."""
        total = sum(len(b) * n for b, n in parts)
        self.head(200, [("Content-Type", ctype), ("Content-Length", str(total))])
        for piece, n in parts:
            for _ in range(n):
                self.w.write(piece)
                await self.w.drain()

    def start_stream(self) -> None:
        if self.http10:
            self.w.write(b"HTTP/1.0 200 OK\r\nContent-Type: text/event-stream\r\n\r\n")
            return
        self.head(
            200,
            [
                ("Content-Type", "text/event-stream; charset=utf-8"),
                ("Cache-Control", "no-cache"),
                ("Transfer-Encoding", "chunked"),
            ],
        )

    async def chunk(self, data: bytes) -> None:
        if self.transform is not None:
            data = self.transform(data)
        if self.http10:
            self.w.write(data)
            await self.w.drain()
            return
        self.w.write(b"%x\r\n%s\r\n" % (len(data), data))
        await self.w.drain()

    async def end_stream(self) -> None:
        if self.http10:
            await self.w.drain()
            raise Closed
        self.w.write(b"0\r\n\r\n")
        await self.w.drain()


class Closed(Exception):
    """The answer left the connection unusable (held, cut): close it."""


class Hostile:
    def __init__(self, options: Options) -> None:
        if options.case not in CASES:
            raise ValueError(f"unknown case {options.case!r}; cases: {', '.join(CASES)}")
        self.o = options
        self.case = options.case
        self.stats = Stats()
        self.running = 0
        self.generated = 0  # tokens sent, all requests
        self.prompted = 0
        self.restart_at: int | None = None  # counter_restart: generated at the restart
        self.decode_requests = 0
        self.port = 0
        self.other_port = 0
        self.model = {
            "model_id_huge": "hostile-" + "m" * (1 << 20),
            "esc_in_model_id": "hostile" + INJECTED + "-model",
            "markdown_in_model_id": MARKDOWN,
            "bidi_in_model_id": BIDI,
        }.get(self.case, MODEL)
        if self.case == "key_in_model_id":
            self.model = f"hostile-{options.api_key or 'sk-no-key-given'}-model"

    # -- connections -----------------------------------------------------------------------

    async def connection(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, other: bool = False
    ) -> None:
        extra = [("Server", "llmspeed-hostile")]
        if self.case == "header_huge":
            extra.append(("X-Hostile-Padding", "h" * (1 << 20)))
        if self.case == "headers_many":
            extra += [(f"X-Hostile-{i}", "h") for i in range(10_000)]
        if self.case == "header_nul":
            extra.append(("X-Hostile", "a\x00b"))
        out = Writer(reader, writer, extra)
        try:
            while True:
                req = await _read_request(reader)
                if req is None:
                    break
                if other:
                    self.stats.other_port += 1
                await self.dispatch(req, out, other)
        except (Closed, ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def dispatch(self, req: Request, out: Writer, other: bool) -> None:
        if req.path == "/_hostile/stats":  # for the tests: no misbehaviour, not even a header
            out.extra = out.extra[:1]
            await out.whole(200, _dumps(self.stats_dict()))
            return
        self.stats.routes[req.path] += 1
        if not other and self.case in ("redirect_other_port", "redirect_loop"):
            port = self.other_port if self.case == "redirect_other_port" else self.port
            out.head(
                307,
                [
                    ("Location", f"http://127.0.0.1:{port}{req.path}"),
                    ("Content-Length", "0"),
                ],
            )
            await out.w.drain()
            return
        key = self.o.api_key
        if (
            req.path.startswith("/v1/")
            and key
            and req.headers.get("authorization") != f"Bearer {key}"
        ):
            await out.whole(401, _error("Unauthorized: missing or wrong API key", 401))
            return
        routes: dict[tuple[str, str], Callable[[Request, Writer], Awaitable[None]]] = {
            ("GET", "/health"): self.health,
            ("GET", "/version"): self.version,
            ("GET", "/v1/models"): self.models,
            ("HEAD", "/v1/models"): self.models,
            ("POST", "/tokenize"): self.tokenize_route,
            ("GET", "/metrics"): self.metrics,
            ("POST", "/v1/completions"): self.completions,
            ("POST", "/v1/chat/completions"): self.completions,
        }
        handler = routes.get((req.method, req.path))
        if handler is None:
            await out.whole(404, _error(f"Not Found: {req.path}", 404))
            return
        await handler(req, out)

    def stats_dict(self) -> dict[str, Any]:
        s = self.stats
        return {
            "case": self.case,
            "routes": dict(s.routes),
            "streams": s.streams,
            "misbehaved": s.misbehaved,
            "other_port": s.other_port,
            "redirect_port": self.other_port,
            "metrics_reads": s.metrics_reads,
            "generated": self.generated,
        }

    # -- small routes ------------------------------------------------------------------------

    async def health(self, req: Request, out: Writer) -> None:
        if self.case == "health_trickle":
            for b in b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n":
                out.w.write(bytes([b]))
                await out.w.drain()
                await asyncio.sleep(self.o.interval)
            return
        await out.whole(200, b"")

    async def version(self, req: Request, out: Writer) -> None:
        if self.case in ("version_list", "version_bomb"):
            body = b"[" * 100_000 if self.case == "version_bomb" else b'["0.26.1", "hostile"]'
            await out.whole(200, body)
            return
        version = VERSION + INJECTED if self.case == "esc_in_version" else VERSION
        await out.whole(200, _dumps({"version": version}))

    def _mml(self) -> Any:
        return {
            "mml_huge": 1e30,
            "mml_negative": -5,
            "mml_bool": True,
            "mml_string": str(MAX_MODEL_LEN),
            "mml_2_63": 2**63,
            "mml_digits": DIGITS_MARK,
        }.get(self.case, MAX_MODEL_LEN)

    async def models(self, req: Request, out: Writer) -> None:
        head = req.method == "HEAD"
        if self.case == "models_data_int":
            await out.whole(200, b'{"data": 5}', head_only=head)
            return
        if self.case == "models_bomb":
            await out.whole(200, b"[" * 100_000, head_only=head)
            return
        if self.case == "models_html" and not head:
            await out.whole(200, HTML, "text/html; charset=utf-8")
            return
        entry = {
            "id": self.model,
            "object": "model",
            "created": int(time.time()),
            "owned_by": "vllm",
            "root": self.model,
            "parent": None,
            "max_model_len": self._mml(),
            "permission": [],
        }
        body = _digits(_dumps({"object": "list", "data": [entry]}))
        if not head and await self.models_http(body, out):
            return
        if self.case == "models_huge" and not head:
            # the padding goes in a field of its own, after the model list
            start, end = body[:-1] + b',"padding":"', b'"}'
            block = b"p" * (1 << 20)
            n = max(self.o.size - len(start) - len(end), 0)
            await out.sized(
                "application/json",
                [(start, 1), (block, n // len(block)), (b"p" * (n % len(block)), 1), (end, 1)],
            )
            return
        if self.case == "models_trickle" and not head:
            out.head(
                200, [("Content-Type", "application/json"), ("Content-Length", str(len(body)))]
            )
            for i in range(len(body)):
                out.w.write(body[i : i + 1])
                await out.w.drain()
                await asyncio.sleep(self.o.interval)
            return
        await out.whole(200, body, head_only=head)

    async def models_http(self, body: bytes, out: Writer) -> bool:
        """The HTTP-level cases of /v1/models; False: not one of them."""
        case = self.case
        if case == "models_bad_chunk":
            await bad_chunk(out, "application/json", body)
        elif case == "models_gzip_bomb":
            await out.whole(200, gzip_blob(*MODELS_BOMB), headers=(("Content-Encoding", "gzip"),))
        elif case in ("models_length_short", "models_length_long"):
            n = len(body) - 10 if case == "models_length_short" else len(body) + 10
            out.head(200, [("Content-Type", "application/json"), ("Content-Length", str(n))])
            out.w.write(body)
            await out.w.drain()
            if case == "models_length_long":
                while await out.r.read(4096):  # held: the 10 bytes never come
                    pass
                raise Closed
        elif case == "models_continue":
            out.w.write(b"HTTP/1.1 100 Continue\r\n\r\n")
            await out.whole(200, body)
        else:
            return False
        return True

    async def tokenize_route(self, req: Request, out: Writer) -> None:
        body = req.json()
        if isinstance(body.get("messages"), list):
            text = " ".join(
                str(m.get("content", "")) for m in body["messages"] if isinstance(m, dict)
            )
        elif isinstance(body.get("prompt"), str):
            text = body["prompt"]
        else:
            await out.whole(400, _error("'prompt' (a string) or 'messages' is required", 400))
            return
        ids = tokenize(text)
        if self.case == "tokenize_huge":
            await out.sized(
                "application/json", [(b'{"tokens":[1', 1), (b",1" * 1000, 10_000), (b"]}", 1)]
            )
            return
        if self.case == "tokenize_wrong":
            ids = ids + ids
        answer = {"count": len(ids), "max_model_len": self._mml(), "tokens": ids}
        await out.whole(200, _dumps(answer))

    # -- /metrics ----------------------------------------------------------------------------

    async def metrics(self, req: Request, out: Writer) -> None:
        self.stats.metrics_reads += 1
        case = self.case
        if case == "usage_double_blind":
            await out.whole(404, _error("no such route", 404))
            return
        if case == "metrics_slow" or (case == "metrics_slow_mid" and self.stats.metrics_reads > 3):
            await asyncio.sleep(self.o.delay)
        if case == "metrics_garbage":
            await out.whole(
                200, b"<html>not {prometheus} at all\n\x00\x01 ??? = = =\n", "text/plain"
            )
            return
        text = self.metrics_text().encode()
        if case == "metrics_bad_chunk":
            await bad_chunk(out, "text/plain; version=0.0.4", text)
            return
        if case == "metrics_timestamps":
            stamp = b" %d" % int(time.time() * 1000)
            text = b"\n".join(
                line + stamp if line and not line.startswith(b"#") else line
                for line in text.split(b"\n")
            )
        if case == "metrics_many_series":
            lines = b"".join(
                b'vllm:num_requests_running{engine="%d",model_name="hostile"} 0.0\n' % i
                for i in range(1, 200_000)
            )
            at = (
                text.index(b"vllm:num_requests_waiting")
                if False
                else text.index(b"# HELP vllm:num_requests_waiting")
            )
            text = text[:at] + lines + text[at:]
        if case == "metrics_huge":
            line = b'hostile_padding_total{i="0000000000"} 1\n'
            block = line * ((1 << 20) // len(line))
            n = max(self.o.size - len(text), 0)
            await out.sized("text/plain; version=0.0.4", [(text, 1), (block, n // len(block) + 1)])
            return
        await out.whole(200, text, "text/plain; version=0.0.4; charset=utf-8")

    def metrics_text(self) -> str:
        case = self.case
        label = 'engine="0",model_name="hostile"'
        if case == "metrics_label_newline":
            label = 'engine="0",model_name="host\nile"'
        running: float = self.running
        waiting: float = 0
        if case == "gauges_busy":
            running += 2
        if case == "gauges_negative":
            running, waiting = -3, -2
        gen: float = self.generated
        if case == "counter_10x":
            gen *= 10
        if case == "counter_restart" and self.restart_at is not None:
            gen -= self.restart_at
        gen_text = {"gen_counter_nan": "NaN", "gen_counter_inf": "+Inf"}.get(case, f"{gen:.1f}")
        size = "0" if case == "kv_string_zero" else str(KV_TOKENS)
        blocks = "0" if case in ("kv_string_zero", "blocks_zero") else str(KV_TOKENS // BLOCK)
        size_label = "" if case == "blocks_zero" else f'kv_cache_size_tokens="{size}",'
        usage = 0.0 if case != "gauges_negative" else -0.5
        return (
            "# HELP vllm:num_requests_running Number of requests in model execution batches.\n"
            "# TYPE vllm:num_requests_running gauge\n"
            f"vllm:num_requests_running{{{label}}} {running:.1f}\n"
            "# HELP vllm:num_requests_waiting Number of requests waiting to be processed.\n"
            "# TYPE vllm:num_requests_waiting gauge\n"
            f"vllm:num_requests_waiting{{{label}}} {waiting:.1f}\n"
            "# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.\n"
            "# TYPE vllm:kv_cache_usage_perc gauge\n"
            f"vllm:kv_cache_usage_perc{{{label}}} {usage}\n"
            "# HELP vllm:generation_tokens_total Number of generation tokens processed.\n"
            "# TYPE vllm:generation_tokens_total counter\n"
            f"vllm:generation_tokens_total{{{label}}} {gen_text}\n"
            "# HELP vllm:prompt_tokens_total Number of prefill tokens processed.\n"
            "# TYPE vllm:prompt_tokens_total counter\n"
            f"vllm:prompt_tokens_total{{{label}}} {float(self.prompted):.1f}\n"
            "# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig\n"
            "# TYPE vllm:cache_config_info gauge\n"
            f'vllm:cache_config_info{{block_size="{BLOCK}",cache_dtype="auto",'
            f'enable_prefix_caching="True",engine="0",{size_label}'
            f'num_gpu_blocks="{blocks}"}} 1.0\n'
        )

    # -- completions -------------------------------------------------------------------------

    async def completions(self, req: Request, out: Writer) -> None:
        body = req.json()
        chat = req.path.endswith("/chat/completions")
        prompt_tokens = _prompt_tokens(body, chat)
        if prompt_tokens is None:
            await out.whole(400, _error("'prompt' must be a string or a list of token ids", 400))
            return
        max_tokens = body.get("max_tokens")
        if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
            max_tokens = 16
        if prompt_tokens + max_tokens > MAX_MODEL_LEN:
            message = (
                f"This model's maximum context length is {MAX_MODEL_LEN} tokens. However, you "
                f"requested {prompt_tokens + max_tokens} tokens."
            )
            await out.whole(400, _error(message, 400))
            return
        n, finish = max_tokens, "length"
        eos_ignored = body.get("ignore_eos") or (body.get("min_tokens") or 0) >= max_tokens
        if not eos_ignored and max_tokens > NO_EOS_TOKENS:
            n, finish = NO_EOS_TOKENS, "stop"
        self.stats.streams += 1
        index = self.stats.streams
        bad = CASES[self.case].stream and index >= self.o.from_request
        if bad:
            self.stats.misbehaved += 1
        if max_tokens >= 32:
            self.decode_requests += 1
        if bad and self.case in ("usage_double", "usage_double_blind"):
            n = max(n // 2, 1)  # its usage says twice: max_tokens at the end
        stream = Stream(self, out, chat, prompt_tokens, n, finish, body, bad)
        self.running += 1
        try:
            if bad and self.case in (
                "key_in_error_body",
                "key_across_cut",
                "esc_in_error_body",
                "key_json_escaped",
                "key_encoded",
            ):
                await out.whole(500, self._error_body())
                return
            if bad and self.case == "html_error_page":
                await out.whole(502, ERROR_PAGE.encode(), "text/html; charset=utf-8")
                return
            if bad and self.case == "stream_html":
                await out.whole(200, HTML, "text/html; charset=utf-8")
                return
            if bad and self.case == "retry_after":
                busy = _error("Too many requests: come back tomorrow", 429)
                await out.whole(429, busy, headers=(("Retry-After", "86400"),))
                return
            if body.get("stream"):
                await stream.run()
            else:
                await stream.whole()
        finally:
            self.running -= 1

    def _error_body(self) -> bytes:
        key = self.o.api_key or "sk-no-key-given"
        if self.case == "key_json_escaped":  # each character of the key as a \\u escape
            escaped = "".join(f"\\u{ord(c):04x}" for c in key)
            return (
                b'{"error":{"message":"invalid api key ' + escaped.encode() + b': try again",'
                b'"type":"InternalServerError","param":null,"code":500}}'
            )
        if self.case == "key_encoded":
            b64, pct = encoded_key(key)
            message = f"bad credentials {b64} (from ?key={pct})"
        elif self.case == "esc_in_error_body":
            message = "engine failure" + INJECTED
        elif self.case == "key_in_error_body":
            message = f"invalid request for api key {key}: try again"
        else:  # key_across_cut: across the message's 200th and 500th characters, the body's 500th
            head = len('{"error":{"message":"')
            message = key_message(key, (195, 495 - head, 495), 600)
        return _error(message, 500)


class Stream:
    """One completion request's answer, well-formed or as the case breaks it."""

    def __init__(
        self,
        server: Hostile,
        out: Writer,
        chat: bool,
        prompt_tokens: int,
        n: int,
        finish: str,
        body: dict[str, Any],
        bad: bool,
    ) -> None:
        self.s = server
        self.out = out
        self.chat = chat
        self.p = prompt_tokens
        self.n = n
        self.finish = finish
        self.bad = bad
        options = body.get("stream_options") or {}
        options = options if isinstance(options, dict) else {}
        self.continuous = bool(options.get("continuous_usage_stats"))
        self.include = bool(options.get("include_usage"))
        self.id = f"cmpl-hostile-{server.stats.streams}"
        self.created = int(time.time())
        self.sent = 0
        #: two_backends: every other stream from a second backend, which names its own model
        second = bad and server.case == "two_backends" and server.stats.streams % 2 == 0
        self.model = f"{MODEL}-backend-b" if second else MODEL

    def usage(self, c: int) -> Any:
        case = self.s.case if self.bad else "good"
        usage: dict[str, Any] = {"prompt_tokens": self.p, "total_tokens": self.p + c}
        count: Any = c
        if case == "tokens_string":
            count = str(c)
        elif case == "tokens_float":
            count = float(c)
        elif case == "tokens_huge":
            count = 1e30
        elif case == "tokens_falling" and c > 4:
            count = 0
        elif case == "count_digits" and c > 2:
            count = DIGITS_MARK
        elif case == "tokens_10x":
            count = 10 * c
        elif case in ("usage_double", "usage_double_blind"):
            count = 2 * c
        elif case == "usage_half":
            count = (c + 1) // 2
        usage["completion_tokens"] = count
        if case == "usage_list":
            return [self.p, c]
        return usage

    def event(self, text: str, finish: str | None, usage: bool, role: bool = False) -> bytes:
        if self.bad and self.s.case == "finish_esc" and finish:
            finish = finish + INJECTED
        if self.bad and self.s.case == "after_finish" and self.sent == 1:
            finish = "length"
        choice: dict[str, Any] = {"index": 0}
        if self.chat:
            choice["delta"] = {"role": "assistant", "content": ""} if role else {"content": text}
        else:
            choice["text"] = text
        choice["logprobs"] = None
        choice["finish_reason"] = finish
        if self.bad and self.s.case == "delta_string":
            choice["delta"] = text or "x"
        obj: dict[str, Any] = {
            "id": self.id,
            "object": "chat.completion.chunk" if self.chat else "text_completion",
            "created": self.created,
            "model": self.model,
            "choices": [choice],
        }
        if self.bad and self.s.case == "choices_object":
            obj["choices"] = choice
        if self.bad and self.s.case == "choices_empty":
            obj["choices"] = []
        if usage:
            obj["usage"] = self.usage(self.sent)
        return b"data: " + _digits(_dumps(obj)) + b"\n\n"

    async def token(self) -> None:
        """Generate one token (its time), counted by the server's counters."""
        await asyncio.sleep(TOKEN_S)
        self.sent += 1
        self.s.generated += 1
        s = self.s
        if (
            s.case == "counter_restart"
            and s.restart_at is None
            and s.decode_requests >= s.o.from_request
            and self.sent == 10
        ):
            s.restart_at = s.generated

    async def run(self) -> None:
        out, case, bad = self.out, self.s.case, self.bad
        if bad and case == "stream_gzip_bomb":
            await self.gzip_bomb()
            return
        out.http10 = bad and case == "http10"
        out.start_stream()
        await out.w.drain()
        if bad and case == "close_after_headers":
            raise Closed
        if bad and case == "stop_at_once":
            await out.chunk(self.event("", "stop", self.continuous))
            await out.chunk(b"data: [DONE]\n\n")
            await out.end_stream()
            return
        if bad and case == "done_only":
            await out.chunk(b"data: [DONE]\n\n")
            await out.end_stream()
            return
        if bad and case == "bom":

            def bom(data: bytes) -> bytes:
                out.transform = None
                return b"\xef\xbb\xbf" + data

            out.transform = bom
        elif bad:
            out.transform = TRANSFORMS.get(case)
        if bad and case == "ping_forever":
            while True:
                await out.chunk(b": ping\n\n")
                await asyncio.sleep(self.s.o.interval)
        await asyncio.sleep(0.002 + self.p * 1e-6)  # prefill
        self.s.prompted += self.p
        if self.chat:
            await out.chunk(self.event("", None, self.continuous, role=True))
        for i in range(self.n):
            await self.token()
            last = i == self.n - 1
            text = f" w{self.sent}"
            if bad and case == "usage_first" and i == 0:
                # the token counted in a chunk of usage alone, its text sent later
                obj = {"id": self.id, "object": "text_completion", "created": self.created,
                       "model": MODEL, "choices": [], "usage": self.usage(self.sent)}  # fmt: skip
                await out.chunk(b"data: " + _dumps(obj) + b"\n\n")
                await asyncio.sleep(ANNOUNCED_S)
            if bad and case == "sse_long_line" and i == 0:
                await self.long_event(text)
                continue
            if bad and case == "not_json" and i == 1:
                await out.chunk(b"data: {this is not json, count: 2\n\n")
                continue
            if bad and case == "json_bomb" and i == 1:
                await out.chunk(b"data: " + b"[" * 100_000 + b"\n\n")
                continue
            if bad and case in ("nul_in_stream", "bad_utf8") and i == 1:
                raw = b"\x00" if case == "nul_in_stream" else b"\xff\xfe\xc3"
                await out.chunk(self.event(text, None, self.continuous).replace(b" w", raw, 1))
                continue
            if bad and case == "event_error" and i == 1:
                await out.chunk(b'event: error\ndata: {"message":"engine failure","code":500}\n\n')
                await out.end_stream()
                return
            if bad and case == "stream_bad_chunk" and i == 2:
                out.w.write(b"zz\r\nnot a chunk\r\n")
                await out.w.drain()
                raise Closed
            if bad and case == "no_finish" and i == min(2, self.n // 2):
                await out.end_stream()
                return
            if bad and case in ("key_in_stream_error", "esc_in_stream_error") and i == 1:
                key = self.s.o.api_key or "sk-no-key-given"
                message = (
                    f"request failed: api key {key} is over its quota"
                    if case == "key_in_stream_error"
                    else "engine failure" + INJECTED
                )
                await out.chunk(b"data: " + _error(message, 500) + b"\n\n")
                await out.chunk(b"data: [DONE]\n\n")
                await out.end_stream()
                return
            await out.chunk(self.event(text, self.finish if last else None, self.continuous))
            if bad and case == "token_trickle":
                nxt = self.event(" next", None, self.continuous)
                for b in range(len(nxt)):
                    await out.chunk(nxt[b : b + 1])
                    await asyncio.sleep(self.s.o.interval)
        if self.include:
            obj = {"id": self.id, "object": "text_completion", "created": self.created,
                   "model": MODEL, "choices": [], "usage": self.usage(self.sent)}  # fmt: skip
            await out.chunk(b"data: " + _dumps(obj) + b"\n\n")
        await out.chunk(b"data: [DONE]\n\n")
        if bad and case == "after_done":  # the same stream again, its counts rising on
            again = []
            for _ in range(self.n):
                self.sent += 1
                again.append(self.event(f" again{self.sent}", None, self.continuous))
            await out.chunk(b"".join(again) + b"data: [DONE]\n\n")
        if bad and case == "done_keep_open":
            while await out.r.read(4096):  # held until the client closes it
                pass
            raise Closed
        await out.end_stream()

    async def gzip_bomb(self) -> None:
        """A gzip-compressed stream (its head says so) of one event 1 GB long."""
        self.out.head(
            200,
            [
                ("Content-Type", "text/event-stream; charset=utf-8"),
                ("Content-Encoding", "gzip"),
                ("Transfer-Encoding", "chunked"),
            ],
        )
        blob = gzip_blob(*BOMB_EVENT)
        for i in range(0, len(blob), 1 << 16):
            await self.out.chunk(blob[i : i + (1 << 16)])
        await self.out.end_stream()

    async def long_event(self, text: str) -> None:
        """One event of ``--size`` bytes: its text is that long, its line end at its end."""
        start = self.event("\x00", None, self.continuous)
        head, tail = start.split(b"\\u0000", 1)
        await self.out.chunk(head + text.encode())
        block = b"a" * (1 << 20)
        for _ in range(max(self.s.o.size // len(block), 1)):
            await self.out.chunk(block)
        await self.out.chunk(tail)

    async def whole(self) -> None:
        for _ in range(self.n):
            await self.token()
        self.s.prompted += self.p
        text = "".join(f" w{i + 1}" for i in range(self.n))
        choice: dict[str, Any] = {"index": 0, "logprobs": None, "finish_reason": self.finish}
        if self.chat:
            choice["message"] = {"role": "assistant", "content": text}
        else:
            choice["text"] = text
        obj = {
            "id": self.id,
            "object": "chat.completion" if self.chat else "text_completion",
            "created": self.created,
            "model": MODEL,
            "choices": [choice],
            "usage": self.usage(self.n),
        }
        await self.out.whole(200, _dumps(obj))


#: the stream cases that change every byte of their SSE (line ends, the data: field, a BOM)
TRANSFORMS: dict[str, Callable[[bytes], bytes]] = {
    "crlf": lambda b: b.replace(b"\n", b"\r\n"),
    "cr_only": lambda b: b.replace(b"\n", b"\r"),
    "data_no_space": lambda b: b.replace(b"data: ", b"data:"),
}


def _error(message: str, code: int) -> bytes:
    kind = {400: "BadRequestError", 401: "AuthenticationError", 404: "NotFoundError"}
    return _dumps(
        {
            "error": {
                "message": message,
                "type": kind.get(code, "InternalServerError"),
                "param": None,
                "code": code,
            }
        }
    )


def _prompt_tokens(body: dict[str, Any], chat: bool) -> int | None:
    if chat:
        messages = body.get("messages")
        if not isinstance(messages, list):
            return None
        return len(
            tokenize(" ".join(str(m.get("content", "")) for m in messages if isinstance(m, dict)))
        )
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        return len(tokenize(prompt))
    if isinstance(prompt, list) and all(isinstance(t, int) for t in prompt):
        return len(prompt)
    return None


async def _read_request(reader: asyncio.StreamReader) -> Request | None:
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
        return None
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ")
    if len(parts) < 2:
        return None
    headers: dict[str, str] = {}
    for line in lines[1:]:
        if ":" in line:
            k, v = line.split(":", 1)
            headers[k.strip().lower()] = v.strip()
    n = int(headers.get("content-length", "0") or 0)
    body = await reader.readexactly(n) if n else b""
    return Request(parts[0], parts[1].split("?", 1)[0], headers, body)


# -- running it ------------------------------------------------------------------------------


async def serve(options: Options, port: int, exit_with_stdin: bool) -> None:
    server = Hostile(options)
    if options.case == "stream_gzip_bomb":  # made before it listens (1-2 s), not in a request
        gzip_blob(*BOMB_EVENT)
    if options.case == "models_gzip_bomb":
        gzip_blob(*MODELS_BOMB)
    limit = 1 << 24  # a request's header block (the prompt is the body)
    main = await asyncio.start_server(server.connection, "127.0.0.1", port, limit=limit)
    server.port = main.sockets[0].getsockname()[1]
    other = None
    if options.case == "redirect_other_port":
        other = await asyncio.start_server(
            lambda r, w: server.connection(r, w, other=True), "127.0.0.1", 0, limit=limit
        )
        server.other_port = other.sockets[0].getsockname()[1]
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    if exit_with_stdin:

        def watch() -> None:
            with contextlib.suppress(Exception):
                while sys.stdin.buffer.read(4096):
                    pass
            loop.call_soon_threadsafe(stop.set)

        threading.Thread(target=watch, daemon=True).start()
    print(
        f"llmspeed-hostile listening on http://127.0.0.1:{server.port} (case {options.case})",
        flush=True,
    )
    await stop.wait()
    main.close()
    if other is not None:
        other.close()


def _stdin_is_pipe() -> bool:
    try:
        return stat.S_ISFIFO(os.fstat(sys.stdin.fileno()).st_mode)
    except (OSError, ValueError):
        return False


def build_parser() -> argparse.ArgumentParser:
    cases = "\n".join(f"  {name}: {c.route}: {c.does}" for name, c in CASES.items())
    parser = argparse.ArgumentParser(
        prog="python -m pytest_llmspeed.sim.hostile",
        description="A small OpenAI-compatible server that misbehaves in one named way "
        "(pytest-llmspeed's hostile-server battery, tests/hostile).",
        epilog=f"cases:\n{cases}",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--case", required=True, choices=list(CASES), metavar="NAME")
    parser.add_argument("--port", type=int, default=0, help="port (default 0: a free one)")
    parser.add_argument("--api-key", default=None, metavar="KEY", help="require it on /v1/*")
    parser.add_argument(
        "--from-request",
        type=int,
        default=1,
        metavar="N",
        help="a stream case misbehaves from the N-th completion request on (counter_restart: "
        "the N-th decode-sized one) (default 1)",
    )
    parser.add_argument(
        "--interval", type=float, default=1.0, metavar="S", help="trickle period (default 1)"
    )
    parser.add_argument(
        "--delay", type=float, default=25.0, metavar="S", help="metrics_slow's delay (default 25)"
    )
    parser.add_argument(
        "--size",
        type=int,
        default=None,
        metavar="BYTES",
        help="size of models_huge (default 100 MB), metrics_huge and sse_long_line (50 MB)",
    )
    parser.add_argument(
        "--exit-with-stdin",
        action="store_true",
        help="stop when standard input closes (the default when stdin is a pipe)",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.case == "serve_fails":
        print(f"hostile: starting with {' '.join(sys.argv)}", flush=True)
        print(f"hostile: error: cannot start, api key {args.api_key} refused", file=sys.stderr)
        return 1
    size = args.size
    if size is None:
        size = 100 * 1024 * 1024 if args.case == "models_huge" else 50 * 1024 * 1024
    options = Options(
        case=args.case,
        api_key=args.api_key,
        from_request=args.from_request,
        interval=args.interval,
        delay=args.delay,
        size=size,
    )
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve(options, args.port, args.exit_with_stdin or _stdin_is_pipe()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
