"""What goes over the wire: the request's fields as the negotiated dialect allows, and what a
server streams back (SSE events: text, usage, finish reason, error events) and answers (error
bodies, a non-streamed answer's usage). The one module that knows the OpenAI JSON shapes.

A stream is counted as its reads arrive (:class:`StreamTally`, on the client's hot path): the
raw bytes are never kept, and nothing is parsed after the window closes.
"""

from __future__ import annotations

import json
import math
import re
from array import array
from dataclasses import dataclass, field
from typing import Any

from .errors import AnswerTooLarge, MalformedAnswer
from .text import for_person

# -- what is sent -------------------------------------------------------------------------------


@dataclass
class Dialect:
    """What the server accepted: negotiated once per run with a tiny request."""

    api: str = "completions"  # or "chat"
    vendor_fields: bool = True  # ignore_eos / min_tokens accepted
    stream_options: bool = True  # include_usage / continuous_usage_stats accepted
    notes: list[str] = field(default_factory=list)
    #: chat requests carry :data:`TOOLS` with ``tool_choice: required`` (``--llm-tools``)
    tools: bool = False

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
    if dialect.tools and dialect.api == "chat":
        body["tools"] = TOOLS
        body["tool_choice"] = "required"
    return body


#: the one function a chat request offers with ``--llm-tools`` (the answer must call it)
TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "record_answer",
            "description": "Record the answer to the user's message.",
            "parameters": {
                "type": "object",
                "properties": {"answer": {"type": "string", "description": "the answer"}},
                "required": ["answer"],
            },
        },
    }
]


# -- what comes back: server-sent events --------------------------------------------------------

DONE = b"[DONE]"


def loads(text: str | bytes) -> Any:
    """``json.loads`` of what a server sent, whose every failure is a ValueError: JSON nested
    too deep for Python's parser (100,000 ``[``) raises RecursionError there. A whole number
    past Python's 4,300 digits (which ``int`` refuses) is read as infinity, so that the field
    that holds it is refused by name (``usage.completion_tokens is Infinity``), not the whole
    answer as "not JSON"."""
    try:
        return json.loads(text)
    except RecursionError:
        raise ValueError("JSON nested too deeply") from None
    except ValueError as exc:
        if "digits" not in str(exc):
            raise
    try:
        return json.loads(text, parse_int=_int_or_inf)
    except RecursionError:
        raise ValueError("JSON nested too deeply") from None


def _int_or_inf(digits: str) -> int | float:
    if len(digits) <= 4000:
        return int(digits)
    return -math.inf if digits.startswith("-") else math.inf


def _object(payload: bytes) -> dict[str, Any] | None:
    """An event's JSON object; None for ``[DONE]`` and anything else that is not one."""
    try:
        obj = loads(payload)
    except ValueError:
        return None
    return obj if isinstance(obj, dict) else None


#: the largest token count a server may report (a count above it is not a count)
MAX_COUNT = 2**31
#: the longest SSE line (one event) a stream may send (docs/trust.md)
MAX_LINE = 1 << 20
#: characters of a bad value quoted in an error
_QUOTED = 60


def shown(value: object) -> str:
    """A value a server sent, quoted for an error message: its JSON (or repr), cut short, and
    what type it is."""
    try:
        text = json.dumps(value, ensure_ascii=True)
    except (TypeError, ValueError):
        text = repr(value)
    if len(text) > _QUOTED:
        text = text[: _QUOTED - 1] + "…"
    kind = {
        str: "a string", float: "a number with a fraction", bool: "a boolean",
        list: "a list", dict: "an object", type(None): "null", int: "a whole number",
    }.get(type(value), type(value).__name__)  # fmt: skip
    if isinstance(value, float) and not math.isfinite(value):
        kind = "not a finite number: a whole number past 4,300 digits reads so"
    return f"{text} ({kind})"


def checked_count(value: object, field: str, route: str = "stream") -> int:
    """A token count a server sent: a whole number in 0 … 2^31 (never a boolean, a float, a
    string); else :class:`MalformedAnswer` naming the field and the value."""
    if type(value) is not int:
        raise MalformedAnswer(route, f"is {shown(value)}, not a whole number of tokens", field)
    if not 0 <= value <= MAX_COUNT:
        raise MalformedAnswer(route, f"is {shown(value)}, outside 0 … 2^31 tokens", field)
    return value


def _text_field(holder: dict[str, Any], key: str, where: str) -> str:
    value = holder.get(key)
    if value is None:
        return ""
    if not isinstance(value, str):
        raise MalformedAnswer("stream", f"is {shown(value)}, not a string or null", where + key)
    return value


def _choice_output(choice: object) -> tuple[str, bool, bool, bool, int]:
    """The output (text, content, reasoning) a choice carries, whether it carries any (text,
    or a tool call), whether it carries reasoning text, whether it carries answer (text,
    content or a tool call), and its tool-call deltas; every field checked for its type."""
    if not isinstance(choice, dict):
        raise MalformedAnswer("stream", f"is {shown(choice)}, not an object", "a choice")
    text = _text_field(choice, "text", "choices[].")
    delta = choice.get("delta")
    calls = 0
    reasoning = ""
    if delta is not None:
        if not isinstance(delta, dict):
            raise MalformedAnswer("stream", f"is {shown(delta)}, not an object", "choices[].delta")
        reasoning = _text_field(delta, "reasoning_content", "choices[].delta.") or _text_field(
            delta, "reasoning", "choices[].delta."
        )
        text += _text_field(delta, "content", "choices[].delta.")
        tools = delta.get("tool_calls")
        if tools is not None:
            if not isinstance(tools, list):
                raise MalformedAnswer(
                    "stream", f"is {shown(tools)}, not a list", "choices[].delta.tool_calls"
                )
            for call in tools:
                if not isinstance(call, dict):
                    raise MalformedAnswer(
                        "stream", f"is {shown(call)}, not an object", "choices[].delta.tool_calls[]"
                    )
            calls = len(tools)
    answer = bool(text) or calls > 0
    return reasoning + text, bool(reasoning) or answer, bool(reasoning), answer, calls


#: the counted fields, as vLLM, SGLang and the simulator write them (compact JSON); a stream
#: written otherwise is parsed event by event, exactly, at the cost of a JSON parse each
_COMPLETION = b'"completion_tokens":'
#: a count's digits: at most 10 (2^31 has 10), so that one of 5,000 is followed by a digit, not
#: a count's end, and goes to the exact parse (``int()`` refuses 4,300)
_NUMBER = re.compile(rb"\d{1,10}")
_BOM = b"\xef\xbb\xbf"
#: what follows a whole number in compact JSON (a ``.``, an ``e`` or a quote: not one)
_COUNT_ENDS = (b",", b"}")
_CHOICES = b'"choices":['
_NO_CHOICE = b'"choices":[]'
_FINISHED = b'"finish_reason":"'
_ERROR = b'"error"'
#: the raw control bytes a read counted without a parse is searched for (memchr each, tens of
#: nanoseconds): a NUL, which ends a C string, and an ESC, which starts a terminal sequence.
#: Every other raw control byte is refused by the exact parse only; the text of a counted
#: event is neither kept nor shown (docs/trust.md, "Counted without a parse")
_NUL, _ESC, _CR = 0, 0x1B, 0x0D
#: what a chat read counted without a parse is searched for (``in``: a C search of the read),
#: to attribute its tokens to the reasoning or the answer: a read that may change the stream's
#: phase (answer text while it reasons; reasoning, or a tool call, once it answers) goes to
#: the exact parse. A marker inside a text is escaped (``\\"reasoning``) and still matches: a
#: read parsed for nothing, never one counted wrong (docs/metrics.md, "Reasoning and answer")
_REASONING = b'"reasoning'
_CONTENT = b'"content":"'
_NO_CONTENT = b'"content":""'
_TOOL_CALLS = b'"tool_calls"'
#: text pieces a stream without usage keeps before joining them (bounds their overhead)
_TEXT_PIECES = 64
#: the most output text a request of the re-count's sample keeps (256 K characters: 4,096
#: tokens of text are about 20 K)
RECOUNT_MAX_CHARS = 256 * 1024


class StreamTally:
    """One stream's events, counted as its reads arrive, on the client's hot path: what the
    figures need, never the raw bytes (docs/client-at-scale.md).

    Each read's complete events are counted at once; an event cut by a read's end waits in a
    small carry for the read that ends it, and counts with that read (its arrival time).

    - Until the stream's first token, and on a stream whose every chunk does not carry usage,
      each event is parsed (JSON): text chunks and their times, usage and its rises, the
      finish reason, ``[DONE]``, error events; the output text is kept too while the stream
      has no usage on every chunk (the server's tokenizer may have to count it), until an
      exact total is known.
    - Once a stream has shown usage on every chunk (vLLM's, SGLang's and the simulator's
      continuous usage), a read whose events all carry ``"completion_tokens":N`` and no finish
      reason or error is counted without a JSON parse: byte counts over the read (in C) check
      its shape, and its last usage value, less the stream's count before it, is the read's
      tokens. Anything else in a read (the finish chunk, an error, another shape) sends that
      read to the exact parse.

    It keeps 12 bytes (an arrival time and a count, in two arrays) per token-carrying chunk
    where it parses, per read where it counts (chunks read together arrive together, and the
    figures spread a read's tokens as one: ``stats.window_tokens``); with usage on every
    chunk, nothing else grows. A stream that stops sending usage part way
    has its earlier chunks' times taken from its usage rises (each rise is a chunk with
    output)."""

    __slots__ = (
        "after_cr", "announced", "answer_time", "broken", "carry", "chat", "chunks", "closing",
        "completion_tokens", "details_reasoning", "done", "error", "error_event", "fast",
        "fed", "finish_reason", "limit", "mixed_chunks", "model", "output_chunks", "pending",
        "prev", "prompt_tokens", "reasoning_chunks", "reasoning_rise", "recount", "seen_token",
        "text",
        "text_times", "token_chunks", "tool_deltas", "tools", "usage_chunks", "usage_counts",
        "usage_times",
    )  # fmt: skip

    def __init__(self) -> None:
        self.carry = b""  # an event begun by the last read and not ended
        self.fast = False  # counting without parsing (usage on every chunk so far)
        self.seen_token = False
        self.done = False  # ``data: [DONE]`` came
        self.error: str | None = None  # the first error event's message
        self.finish_reason: str | None = None  # the last one a choice gave
        self.prompt_tokens: int | None = None  # usage.prompt_tokens, the last given
        self.completion_tokens: int | None = None  # usage.completion_tokens, the last given
        self.chunks = 0  # events that carry choices
        self.token_chunks = 0  # ... of them whose usage rose (a chunk of tokens)
        self.usage_chunks = 0  # ... of them with usage.completion_tokens
        self.usage_times = array("d")  # events where usage rose ...
        self.usage_counts = array("I")  # ... and by how much
        self.prev = 0  # usage.completion_tokens so far
        #: chunks that carried output (text, reasoning or a tool call); a read counted without
        #: a parse counts each of its chunks, its rise being at least their number
        self.output_chunks = 0
        #: a usage rise in an event without a choice (a usage-only chunk): credited to the
        #: next chunk that carries a token, at its time; it moves no clock (first token, gaps)
        self.pending = 0
        #: tokens usage counted before the stream's first chunk that carried a token (usage
        #: that announced tokens before it sent them)
        self.announced = 0
        self.text_times = array("d")  # events whose choices carry output
        self.text: list[str] | None = []  # output text, while the tokenizer may need it
        #: a request of the text re-count's sample (core/recount.py): every event parsed and
        #: its text kept to the end (up to RECOUNT_MAX_CHARS), whatever usage it carries
        self.recount = False
        self.fed = False  # a read came
        self.broken: MalformedAnswer | None = None  # the stream broke the protocol here
        self.error_event = False  # an ``event: error`` line came: its data is the error
        self.closing = False  # close() parses what the last read left: no more reads come
        self.after_cr = False  # the last read ended in \r: a \n beginning the next ends nothing
        self.model: str | None = None  # the model its first chunk named
        #: the most tokens the request asked for (``max_tokens``): a count above it is a lie
        self.limit = MAX_COUNT
        #: a chat stream: its reads counted without a parse are searched for a change of
        #: phase between reasoning and answer (docs/metrics.md, "Reasoning and answer")
        self.chat = False
        #: the request offered tools (``tool_choice``): its reads are searched for tool calls
        #: too; a stream that was offered none is searched only for the change of phase
        self.tools = False
        self.answer_time: float | None = None  # the first answer text or tool call arrived
        self.reasoning_chunks = 0  # chunks that carried reasoning text and no answer
        self.mixed_chunks = 0  # chunks that carried both (their tokens count as answer)
        self.reasoning_rise = 0  # usage rises attributed to the reasoning
        self.tool_deltas = 0  # choices[].delta.tool_calls entries
        #: the last ``usage.completion_tokens_details.reasoning_tokens`` sent
        self.details_reasoning: int | None = None

    @property
    def reasoning_phase(self) -> bool:
        """The stream has sent reasoning and no answer yet."""
        return self.reasoning_chunks > 0 and self.answer_time is None

    def feed(self, t: float, data: bytes) -> bool:
        """Count one read that arrived at ``t``; True when it brought the stream's first
        token (an event with output: text, reasoning or a tool call, or a choice whose usage
        rose; a usage-only event, without a choice, is not one)."""
        if self.done:
            return False  # [DONE] ended the stream: what a server sends after it is not read
        if not self.fed and data.startswith(_BOM):  # a BOM before the first event
            data = data[len(_BOM) :]
        self.fed = True
        # SSE lines may end in \r\n, \n or a bare \r, each line its own (WHATWG): looked for
        # in every read (a memchr). A \r\n cut between two reads is one line end: the \n
        # that begins a read after a read that ended in \r is dropped
        if self.after_cr and data[:1] == b"\n":
            data = data[1:]
        self.after_cr = data.endswith(b"\r")
        if _CR in data:
            data = data.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        if self.carry:
            data, self.carry = self.carry + data, b""
        end = data.rfind(b"\n") + 1
        if end < len(data):
            data, self.carry = data[:end], data[end:]
            if len(self.carry) > MAX_LINE:
                self.carry = b""
                raise AnswerTooLarge(
                    "stream", f"sent an event longer than {MAX_LINE >> 20} MiB with no line end"
                )
        if not data:
            return False
        if self.fast and self._count(t, data):
            return False
        return self._parse(t, data)

    def close(self, cut: bool = False) -> None:
        """The stream ended: an event its last read left without a line end is counted (at
        the time of the last token-carrying read), and the text goes once the total is exact
        (a final usage, or a finish at max_tokens). ``cut``: the client stopped reading (the
        window's end): an event its last read left unfinished was cut by the client, not
        sent broken, and is dropped."""
        if cut:
            self.carry = b""
        if self.carry.strip():
            last = self.usage_times[-1] if self.usage_times else 0.0
            last = max(last, self.text_times[-1] if self.text_times else 0.0)
            tail, self.carry = self.carry + b"\n", b""
            self.closing = True  # no read comes after: an event ends with the stream
            try:
                self._parse(last, tail)
            except MalformedAnswer as exc:
                self.broken = self.broken or exc
        if self.pending:
            # tokens counted after the stream's last token-carrying chunk (a usage-only chunk
            # at its end): that chunk's (none came: refused below)
            text = self.text_times[-1] if self.text_times else None
            if self.usage_times and (text is None or text <= self.usage_times[-1]):
                self.usage_counts[-1] += self.pending
            elif text is not None:  # a text chunk without usage, then the usage chunk
                self.usage_times.append(text)
                self.usage_counts.append(self.pending)
                self.token_chunks += 1
            self.pending = 0
        if not self.chunks and self.completion_tokens and self.broken is None:
            self.broken = MalformedAnswer(
                "stream",
                f"counted {self.completion_tokens} tokens in events that carried no choice "
                "(no chunk with output came)",
                "usage.completion_tokens",
            )
        count = self.completion_tokens
        if count is not None and count < self.output_chunks and self.broken is None:
            # a chunk with output carries at least one token: usage below the chunks that
            # carried output credits fewer tokens than the stream sent (docs/trust.md)
            self.broken = MalformedAnswer(
                "stream",
                f"is {count:,}, fewer than the {self.output_chunks:,} chunks with output the "
                "stream carried (each carries at least one token): the server's usage does not "
                "count what it sent",
                "usage.completion_tokens",
            )
        if (self.completion_tokens is not None or self.finish_reason == "length") and not (
            self.recount
        ):
            self.text = None

    def _count(self, t: float, data: bytes) -> bool:
        """A read of a stream with usage on every chunk, without parsing it: its last
        ``completion_tokens`` is the stream's count so far, and its rise is the read's tokens
        (one entry a read: chunks read together arrive together). False: the read holds
        something only the exact parse reads.

        One pass over the read (its usage values: one a chunk, the stream having shown usage
        on every chunk); the rest looks only at its last events, where a stream ends: a finish
        reason or an error is followed by at most a usage-only chunk and ``[DONE]``. A chunk
        without usage among them would not change the count (usage is cumulative): its tokens
        count with the next usage value."""
        if self.finish_reason is not None:
            return False  # past the finish only a usage chunk and [DONE] may come: parsed
        if not _well_formed(data):
            return False  # a NUL, a control byte or bytes that are not UTF-8: the exact parse
        usages = data.count(_COMPLETION)
        if not usages:
            return b"data:" not in data  # events without usage: parsed
        tail = data.rfind(b"data:")
        last = data.rfind(_COMPLETION)
        if last < tail:
            # the read's last event carries no usage (the data of an ``event: error``, a
            # stream that stopped sending usage): the exact parse reads it
            return False
        for _ in range(2):
            tail = max(data.rfind(b"data:", 0, tail), 0) if tail > 0 else 0
        end = data[tail:]
        if DONE in (end if tail == 0 else data):
            return False  # [DONE] ends the stream: the exact parse reads nothing after it
        if _FINISHED in end or _ERROR in end:
            # the stream ends in this read: the events before its finish (or error) are
            # counted, the rest parsed
            found = [i for i in (end.find(_FINISHED), end.find(_ERROR)) if i >= 0]
            cut = data.rfind(b"\n", 0, tail + min(found)) + 1  # its event's line
            if cut and self._count(t, data[:cut]):
                self._parse(t, data[cut:])
                return True
            return False
        at = last + len(_COMPLETION)
        number = _NUMBER.match(data, at)
        if number is None or data[number.end() : number.end() + 1] not in _COUNT_ENDS:
            # not a whole number (a string, a float, 1e30) or too many digits to be a count
            # (int() refuses 4,300): the exact parse says
            return False
        n = int(number.group())
        if n < self.prev or n > self.limit:
            return False  # a count that falls, or out of range: the exact parse refuses it
        reasoning = False
        if self.chat:
            # one search of the read (two where the request offered tools): ~1 ns a byte
            if self.reasoning_chunks and self.answer_time is None:
                # reasoning until an answer's text or tool call: that read is parsed
                if (_CONTENT in data and data.count(_CONTENT) != data.count(_NO_CONTENT)) or (
                    self.tools and _TOOL_CALLS in data
                ):
                    return False
                reasoning = True
            elif _REASONING in data or (self.tools and _TOOL_CALLS in data):
                return False  # reasoning, or a tool call, after the answer began: parsed
        chunks = usages - end.count(_NO_CHOICE)
        rise = n - self.prev + self.pending
        if rise < chunks or (rise and not chunks):
            # fewer tokens than chunks: a chunk without a token (one without output, or a
            # count that lies); or tokens counted in usage-only chunks, which carry none
            # (credited to the next chunk that does): the exact parse tells (docs/trust.md)
            return False
        self.chunks += chunks
        self.usage_chunks += chunks
        self.token_chunks += chunks
        self.output_chunks += chunks
        if rise:
            self.usage_times.append(t)
            self.usage_counts.append(rise)
            if reasoning:
                self.reasoning_rise += n - self.prev
            self.prev = n
            self.pending = 0
        self.completion_tokens = n
        return True

    def _joined(self, data: bytes, payload: bytes, pos: int) -> tuple[bytes | None, int]:
        """An event whose first ``data:`` line (``payload``) is not a JSON object by itself:
        WHATWG's event, its ``data:`` lines up to a blank line joined by newlines (what
        sse-starlette writes for a payload that holds newlines), and where the parse goes on.
        None when the read ended before the event did (the caller waits for the next read;
        a stream that ends there has its last event parsed as it stands). A server that
        leaves out the blank lines between events keeps each line its own event."""
        more, after, ended = _data_lines(data, pos)
        if not ended and not self.closing:
            return None, pos
        if more:
            whole = b"\n".join((payload, *more))
            if _object(whole) is not None:
                return whole, after
        return payload, pos

    def _parse(self, t: float, data: bytes) -> bool:
        """A read's events, each parsed (exact whatever the shape)."""
        first = False
        pos, size = 0, len(data)
        while pos < size:
            start = pos
            end = data.find(b"\n", pos)
            end = size if end < 0 else end
            line = data[pos:end].strip()
            if (
                self.seen_token
                and not self.fast
                and not self.recount
                and self.chunks
                and self.usage_chunks == self.chunks
                and _CHOICES in line
            ):
                # every chunk so far carried usage, in compact JSON: count without parsing
                # from here on (the rest of this read too)
                self.fast = True
                self.text = None
                if self._count(t, data[pos:]):
                    return first
            pos = end + 1
            if not line.startswith(b"data:"):
                if line and line.startswith(b"event:"):  # its data is an error or not
                    self.error_event = line[6:].strip() == b"error"
                continue
            if len(line) > MAX_LINE:
                raise AnswerTooLarge("stream", f"sent an event longer than {MAX_LINE >> 20} MiB")
            payload = line[5:].strip()
            if payload == DONE:
                self.done = True
                self.carry = b""
                break  # the stream's end: nothing after it is read
            if not payload:
                continue
            obj = _object(payload)
            if obj is None:  # the first of an event's several data: lines?
                joined, pos = self._joined(data, payload, pos)
                if joined is None:  # its next line may be in the next read: wait for it
                    self.carry = data[start:] + self.carry
                    break  # (bounded: _data_lines refuses an event of too many lines)
                if joined is not payload:
                    payload, obj = joined, _object(joined)
            if obj is None:
                raise MalformedAnswer(
                    "stream", f"is {shown(payload.decode('utf-8', 'replace'))}, not a JSON object",
                    "a data: event",
                )  # fmt: skip
            choices = obj.get("choices")
            if self.model is None and isinstance(name := obj.get("model"), str):
                self.model = name[:200]  # the backend's name for itself (several: said)
            if self.error_event:  # the data of an ``event: error``: whatever its shape
                self.error_event = False
                if self.error is None:
                    err = obj.get("error", obj)
                    self.error = str(err.get("message", err) if isinstance(err, dict) else err)
                continue
            if "error" in obj and not choices:
                if self.error is None:
                    err = obj["error"]
                    self.error = str(err.get("message", err) if isinstance(err, dict) else err)
                continue
            if choices is None:
                choices = ()
            elif not isinstance(choices, list):
                raise MalformedAnswer("stream", f"is {shown(choices)}, not a list", "choices")
            output = reasoned = answered = False
            for c in choices:
                text, carries, has_reasoning, has_answer, calls = _choice_output(c)
                reasoned = reasoned or has_reasoning
                answered = answered or has_answer
                self.tool_deltas += calls
                if carries and self.finish_reason is not None:
                    raise MalformedAnswer(
                        "stream", f"came after its finish_reason {shown(self.finish_reason)}",
                        "output",
                    )  # fmt: skip
                reason = c.get("finish_reason")
                if reason is not None:
                    if not isinstance(reason, str):
                        raise MalformedAnswer(
                            "stream", f"is {shown(reason)}, not a string or null",
                            "choices[].finish_reason",
                        )  # fmt: skip
                    if reason:
                        self.finish_reason = reason
                if carries:
                    output = True
                    if self.text is not None:
                        self.text.append(text)
            usage = obj.get("usage")
            if usage is not None and not isinstance(usage, dict):
                raise MalformedAnswer("stream", f"is {shown(usage)}, not an object", "usage")
            ct = None
            if usage:
                details = usage.get("completion_tokens_details")
                if details is not None and not isinstance(details, dict):
                    raise MalformedAnswer(
                        "stream", f"is {shown(details)}, not an object or null",
                        "usage.completion_tokens_details",
                    )  # fmt: skip
                raw = usage.get("completion_tokens")
                if raw is not None:
                    ct = checked_count(raw, "usage.completion_tokens")
                    if ct > self.limit:
                        raise MalformedAnswer(
                            "stream", f"is {ct:,}, more than the {self.limit:,} max_tokens asked",
                            "usage.completion_tokens",
                        )  # fmt: skip
                    if ct < self.prev:
                        raise MalformedAnswer(
                            "stream", f"fell from {self.prev} to {ct} (a count only rises)",
                            "usage.completion_tokens",
                        )  # fmt: skip
            in_reasoning = self.reasoning_phase or (reasoned and not answered)
            if reasoned and not answered:
                self.reasoning_chunks += 1
            elif reasoned:
                self.mixed_chunks += 1
            if answered and self.answer_time is None:
                self.answer_time = t
            if choices:
                self.chunks += 1
                if ct is not None:
                    self.usage_chunks += 1
                elif self.fast:
                    # usage stopped part way: the chunks counted without a parse were those
                    # whose usage rose; the text from here on is kept
                    self.fast = False
                    self.text_times = array("d", self.usage_times)
                    self.text = []
                if output:
                    self.text_times.append(t)
            if output:
                self.output_chunks += 1
            rise = 0
            if usage:
                pt = usage.get("prompt_tokens")
                if pt is not None:
                    self.prompt_tokens = checked_count(pt, "usage.prompt_tokens")
                if ct is not None:
                    if ct > self.prev:
                        rise = ct - self.prev
                        if in_reasoning and not answered:
                            # a chunk of reasoning text, or one without text while the
                            # stream reasons (a byte-level token): the reasoning's
                            self.reasoning_rise += rise
                        self.prev = ct
                    self.completion_tokens = ct
            # a chunk that carries a choice carries its usage's rise (an empty text too: a
            # byte of a character, docs/metrics.md); a usage-only chunk (no choice) carries
            # no token: its rise is credited to the next chunk that does, at that chunk's time
            carries = output or (bool(choices) and rise > 0)
            if carries and (rise or self.pending):
                self.token_chunks += 1
                self.usage_times.append(t)
                self.usage_counts.append(rise + self.pending)
                self.pending = 0
            elif rise:
                self.pending += rise
                if not self.seen_token:
                    self.announced += rise  # counted before any chunk carried a token
            if usage and details is not None and details.get("reasoning_tokens") is not None:
                where = "usage.completion_tokens_details.reasoning_tokens"
                r = checked_count(details["reasoning_tokens"], where)
                total = ct if ct is not None else self.completion_tokens
                if total is not None and r > total:
                    raise MalformedAnswer(
                        "stream", f"is {r:,}, more than the {total:,} completion_tokens",
                        where,
                    )  # fmt: skip
                self.details_reasoning = r
            if not self.seen_token and carries:
                self.seen_token = first = True
        if self.text is not None and len(self.text) > _TEXT_PIECES:
            self.text[:] = ["".join(self.text)]
            if self.recount and len(self.text[0]) > RECOUNT_MAX_CHARS:
                self.recount = False  # too long to re-count: the sample goes on without it
        return first

    @property
    def usage_per_chunk(self) -> bool:
        """Every chunk with choices carried ``usage.completion_tokens``."""
        return bool(self.chunks) and self.usage_chunks >= self.chunks

    def output_text(self) -> str:
        """The output text received (text, content, reasoning), where it was kept."""
        return "".join(self.text or ())


#: the most ``data:`` lines one event may have (a pretty-printed chunk has tens): past it a
#: server that never ends its event would make every read scan a growing event again
MAX_EVENT_LINES = 1000


def _data_lines(data: bytes, pos: int) -> tuple[list[bytes], int, bool]:
    """The ``data:`` lines from ``pos`` up to the next line that is not one (their values),
    where that line starts, and whether the read holds that line (False: the read ended).
    :class:`AnswerTooLarge` past :data:`MAX_EVENT_LINES` or :data:`MAX_LINE` bytes."""
    values: list[bytes] = []
    size, first = len(data), pos
    while pos < size:
        end = data.find(b"\n", pos)
        end = size if end < 0 else end
        line = data[pos:end].strip()
        if not line.startswith(b"data:"):
            return values, pos, True
        values.append(line[5:].strip())
        pos = end + 1
        if len(values) > MAX_EVENT_LINES or pos - first > MAX_LINE:
            raise AnswerTooLarge(
                "stream",
                f"sent an event of more than {MAX_EVENT_LINES} data: lines or {MAX_LINE >> 20} MiB",
            )
    return values, pos, False


def _well_formed(data: bytes) -> bool:
    """``data`` may be counted without a parse: UTF-8 without a NUL or an ESC. Counting reads
    only the usage values, so this is what it checks of the rest (a stream that hid a NUL or
    a broken character in an event's text passed otherwise). Each scan runs in C: about 170
    ns for a read of one vLLM event (226 bytes), 340 ns for one of 8 events, the UTF-8 one
    only for reads that are not ASCII. A search for every control byte cost 470 ns
    (``bytes.translate``) to 1,240 ns (a regular expression), against about 3,700 ns a read
    in all (benchmarks/results/wire_checks_cost.md, docs/trust.md)."""
    if _NUL in data or _ESC in data:  # an int: memchr (a bytes needle is 8 times slower)
        return False
    if data.isascii():
        return True
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def parse_stream(reads: list[tuple[float, bytes]], chat: bool = False) -> StreamTally:
    """A stream's recorded reads, counted (tests, and records made from recorded reads)."""
    tally = StreamTally()
    tally.chat = chat
    for t, data in reads:
        tally.feed(t, data)
    tally.close()
    return tally


# -- what comes back: plain answers -------------------------------------------------------------


def error_message(body: str) -> str:
    """The human part of an OpenAI/vLLM error body, or the body itself, shortened, as one
    line a person may be shown (:func:`~.text.for_person`: an HTML page's or a Markdown
    body's line breaks cannot start a line of the terminal, the CI log or the summary)."""
    return for_person(_error_text(body), 500)


def _error_text(body: str) -> str:
    try:
        data = loads(body)
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
