"""The columns of "All measurements", one list for the terminal and the page (issue 31): each
column's header, how it shows a cell, and where it is shown. The terminal's table is the
page's without the columns marked ``page_only``, so the two cannot drift apart: a column added
here is added to both, with the same text for the same cell.

Pure: records in, strings out.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ..results import CellRecord, Phase
from .terminal import fmt_ci_ms, fmt_ms, fmt_rate, fmt_tbt, pm  # terminal imports this lazily

NONE = "—"


@dataclass(frozen=True)
class Column:
    header: str  # on the page
    #: the cell's text in this column: a decode cell's, and a prefill cell's (None: "—")
    decode: Callable[[CellRecord], str]
    prefill: Callable[[CellRecord], str] | None = None
    short: str = ""  # the terminal's header, where it is narrower ("" = the same)
    page_only: bool = False  # too wide for the terminal: the page shows it
    #: the page's words for the cell, where they differ from the terminal's (the head's: the
    #: status's label, the resolved context); a figure's text is the same in both
    on_page: Callable[[CellRecord], str] | None = None
    #: an open-loop cell's text (rate, trace: docs/workloads.md); None: "—"
    open: Callable[[CellRecord], str] | None = None
    #: a conversation cell's text (docs/workloads.md, "Conversations"); None: "—"
    conversation: Callable[[CellRecord], str] | None = None

    def text(self, cell: CellRecord, page: bool = False) -> str:
        if page and self.on_page is not None:
            return self.on_page(cell)
        if cell.phase.open_loop:
            show = self.open
        elif cell.phase is Phase.CONVERSATION:
            show = self.conversation
        else:
            show = self.decode if cell.phase is Phase.DECODE else self.prefill
        return show(cell) if show is not None else NONE


_PHASE_WORDS = {
    Phase.PREFILL: "Prefill",
    Phase.DECODE: "Sustained decode",
    Phase.RATE: "Open loop: rate",
    Phase.TRACE: "Open loop: trace",
    Phase.CONVERSATION: "Conversation",
}


def _phase(c: CellRecord) -> str:
    return _PHASE_WORDS[c.phase]


def _context(c: CellRecord) -> str:
    return str(c.context)


def _concurrency(c: CellRecord) -> str:
    if c.phase.open_loop:  # as many as the open loop had open at once
        return NONE if c.max_in_flight is None else f"≤{c.max_in_flight}"
    return "" if c.concurrency is None else str(c.concurrency)


def _status(c: CellRecord) -> str:
    return c.status.value


#: the head of every row: which cell, and its status (shown for a cell with no figures too)
HEAD: tuple[Column, ...] = (
    Column("Phase", _phase, _phase, open=_phase, conversation=_phase),
    Column(
        "Context",
        _context,
        _context,
        on_page=lambda c: str(c.context_display or c.context),
        open=_context,
        conversation=_context,
    ),
    Column(
        "Requests at once",
        _concurrency,
        _concurrency,
        "Requests",
        on_page=lambda c: _concurrency(c) if c.phase.open_loop else str(c.concurrency),
        open=_concurrency,
        conversation=_concurrency,  # its users
    ),
    Column(
        "Status",
        _status,
        _status,
        on_page=lambda c: c.status.label,
        open=_status,
        conversation=_status,
    ),
)

#: the figures: "—" in each for a cell that has none
FIGURES: tuple[Column, ...] = (
    Column(
        "Total tok/s",
        lambda c: fmt_rate(c.total_tok_s) + pm(c.total_tok_s, c.total_tok_s_ci),
        lambda c: fmt_rate(c.prompt_tok_s) + pm(c.prompt_tok_s, c.prompt_tok_s_ci),
        open=lambda c: fmt_rate(c.open_output_tok_s),
    ),
    Column(
        "Per request tok/s",
        lambda c: fmt_rate(c.per_request_tok_s) + pm(c.per_request_tok_s, c.per_request_tok_s_ci),
    ),
    Column(
        "TTFT",
        lambda c: fmt_ms(c.ttft_ms) + fmt_ci_ms(c.ttft_ms_ci),
        lambda c: fmt_ms(c.ttft_ms) + fmt_ci_ms(c.ttft_ms_ci),
        open=lambda c: fmt_ms(c.sched_ttft_ms) + fmt_ci_ms(c.sched_ttft_ms_ci),
        conversation=lambda c: fmt_ms(c.conv_ttft_ms),  # the turns after the first
    ),
    Column(
        "TTFT p90",
        lambda c: fmt_ms(c.ttft_p90_ms),
        page_only=True,
        open=lambda c: fmt_ms(c.sched_ttft_p90_ms),
    ),
    Column(
        "TTFT p99",
        lambda c: fmt_ms(c.ttft_p99_ms),
        page_only=True,
        open=lambda c: fmt_ms(c.sched_ttft_p99_ms),
    ),
    Column(
        "Time between tokens",
        lambda c: fmt_tbt(c.tbt_ms) + fmt_ci_ms(c.tbt_ms_ci, 2),
        open=lambda c: fmt_tbt(c.open_tbt_ms) + fmt_ci_ms(c.open_tbt_ms_ci, 2),
    ),
    Column("TBT p90", lambda c: fmt_tbt(c.tbt_p90_ms), page_only=True),
    Column("TBT p99", lambda c: fmt_tbt(c.tbt_p99_ms), page_only=True),
    Column("Average active requests", lambda c: f"{c.avg_active or 0:.1f}", short="Avg active"),
    Column(
        "Completed requests",
        lambda c: str(c.completed),
        lambda c: str(c.repeats or 1),
        short="Completed",
        open=lambda c: str(c.open_completed),
        conversation=lambda c: str((c.conv_requests or 0) - (c.conv_failed or 0)),
    ),
    Column("Output tokens", lambda c: f"{c.output_tokens or 0:,}"),
    Column(
        "Measured for",
        lambda c: f"{c.measured_s or 0:.1f} s",
        open=lambda c: f"{c.open_span_s or 0:.1f} s",
    ),
)


def columns(page: bool) -> tuple[Column, ...]:
    """The head and figure columns of the page's table, or the terminal's."""
    return tuple(c for c in (*HEAD, *FIGURES) if page or not c.page_only)


def headers(page: bool) -> list[str]:
    return [c.header if page else (c.short or c.header) for c in columns(page)]


def row(cell: CellRecord, page: bool) -> list[str]:
    """A cell's row: its head, then its figures (each "—" for a cell with none)."""
    head = [c.text(cell, page) for c in HEAD]
    shown = [c for c in FIGURES if page or not c.page_only]
    if not cell.measured:
        return [*head, *[NONE] * len(shown)]
    return [*head, *(c.text(cell, page) for c in shown)]


__all__ = ["FIGURES", "HEAD", "Column", "columns", "headers", "row"]
