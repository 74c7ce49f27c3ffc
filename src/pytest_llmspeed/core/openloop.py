"""Open-loop cells (docs/workloads.md): requests sent at scheduled times, whatever the server
does — at an arrival rate (``rate[8K-r2]``) or at a trace's own times (``trace[NAME]``).

The parts, pure first: the schedule (:func:`rate_schedule`, :func:`trace_schedule`), the
trace file read with its bounds (:func:`read_trace`, :func:`parse_trace`; :class:`TraceError`
names the file, the line and the fix), the blocks a trace's requests share
(:func:`shared_tokens`), the figures of what was sent and read (:func:`open_figures`); then
the I/O: the prompts (:func:`rate_plan`, :func:`trace_plan`) and the sender
(:func:`run_open_loop`). No pytest here.

Every latency counts from the request's *scheduled* send time, and from its actual send
beside it: a request the client sent late keeps the lateness in its latency (no coordinated
omission).
"""

from __future__ import annotations

import asyncio
import contextlib
import csv
import dataclasses
import datetime
import functools
import gzip
import hashlib
import json
import math
import os
import re
import shlex
import time
import zlib
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO, cast

import numpy as np

from ..results import Flag, FlagKind
from .client import Connection, StreamRecord, account_tokens
from .errors import KeyRejected, LLMSpeedError
from .intervals import Interval, median_interval
from .prompts import PromptFactory, material_piece
from .replicas import ReplicaSet, stream_to
from .server_figures import ServerFigures
from .status import CellStatus
from .wire import Dialect, request_fields

#: tokens of one block of a trace's ``hash_ids`` (the Mooncake traces' block size)
BLOCK_TOKENS = 512
#: the first request is due this long after the schedule is laid on the clock
LEAD_S = 0.05
#: what is read of a trace file (before any request): its first TRACE_MAX_LINES requests, at
#: most TRACE_MAX_BYTES of it (the rest is left out, a note says so), each line at most
#: TRACE_MAX_LINE_BYTES
TRACE_MAX_BYTES = 64 << 20
TRACE_MAX_LINES = 100_000
TRACE_MAX_LINE_BYTES = 64 << 10
#: the lines past those read are counted (for the note), up to this many bytes
TRACE_COUNT_BYTES = 1 << 30
TRACE_MAX_BLOCKS = 4096
#: an open-loop cell builds its first requests' bodies before its first send, up to this many
#: prompt tokens; each later one just before its send (send lag counts any delay that makes)
PREBUILT_TOKENS = 4_000_000
#: the token ids of this many blocks of a trace are kept, the least recently used dropped
BLOCK_CACHE = 4096
#: requests of one rate cell (rate × duration)
MAX_RATE_REQUESTS = 100_000
#: a cell whose p99 send lag is above this is flagged: the client sent late
SEND_LAG_FLAG_MS = 10.0
#: /metrics is read about this often while a cell runs (the server's gauges)
POLL_S = 1.0

_NAME_BAD = re.compile(r"[^A-Za-z0-9_.-]")


# -- the schedule --------------------------------------------------------------------------


def rate_schedule(
    rate: float, duration: float, burstiness: float = 1.0, seed: int = 0
) -> tuple[float, ...]:
    """When each request of a rate cell is due, in seconds from the cell's start: the arrivals
    of a renewal process whose gaps are Gamma(shape ``burstiness``, scale 1 / (rate ×
    burstiness)) — mean 1 / rate; burstiness 1 is a Poisson process —, those before
    ``duration``. Pure: the same arguments give the same schedule."""
    if not (rate > 0 and math.isfinite(rate)):
        raise ValueError(f"rate {rate!r}: must be a positive number of requests per second")
    if not (duration > 0 and math.isfinite(duration)):
        raise ValueError(f"duration {duration!r}: must be a positive number of seconds")
    if not (burstiness > 0 and math.isfinite(burstiness)):
        raise ValueError(f"burstiness {burstiness!r}: must be a positive number")
    if rate * duration > MAX_RATE_REQUESTS:
        raise ValueError(
            f"rate {rate:g} × duration {duration:g} s = {rate * duration:,.0f} requests: more "
            f"than {MAX_RATE_REQUESTS:,} in one cell"
        )
    rng = np.random.default_rng(seed)
    scale = 1.0 / (rate * burstiness)
    out: list[float] = []
    t = 0.0
    batch = max(16, int(rate * duration * 1.2) + 16)
    while True:
        for gap in rng.gamma(burstiness, scale, batch):
            t += float(gap)
            if t >= duration:
                return tuple(out)
            out.append(t)


# -- traces --------------------------------------------------------------------------------


class TraceError(LLMSpeedError):
    """A trace file that cannot be replayed: the file, the line (0: the file as a whole), what
    is wrong and what to do, in one line."""

    def __init__(self, source: str, line: int, what: str, fix: str) -> None:
        where = f"{source}: line {line}" if line else source
        super().__init__(f"{where}: {what}: {fix}", setting="trace")
        self.source, self.line, self.what, self.fix = source, line, what, fix


@dataclass(frozen=True)
class TraceRequest:
    """One line of a trace: when it arrives (ms), its lengths, its prefix blocks."""

    line: int
    timestamp_ms: float
    input_length: int
    output_length: int
    hash_ids: tuple[int, ...] = ()


@dataclass(frozen=True)
class Trace:
    name: str  # the cell's id: trace[NAME]
    source: str  # the file, as given
    requests: tuple[TraceRequest, ...]  # in time order (stable)
    #: what reading it left out, in words (rows of 0 tokens, lines past the bounds): the
    #: cell's notes
    notes: tuple[str, ...] = ()

    @property
    def span_s(self) -> float:
        """From the first request's time to the last's, in seconds (at speed 1)."""
        if not self.requests:
            return 0.0
        return (self.requests[-1].timestamp_ms - self.requests[0].timestamp_ms) / 1e3


def trace_name(path: str | os.PathLike[str]) -> str:
    """The cell's name for a trace file: its stem, other characters than letters, digits,
    ``_``, ``-`` and ``.`` as ``_``, at most 64 characters."""
    stem = Path(path).name
    if stem.lower().endswith(".gz"):
        stem = stem[:-3]
    for ext in (".jsonl", ".json", ".csv", ".txt"):
        if stem.lower().endswith(ext):
            stem = stem[: -len(ext)]
            break
    return (_NAME_BAD.sub("_", stem) or "trace")[:64]


_FIX = "fix that line or drop it"
_BOM = "\ufeff"


def _whole(source: str, n: int, obj: dict[str, object], key: str, least: int) -> int:
    value = obj.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value < least or value > 1 << 31:
        raise TraceError(
            source,
            n,
            f"{key!r} must be a whole number ≥ {least}, got {json.dumps(value)[:40]}",
            _FIX,
        )
    return value


def _jsonl_request(source: str, n: int, text: str) -> TraceRequest:
    """One line of a Mooncake trace (JSONL) as a request."""
    try:
        obj = json.loads(text)
    except (ValueError, RecursionError):
        raise TraceError(source, n, "not JSON (each line is one JSON object)", _FIX) from None
    if not isinstance(obj, dict):
        raise TraceError(source, n, "not a JSON object", _FIX)
    ts = obj.get("timestamp")
    if isinstance(ts, bool) or not isinstance(ts, int | float) or not (0 <= ts < 1e15):
        raise TraceError(
            source,
            n,
            f"'timestamp' must be a number of ms ≥ 0, got {json.dumps(ts)[:40]}",
            _FIX,
        )
    inp = _whole(source, n, obj, "input_length", 1)
    out = _whole(source, n, obj, "output_length", 1)
    hashes: tuple[int, ...] = ()
    if "hash_ids" in obj:
        ids = obj["hash_ids"]
        if not isinstance(ids, list) or any(
            isinstance(h, bool) or not isinstance(h, int) for h in ids
        ):
            raise TraceError(source, n, "'hash_ids' must be a list of whole numbers", _FIX)
        if len(ids) > TRACE_MAX_BLOCKS:
            raise TraceError(
                source, n, f"more than {TRACE_MAX_BLOCKS:,} hash_ids", "shorten the prompt"
            )
        hashes = tuple(ids)
    return TraceRequest(n, float(ts), inp, out, hashes)


# -- CSV traces: the public formats (docs/workloads.md, "Trace files") ----------------------


def _column_key(name: str) -> str:
    """A header's column as matched: lower case, letters and digits only (``Request tokens``,
    ``request_tokens`` and ``RequestTokens`` are one name)."""
    return re.sub(r"[^a-z0-9]", "", name.lower())


#: a generic CSV's time column: these names, then an optional unit (``timestamp_ms``,
#: ``arrival_time_s``); without one, numbers are seconds (and a note says so)
_TIME_NAMES = ("timestamp", "time", "arrivaltime", "arrivedat", "arrival", "starttime")
_TIME_UNITS = {"ms": "ms", "msec": "ms", "millis": "ms", "milliseconds": "ms"} | {
    "s": "s", "sec": "s", "secs": "s", "seconds": "s",
}  # fmt: skip
#: a generic CSV's token counts
_INPUT_NAMES = (
    "inputlength", "inputtokens", "inputlen", "prompttokens", "promptlength", "promptlen",
    "numprefilltokens", "prefilltokens", "contexttokens", "requesttokens",
)  # fmt: skip
_OUTPUT_NAMES = (
    "outputlength", "outputtokens", "outputlen", "completiontokens", "completionlength",
    "numdecodetokens", "decodetokens", "generatedtokens", "responsetokens",
)  # fmt: skip
#: the named formats: (words, time column, its kind, input column, output column)
_KNOWN = (
    ("an Azure LLM inference trace", "timestamp", "date", "contexttokens", "generatedtokens"),
    ("a BurstGPT trace", "timestamp", "s", "requesttokens", "responsetokens"),
)

_DATE = re.compile(
    r"(\d{4})-(\d{1,2})-(\d{1,2})[T ](\d{1,2}):(\d{2}):(\d{2})(?:[.,](\d{1,9}))?"
    r" ?(Z|UTC|[+-]\d{2}(?::?\d{2})?)?",
    re.IGNORECASE,
)
_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)


def _date_ms(value: str) -> tuple[int, float] | None:
    """A date-time (``2023-11-16 18:15:46.6805900``, ``2024-05-10 00:00:00.009930+00:00``,
    ISO ``T`` and ``Z`` too; no zone: UTC) as whole seconds since 1970 and the ms past them
    (kept apart: 7 fractional digits survive); None if it is not one."""
    m = _DATE.fullmatch(value)
    if m is None:
        return None
    y, mo, d, hh, mm, ss, frac, zone = m.groups()
    tz = datetime.UTC
    if zone and zone.upper() not in ("Z", "UTC"):
        digits = zone[1:].replace(":", "")
        offset = datetime.timedelta(hours=int(digits[:2]), minutes=int(digits[2:] or 0))
        tz = datetime.timezone(-offset if zone[0] == "-" else offset)
    try:
        at = datetime.datetime(int(y), int(mo), int(d), int(hh), int(mm), int(ss), tzinfo=tz)
    except ValueError:  # a 13th month, a 61st second, ...
        return None
    whole = (at - _EPOCH) // datetime.timedelta(seconds=1)
    return whole, int(frac) / 10 ** (len(frac) - 3) if frac else 0.0


@dataclass(frozen=True)
class _Columns:
    """Where a CSV trace's figures are: the format's words, the columns (index, header name),
    how the time column is read (``date``, ``s``, ``ms``; ``auto``: seconds or date-times,
    by the first row)."""

    words: str
    time: tuple[int, str]
    kind: str
    input: tuple[int, str]
    output: tuple[int, str]
    delimiter: str


def _csv_columns(source: str, n: int, header: str) -> _Columns:
    """The columns a CSV header names (:data:`_KNOWN` first, then the generic names), or the
    one-line :class:`TraceError` saying what it found and what it needs."""
    delimiter = next((d for d in (",", "\t", ";") if d in header), ",")
    try:
        names = next(csv.reader([header], delimiter=delimiter))
    except (csv.Error, StopIteration):
        names = [header]
    keys = [_column_key(c) for c in names]

    def find(*wanted: str) -> tuple[int, str] | None:
        for i, k in enumerate(keys):
            if k in wanted:
                return i, names[i].strip()
        return None

    for words, t, kind, i, o in _KNOWN:
        tc, ic, oc = find(t), find(i), find(o)
        if tc and ic and oc:
            return _Columns(words, tc, kind, ic, oc, delimiter)
    tc, kind = None, "auto"
    for j, k in enumerate(keys):
        for base in _TIME_NAMES:
            unit = k.removeprefix(base) if k.startswith(base) else None
            if unit == "" or unit in _TIME_UNITS:
                tc, kind = (j, names[j].strip()), _TIME_UNITS.get(unit, "auto")
                break
        if tc:
            break
    ic, oc = find(*_INPUT_NAMES), find(*_OUTPUT_NAMES)
    if tc and ic and oc:
        return _Columns("a CSV trace", tc, kind, ic, oc, delimiter)
    if header.lstrip().startswith("["):
        raise TraceError(
            source, n, "a JSON array", "give one JSON object per line (JSONL), or a CSV file"
        )
    found = ", ".join(repr(c.strip()[:40]) for c in names[:12])
    found += ", ..." if len(names) > 12 else ""
    missing = [
        what
        for what, got in (
            ("a time (timestamp, time, arrival_time; _ms or _s for the unit)", tc),
            ("the input tokens (input_length, input_tokens, prompt_tokens)", ic),
            ("the output tokens (output_length, output_tokens, completion_tokens)", oc),
        )
        if not got
    ]
    raise TraceError(
        source,
        n,
        f"a CSV header of no trace format known: found the columns {found}; a trace needs "
        + "; ".join(missing)
        + " (or the Azure TIMESTAMP, ContextTokens, GeneratedTokens, or BurstGPT's Timestamp, "
        "Request tokens, Response tokens)",
        "name its columns so (docs/workloads.md lists the names read)",
    )


def _tokens(source: str, n: int, col: str, value: str) -> int:
    """A whole number of tokens ≥ 0 (``12``, ``12.0``)."""
    try:
        number = float(value) if value.strip() else math.nan
    except ValueError:
        number = math.nan
    if not (number >= 0 and number.is_integer() and number <= 1 << 31):
        raise TraceError(
            source, n, f"{col!r} must be a whole number of tokens ≥ 0, got {value[:40]!r}", _FIX
        )
    return int(number)


class _CsvRows:
    """The rows of a CSV trace, each a request or a row of 0 tokens (left out, counted)."""

    def __init__(self, source: str, columns: _Columns) -> None:
        self.source, self.c = source, columns
        self.kind = columns.kind
        self.origin: tuple[int, float] | None = None  # a date column's first row
        self.width = 1 + max(columns.time[0], columns.input[0], columns.output[0])

    def request(self, n: int, text: str) -> TraceRequest | str:
        """Line ``n`` as a request, or (0 tokens) the words of its first empty count."""
        src, c = self.source, self.c
        try:
            row = next(csv.reader([text], delimiter=c.delimiter, strict=True))
        except (csv.Error, StopIteration):
            raise TraceError(src, n, "not a CSV row", _FIX) from None
        if len(row) < self.width:
            raise TraceError(
                src, n, f"{len(row)} fields, where the header names {c.time[1]!r}, "
                f"{c.input[1]!r} and {c.output[1]!r} (up to field {self.width})", _FIX,
            )  # fmt: skip
        value = row[c.time[0]].strip()
        if self.kind == "auto":  # a generic time column of no unit: the first row says
            self.kind = "date" if _date_ms(value) is not None else "s"
        if self.kind == "date":
            at = _date_ms(value)
            if at is None:
                raise TraceError(
                    src, n, f"{c.time[1]!r} must be a date-time like 2023-11-16 "
                    f"18:15:46.6805900, got {value[:40]!r}", _FIX,
                )  # fmt: skip
            self.origin = self.origin or at
            ms = (at[0] - self.origin[0]) * 1e3 + (at[1] - self.origin[1])
        else:
            try:
                number = float(value)
            except ValueError:
                number = math.nan
            scale = 1e3 if self.kind == "s" else 1.0
            if not (0 <= number * scale < 1e15):
                unit = "seconds" if self.kind == "s" else "ms"
                raise TraceError(
                    src, n, f"{c.time[1]!r} must be a number of {unit} ≥ 0, got "
                    f"{value[:40]!r}", _FIX,
                )  # fmt: skip
            ms = number * scale
        inp = _tokens(src, n, c.input[1], row[c.input[0]])
        out = _tokens(src, n, c.output[1], row[c.output[0]])
        if inp == 0:
            return f"line {n}: {c.input[1]} 0"
        if out == 0:
            return f"line {n}: {c.output[1]} 0"
        return TraceRequest(n, ms, inp, out)


@dataclass
class _Read:
    """What reading a trace's lines found (:func:`_read_lines`)."""

    requests: list[TraceRequest] = field(default_factory=list)
    rows: int = 0  # the rows read: requests and rows of 0 tokens
    empty: int = 0  # rows of 0 input or 0 output tokens, left out
    first_empty: str = ""
    csv: _Columns | None = None
    seconds_said: str | None = None  # a generic time column of no unit, read as seconds
    stop: int | None = None  # the line of the first request left out (the limit reached)


def _read_lines(lines: Iterable[bytes | str], source: str) -> _Read:
    """The requests of a trace's lines, in the file's order: JSONL (the first line that is
    not blank begins with ``{``) or a CSV whose header names its columns. Reading stops at
    the line of request :data:`TRACE_MAX_LINES` + 1 (:attr:`_Read.stop`)."""
    got = _Read()
    rows: _CsvRows | None = None
    jsonl: bool | None = None
    for n, raw in enumerate(lines, start=1):
        if len(got.requests) >= TRACE_MAX_LINES and raw.strip():
            got.stop = n  # the first line left out: not read further
            break
        if len(raw) > TRACE_MAX_LINE_BYTES:
            raise TraceError(
                source, n, f"a line over {TRACE_MAX_LINE_BYTES // 1024} KiB", "shorten it"
            )
        text = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw
        if jsonl is None:
            text = text.removeprefix(_BOM)
        if not text.strip():
            continue
        if jsonl is None:  # the first line: JSONL, or a CSV's header
            jsonl = text.lstrip().startswith("{")
            if not jsonl:
                got.csv = _csv_columns(source, n, text)
                rows = _CsvRows(source, got.csv)
                continue
        req = _jsonl_request(source, n, text) if rows is None else rows.request(n, text)
        got.rows += 1
        if isinstance(req, str):
            got.empty += 1
            got.first_empty = got.first_empty or req
        else:
            got.requests.append(req)
    if rows is not None and rows.kind == "s" and got.csv and got.csv.kind == "auto":
        got.seconds_said = got.csv.time[1]
    return got


def _size(n: int) -> str:
    return f"{n >> 20:,} MiB" if n >= 1 << 20 else f"{n:,} bytes"


def _trace(
    got: _Read,
    source: str,
    name: str | None,
    rest: tuple[int, int, bool, bool] | None,
    gz: bool = False,
) -> Trace:
    """The trace of what was read, in time order, with the notes of what was left out.
    ``rest``, where reading stopped before the end: the first line left out, the lines from
    it to the end, whether there are more than those (uncounted past
    :data:`TRACE_COUNT_BYTES`), whether :data:`TRACE_MAX_BYTES` stopped it (else the
    requests' limit)."""
    name = name or trace_name(source)
    if not got.requests:
        if got.empty:
            raise TraceError(
                source, 0, f"no request in it: all its {got.empty:,} rows have 0 input or 0 "
                f"output tokens (the first: {got.first_empty})", "give a trace of requests",
            )  # fmt: skip
        raise TraceError(source, 0, "no request in it", "give a JSONL or CSV file of requests")
    notes: list[str] = []
    if got.seconds_said:
        notes.append(
            f"trace {name}: times read as seconds ({got.seconds_said!r} names no unit; "
            f"{got.seconds_said}_ms would be read as ms)"
        )
    if got.empty:
        notes.append(
            f"trace {name}: {got.empty:,} of {got.rows:,} requests left out, with 0 input or "
            f"0 output tokens: nothing to replay (the first: {got.first_empty})"
        )
    if rest is not None:
        first, lines, more, cut = rest
        why = (
            f"a trace is read up to {_size(TRACE_MAX_BYTES)}"
            if cut
            else f"a replay takes at most {TRACE_MAX_LINES:,} requests"
        )
        q = shlex.quote(source)
        text, lines_of = (f"zcat {q} | ", "") if gz else ("", f" {q}")
        part = f"{text}tail -n +{first}{lines_of} | head -n {TRACE_MAX_LINES}"
        header = f"{text}head -n 1{lines_of}"
        part = f"({header}; {part}) > part.csv" if got.csv else f"{part} > part.jsonl"
        notes.append(
            f"trace {name}: the first {len(got.requests):,} requests replayed (to line "
            f"{got.requests[-1].line:,}), {'more than ' if more else ''}{lines:,} more lines "
            f"from line {first:,} left out ({why}): to replay another part, cut it to a file "
            f"of its own, e.g. {part}"
        )
    blocks = block_mismatch(got.requests)
    if blocks:
        notes.append(f"trace {name}: {blocks}")
    requests = sorted(got.requests, key=lambda r: r.timestamp_ms)  # stable: equal times too
    return Trace(name, source, tuple(requests), tuple(notes))


def block_mismatch(requests: Sequence[TraceRequest]) -> str:
    """The requests whose ``hash_ids`` are not one id per :data:`BLOCK_TOKENS` of their
    prompt, in words ("" when none): fewer leave the rest of the prompt unique to the request
    (no sharing is replayed there); more are cut (a trace made with smaller blocks shares at
    other places than it says). The first such line is named."""
    short = [r for r in requests if r.hash_ids and len(r.hash_ids) * BLOCK_TOKENS < r.input_length]
    long = [r for r in requests if len(r.hash_ids) > -(-r.input_length // BLOCK_TOKENS)]
    parts = []
    for rows, words in (
        (short, "fewer hash_ids than their prompt's blocks: the rest of each prompt is its own"),
        (long, "more hash_ids than their prompt's blocks: the extra ids are not replayed"),
    ):
        if rows:
            r = rows[0]
            parts.append(
                f"{len(rows):,} request(s) with {words} (the first: line {r.line:,}, "
                f"{len(r.hash_ids):,} ids for {r.input_length:,} tokens, "
                f"{-(-r.input_length // BLOCK_TOKENS):,} blocks of {BLOCK_TOKENS})"
            )
    if not parts:
        return ""
    return "; ".join(parts) + (
        f" — a trace's hash_ids name blocks of {BLOCK_TOKENS} tokens (the Mooncake format's)"
    )


def parse_trace(lines: Iterable[bytes | str], source: str, name: str | None = None) -> Trace:
    """A trace from its lines (blank lines skipped), in the format the first says
    (docs/workloads.md, "Trace files"):

    - JSONL (the Mooncake format), each line a JSON object with ``timestamp`` (ms, ≥ 0),
      ``input_length`` and ``output_length`` (whole, ≥ 1) and optional ``hash_ids`` (whole
      numbers, at most :data:`TRACE_MAX_BLOCKS`); other keys are ignored;
    - a CSV whose header names a time and the two token counts: the Azure LLM inference
      traces' (``TIMESTAMP`` date-times, ``ContextTokens``, ``GeneratedTokens``), BurstGPT's
      (``Timestamp`` in s, ``Request tokens``, ``Response tokens``), or the generic names;
      its rows of 0 input or 0 output tokens are left out, said in the trace's notes.

    The first :data:`TRACE_MAX_LINES` requests are read, the rest left out (a note says how
    many lines). :class:`TraceError` for the first line that is not a request, or for a trace
    past its bounds."""
    it = iter(lines)
    got = _read_lines(it, source)
    rest = None if got.stop is None else (got.stop, 1 + sum(1 for _ in it), False, False)
    return _trace(got, source, name, rest)


class _Bounded:
    """A file's lines, ends dropped, up to :data:`TRACE_MAX_BYTES` in all (:attr:`cut`: the
    line that would pass it, not given)."""

    def __init__(self, f: BinaryIO) -> None:
        self.f, self.size, self.n = f, 0, 0
        self.cut: int | None = None
        self.whole = True  # the last line read ended (not cut at TRACE_MAX_LINE_BYTES)

    def __iter__(self) -> Iterator[bytes]:
        while True:
            line = self.f.readline(TRACE_MAX_LINE_BYTES + 1)
            if not line:
                return
            self.n += 1
            self.whole = line.endswith(b"\n")
            if self.size + len(line) > TRACE_MAX_BYTES:
                self.cut = self.n
                return
            self.size += len(line)
            yield line.rstrip(b"\r\n") if self.whole else line

    def rest(self) -> tuple[int, bool]:
        """The lines from the last one read to the end (counted, not read, up to
        :data:`TRACE_COUNT_BYTES`), and whether there are more than that."""
        lines, scanned, last = int(self.whole), 0, b"\n"
        while scanned < TRACE_COUNT_BYTES:
            chunk = self.f.read(min(1 << 20, TRACE_COUNT_BYTES - scanned))
            if not chunk:
                return lines + (last != b"\n"), False
            scanned += len(chunk)
            lines += chunk.count(b"\n")
            last = chunk[-1:]
        return lines, bool(self.f.read(1))


def read_trace(path: str | os.PathLike[str]) -> Trace:
    """A trace file (:func:`parse_trace`'s formats), read within its bounds: its first
    :data:`TRACE_MAX_LINES` requests, at most :data:`TRACE_MAX_BYTES` of it, each line at most
    :data:`TRACE_MAX_LINE_BYTES`; the lines past those are counted, not read."""
    source = str(path)
    try:
        with open(path, "rb") as raw:
            head = raw.read(2)
            if head == b"PK":
                raise TraceError(
                    source, 0, "a zip archive", "unzip it and give the CSV or JSONL file in it"
                )
            raw.seek(0)
            gz = head == b"\x1f\x8b"  # a .csv.gz as published: read as it is decompressed
            with gzip.open(raw, "rb") if gz else contextlib.nullcontext(raw) as f:
                lines = _Bounded(cast(BinaryIO, f))
                got = _read_lines(lines, source)
                rest = None
                first = got.stop or lines.cut
                if first is not None:
                    count, more = lines.rest()
                    rest = (first, count, more, got.stop is None)
    except (OSError, EOFError, zlib.error) as exc:
        words = getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
        raise TraceError(source, 0, f"cannot be read ({words})", "give a readable file") from None
    return _trace(got, source, None, rest, gz)


def fitting(trace: Trace, max_model_len: int | None) -> tuple[Trace, str | None]:
    """``trace`` without the requests whose prompt and output do not fit in the server's
    ``max_model_len``, and a note saying how many were left out and the first one's line
    (None when all fit, or the length is unknown). :class:`TraceError` when none fits."""
    if max_model_len is None:
        return trace, None
    kept = tuple(r for r in trace.requests if r.input_length + r.output_length <= max_model_len)
    if len(kept) == len(trace.requests):
        return trace, None
    first = next(r for r in trace.requests if r.input_length + r.output_length > max_model_len)
    longest = (
        f"line {first.line}: input_length {first.input_length:,} + output_length "
        f"{first.output_length:,} = {first.input_length + first.output_length:,} > the "
        f"server's max_model_len {max_model_len:,}"
    )
    if not kept:
        raise TraceError(
            trace.source, 0, f"no request fits the server ({longest}, and every other)",
            "replay a trace of shorter requests, or on a server with a longer context",
        )  # fmt: skip
    left = len(trace.requests) - len(kept)
    note = (
        f"trace {trace.name}: {left:,} of {len(trace.requests):,} requests left out, longer "
        f"than the server's context (the first: {longest})"
    )
    return dataclasses.replace(trace, requests=kept), note


def trace_schedule(trace: Trace, speed: float = 1.0) -> tuple[float, ...]:
    """When each request of ``trace`` is due, in seconds from the first: its timestamps,
    divided by ``speed``."""
    if not (speed > 0 and math.isfinite(speed)):
        raise ValueError(f"speed {speed!r}: must be a positive number")
    t0 = trace.requests[0].timestamp_ms
    return tuple((r.timestamp_ms - t0) / 1e3 / speed for r in trace.requests)


def hit_blocks(r: TraceRequest) -> int:
    """The request's leading blocks a cache may hit: whole (512 tokens) and ending before its
    last prompt token (a server computes at least that token)."""
    return min(len(r.hash_ids), (r.input_length - 1) // BLOCK_TOKENS)


def held_blocks(r: TraceRequest) -> int:
    """The request's leading blocks that are whole: what a cache holds once it was computed."""
    return min(len(r.hash_ids), r.input_length // BLOCK_TOKENS)


def shared_tokens(trace: Trace) -> tuple[int, ...]:
    """For each request, in order, the prompt tokens in leading blocks that an earlier request
    held whole at the same places (the same ids before them: blocks are chained): what an
    unbounded prefix cache would hit."""
    seen: dict[tuple[int, int], int] = {}  # (parent node, block id) → node
    out: list[int] = []
    for r in trace.requests:
        node, k = 0, 0
        for h in r.hash_ids[: hit_blocks(r)]:
            nxt = seen.get((node, h))
            if nxt is None:
                break
            node, k = nxt, k + 1
        out.append(k * BLOCK_TOKENS)
        node = 0
        for h in r.hash_ids[: held_blocks(r)]:
            nxt = seen.get((node, h))
            if nxt is None:
                nxt = seen[(node, h)] = len(seen) + 1
            node = nxt
    return tuple(out)


def expected_hit_share(trace: Trace) -> float:
    """Prompt tokens an unbounded prefix cache would hit (:func:`shared_tokens`) / all prompt
    tokens of the trace."""
    total = sum(r.input_length for r in trace.requests)
    return sum(shared_tokens(trace)) / total if total else 0.0


# -- what is sent ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Planned:
    """One request of a schedule: when it is due (s from the start), its body (or how to
    build it: :meth:`payload`), its lengths."""

    at: float
    body: bytes | None = field(repr=False)
    prompt_tokens: int
    max_tokens: int
    build: Callable[[], bytes] | None = field(default=None, repr=False, compare=False)

    def payload(self) -> bytes:
        if self.body is not None:
            return self.body
        assert self.build is not None
        return self.build()


async def rate_plan(
    factory: PromptFactory,
    dialect: Dialect,
    model: str,
    context: int,
    max_output: int,
    times: Sequence[float],
    cold: bool = False,
) -> list[Planned]:
    """A rate cell's requests: at ``context`` tokens, each sharing the context's prefix P(C)
    and ending in its own suffix (a decode cell's prompts), built before the first is sent.
    ``cold`` (``--llm-rate-prompts=cold``): each request a prompt of its own from start to end
    (a fresh salt each: no block of it cached, whatever the server keeps): new users' TTFT."""
    from .streams import PromptSource

    fields = request_fields(model, max_output, dialect)
    if cold:
        plan = []
        for t in times:
            prompt = await factory.fresh().prompt(context, 1)
            plan.append(Planned(t, prompt.encode(fields), context, max_output))
        return plan
    prompts = PromptSource(factory, context, fields, min(len(times), 64) or 1)
    await prompts.build()
    return [Planned(t, await prompts.next(), context, max_output) for t in times]


class _Blocks:
    """The token ids of a trace's blocks, as JSON, drawn from the run's salt and each block's
    id (the same id, the same tokens), the least recently used dropped past
    :data:`BLOCK_CACHE`."""

    def __init__(self, salt: int, pool: Sequence[int], text: list[int] | None = None) -> None:
        self.salt, self.pool = salt, np.asarray(pool)
        self.text, self._pool_list = text, list(pool)  # text: --llm-prompt-text's token ids
        self.cache: OrderedDict[int, list[str]] = OrderedDict()

    def _draw(self, key: str, n: int) -> list[str]:
        if self.text is not None:
            piece = material_piece(f"{self.salt}:{key}", self._pool_list, self.text, n)
            return [str(i) for i in piece]
        seed = int.from_bytes(hashlib.sha256(f"{self.salt}:{key}".encode()).digest()[:8])
        rng = np.random.default_rng(seed)
        return [str(i) for i in self.pool[rng.integers(0, len(self.pool), n)].tolist()]

    def ids(self, block: int) -> list[str]:
        found = self.cache.get(block)
        if found is not None:
            self.cache.move_to_end(block)
            return found
        ids = self._draw(f"block:{block}", BLOCK_TOKENS)
        self.cache[block] = ids
        if len(self.cache) > BLOCK_CACHE:
            self.cache.popitem(last=False)
        return ids

    def tail(self, request: int, n: int) -> list[str]:
        """``n`` token ids of a request's own (no other request has them)."""
        if self.text is not None:
            return self._draw(f"request:{request}", n)
        seed = int.from_bytes(
            hashlib.sha256(f"{self.salt}:request:{request}".encode()).digest()[:8]
        )
        rng = np.random.default_rng(seed)
        return [str(i) for i in self.pool[rng.integers(0, len(self.pool), n)].tolist()]


def trace_body(blocks: _Blocks, index: int, r: TraceRequest, fields: dict[str, object]) -> bytes:
    """Request ``index`` of a trace as a body: its blocks' tokens in order, cut to its
    ``input_length``, then tokens of its own to that length."""
    ids: list[str] = []
    for h in r.hash_ids:
        take = min(BLOCK_TOKENS, r.input_length - len(ids))
        if take <= 0:
            break
        ids += blocks.ids(h)[:take]
    if len(ids) < r.input_length:
        ids += blocks.tail(index, r.input_length - len(ids))
    rest = json.dumps(fields)[1:].encode()
    return b"".join((b'{"prompt": [', ", ".join(ids).encode(), b"], ", rest))


async def trace_plan(
    factory: PromptFactory,
    dialect: Dialect,
    model: str,
    trace: Trace,
    speed: float = 1.0,
) -> list[Planned]:
    """A trace's requests at its times: each prompt its blocks' tokens (block id → 512 token
    ids of the server's own tokenizer, drawn from the run's salt and the id: the same id, the
    same tokens), cut to its ``input_length``, then tokens of its own to that length; with
    ``--llm-prompt-text`` each block and tail is a slice of the text's token ids at an offset
    drawn from the salt and the id, after 4 salted ids (:func:`~.prompts.material_piece`). Token-id
    prompts only (text would not keep the blocks' boundaries through the tokenizer). The
    bodies are built when sent (:attr:`Planned.build`; the first ones before the cell)."""
    if not factory.uses_ids:
        raise LLMSpeedError(
            f"a trace replay needs token-id prompts (its shared blocks must be exact), and "
            f"this run sends {'chat messages' if factory.api == 'chat' else 'text'}",
            setting="prompt_form" if factory.api == "completions" else "api",
        )
    longest = max((r.input_length for r in trace.requests), default=1)
    text = await factory.material_ids(longest)  # --llm-prompt-text: blocks made of the text
    blocks = _Blocks(factory.salt, await factory.id_pool(), text)
    out: list[Planned] = []
    for i, (at, r) in enumerate(zip(trace_schedule(trace, speed), trace.requests, strict=True)):
        fields = request_fields(model, r.output_length, dialect)
        build = functools.partial(trace_body, blocks, i, r, fields)
        out.append(Planned(at, None, r.input_length, r.output_length, build))
    return out


# -- the figures -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Sent:
    """One request of an open-loop cell: when it was due (``perf_counter``), what it was and
    what it saw."""

    due: float
    planned: Planned
    rec: StreamRecord


@dataclass(frozen=True)
class OpenFigures:
    """The figures of docs/workloads.md over one cell's requests (ms, req/s, tok/s)."""

    requests: int
    completed: int
    failed: int
    early_stops: int
    span_s: float  # the schedule's start to the later of its end and the last request's end
    offered_rate: float | None  # None: a schedule of no length (a trace of one request)
    achieved_rate: float
    sched_ttft: tuple[float, ...]  # per request with a first token: arrival − scheduled send
    sent_ttft: tuple[float, ...]  # ... − actual send
    sched_e2e: tuple[float, ...]  # per finished request: last token − scheduled send
    sent_e2e: tuple[float, ...]
    tbt: tuple[float, ...]  # per request with ≥ 2 tokens
    output_tokens: int
    send_lag: tuple[float, ...]  # actual − scheduled send, every request
    max_in_flight: int
    errors: dict[str, int]
    wrong_lengths: dict[int, int]

    @property
    def output_tok_s(self) -> float | None:
        return self.output_tokens / self.span_s if self.span_s > 0 else None

    @property
    def error_rate(self) -> float:
        return self.failed / max(self.requests, 1)


def _median(values: Sequence[float]) -> float | None:
    return float(np.median(values)) if len(values) else None


def _pct(values: Sequence[float], q: float) -> float | None:
    return float(np.percentile(values, q)) if len(values) else None


def _most_at_once(spans: Sequence[tuple[float, float]]) -> int:
    events = sorted([(a, 1) for a, _ in spans] + [(b, -1) for _, b in spans])
    most = now = 0
    for _, step in events:  # at equal times an end (-1) comes first: not both at once
        now += step
        most = max(most, now)
    return most


def open_figures(sent: Sequence[Sent], offered_s: float) -> OpenFigures:
    """The figures of an open-loop cell from its requests (their streams read, tokens
    accounted), ``offered_s`` the schedule's length (the rate cell's duration, the trace's span
    at its speed). The cell's span runs from the schedule's start (its time 0) to the later of
    ``offered_s`` and the last request's end: the achieved rate and output tok/s are over it,
    so a server that keeps up achieves the offered rate, no more. Pure."""
    sched_ttft: list[float] = []
    sent_ttft: list[float] = []
    sched_e2e: list[float] = []
    sent_e2e: list[float] = []
    tbt: list[float] = []
    lags: list[float] = []
    spans: list[tuple[float, float]] = []
    errors: dict[str, int] = {}
    wrong: dict[int, int] = {}
    completed = failed = early = tokens = 0
    # the schedule's time 0 on the clock (each request is due ``at`` after it)
    origin = sent[0].due - sent[0].planned.at if sent else 0.0
    last_end = origin
    for s in sent:
        rec = s.rec
        lags.append((rec.t_send - s.due) * 1e3)
        end = rec.t_end if rec.t_end is not None else rec.t_send
        last_end = max(last_end, end)
        spans.append((rec.t_send, end))
        tokens += rec.n_tokens
        if rec.prompt_tokens is not None and rec.prompt_tokens != s.planned.prompt_tokens:
            wrong[rec.prompt_tokens] = wrong.get(rec.prompt_tokens, 0) + 1
        if rec.t_first is not None:
            sched_ttft.append((rec.t_first - s.due) * 1e3)
            sent_ttft.append((rec.t_first - rec.t_send) * 1e3)
        n = rec.n_tokens
        if n >= 2 and rec.token_times:
            tbt.append((rec.token_times[-1] - rec.token_times[0]) / (n - 1) * 1e3)
        if rec.error:
            failed += 1
            key = rec.error[:120]
            errors[key] = errors.get(key, 0) + 1
        elif rec.finished and rec.token_times:
            completed += 1
            t_last = rec.token_times[-1]
            sched_e2e.append((t_last - s.due) * 1e3)
            sent_e2e.append((t_last - rec.t_send) * 1e3)
            if n < s.planned.max_tokens:
                early += 1
    # from the schedule's start to the later of its planned end and the last request's end
    span = max(offered_s, last_end - origin)
    n_req = len(sent)
    return OpenFigures(
        requests=n_req,
        completed=completed,
        failed=failed,
        early_stops=early,
        span_s=span,
        offered_rate=n_req / offered_s if offered_s > 0 else None,
        achieved_rate=completed / span if span > 0 else 0.0,
        sched_ttft=tuple(sched_ttft),
        sent_ttft=tuple(sent_ttft),
        sched_e2e=tuple(sched_e2e),
        sent_e2e=tuple(sent_e2e),
        tbt=tuple(tbt),
        output_tokens=tokens,
        send_lag=tuple(lags),
        max_in_flight=_most_at_once(spans),
        errors=errors,
        wrong_lengths=wrong,
    )


# -- the cell --------------------------------------------------------------------------------


@dataclass
class OpenLoopResult:
    """What an open-loop cell measured: its figures, the server's own over the cell, its
    flags."""

    figures: OpenFigures
    server: ServerFigures | None = None
    flags: tuple[Flag, ...] = ()
    notes: tuple[str, ...] = ()
    #: expected prefix-cache share of a trace (:func:`expected_hit_share`); None for a rate
    expected_hit_share: float | None = None
    sent: list[Sent] = field(default_factory=list, repr=False)

    @property
    def sched_ttft_ci(self) -> Interval | None:
        return median_interval(self.figures.sched_ttft)

    @property
    def sched_e2e_ci(self) -> Interval | None:
        return median_interval(self.figures.sched_e2e)

    @property
    def tbt_ci(self) -> Interval | None:
        return median_interval(self.figures.tbt)

    @property
    def send_lag_p99_ms(self) -> float | None:
        return _pct(self.figures.send_lag, 99)

    @property
    def server_queue_ms(self) -> float | None:
        q = self.server.queue_time_mean_s if self.server is not None else None
        return None if q is None else q * 1e3


def open_status(result: OpenLoopResult, max_error_rate: float) -> CellStatus:
    """Valid, or failed (prompts at another length; more failed requests than
    ``max_error_rate``), as :func:`~.status.cell_status` words a decode cell."""
    from ..results import Status

    f = result.figures
    errors = "; ".join(f"{n}× {msg}" for msg, n in f.errors.items()) or None
    if f.wrong_lengths:
        return CellStatus(
            Status.FAILED,
            "the server counted other prompt lengths than those sent: "
            + ", ".join(f"{k:,} ({v}×)" for k, v in sorted(f.wrong_lengths.items())),
            "prompt_form",
            errors,
        )
    if f.error_rate > max_error_rate:
        return CellStatus(
            Status.FAILED,
            f"{f.failed} of {f.requests} requests failed "
            f"({f.error_rate:.0%} > max_error_rate {max_error_rate:g})",
            "max_error_rate",
            errors,
        )
    if f.requests == 0:
        return CellStatus(Status.ERROR, "the schedule had no request (rate × duration too small)")
    return CellStatus(Status.VALID)


async def run_open_loop(
    conn: Connection | ReplicaSet,
    dialect: Dialect,
    plan: Sequence[Planned],
    offered_s: float,
    watch_metrics: bool = True,
    keep_reads: bool = False,
) -> OpenLoopResult:
    """Send each planned request at its time (``LEAD_S`` after the call, plus its ``at``),
    never waiting for an earlier one; read every stream to its end; then the figures.

    With ``watch_metrics``, ``/metrics`` is read before the first send, about once a second
    while requests are out, and after the last ended: the server's figures of the cell (its
    queue time, prefix cache, ...), as a decode window reads them. The reads are parsed after
    the cell. A request is never cancelled by the cell; the client's own bounds
    (``--llm-timeout``) end a stalled one as an error."""
    from .protocol import EDGE_FAMILIES, IDLE_WAIT_S, POLL_FAMILIES, _read, _wait_idle
    from .protocol import _window_figures as window
    from .streams import failure_words

    busy = await _wait_idle(conn, min(conn.timeout, IDLE_WAIT_S)) if watch_metrics else None
    if isinstance(conn, Connection):
        await conn.warm_pool(min(16, max(len(plan), 1)))
    read_open = await _read(conn) if watch_metrics else None
    path = dialect.path
    loop = asyncio.get_running_loop()
    sent: list[Sent] = []
    tasks: list[asyncio.Task[StreamRecord]] = []
    polls = []
    bodies: list[bytes | None] = []
    prebuilt = 0
    for p in plan:  # the first bodies now, the others just before they are sent
        ready = p.body is not None or prebuilt + p.prompt_tokens <= PREBUILT_TOKENS
        bodies.append(p.payload() if ready else None)
        prebuilt += p.prompt_tokens if ready else 0
    t0 = time.perf_counter() + LEAD_S

    async def poll() -> None:
        while True:
            await asyncio.sleep(POLL_S)
            polls.append(await _read(conn))

    poller = loop.create_task(poll()) if watch_metrics else None
    try:
        for p, body in zip(plan, bodies, strict=True):
            due = t0 + p.at
            if body is None:
                await asyncio.sleep(0)  # the streams' reads first
                body = p.payload()
            delay = due - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            rec = StreamRecord(keep_reads=keep_reads)
            sent.append(Sent(due, p, rec))
            tasks.append(loop.create_task(stream_to(conn, path, body, rec)))
        ended = await asyncio.gather(*tasks, return_exceptions=True)
        # a request's own failure is in its record; these stop the cell: the key refused, or
        # an exception that is not the server's (the client's own), said in one line
        for outcome in ended:
            if isinstance(outcome, KeyRejected):
                raise outcome
        for outcome in ended:
            if isinstance(outcome, Exception):
                raise LLMSpeedError(failure_words(outcome))
    finally:
        for t in tasks:
            t.cancel()
        if poller is not None:
            poller.cancel()
            await asyncio.gather(poller, return_exceptions=True)
        await asyncio.gather(*tasks, return_exceptions=True)
    read_close = await _read(conn) if watch_metrics else None
    for s in sent:
        account_tokens(s.rec, s.planned.max_tokens)
    server = None
    if read_open is not None and read_close is not None:
        server_open = read_open.parse(EDGE_FAMILIES)[1]
        server_close = read_close.parse(EDGE_FAMILIES)[1]
        server_polls = [x for p in polls if (x := p.parse(POLL_FAMILIES)[1]) is not None]
        server = window(server_open, server_close, server_polls)
    figures = open_figures(sent, offered_s)
    flags: list[Flag] = [busy] if busy is not None else []
    lag = _pct(figures.send_lag, 99)
    if lag is not None and lag > SEND_LAG_FLAG_MS:
        flags.append(
            Flag(
                FlagKind.CLIENT_BEHIND,
                f"sent requests late: p99 {lag:.1f} ms after their scheduled time (counted "
                "in their latencies)",
            )
        )
    return OpenLoopResult(figures, server=server, flags=tuple(flags), sent=sent)
