"""OpenAI-compatible streaming client on aiohttp.

The hot path reads raw bytes with ``iter_any()`` and stamps each read once with
``time.perf_counter()``. JSON is parsed in the hot path only until a stream's first token is
seen (the decode window needs that in real time); everything else is parsed after the cell by
:func:`account_tokens`. What the bytes mean is :mod:`.wire`'s business.
"""

from __future__ import annotations

import asyncio
import math
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from aiohttp.http_exceptions import HttpProcessingError

from .errors import (
    AnswerTooLarge,
    KeyRejected,
    LLMSpeedError,
    MalformedAnswer,
    Redirected,
    RequestRejected,
    ServerUnreachable,
    redact,
)
from .text import Secret, for_person, reveal, secret
from .wire import StreamTally, error_message, loads, parse_stream

#: aiohttp read buffer: large enough for long responses without line-length limits.
READ_BUFSIZE = 4 * 1024 * 1024
#: caps on what a server may send (docs/trust.md): a JSON answer, /metrics, a header line or
#: field, and what is read of an error body
JSON_LIMIT = 4 << 20
METRICS_LIMIT = 16 << 20
HEADER_LIMIT = 64 << 10
ERROR_BODY_LIMIT = 64 << 10
#: a request's total time is bounded by the timeout plus its max_tokens at this rate (tok/s):
#: far below any real server's per-request rate (docs/trust.md)
FLOOR_TOK_S = 1.0
#: a stream ends at its ``[DONE]``; what the server sends after it (its body's end, at once on
#: a well-behaved server) is read off the request's clock for at most this long, so that its
#: connection goes back to the pool, and at most this much of it (docs/trust.md)
DONE_GRACE_S = 0.5
MAX_AFTER_DONE = 64 << 10
_MAX_TOKENS = re.compile(rb'"max_tokens":\s*(\d{1,9})')
#: a request body that offers tools (``--llm-tools``), looked for in its last bytes, where a
#: body the plugin encodes has its fields (core/prompts.py, ``Prompt.encode``)
_TOOL_CHOICE = b'"tool_choice"'
_FIELDS_TAIL = 4096
#: answers are asked for, and read, uncompressed: aiohttp inflates a whole read at once before
#: any cap can look at it (64 KB of gzip is 64 MB), so a compressed answer is refused instead
#: (:func:`refuse_encoding`)
UNCOMPRESSED: dict[str, Any] = {
    "auto_decompress": False,
    "headers": {"Accept-Encoding": "identity"},
}
#: seconds an idle pooled connection is kept (below uvicorn's 5 s keep-alive timeout)
KEEPALIVE_S = 4.0


class FreshConnections:
    """A session whose every request opens a new connection, made on first use."""

    def __init__(self) -> None:
        self._session: aiohttp.ClientSession | None = None

    def session(self, timeout: aiohttp.ClientTimeout) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=0, force_close=True),
                timeout=timeout,
                read_bufsize=READ_BUFSIZE,
                **UNCOMPRESSED,
                max_line_size=HEADER_LIMIT,
                max_field_size=HEADER_LIMIT,
            )
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


@dataclass
class Connection:
    """One server endpoint with one pooled aiohttp session, bound to the running loop."""

    base_url: str
    api_key: Secret | None  # its repr is <redacted>: revealed only in the header
    timeout: float
    session: aiohttp.ClientSession
    #: for a request whose pooled connection was found closed: a new connection each time
    #: (shared, like ``session``, by the connections of one set of replicas)
    fresh: FreshConnections = field(default_factory=lambda: FreshConnections())
    #: streams that ended at ``[DONE]`` before the server ended them, read to their end off
    #: any request's clock (:meth:`after_done`)
    drains: set[asyncio.Task[None]] = field(default_factory=set)
    #: streams the server held open for DONE_GRACE_S after their ``[DONE]`` (then closed)
    held_open: int = 0
    #: a cell's notes said so (once a run: :func:`~.protocol.wire_notes`)
    held_open_said: bool = False

    @classmethod
    def open(cls, base_url: str, api_key: str | Secret | None, timeout: float) -> Connection:
        """Create inside the event loop that will use it."""
        # Idle pooled connections are dropped after KEEPALIVE_S, before the server's own
        # keep-alive timeout (uvicorn, under vLLM and SGLang: 5 s) closes them under a request.
        connector = aiohttp.TCPConnector(
            limit=0, force_close=False, enable_cleanup_closed=True, keepalive_timeout=KEEPALIVE_S
        )
        session = aiohttp.ClientSession(
            connector=connector,
            timeout=aiohttp.ClientTimeout(total=None, connect=timeout, sock_read=timeout),
            read_bufsize=READ_BUFSIZE,
            **UNCOMPRESSED,
            max_line_size=HEADER_LIMIT,
            max_field_size=HEADER_LIMIT,
        )
        return cls(base_url.rstrip("/"), secret(api_key), timeout, session)

    @property
    def headers(self) -> dict[str, str]:
        key = reveal(self.api_key)
        return {"Authorization": f"Bearer {key}"} if key else {}

    def url(self, path: str) -> str:
        return f"{self.base_url}{path}"

    async def close(self) -> None:
        await self.end_drains()
        await self.session.close()
        await self.fresh.close()

    async def end_drains(self) -> None:
        """Stop reading the bodies after ``[DONE]`` still being read (:meth:`after_done`)."""
        for task in list(self.drains):
            task.cancel()
        await asyncio.gather(*self.drains, return_exceptions=True)

    def after_done(self, resp: aiohttp.ClientResponse) -> None:
        """A stream ended at its ``[DONE]`` (the request is over) before the server ended its
        body: the rest is read off any request's clock, so that a server that ends it at once
        gives its connection back to the pool; one that holds it open for DONE_GRACE_S is
        closed then and counted (``held_open``)."""
        task = asyncio.get_running_loop().create_task(self._drain(resp))
        self.drains.add(task)
        task.add_done_callback(self.drains.discard)

    async def _drain(self, resp: aiohttp.ClientResponse) -> None:
        read = 0
        try:
            async with asyncio.timeout(DONE_GRACE_S):
                while data := await resp.content.readany():
                    read += len(data)  # not looked at: nothing after [DONE] is read
                    if read > MAX_AFTER_DONE:
                        raise TimeoutError
            resp.release()  # ended: the connection goes back to the pool
        except TimeoutError:
            self.held_open += 1
            resp.close()
        except asyncio.CancelledError:
            resp.close()
            raise
        except (aiohttp.ClientError, HttpProcessingError, OSError):
            resp.close()

    async def warm_pool(self, n: int) -> None:
        """Open ``n`` pooled keep-alive connections, so that starting n streams at once
        writes n requests at once instead of first opening n TCP connections (which would
        count in the TTFT of streams already started)."""

        async def one() -> None:
            # HEAD: no body whatever the server answers (a 405 keeps the connection too), so a
            # large /v1/models is read once a run (the probe), not once a stream
            try:
                async with asyncio.timeout(self.timeout):
                    async with self.session.head(
                        self.url("/v1/models"), headers=self.headers, allow_redirects=False
                    ) as r:
                        await r.release()
            except (TimeoutError, aiohttp.ClientError, OSError):
                pass

        await asyncio.gather(*(one() for _ in range(n)))

    async def send(self, method: str, path: str, **kwargs: Any) -> aiohttp.ClientResponse:
        """Send a request; returns once the response headers are in (use it as ``async with``).

        A pooled keep-alive connection the server closed while it sat idle fails at once
        (disconnected, or "Can not write request body"): the request is sent again, once, on a
        new connection — never another pooled one, which may be just as stale (on real vLLM
        beside other work, 1 request in 11 at c4 failed twice that way when the retry took
        the pool's next connection). Nothing reached the server, so this is not a retry of a
        request the server saw; a refused connection (server down) is not retried."""
        kwargs["allow_redirects"] = False  # never followed (docs/trust.md)
        try:
            return await self.session.request(method, self.url(path), **kwargs)
        except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError) as exc:
            if isinstance(exc, aiohttp.ClientConnectorError):
                raise
        fresh = self.fresh.session(self.session.timeout)
        return await fresh.request(method, self.url(path), **kwargs)

    async def get(self, path: str, limit: int = JSON_LIMIT) -> tuple[int, str]:
        """GET a path; returns (status, body text), the whole answer within the timeout and
        at most ``limit`` bytes. Connection problems and a slow answer → ServerUnreachable;
        a redirect → Redirected; a body or header over its cap → AnswerTooLarge."""
        answered = False
        try:
            async with asyncio.timeout(self.timeout):
                async with await self.send("GET", path, headers=self.headers) as resp:
                    answered = True
                    self.refuse_redirect(resp, path)
                    cap = limit if resp.status == 200 else ERROR_BODY_LIMIT
                    return resp.status, await read_body(resp, path, cap)
        except TimeoutError as exc:
            raise (self._slow(path) if answered else self._unreachable(exc)) from None
        except aiohttp.ClientResponseError as exc:
            raise self._bad_head(path, exc) from None
        except (aiohttp.ClientPayloadError, HttpProcessingError) as exc:  # a body cut short,
            raise self._bad_body(path, exc) from None  # a chunk or gzip not valid
        except (aiohttp.ClientConnectionError, OSError) as exc:
            raise self._unreachable(exc) from None

    async def post_json(
        self, path: str, payload: dict[str, Any], purpose: str | None = None
    ) -> dict[str, Any]:
        """POST JSON, return the JSON object answered (within the timeout, at most
        JSON_LIMIT bytes); HTTP errors → RequestRejected / KeyRejected, whose message names
        the URL and ``purpose`` (what the request was for); an answer that is not a JSON
        object → MalformedAnswer."""
        answered = False
        try:
            async with asyncio.timeout(self.timeout):
                async with await self.send(
                    "POST", path, json=payload, headers=self.headers
                ) as resp:
                    answered = True
                    self.refuse_redirect(resp, path)
                    cap = JSON_LIMIT if resp.status == 200 else ERROR_BODY_LIMIT
                    body = await read_body(resp, path, cap)
                    if resp.status != 200:
                        raise self.http_error(resp.status, body, path, purpose)
        except TimeoutError as exc:
            raise (self._slow(path) if answered else self._unreachable(exc)) from None
        except aiohttp.ClientResponseError as exc:
            raise self._bad_head(path, exc) from None
        except (aiohttp.ClientPayloadError, HttpProcessingError) as exc:  # a body cut short,
            raise self._bad_body(path, exc) from None  # a chunk or gzip not valid
        except (aiohttp.ClientConnectionError, OSError) as exc:
            raise self._unreachable(exc) from None
        try:
            answer = loads(body)
        except ValueError:
            raise MalformedAnswer(path, "did not answer JSON") from None
        if not isinstance(answer, dict):
            raise MalformedAnswer(path, f"answered {type(answer).__name__}, not a JSON object")
        return answer

    def refuse_redirect(self, resp: aiohttp.ClientResponse, path: str) -> None:
        """A redirect is never followed: one line naming where it pointed."""
        if 300 <= resp.status < 400:
            where = for_person(resp.headers.get("Location", "(no Location header)"), 120)
            raise Redirected(
                f"{self.base_url}{path} answered HTTP {resp.status}, a redirect to {where}: "
                "redirects are not followed; point the endpoint at the server itself"
            )

    def _slow(self, path: str) -> ServerUnreachable:
        return ServerUnreachable(
            f"{self.base_url}{path} did not send its whole answer within {self.timeout:g} s "
            "(a stalled or trickling server)",
            setting="timeout",
        )

    def _bad_head(self, path: str, exc: aiohttp.ClientResponseError) -> MalformedAnswer:
        """aiohttp's refusal of a response's head: a header over HEADER_LIMIT, or a head
        that is not HTTP."""
        what = for_person(exc.message or type(exc).__name__, 120)
        if "Got more than" in what or "too long" in what.lower():
            return AnswerTooLarge(
                path, f"sent a response header larger than {HEADER_LIMIT >> 10} KiB"
            )
        return MalformedAnswer(path, f"sent a response that is not valid HTTP ({what})")

    def _bad_body(self, path: str, exc: Exception) -> MalformedAnswer:
        """aiohttp's refusal of a response's body: cut short, a chunk size or a compression
        that is not valid."""
        what = for_person(str(exc) or type(exc).__name__, 120, self.api_key)
        return MalformedAnswer(path, f"sent a body that is not valid HTTP ({what})")

    def _unreachable(self, exc: BaseException) -> ServerUnreachable:
        if isinstance(exc, asyncio.TimeoutError):
            return ServerUnreachable(
                redact(
                    f"cannot reach the LLM server at {self.base_url}: no answer within "
                    f"{self.timeout:g} s",
                    self.api_key,
                ),
                setting="timeout",
            )
        if isinstance(exc, aiohttp.ClientConnectorCertificateError):
            why = for_person(getattr(exc.certificate_error, "verify_message", "") or "", 120)
            return ServerUnreachable(
                redact(
                    f"the LLM server at {self.base_url} shows a TLS certificate this machine "
                    f"does not trust ({why or 'not verified'}): for a private certificate "
                    "authority, point SSL_CERT_FILE at its certificates (PEM) and run again",
                    self.api_key,
                )
            )
        what = str(exc) or type(exc).__name__
        return ServerUnreachable(
            redact(f"cannot reach the LLM server at {self.base_url}: {what}", self.api_key)
        )

    def http_error(
        self, status: int, body: str, path: str | None = None, purpose: str | None = None
    ) -> LLMSpeedError:
        """The typed error of an HTTP error answer (the key, if echoed, redacted)."""
        message = error_message(redact(body, self.api_key))  # redacted before any cut
        if status == 401 or status == 403:
            return KeyRejected(f"API key rejected by {self.base_url} (HTTP {status}: {message})")
        return RequestRejected(status, message, self.url(path) if path else None, purpose)


def size_words(n: int) -> str:
    """A cap in words: ``4 MiB``, ``64 KiB``."""
    return f"{n >> 20} MiB" if n >= 1 << 20 else f"{n >> 10} KiB"


def refuse_encoding(resp: aiohttp.ClientResponse, route: str) -> None:
    """An answer compressed though the request asked for ``identity``: MalformedAnswer."""
    encoding = resp.headers.get("Content-Encoding", "").strip().lower()
    if encoding and encoding != "identity":
        raise MalformedAnswer(
            route,
            f"answered Content-Encoding {for_person(encoding, 40)}, though the request asked "
            "for identity: a compressed answer is not read",
        )


async def read_body(
    resp: aiohttp.ClientResponse, route: str, limit: int, truncate: bool = False
) -> str:
    """A response's body, at most ``limit`` bytes: past it AnswerTooLarge (or, with
    ``truncate``, the first ``limit`` bytes: an error body). Decoded as UTF-8, bad bytes
    replaced. A compressed body is refused (MalformedAnswer; an error body says so)."""
    try:
        refuse_encoding(resp, route)
    except MalformedAnswer as exc:
        if not truncate:
            raise
        return f"(a body not read: {exc.what})"
    length = resp.content_length
    if length is not None and length > limit and not truncate:
        raise AnswerTooLarge(route, f"answered {length:,} bytes, over its {size_words(limit)} cap")
    parts: list[bytes] = []
    size = 0
    async for chunk in resp.content.iter_chunked(64 << 10):
        size += len(chunk)
        if size > limit:
            if truncate:
                parts.append(chunk[: len(chunk) - (size - limit)])
                break
            raise AnswerTooLarge(route, f"answered more than its {size_words(limit)} cap")
        parts.append(chunk)
    return b"".join(parts).decode("utf-8", "replace")


class Stop:
    """When a cell's streams stop reading (``time.perf_counter``; infinity until set): shared
    by the streams of one cell, so that a stream whose reads wait in a busy event loop stops
    at its first read past the time, not when its task is cancelled."""

    __slots__ = ("at",)

    def __init__(self) -> None:
        self.at = [math.inf]  # a list, so a stream holds the same cell as the window

    def set(self, t: float) -> None:
        self.at[0] = min(self.at[0], t)


@dataclass
class StreamRecord:
    """What one streamed request saw: its events counted as they arrived (``tally``), then the
    parsed accounting. The raw reads are kept only when asked (``keep_reads``: tests that
    compare the wire with a server's record); a record made from recorded ``reads`` is counted
    from them by :func:`account_tokens`."""

    t_send: float = 0.0
    reads: list[tuple[float, bytes]] = field(default_factory=list)
    t_first: float | None = None  # first chunk carrying an output token (real time)
    t_end: float | None = None  # stream finished, failed or was cancelled
    status: int | None = None
    error: str | None = None
    cancelled: bool = False
    error_setting: str | None = None  # the setting that may fix the error ("timeout")
    replica: int = 0  # which replica served it (core/replicas.py), 0 with one server
    keep_reads: bool = False
    tally: StreamTally = field(default_factory=StreamTally, repr=False)
    # filled by account_tokens():
    token_times: Sequence[float] = field(default_factory=list)  # per token-carrying chunk
    token_counts: Sequence[int] = field(default_factory=list)
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    finish_reason: str | None = None
    usage_per_chunk: bool = True
    count_method: str | None = None  # USAGE, FINAL_USAGE, MAX_TOKENS, RATIO; None: unknown
    tokenized: int | None = None  # tokens of the text received, by the server's tokenizer
    finished: bool = False  # the stream ended normally ([DONE] or a finish_reason)
    #: reasoning and answer (docs/metrics.md, "Reasoning and answer"): the first answer text
    #: or tool call's arrival; the tokens of each (None: the stream sent no reasoning), and
    #: how they were told apart (REASONING_SERVER, REASONING_STREAM, REASONING_ESTIMATE)
    t_answer: float | None = None
    reasoning_tokens: int | None = None
    answer_tokens: int | None = None
    reasoning_from: str | None = None
    tool_call_deltas: int = 0  # choices[].delta.tool_calls entries received

    @property
    def n_tokens(self) -> int:
        return sum(self.token_counts)

    @property
    def chunks(self) -> int:
        """Token-carrying chunks received (``token_times`` may hold one entry a read, where
        the chunks of a read were counted together)."""
        return self.tally.token_chunks if self.count_method == USAGE else len(self.token_counts)


#: how a request's tokens were counted, best first (docs/metrics.md, "Token accounting")
USAGE = "usage"  # continuous usage: every chunk's tokens, exact
FINAL_USAGE = "final-usage"  # the stream's final usage: the total exact, spread over chunks
MAX_TOKENS = "max-tokens"  # no usage, finish_reason length at max_tokens: exact, spread
RATIO = "ratio"  # cut at the window's end: the cell's tokens per chunk (an estimate)
TOKENIZE = "tokenize"  # cut, no request finished: the server's tokenizer on the text received
CHUNK_COUNT = "chunk-count"  # nothing better: one token per chunk (an estimate)
EXACT = (USAGE, FINAL_USAGE, MAX_TOKENS)

#: how a request's reasoning tokens were told from its answer's, best first
REASONING_SERVER = "server"  # usage.completion_tokens_details.reasoning_tokens: exact
REASONING_STREAM = "stream"  # each chunk's usage rise, by the text it carried: exact
#: a chunk carried both (its tokens counted as answer), or no usage on every chunk (the total
#: shared by the chunks of each kind)
REASONING_ESTIMATE = "estimate"
REASONING_ORDER = (REASONING_SERVER, REASONING_STREAM, REASONING_ESTIMATE)


def split_reasoning(rec: StreamRecord) -> None:
    """The request's reasoning and answer tokens, from its counted stream: the server's
    ``reasoning_tokens`` where it sent them, else the stream's usage rises by the text each
    chunk carried, else its total shared by the chunks of each kind. None where the stream
    carried no reasoning (no reasoning text, no reasoning_tokens above 0)."""
    tally = rec.tally
    rec.t_answer = tally.answer_time
    rec.tool_call_deltas = tally.tool_deltas
    details = tally.details_reasoning
    if not tally.reasoning_chunks and not tally.mixed_chunks and not details:
        rec.reasoning_tokens = rec.answer_tokens = rec.reasoning_from = None
        return
    total = rec.n_tokens
    if details is not None and rec.completion_tokens is not None:
        reasoning, how = details, REASONING_SERVER
        total = rec.completion_tokens
    elif rec.count_method == USAGE:
        reasoning = tally.reasoning_rise
        how = REASONING_ESTIMATE if tally.mixed_chunks else REASONING_STREAM
    else:
        chunks = len(tally.text_times) or 1
        reasoning = min(round(total * tally.reasoning_chunks / chunks), total)
        how = REASONING_ESTIMATE
    rec.reasoning_tokens, rec.answer_tokens = reasoning, max(total - reasoning, 0)
    rec.reasoning_from = how


def spread(total: int, chunks: int) -> list[int]:
    """``total`` tokens over ``chunks`` chunks as evenly as whole tokens allow (the remainder
    one each to the last chunks, so a stream's first chunk carries its smallest share)."""
    if chunks <= 0:
        return []
    base, extra = divmod(max(total, 0), chunks)
    return [base + (1 if i >= chunks - extra else 0) for i in range(chunks)]


def account_tokens(rec: StreamRecord, max_tokens: int | None = None) -> StreamRecord:
    """The stream's counted events as tokens per chunk, the best way the stream allows.

    - continuous usage (``usage.completion_tokens`` on every chunk): its rise, exact;
    - usage only at the end: that total, exact, spread over the non-empty chunks;
    - no usage, but ``finish_reason: length`` and the ``max_tokens`` asked: ``max_tokens``,
      exact, spread over the chunks;
    - otherwise (cut at the window's end, or no usage and an early end): one token per chunk
      for now, ``count_method = None``; the decode cell replaces it with its finished
      requests' tokens-per-chunk ratio where it can (``chunk-count`` where it cannot).
    """
    parsed = rec.tally
    if rec.reads and not parsed.fed:  # made from recorded reads
        parsed = rec.tally = parse_stream(rec.reads, chat=rec.tally.chat)
    else:
        parsed.close(cut=rec.cancelled)
    if parsed.error is not None:
        rec.error = rec.error or f"error event: {parsed.error}"
    if parsed.broken is not None and not rec.error:  # a stream cut at the window's end too
        broken = parsed.broken
        rec.error = for_person(f"{broken.field + ' ' if broken.field else ''}{broken.what}", 300)
    if parsed.finish_reason is not None:
        rec.finish_reason = parsed.finish_reason
    # transformers serve ends its streams with a finish_reason but without [DONE]
    rec.finished = rec.finished or parsed.done or parsed.finish_reason is not None
    if parsed.prompt_tokens is not None:
        rec.prompt_tokens = parsed.prompt_tokens
    if parsed.completion_tokens is not None:
        rec.completion_tokens = parsed.completion_tokens
    if parsed.usage_per_chunk:
        rec.usage_per_chunk = True
        rec.count_method = USAGE
        rec.token_times, rec.token_counts = parsed.usage_times, parsed.usage_counts
    else:
        rec.usage_per_chunk = False
        total: int | None = None
        if rec.completion_tokens is not None:
            total, rec.count_method = rec.completion_tokens, FINAL_USAGE
        elif rec.finish_reason == "length" and max_tokens is not None and not rec.error:
            total, rec.count_method = max_tokens, MAX_TOKENS
        else:
            rec.count_method = None
        rec.token_times = parsed.text_times
        if total is not None and parsed.text_times:
            rec.token_counts = spread(total, len(parsed.text_times))
        else:
            rec.token_counts = [1] * len(parsed.text_times)
    if rec.token_times:
        rec.t_first = rec.token_times[0]
    split_reasoning(rec)
    return rec


async def stream_request(
    conn: Connection,
    path: str,
    payload: dict[str, Any] | bytes,
    rec: StreamRecord | None = None,
    on_first_token: Callable[[StreamRecord], None] | None = None,
    stop: Stop | None = None,
) -> StreamRecord:
    """Send one streaming request and count every read at its arrival time (``rec.tally``).

    Never raises for server-side problems: they end up in ``rec.error``. Cancellation
    (the decode window closing) marks ``rec.cancelled`` and re-raises; so does a read that
    arrives at or after ``stop``'s time (the stream ends there, its read not counted).
    """
    rec = rec or StreamRecord()
    if isinstance(payload, bytes):
        kwargs: dict[str, Any] = {
            "data": payload,
            "headers": {**conn.headers, "Content-Type": "application/json"},
        }
        asked = _MAX_TOKENS.search(payload)
        max_tokens = int(asked.group(1)) if asked else None
        tools = _TOOL_CHOICE in payload[-_FIELDS_TAIL:]  # the fields follow the prompt
    else:
        kwargs = {"json": payload, "headers": conn.headers}
        value = payload.get("max_tokens")
        max_tokens = value if isinstance(value, int) else None
        tools = "tool_choice" in payload
    tally = rec.tally
    tally.chat = path.endswith("/chat/completions")
    tally.tools = tally.chat and tools
    if max_tokens is not None and max_tokens > 0:
        tally.limit = min(tally.limit, max_tokens)  # a count above it is not a count
    reads = rec.reads if rec.keep_reads else None
    clock = time.perf_counter
    stop_at = stop.at if stop is not None else None
    watch: Watchdog | None = None
    try:
        rec.t_send = clock()
        async with asyncio.timeout(None) as bound:
            watch = Watchdog(tally, rec.t_send, conn.timeout, max_tokens, bound)
            async with _Answer(await conn.send("POST", path, **kwargs), conn) as answer:
                resp = answer.resp
                rec.status = resp.status
                if resp.status != 200:
                    conn.refuse_redirect(resp, path)
                    body = await read_body(resp, path, ERROR_BODY_LIMIT, truncate=True)
                    err = conn.http_error(resp.status, body, path)
                    if isinstance(err, KeyRejected):
                        raise err
                    rec.error = str(err)
                    rec.t_end = clock()  # answered: out of flight (not open to the window's end)
                    return rec
                ctype = resp.headers.get("Content-Type", "")
                refuse_encoding(resp, path)
                try:
                    async for data in resp.content.iter_any():
                        t = clock()
                        if stop_at is not None and t >= stop_at[0]:
                            # the window closed: what comes now is read by nobody (the connection
                            # is closed with the response), even when the loop is behind
                            rec.cancelled = True
                            break
                        if reads is not None:
                            reads.append((t, data))
                        if tally.feed(t, data) and rec.t_first is None:
                            rec.t_first = t
                            if on_first_token is not None:
                                on_first_token(rec)
                        if tally.done:
                            # [DONE] ends the request at once, whether or not the server ends
                            # its body: a body not ended yet is read to its end off the
                            # request's clock (Connection.after_done)
                            rec.t_end = t
                            answer.ended_at_done = not resp.content.at_eof()
                            break
                except (asyncio.CancelledError, TimeoutError):
                    if _connection_gone(resp):  # aiohttp reads nothing more of it: say why
                        rec.error = f"{path}: {GONE}"
                    raise
                if not rec.cancelled:
                    tally.close()
                    if tally.finish_reason is None and tally.broken is None:
                        # the server closed the stream before its end, or ended it with no
                        # token and no finish: a failed request, not one that ended early (an
                        # HTML page answered with 200 ends so too); an error event that ended
                        # it so is its reason. One followed by [DONE] is the request's error
                        # once counted (account_tokens): the request was accepted
                        if tally.error is not None:
                            if not tally.done:
                                rec.error = f"{path}: error event: {tally.error}"
                        elif not tally.done or not tally.seen_token:
                            rec.error = f"{path}: {_cut_short(ctype, tally.done)}"
    except asyncio.CancelledError:
        rec.cancelled = True
        rec.t_end = clock()
        raise
    except KeyRejected:
        raise
    except TimeoutError:
        if not rec.error:
            rec.error = (
                watch.why
                if watch is not None and watch.why
                else f"no data for {conn.timeout:g} s (stalled stream)"
            )
            rec.error_setting = "timeout"
    except MalformedAnswer as exc:  # the stream broke the protocol: a failed request
        rec.error = f"{path}: {exc.field + ' ' if exc.field else ''}{exc.what}"
    except Redirected as exc:
        rec.error = str(exc)
    except aiohttp.ClientResponseError as exc:  # a header over its cap, a head not HTTP
        rec.error = str(conn._bad_head(path, exc))
    except (aiohttp.ClientPayloadError, HttpProcessingError) as exc:
        rec.error = f"stream broken: {exc}"
    except (aiohttp.ClientConnectionError, OSError) as exc:
        rec.error = f"connection failed: {exc}"
    finally:
        if watch is not None:
            watch.cancel()
    if not tally.done or rec.t_end is None:
        rec.t_end = clock()
    tally.close(cut=rec.cancelled)  # its text goes, where its total is exact
    if tally.broken is not None and not rec.error:
        broken = tally.broken
        rec.error = f"{path}: {broken.field + ' ' if broken.field else ''}{broken.what}"
    if tally.error is not None:  # an error event: redacted before it is cut, made printable
        tally.error = for_person(tally.error, 300, conn.api_key)
    if rec.error:
        rec.error = for_person(rec.error, 300, conn.api_key)
    return rec


#: a stream whose connection aiohttp closed under it without a word (its C parser, on a chunk
#: size that is not hex, drops the connection and leaves the read waiting)
GONE = (
    "the connection broke mid-stream (a chunked encoding or compression that is not valid "
    "HTTP): nothing more could be read"
)


def _connection_gone(resp: aiohttp.ClientResponse) -> bool:
    """The response's connection is gone while its body was being read."""
    conn = resp.connection
    return conn is not None and conn.transport is None


def _cut_short(ctype: str, done: bool = False) -> str:
    """Why a stream that ended without its end is a failed request, in words."""
    if done:
        return "the stream ended (data: [DONE]) with no output token and no finish_reason"
    what = "the stream ended without a finish_reason or data: [DONE]"
    if "event-stream" in ctype:
        return f"{what} (cut short)"
    return f"{what}: it answered {for_person(ctype or 'no Content-Type', 60)}, not an event stream"


class _Answer:
    """A streamed answer as ``async with`` holds it: released at the end (its connection back
    to the pool, or closed where its body was not read to its end), or, where its stream ended
    at ``[DONE]`` before the body did, handed to :meth:`Connection.after_done`."""

    __slots__ = ("conn", "ended_at_done", "resp")

    def __init__(self, resp: aiohttp.ClientResponse, conn: Connection) -> None:
        self.resp, self.conn = resp, conn
        self.ended_at_done = False

    async def __aenter__(self) -> _Answer:
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self.ended_at_done and exc[0] is None:
            self.conn.after_done(self.resp)
            return
        self.resp.release()
        await self.resp.wait_for_close()


class Watchdog:
    """The time bounds of one stream (docs/trust.md): its first token within the timeout of
    its send, each gap between tokens within the timeout, and the whole request within the
    timeout plus its max_tokens at FLOOR_TOK_S. A token is an event with output or a rise of
    its usage: comments, keep-alives and whitespace do not count. It wakes when a bound is
    due, never once a read, and expires the request's ``asyncio.timeout``; ``why`` says
    which bound it was."""

    __slots__ = ("bound", "handle", "loop", "t_send", "tally", "timeout", "total", "why")

    def __init__(
        self,
        tally: StreamTally,
        t_send: float,
        timeout: float,
        max_tokens: int | None,
        bound: asyncio.Timeout,
    ) -> None:
        self.tally, self.t_send, self.timeout, self.bound = tally, t_send, timeout, bound
        self.total = timeout + (max_tokens if max_tokens is not None else 4096) / FLOOR_TOK_S
        self.why: str | None = None
        self.loop = asyncio.get_running_loop()
        self.handle: asyncio.TimerHandle | None = self.loop.call_later(timeout, self.check)

    def last_token(self) -> float | None:
        tally = self.tally
        last = tally.usage_times[-1] if tally.usage_times else None
        if tally.text_times and (last is None or tally.text_times[-1] > last):
            last = tally.text_times[-1]
        return last

    def check(self) -> None:
        now = time.perf_counter()
        last = self.last_token()
        if last is None:
            due = self.t_send + self.timeout
            why = f"no first token within {self.timeout:g} s of the request (a stalled stream)"
        else:
            due = last + self.timeout
            why = (
                f"no token for {self.timeout:g} s after the last one (a stalled stream; "
                "comments and keep-alives are not tokens)"
            )
        if self.t_send + self.total < due:
            due = self.t_send + self.total
            why = (
                f"not finished within {self.total:g} s (the timeout plus max_tokens at "
                f"{FLOOR_TOK_S:g} tok/s)"
            )
        if now >= due - 1e-3:
            self.expire(why)
        else:
            self.handle = self.loop.call_later(due - now, self.check)

    def expire(self, why: str) -> None:
        self.handle = None
        self.why = why
        self.bound.reschedule(self.loop.time())

    def cancel(self) -> None:
        if self.handle is not None:
            self.handle.cancel()
            self.handle = None
