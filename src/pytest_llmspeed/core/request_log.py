"""One row per request (``--llm-requests=FILE``): what each request of a decode or open-loop
cell saw, as JSON Lines, written as each cell ends (docs/outputs.md, "One row per request").

Every row has every key (null where it does not apply), so pandas' ``read_json(lines=True)``
and DuckDB's ``read_json_auto`` read the file as one table without glue. Times are seconds
from the cell's first send (a cell's rows share a clock; cells do not); latencies are ms.
The file is bounded: past :data:`REQUESTS_CAP_BYTES` no more rows are written and the run says
so; a write that fails stops the file, once, with one line naming the path and the cause.
Server strings (errors) are redacted and made printable as every output's are. No pytest.
"""

from __future__ import annotations

import contextlib
import json
import math
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import IO, Any

import numpy as np

from .client import StreamRecord
from .stats import arrival_gaps_ms
from .text import for_person

#: the most bytes the file holds (100 MiB: about 50,000 rows of 4,096-token requests, their
#: gaps included); past it no more rows are written, and the run's notes say after how many
REQUESTS_CAP_BYTES = 100 << 20
#: the keys of a row, in order (the schema: docs/outputs.md)
KEYS = (
    "cell", "attempt", "arm", "round", "request", "window_open_s", "window_close_s", "sent_s",
    "due_s", "first_s", "last_s", "ttft_ms", "e2e_ms", "output_tokens", "chunks", "gaps_ms",
    "finish_reason", "status", "error",
)  # fmt: skip


def _t(value: float | None, zero: float) -> float | None:
    return None if value is None or not math.isfinite(value) else round(value - zero, 6)


def _ms(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else round((b - a) * 1e3, 3)


def status_of(rec: StreamRecord) -> str:
    """``finished`` (its stream ended as the protocol says), ``error``, ``cut`` (cancelled by
    the window's end, or a stream that ended early) ."""
    if rec.error:
        return "error"
    if rec.finished:
        return "finished"
    return "cut"


def request_row(
    cell: str,
    index: int,
    rec: StreamRecord,
    zero: float,
    due: float | None = None,
    tags: dict[str, Any] | None = None,
    window: tuple[float, float] | None = None,
) -> dict[str, Any]:
    """One request's row (``zero``: the cell's first send, ``perf_counter`` time; ``window``:
    a decode cell's, whose figures count what arrived inside it)."""
    times = np.asarray(rec.token_times, dtype=np.float64)
    last = float(times[-1]) if len(times) else None
    gaps = arrival_gaps_ms(times, -math.inf, math.inf) if len(times) else np.empty(0)
    row: dict[str, Any] = dict.fromkeys(KEYS)
    row.update(tags or {})
    row.update(
        cell=cell,
        request=index,
        window_open_s=_t(window[0], zero) if window else None,
        window_close_s=_t(window[1], zero) if window else None,
        sent_s=_t(rec.t_send, zero),
        due_s=_t(due, zero),
        first_s=_t(rec.t_first, zero),
        last_s=_t(last, zero),
        ttft_ms=_ms(rec.t_send, rec.t_first),
        e2e_ms=_ms(rec.t_send, last) if rec.finished else None,
        output_tokens=rec.n_tokens,
        chunks=rec.chunks,
        gaps_ms=[round(float(g), 3) for g in gaps],
        finish_reason=for_person(rec.finish_reason, 40) if rec.finish_reason else None,
        status=status_of(rec),
        error=for_person(rec.error, 300) if rec.error else None,
    )
    return row


def cell_rows(
    cell: str,
    records: Sequence[StreamRecord],
    due: Sequence[float | None] | None = None,
    tags: dict[str, Any] | None = None,
    window: tuple[float, float] | None = None,
) -> list[dict[str, Any]]:
    """A cell's rows, its requests in the order they were sent (``due``: each one's scheduled
    send, for an open-loop cell; ``window``: a decode cell's)."""
    if not records:
        return []
    zero = min(r.t_send for r in records)
    dues = list(due) if due is not None else [None] * len(records)
    order = sorted(range(len(records)), key=lambda i: records[i].t_send)
    return [
        request_row(cell, k, records[i], zero, dues[i], tags, window)
        for k, i in enumerate(order, start=1)
    ]


class RequestLog:
    """The ``--llm-requests`` file, truncated when the run begins and appended to as each cell
    ends; each measurement of a cell (a re-measurement, an A/B round) its ``attempt``."""

    def __init__(self, path: str | Path, cap_bytes: int = REQUESTS_CAP_BYTES) -> None:
        self.path, self.cap = Path(path), cap_bytes
        self.attempts: dict[str, int] = {}
        self.size = self.rows = 0
        self.capped = False
        self.error: str | None = None  # why the file stopped (said once)
        self._file: IO[str] | None = None
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._file = self.path.open("w", encoding="utf-8")
        except OSError as exc:
            self.error = f"{self.path}: {exc.strerror or exc}"

    def cell(self, rows: Iterable[dict[str, Any]]) -> None:
        """Append a measurement's rows (flushed: a run cut later keeps them), within the
        cap."""
        if self._file is None or self.capped:
            return
        rows = list(rows)
        if rows:
            cell = str(rows[0]["cell"])
            self.attempts[cell] = attempt = self.attempts.get(cell, 0) + 1
        try:
            for row in rows:
                row["attempt"] = attempt
                line = json.dumps(row, ensure_ascii=False, allow_nan=False) + "\n"
                size = len(line.encode())
                if self.size + size > self.cap:
                    self.capped = True
                    break
                self._file.write(line)
                self.size += size
                self.rows += 1
            self._file.flush()
        except OSError as exc:
            self.error = f"{self.path}: {exc.strerror or exc}"
            self.close()

    def note(self) -> str | None:
        """The run's line about the file, when it is not whole."""
        if self.error:
            return f"--llm-requests: not written past {self.rows:,} rows: {self.error}"
        if self.capped:
            return (
                f"--llm-requests: {self.path} capped at {self.cap >> 20} MiB after "
                f"{self.rows:,} rows: the later requests are not in it"
            )
        return None

    def close(self) -> None:
        if self._file is not None:
            with contextlib.suppress(OSError):
                self._file.close()
            self._file = None
