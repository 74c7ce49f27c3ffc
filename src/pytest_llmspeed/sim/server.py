"""The simulator's HTTP side: vLLM-shaped routes on ``aiohttp.web`` around an :class:`EngineCore`.

One asyncio task runs the engine's steps. At the end of a step every stream's SSE chunk is built
from pre-escaped token texts and written straight to its transport in one pass (chunked
transfer framing done here), so a slow client never blocks the step loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import time
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from time import perf_counter
from typing import Any

import numpy as np
from aiohttp import web

from . import SimOptions, parse_quirks
from .engine import Drift, EngineCore, SimRequest, parse_slower, start_factor
from .faults import FaultSpec, parse_faults
from .profiles import Profile, get_profile
from .tokenizer import BYTE_BASE, EOS_ID, Tokenizer

TRACE_LIMIT = 20000
TEXT_TABLE_SIZE = 1 << 16
#: how far behind its schedule the engine loop may fall and still catch up (steps run back to
#: back until on time); beyond it the simulator's own CPU is the bottleneck and it re-bases.
#: 50 ms lost whatever a busy machine's scheduler took: beside three busy loops a c4 cell at
#: speed 4 measured 27 % of its throughput and a gate test took it for the baseline
LAG_RESET_S = 1.0
FIRST_TOKEN_SPIN_S = 0.002
BIG_TEXT_CHARS = 100_000
BIG_BODY_BYTES = 16_384
_BYTE_PAIR_CHARS = "éèüöäßñçøåœ"

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class ApiError(Exception):
    """An error answered in vLLM's / OpenAI's shape."""

    def __init__(self, status: int, message: str, err_type: str, param: str | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.err_type = err_type
        self.param = param

    def body(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": self.err_type,
                "param": self.param,
                "code": self.status,
            }
        }

    def response(self) -> web.Response:
        return web.json_response(self.body(), status=self.status)


def _bad(message: str, param: str | None = None) -> ApiError:
    return ApiError(400, message, "BadRequestError", param)


class TextTable:
    """A seeded cyclic stream of output tokens: JSON-escaped text, raw text."""

    def __init__(self, tokenizer: Tokenizer, profile: Profile, seed: int) -> None:
        rng = np.random.default_rng([seed, 2])
        words = tokenizer.word_ids
        punct = [tokenizer.encode(s)[0] for s in (".", ",", "\n\n", "!", "?")]
        raw: list[str] = []
        ids: list[int] = []
        picks = rng.integers(0, len(words), TEXT_TABLE_SIZE).tolist()
        kinds = rng.random(TEXT_TABLE_SIZE).tolist()
        chars = rng.integers(0, len(_BYTE_PAIR_CHARS), TEXT_TABLE_SIZE).tolist()
        i = 0
        while len(raw) < TEXT_TABLE_SIZE:
            u = kinds[i]
            if u < profile.byte_pair_probability and len(raw) < TEXT_TABLE_SIZE - 1:
                ch = _BYTE_PAIR_CHARS[chars[i]]
                b = ch.encode("utf-8")
                raw += ["", ch]
                ids += [BYTE_BASE + b[0], BYTE_BASE + b[1]]
            elif u > 0.95:
                tid = punct[picks[i] % len(punct)]
                raw.append(tokenizer.token_str(tid))
                ids.append(tid)
            else:
                tid = words[picks[i]]
                raw.append(tokenizer.token_str(tid))
                ids.append(tid)
            i += 1
        esc = [json.dumps(t, ensure_ascii=False)[1:-1] for t in raw]
        self.raw2 = raw + raw
        self.esc2 = esc + esc
        self.ids = ids

    @staticmethod
    def _join(table: list[str], start: int, n: int) -> str:
        if n <= 0:
            return ""
        start %= TEXT_TABLE_SIZE
        if n <= TEXT_TABLE_SIZE:
            return "".join(table[start : start + n])
        parts = []
        while n > 0:
            k = min(n, TEXT_TABLE_SIZE)
            parts.append("".join(table[start : start + k]))
            n -= k
        return "".join(parts)

    def esc(self, start: int, n: int) -> str:
        return self._join(self.esc2, start, n)

    def raw(self, start: int, n: int) -> str:
        return self._join(self.raw2, start, n)

    def ids_at(self, start: int, n: int) -> list[int]:
        """The token ids of ``n`` output tokens from ``start`` (the text's own ids)."""
        return [self.ids[(start + i) % TEXT_TABLE_SIZE] for i in range(max(n, 0))]


def prompt_hash(ids: Sequence[int]) -> str:
    """A fingerprint of a prompt's token ids for the trace (equal prompts, equal hashes)."""
    return f"{hash(tuple(ids)) & 0xFFFFFFFFFFFFFFFF:016x}"


@dataclass
class Rejected:
    """A request answered with an injected error before any output (kept for the trace)."""

    rid: str
    arrival: float
    req: SimRequest
    reason: str
    streaming: bool

    def as_dict(self) -> dict[str, Any]:
        return {
            "id": self.rid,
            "arrival": self.arrival,
            "prompt_tokens": self.req.prompt_len,
            "prompt_hash": prompt_hash(self.req.prompt_ids),
            "max_tokens": self.req.max_tokens,
            "cached_tokens": 0,
            "first_token_time": None,
            "chunks": [],
            "finish_reason": self.reason,
            "completion_tokens": 0,
            "stream": self.streaming,
            "queued": None,
            "scheduled": None,
            "preemptions": 0,
        }


class Stream:
    """One response: receives the engine's tokens, writes SSE chunks, keeps its trace."""

    def __init__(
        self,
        server: SimServer,
        req: SimRequest,
        *,
        rid: str,
        chat: bool,
        streaming: bool,
        include_usage: bool,
        continuous: bool,
        reasoning: int,
        arrival: float,
    ) -> None:
        self.server = server
        self.req = req
        self.rid = rid
        self.chat = chat
        self.streaming = streaming
        self.include_usage = include_usage
        self.continuous = continuous
        self.reasoning = reasoning
        self.arrival = arrival
        self.interval = server.options.stream_interval
        self.prompt_tokens = req.prompt_len
        self.offset = int(server.text_rng.integers(0, TEXT_TABLE_SIZE))
        self.generated = 0
        self.sent = 0
        self.finish: str | None = None
        self.chunks: list[list[float]] = []
        self.first_token_time: float | None = None
        self.prompt_hash: str | None = None
        #: vLLM's ``return_token_ids``: each completions chunk carries its tokens' ids
        self.token_ids = False
        #: a chat request with ``tools`` and a ``tool_choice`` that asks for a call: the name
        #: of the function the answer calls (its tokens stream as tool-call deltas)
        self.tool: str | None = None
        #: usage's ``completion_tokens_details.reasoning_tokens`` (chat; a quirk leaves it out)
        self.details = chat
        #: a chunk with answer text (content not empty) or a tool call was written, and when
        #: the first was (an answer token without text, a byte of a character, shows nothing)
        self.answer_shown = False
        self.answer_time: float | None = None
        self.tool_deltas = 0  # tool-call deltas written
        self.transport: asyncio.Transport | None = None
        self.done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        created = int(time.time())
        model = json.dumps(server.model_name)
        if chat:
            self.head = (
                f'data: {{"id":"{rid}","object":"chat.completion.chunk","created":'
                f'{created},"model":{model},"choices":['
            )
        else:
            self.head = (
                f'data: {{"id":"{rid}","object":"text_completion","created":'
                f'{created},"model":{model},"choices":['
            )

    # -- engine side ----------------------------------------------------------------------

    def emit(self, req: SimRequest, n_new: int, finish: str | None, now: float) -> None:
        """Called by the step loop with a request's new tokens."""
        self.generated += n_new
        if finish is not None:
            self.finish = finish
        if self.done.done():
            return
        if not self.streaming:
            if n_new:
                self._record(now, n_new)
            if finish is not None:
                self.done.set_result(None)
            return
        pending = self.generated - self.sent
        if finish is None and (pending == 0 or (self.sent and pending < self.interval)):
            return
        transport = self.transport
        if transport is None or transport.is_closing():
            self.server.abort(req)
            self.done.set_result(None)
            return
        parts = []
        if self.sent == 0 and self.chat:
            parts.append(self._role_chunk())
        if pending:
            parts.append(self._token_chunk(self.sent, self.generated, finish))
        if finish is not None and finish != "drop":
            if finish == "midstream":
                err = ApiError(
                    500, "llmspeed-sim injected fault: error in mid-stream", "InternalServerError"
                )
                parts.append(f"data: {json.dumps(err.body())}\n\n")
            elif self.include_usage:
                parts.append(self.head + "]" + self._usage(final=True) + "}\n\n")
            parts.append("data: [DONE]\n\n")
        payload = "".join(parts).encode()
        t = perf_counter()
        transport.write(b"%x\r\n%b\r\n" % (len(payload), payload))
        if pending:
            self._record(t, pending)
            if self.answer_time is None and self.answer_shown:
                self.answer_time = t
        self.sent = self.generated
        if finish is not None:
            if finish == "drop":
                transport.close()
            self.done.set_result(None)

    def _record(self, t: float, n: int) -> None:
        if self.first_token_time is None:
            self.first_token_time = t
        self.chunks.append([t, n])

    def _usage(self, final: bool = False) -> str:
        p, c = self.prompt_tokens, self.generated
        details = ""
        if final and self.details:
            details = f',"completion_tokens_details":{{"reasoning_tokens":{self.reasoning_done}}}'
        return (
            f',"usage":{{"prompt_tokens":{p},"total_tokens":{p + c},"completion_tokens":{c}'
            + details
            + "}"
        )

    @property
    def reasoning_done(self) -> int:
        """The reasoning tokens generated so far (the first ``reasoning`` of a chat answer)."""
        return min(self.reasoning, self.generated) if self.chat else 0

    def _role_chunk(self) -> str:
        usage = ""
        if self.continuous:
            p = self.prompt_tokens
            usage = f',"usage":{{"prompt_tokens":{p},"total_tokens":{p},"completion_tokens":0}}'
        return (
            self.head + '{"index":0,"delta":{"role":"assistant","content":""},'
            '"logprobs":null,"finish_reason":null}]' + usage + "}\n\n"
        )

    def _token_chunk(self, lo: int, hi: int, finish: str | None) -> str:
        text_hi = hi - 1 if finish == "stop" else hi  # the EOS token has no text
        if finish == "stop" and self.tool is not None:
            finish = "tool_calls"  # a call that ended (one cut at max_tokens stays "length")
        fin = f'"{finish}"' if finish in ("stop", "length", "tool_calls") else "null"
        usage = self._usage() if self.continuous else ""
        table = self.server.text
        if not self.chat:
            text = table.esc(self.offset + lo, text_hi - lo)
            ids = ""
            if self.token_ids:
                got = table.ids_at(self.offset + lo, text_hi - lo) + [EOS_ID] * (hi - text_hi)
                ids = '"token_ids":[' + ",".join(map(str, got)) + "],"
            return (
                self.head + f'{{"index":0,"text":"{text}",{ids}"logprobs":null,'
                f'"finish_reason":{fin},"stop_reason":null}}]' + usage + "}\n\n"
            )
        r = self.reasoning
        fields = []
        if lo < r:
            rtext = table.esc(self.offset + lo, min(text_hi, r) - lo)
            fields.append(f'"reasoning_content":"{rtext}","reasoning":"{rtext}"')
        if hi > r:
            start = max(lo, r)
            text = table.esc(self.offset + start, text_hi - start)
            self.answer_shown = self.answer_shown or bool(text) or self.tool is not None
            if self.tool is None:
                fields.append(f'"content":"{text}"')
            else:
                # the call: its first delta names it, the others carry its arguments' pieces
                args = f'"arguments":"{text}"'
                if start == r:
                    call = (
                        f'{{"index":0,"id":"call_{self.rid}","type":"function",'
                        f'"function":{{"name":{self.tool},{args}}}}}'
                    )
                else:
                    call = f'{{"index":0,"function":{{{args}}}}}'
                fields.append(f'"tool_calls":[{call}]')
                self.tool_deltas += 1
        return (
            self.head + '{"index":0,"delta":{' + ",".join(fields) + '},"logprobs":null,'
            f'"finish_reason":{fin}}}]' + usage + "}\n\n"
        )

    # -- non-streaming and trace ----------------------------------------------------------

    def full_response(self, created: int) -> dict[str, Any]:
        n = self.generated
        text_n = n - 1 if self.finish == "stop" else n
        table = self.server.text
        usage: dict[str, Any] = {
            "prompt_tokens": self.prompt_tokens,
            "total_tokens": self.prompt_tokens + n,
            "completion_tokens": n,
            "prompt_tokens_details": None,
        }
        if self.details:
            usage["completion_tokens_details"] = {"reasoning_tokens": self.reasoning_done}
        model = self.server.model_name
        if not self.chat:
            return {
                "id": self.rid,
                "object": "text_completion",
                "created": created,
                "model": model,
                "choices": [
                    {
                        "index": 0,
                        "text": table.raw(self.offset, text_n),
                        "logprobs": None,
                        "finish_reason": self.finish,
                        "stop_reason": None,
                        "prompt_logprobs": None,
                    }
                ],
                "usage": usage,
            }
        r = min(self.reasoning, text_n)
        reasoning = table.raw(self.offset, r) if self.reasoning else None
        content = table.raw(self.offset + r, text_n - r)
        message: dict[str, Any] = {
            "role": "assistant",
            "content": content,
            "reasoning_content": reasoning,
            "reasoning": reasoning,
            "tool_calls": [],
        }
        return {
            "id": self.rid,
            "object": "chat.completion",
            "created": created,
            "model": model,
            "choices": [
                {
                    "index": 0,
                    "message": message,
                    "logprobs": None,
                    "finish_reason": self.finish,
                    "stop_reason": None,
                }
            ],
            "usage": usage,
        }

    def as_dict(self) -> dict[str, Any]:
        req = self.req
        if self.prompt_hash is None:  # here, not on arrival: no work on the request's path
            self.prompt_hash = prompt_hash(req.prompt_ids)
        return {
            "id": self.rid,
            "arrival": self.arrival,
            "prompt_tokens": self.prompt_tokens,
            "prompt_hash": self.prompt_hash,
            "max_tokens": req.max_tokens,
            "cached_tokens": req.cached_tokens,
            "first_token_time": self.first_token_time,
            "chunks": self.chunks,
            "finish_reason": self.finish,
            "completion_tokens": self.generated,
            "stream": self.streaming,
            "queued": req.ready_at or None,
            "scheduled": req.scheduled_at,
            # the engine's own queue time (what its queue-time histogram observes) and its
            # prefix cache's record of the request: the leading blocks it found cached
            "queue_time": (
                req.scheduled_at - req.ready_at if req.scheduled_at is not None else None
            ),
            "cached_blocks": req.cached_tokens // self.server.core.block_size,
            "block_size": self.server.core.block_size,
            "preemptions": req.preemptions,
            # a chat answer's reasoning tokens, when its first answer text (or tool call) was
            # written, and
            # the tool-call deltas it wrote (truth for the client's reasoning figures)
            "reasoning_tokens": self.reasoning_done,
            "answer_time": self.answer_time,
            "tool_call_deltas": self.tool_deltas,
        }


class SimServer:
    """The aiohttp application, the engine task and the trace of one simulator instance."""

    def __init__(self, options: SimOptions) -> None:
        self.options = options
        self.api_key = options.api_key  # PUT /sim/api-key changes it while the server runs
        self.profile = get_profile(options.profile)
        self.max_model_len = options.effective_max_model_len
        self.model_name = self.profile.served_model_name
        self.tokenizer = Tokenizer(self.profile.vocab_size)
        self.text = TextTable(self.tokenizer, self.profile, options.seed)
        self.text_rng = np.random.default_rng([options.seed, 3])
        self.fault_rng = np.random.default_rng([options.seed, 4])
        self.faults: FaultSpec = parse_faults(options.faults)
        self.quirks = parse_quirks(options.quirks)
        self.burst_until = -1.0
        #: this start's speed factor (``start_noise``), drawn once: every time is divided by
        #: ``speed`` = the option's speed × the factor
        self.start_factor = start_factor(options.start_noise, options.start_seed)
        self.speed = options.speed * self.start_factor
        self.core = EngineCore(
            self.profile,
            kv_capacity=options.effective_kv_capacity,
            speed=self.speed,
            noise=options.noise,
            seed=options.seed,
            max_num_seqs=options.max_num_seqs,
            acceptance=options.accept,
            preempt=options.kv_preempt is not None,
            drift=Drift(options.drift, options.drift_period, options.drift_seed)
            if options.drift
            else None,
            slower=parse_slower(options.slower),
        )
        self.trace: deque[Stream | Rejected] = deque(maxlen=TRACE_LIMIT)
        self.active: set[Stream] = set()
        self._counter = 0
        self.steps = 0
        self.late_steps = 0
        self._id_salt = os.urandom(4).hex()
        self._wake: asyncio.Event | None = None
        self._engine_task: asyncio.Task[None] | None = None
        self._runner: web.AppRunner | None = None
        self.url: str | None = None

    # -- lifecycle ------------------------------------------------------------------------

    def make_app(self) -> web.Application:
        app = web.Application(middlewares=[self._middleware], client_max_size=64 * 1024 * 1024)
        r = app.router
        r.add_get("/health", self.health)
        r.add_get("/ping", self.health)
        r.add_get("/version", self.version)
        r.add_get("/v1/models", self.models)
        r.add_get("/metrics", self.metrics)
        r.add_post("/tokenize", self.tokenize)
        r.add_post("/extras/tokenize", self.extras_tokenize)
        r.add_post("/detokenize", self.detokenize)
        r.add_post("/v1/completions", self.completions)
        r.add_post("/v1/chat/completions", self.chat_completions)
        r.add_get("/sim/info", self.info)
        r.add_get("/sim/trace", self.get_trace)
        r.add_delete("/sim/trace", self.clear_trace)
        r.add_put("/sim/api-key", self.put_api_key)
        r.add_put("/sim/faults", self.put_faults)
        return app

    async def start(self) -> str:
        """Bind, start the step loop; return the base URL."""
        self._wake = asyncio.Event()
        self._runner = web.AppRunner(
            self.make_app(), handler_cancellation=True, access_log=None, shutdown_timeout=1.0
        )
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.options.host, self.options.port)
        await site.start()
        port = self._runner.addresses[0][1]
        host = self.options.host
        shown = f"[{host}]" if ":" in host else host
        self.url = f"http://{shown}:{port}"
        self._engine_task = asyncio.create_task(self._run_engine(), name="llmspeed-sim-engine")
        return self.url

    async def stop(self) -> None:
        """Close every open stream, stop the step loop and the server."""
        for stream in list(self.active):
            self.core.abort(stream.req)
            if stream.transport is not None:
                stream.transport.close()
            if not stream.done.done():
                stream.done.set_result(None)
        if self._engine_task is not None:
            self._engine_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._engine_task
            self._engine_task = None
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    # -- step loop ------------------------------------------------------------------------

    async def _run_engine(self) -> None:
        core = self.core
        wake = self._wake
        assert wake is not None
        deadline: float | None = None
        while True:
            now = perf_counter()
            t = core.next_event(now)
            if t is None or t > now:
                wake.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(wake.wait(), None if t is None else t - now)
                # An event due at t (a request through the front end) starts its step at t,
                # not when the loop got round to it: a timer fires ~1 ms late, which at
                # --speed 10 was 2-12 % of a cold 8K prefill. Woken early by a new request:
                # no anchor, the step starts now.
                deadline = t if t is not None and perf_counter() >= t else None
                continue
            if deadline is not None and now - deadline > LAG_RESET_S:
                self.late_steps += 1  # the simulator itself fell behind: re-base
                deadline = None
            start = now if deadline is None else deadline
            plan = core.plan(start)
            if plan is None:
                deadline = None
                await asyncio.sleep(0.001)
                continue
            end = start + plan.duration
            if any(r.computed + q >= r.prefill_target for r, q in plan.prefill):
                # A first token ends this step. The loop wakes from a timed sleep 1-2 ms late
                # (epoll rounds up to whole ms), which a TTFT, counted from the arrival, would
                # keep: sleep short and yield until the step's end. Other steps need no such
                # care: their lateness is the same at both ends of a time between tokens.
                delay = end - FIRST_TOKEN_SPIN_S - perf_counter()
                if delay > 0:
                    await asyncio.sleep(delay)
                while perf_counter() < end:
                    await asyncio.sleep(0)
            else:
                delay = end - perf_counter()
                await asyncio.sleep(delay if delay > 0 else 0)
            deadline = end
            self.steps += 1
            now = perf_counter()
            for req, n_new, finish in core.complete(plan, now):
                sink = req.sink
                if sink is not None:
                    sink.emit(req, n_new, finish, now)

    def abort(self, req: SimRequest) -> None:
        """Drop a request (client gone); its freed blocks may let a waiting one in."""
        if req.state != "finished":
            self.core.abort(req)
            if self._wake is not None:
                self._wake.set()

    def _submit(self, stream: Stream) -> None:
        # The front-end delay is counted from the HTTP arrival: the real time spent parsing and
        # validating the request is part of it, not added to it.
        self.core.add(stream.req, stream.arrival)
        assert self._wake is not None
        self._wake.set()

    # -- middleware, helpers --------------------------------------------------------------

    @web.middleware
    async def _middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        key = self.api_key
        if (
            key is not None
            and request.path.startswith("/v1")
            and request.headers.get("Authorization", "") != f"Bearer {key}"
        ):
            return ApiError(
                401,
                "Unauthorized: missing or wrong API key (send 'Authorization: Bearer KEY')",
                "AuthenticationError",
            ).response()
        try:
            return await handler(request)
        except ApiError as err:
            return err.response()

    async def _json_body(self, request: web.Request) -> dict[str, Any]:
        raw = await request.read()
        try:
            if len(raw) > BIG_BODY_BYTES:
                # Off the event loop: an 8K-token prompt's body takes ~1 ms of JSON and a 32K
                # one ~3 ms; parsed inline, requests sent at the same moment would wait that
                # long each before their arrival is stamped (seen: +2.3 ms per 8K request at
                # c=8), time a client's TTFT holds and the server's own record would not.
                body = await asyncio.to_thread(json.loads, raw)
            else:
                body = json.loads(raw)
        except ValueError as exc:
            raise _bad(f"request body is not valid JSON: {exc}") from None
        if not isinstance(body, dict):
            raise _bad("request body must be a JSON object")
        model = body.get("model")
        if model is not None and model != self.model_name:
            raise ApiError(
                404,
                f"The model `{model}` does not exist. Valid aliases: {self.model_name}.",
                "NotFoundError",
                "model",
            )
        return body

    async def _encode(self, text: str) -> list[int]:
        if len(text) > BIG_TEXT_CHARS:
            return await asyncio.to_thread(self.tokenizer.encode, text)
        return self.tokenizer.encode(text)

    async def _chat_ids(self, body: dict[str, Any]) -> list[int]:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise _bad("'messages' must be a non-empty list", "messages")
        if not all(isinstance(m, dict) for m in messages):
            raise _bad("each message must be an object with 'role' and 'content'", "messages")
        add_gen = body.get("add_generation_prompt", True) is not False
        tok = self.tokenizer
        try:
            size = sum(len(str(m.get("content") or "")) for m in messages)
            if size > BIG_TEXT_CHARS:
                return await asyncio.to_thread(tok.apply_chat_template, messages, add_gen)
            return tok.apply_chat_template(messages, add_gen)
        except ValueError as exc:
            raise _bad(str(exc), "messages") from None

    async def _prompt_ids(self, body: dict[str, Any]) -> list[int]:
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
            prompt = prompt[0]
        if isinstance(prompt, str):
            ids = await self._encode(prompt)
        elif "text-only" in self.quirks and isinstance(prompt, list):
            raise _bad("'prompt' must be a string", "prompt")
        elif "text-only-500" in self.quirks and isinstance(prompt, list):
            # llama-cpp-python's error handler answers its validation errors with HTTP 500
            message = f"{len(prompt)} validation errors: 'prompt': Input should be a valid string"
            raise ApiError(500, message, "InternalServerError", "prompt")
        elif isinstance(prompt, list) and prompt and set(map(type, prompt)) == {int}:
            ids = prompt
            bad = self.tokenizer.out_of_vocab(ids)
            if bad is not None:
                raise _bad(f"Token id {bad} is out of vocabulary", "prompt")
        elif isinstance(prompt, list) and prompt:
            raise _bad(
                "batched prompts (a list of several prompts) are not supported by "
                "llmspeed-sim: send one prompt per request",
                "prompt",
            )
        else:
            raise _bad("'prompt' must be a string or a list of token ids", "prompt")
        if not ids:
            raise _bad("The decoder prompt cannot be empty", "prompt")
        return ids

    def _check_length(self, prompt_len: int, max_tokens: int | None) -> int:
        """max_tokens after defaults; 400s worded as vLLM words them."""
        mml = self.max_model_len
        if prompt_len >= mml:
            raise _bad(
                f"This model's maximum context length is {mml} tokens. However, your "
                f"prompt contains {prompt_len} input tokens, which exceeds this limit even "
                "without any output tokens. Please reduce the length of the input prompt. "
                f"(parameter=input_tokens, value={prompt_len})",
                "input_tokens",
            )
        if max_tokens is None:
            return mml - prompt_len
        if max_tokens > mml:
            raise _bad(
                f"max_tokens={max_tokens} cannot be greater than max_model_len={mml}. "
                "Please request fewer output tokens. "
                f"(parameter=max_tokens, value={max_tokens})",
                "max_tokens",
            )
        if prompt_len + max_tokens > mml:
            raise _bad(
                f"This model's maximum context length is {mml} tokens. However, you "
                f"requested {max_tokens} output tokens and your prompt contains "
                f"{prompt_len} input tokens, for a total of {prompt_len + max_tokens} "
                "tokens. Please reduce the length of the input prompt or the number of "
                f"requested output tokens. (parameter=max_tokens, value={max_tokens})",
                "max_tokens",
            )
        return max_tokens

    @staticmethod
    def _tool_call(body: dict[str, Any]) -> str | None:
        """The function a chat request's answer calls, JSON-quoted: its ``tools`` hold a
        function and its ``tool_choice`` is "required" (the first) or names one; None: the
        answer is text ("auto" and "none" answer in text here)."""
        tools = body.get("tools")
        if not isinstance(tools, list) or not tools:
            return None
        names = [
            t["function"]["name"]
            for t in tools
            if isinstance(t, dict)
            and isinstance(t.get("function"), dict)
            and isinstance(t["function"].get("name"), str)
        ]
        if not names:
            raise _bad("tools: every tool must be a function with a name", "tools")
        choice = body.get("tool_choice")
        if choice == "required":
            return json.dumps(names[0])
        if isinstance(choice, dict) and isinstance(choice.get("function"), dict):
            name = choice["function"].get("name")
            if name not in names:
                raise _bad(f"tool_choice names {name!r}, not one of the tools", "tool_choice")
            return json.dumps(name)
        return None

    @staticmethod
    def _int(body: dict[str, Any], name: str, minimum: int) -> int | None:
        value = body.get(name)
        if value is None:
            return None
        if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
            raise _bad(f"'{name}' must be an integer >= {minimum}, got {value!r}", name)
        return value

    def _next_id(self, prefix: str) -> str:
        self._counter += 1
        return f"{prefix}-{self._id_salt}{self._counter:08x}"

    def _draw_faults(
        self, rid: str, arrival: float, streaming: bool, req: SimRequest
    ) -> ApiError | None:
        f = self.faults
        if not f.any:
            return None
        rng = self.fault_rng
        u_burst, u_start, u_mid, u_pos = rng.random(4).tolist()
        reason: str | None = None
        err: ApiError | None = None
        if arrival < self.burst_until or u_burst < f.burst503:
            if arrival >= self.burst_until:
                self.burst_until = arrival + f.burst_s / self.speed
            reason = "burst503"
            err = ApiError(
                503,
                "llmspeed-sim injected fault: service unavailable (503 burst)",
                "ServiceUnavailableError",
            )
        elif u_start < f.start500:
            reason = "start500"
            err = ApiError(
                500,
                "llmspeed-sim injected fault: internal server error at start",
                "InternalServerError",
            )
        if err is not None and reason is not None:
            self.trace.append(Rejected(rid, arrival, req, reason, streaming))
            return err
        if req.max_tokens >= 2:
            for name in ("midstream", "drop", "stall"):
                rate = getattr(f, name)
                if u_mid < rate:
                    req.fault = name
                    req.fault_at = 1 + int(u_pos * (req.max_tokens - 1))
                    req.stall_s = f.stall_s
                    break
                u_mid -= rate
        return None

    # -- generation routes ----------------------------------------------------------------

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, chat=False)

    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, chat=True)

    async def _generate(self, request: web.Request, chat: bool) -> web.StreamResponse:
        arrival = perf_counter()
        # Let every request whose headers are in stamp its arrival before any of them parses
        # its body: like vLLM's arrival_time, it is taken on receipt, before the front-end's
        # serial work (JSON, validation, hashing) that a client's TTFT also includes.
        await asyncio.sleep(0)
        body = await self._json_body(request)
        if "no-vendor-fields" in self.quirks:
            for name in ("ignore_eos", "min_tokens"):
                if name in body:
                    raise ApiError(
                        422,
                        f"body.{name}: Extra inputs are not permitted",
                        "UnprocessableEntity",
                        name,
                    )
        if "no-stream-usage" in self.quirks:
            body.pop("stream_options", None)
        if "final-usage-only" in self.quirks and isinstance(body.get("stream_options"), dict):
            body["stream_options"].pop("continuous_usage_stats", None)
        n = body.get("n", 1)
        if n != 1:
            raise _bad("llmspeed-sim supports only n = 1", "n")
        ids = await (self._chat_ids(body) if chat else self._prompt_ids(body))
        max_tokens = self._int(body, "max_completion_tokens", 1) if chat else None
        if max_tokens is None:
            max_tokens = self._int(body, "max_tokens", 1)
        max_tokens = self._check_length(len(ids), max_tokens)
        min_tokens = self._int(body, "min_tokens", 0) or 0
        if min_tokens > max_tokens:
            raise _bad(
                f"min_tokens must be less than or equal to max_tokens={max_tokens}, "
                f"got {min_tokens}.",
                "min_tokens",
            )
        streaming = body.get("stream") is True
        opts = body.get("stream_options") or {}
        if not isinstance(opts, dict):
            raise _bad("'stream_options' must be an object", "stream_options")
        reasoning = 0
        if chat:
            kwargs = body.get("chat_template_kwargs") or {}
            thinking = not (isinstance(kwargs, dict) and kwargs.get("enable_thinking") is False)
            reasoning = self.profile.reasoning_tokens if thinking else 0
        rid = self._next_id("chatcmpl" if chat else "cmpl")
        req = SimRequest(
            ids, max_tokens, min_tokens=min_tokens, ignore_eos=body.get("ignore_eos") is True
        )
        fault = self._draw_faults(rid, arrival, streaming, req)
        if fault is not None:
            return fault.response()
        stream = Stream(
            self,
            req,
            rid=rid,
            chat=chat,
            streaming=streaming,
            include_usage=streaming and opts.get("include_usage") is True,
            continuous=streaming and opts.get("continuous_usage_stats") is True,
            reasoning=reasoning,
            arrival=arrival,
        )
        stream.token_ids = not chat and body.get("return_token_ids") is True
        if chat:
            stream.tool = self._tool_call(body)
            stream.details = "no-reasoning-details" not in self.quirks
        req.sink = stream
        self.trace.append(stream)
        self.active.add(stream)
        try:
            if streaming:
                return await self._stream(request, stream)
            return await self._whole(request, stream)
        finally:
            self.active.discard(stream)
            self.abort(req)

    async def _stream(self, request: web.Request, stream: Stream) -> web.StreamResponse:
        resp = web.StreamResponse(
            headers={
                "Content-Type": "text/event-stream; charset=utf-8",
                "Cache-Control": "no-cache",
            }
        )
        try:
            await resp.prepare(request)
        except ConnectionError:  # the client left before the headers went out
            return resp
        stream.transport = request.transport  # type: ignore[assignment]
        self._submit(stream)
        await stream.done
        if stream.finish != "drop" and not (
            stream.transport is None or stream.transport.is_closing()
        ):
            with contextlib.suppress(ConnectionError):
                await resp.write_eof()
        return resp

    async def _whole(self, request: web.Request, stream: Stream) -> web.StreamResponse:
        self._submit(stream)
        await stream.done
        if stream.finish == "drop":
            if request.transport is not None:
                request.transport.close()
            return web.Response(status=500)
        if stream.finish == "midstream":
            return ApiError(
                500, "llmspeed-sim injected fault: error during generation", "InternalServerError"
            ).response()
        return web.json_response(stream.full_response(int(time.time())))

    # -- other routes ---------------------------------------------------------------------

    async def health(self, request: web.Request) -> web.Response:
        return web.Response(status=200)

    async def version(self, request: web.Request) -> web.Response:
        return web.json_response({"version": self.profile.version})

    async def models(self, request: web.Request) -> web.Response:
        if "models-500" in self.quirks:
            raise ApiError(
                500, "Internal Server Error: cannot list models offline", "InternalError"
            )
        return web.json_response(
            {
                "object": "list",
                "data": [
                    {
                        "id": self.model_name,
                        "object": "model",
                        "created": int(time.time()),
                        "owned_by": "vllm",
                        "root": self.model_name,
                        "parent": None,
                        "max_model_len": self.max_model_len,
                        "permission": [],
                    }
                ],
            }
        )

    async def tokenize(self, request: web.Request) -> web.Response:
        if "no-tokenize" in self.quirks or "tokenize-extras" in self.quirks:
            raise ApiError(404, "Not Found", "NotFoundError")
        body = await self._json_body(request)
        if "tokenize-content" in self.quirks:  # llama.cpp: no content, no tokens
            content = body.get("content")
            text = content if isinstance(content, str) else ""
            return web.json_response({"tokens": await self._encode(text)})
        if "messages" in body:
            ids = await self._chat_ids(body)
        else:
            prompt = body.get("prompt")
            if not isinstance(prompt, str):
                raise _bad("'prompt' (a string) or 'messages' is required", "prompt")
            ids = await self._encode(prompt)
        strs = None
        if body.get("return_token_strs") is True:
            strs = [self.tokenizer.token_str(i) for i in ids]
        return web.json_response(
            {
                "count": len(ids),
                "max_model_len": self.max_model_len,
                "tokens": ids,
                "token_strs": strs,
            }
        )

    async def extras_tokenize(self, request: web.Request) -> web.Response:
        """llama-cpp-python's route: ``{"input": TEXT}`` → ``{"tokens": [...]}``."""
        if "tokenize-extras" not in self.quirks:
            raise ApiError(404, "Not Found", "NotFoundError")
        body = await self._json_body(request)
        text = body.get("input")
        if not isinstance(text, str):
            raise _bad("'input' (a string) is required", "input")
        return web.json_response({"tokens": await self._encode(text)})

    async def detokenize(self, request: web.Request) -> web.Response:
        body = await self._json_body(request)
        ids = body.get("tokens")
        if not isinstance(ids, list) or not all(
            isinstance(x, int) and not isinstance(x, bool) for x in ids
        ):
            raise _bad("'tokens' must be a list of token ids", "tokens")
        bad = self.tokenizer.out_of_vocab(ids)
        if bad is not None:
            raise _bad(f"Token id {bad} is out of vocabulary", "tokens")
        return web.json_response({"prompt": self.tokenizer.decode(ids)})

    async def metrics(self, request: web.Request) -> web.Response:
        from .metrics import render_metrics

        if "no-metrics" in self.quirks:
            raise web.HTTPNotFound()
        return web.Response(
            text=render_metrics(self),
            content_type="text/plain",
            charset="utf-8",
            headers={"X-Prometheus-Format": "0.0.4"},
        )

    async def put_api_key(self, request: web.Request) -> web.Response:
        """Test hook: ``{"api_key": "new"}`` (or null) — the key a running server requires, so
        a test can make the key rejected in the middle of a run."""
        body = await self._json_body(request)
        key = body.get("api_key")
        if key is not None and not isinstance(key, str):
            raise ApiError(400, "api_key must be a string or null", "BadRequestError")
        self.api_key = key
        return web.json_response({"api_key_set": key is not None})

    async def put_faults(self, request: web.Request) -> web.Response:
        """Test hook: ``{"faults": "stall=1,stall_s=20"}`` — the faults of a running server
        (same grammar as ``--faults``), so a test can break the server after its warm-up."""
        body = await self._json_body(request)
        try:
            self.faults = parse_faults(body.get("faults"))
        except ValueError as exc:
            raise ApiError(400, str(exc), "BadRequestError") from None
        return web.json_response({"faults": body.get("faults")})

    def start_info(self) -> dict[str, Any]:
        """This start: its speed factor and the speed it runs at."""
        opts = self.options
        return {
            "start_factor": self.start_factor,
            "start_noise": opts.start_noise,
            "start_seed": opts.start_seed,
            "speed": self.speed,
            "option_speed": opts.speed,
            "drift": opts.drift,
            "drift_factor": self.core.drift.factor() if self.core.drift is not None else 1.0,
            "slower": parse_slower(opts.slower),
        }

    async def info(self, request: web.Request) -> web.Response:
        return web.json_response({"profile": self.profile.name, **self.start_info()})

    async def get_trace(self, request: web.Request) -> web.Response:
        return web.json_response(
            {
                "clock": "perf_counter",
                "start_factor": self.start_factor,
                "requests": [r.as_dict() for r in self.trace],
            }
        )

    async def clear_trace(self, request: web.Request) -> web.Response:
        self.trace.clear()
        return web.json_response({"cleared": True})
