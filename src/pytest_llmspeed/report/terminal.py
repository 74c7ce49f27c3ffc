"""The terminal report: prefill table and decode matrix, as in the published speed tests."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from tabulate import tabulate

from .. import figures
from ..gate.verdict import Accounting
from ..results import CellRecord, Phase, Status, order_contexts
from .notes import note_lines
from .server import not_exposed
from .server import table as server_table

_COMPACT_MARK = {
    Status.VALID: "",
    Status.OVER_CAPACITY: "over",
    Status.DOES_NOT_FIT: "long",
    Status.FAILED: "FAIL",
    Status.ERROR: "ERR",
    Status.NOT_RUN: "skip",
}


def fmt_rate(x: float | None) -> str:
    if x is None:
        return "—"
    if x >= 10_000:
        return f"{x / 1000:,.1f}K"
    return f"{x:,.1f}"


def fmt_ms(x: float | None) -> str:
    return "—" if x is None else f"{x:,.0f} ms"


def fmt_tbt(x: float | None) -> str:
    return "—" if x is None else f"{x:,.1f} ms"


def pm(value: float | None, ci: tuple[float, float] | None) -> str:
    """`` ±0.4%``: the larger side of a 95 % interval, as a fraction of the value ('' if
    there is none)."""
    if value is None or ci is None or value == 0:
        return ""
    half = max(value - ci[0], ci[1] - value) / abs(value)
    return f" ±{half:.1%}" if half < 0.0995 else f" ±{half:.0%}"


def fmt_ci_ms(ci: tuple[float, float] | None, digits: int = 0) -> str:
    return "" if ci is None else f" [{ci[0]:,.{digits}f}–{ci[1]:,.{digits}f}]"


def _row_label(cells: list[CellRecord], ctx: str) -> str:
    shown = next(
        (c.context_display for c in cells if c.context == ctx and c.context_display),
        None,
    )
    return f"{ctx} ({shown})" if shown and shown != ctx else ctx


def prefill_table(cells: list[CellRecord]) -> str:
    rows = []
    for c in cells:
        if c.status is Status.VALID:
            rows.append([_row_label(cells, c.context), fmt_rate(c.prompt_tok_s), fmt_ms(c.ttft_ms)])
        else:
            rows.append([c.context, c.status.label, ""])
    return tabulate(
        rows,
        headers=["Context", "prompt tok/s", "TTFT (cold)"],
        tablefmt="simple",
        disable_numparse=True,
        colalign=("left", "right", "right"),
    )


def open_table(cells: list[CellRecord]) -> str:
    """The open-loop cells (docs/workloads.md), one row each: offered and achieved rate, the
    latencies from the scheduled send (and TTFT from the actual send), time between tokens,
    output tok/s, requests completed / sent, the most in flight, the server's queue time."""

    def rate(x: float | None) -> str:
        return "—" if x is None else f"{x:,.2f}"

    rows = []
    for c in cells:
        if not c.measured:
            rows.append([str(c.id), c.status.label, *[""] * 8])
            continue
        mark = " ✗" if c.status is Status.FAILED else ""
        rows.append(
            [
                str(c.id) + mark,
                f"{rate(c.offered_rate)} / {rate(c.achieved_rate)}",
                f"{fmt_ms(c.sched_ttft_ms)} / {fmt_ms(c.sched_ttft_p99_ms)}",
                fmt_ms(c.sent_ttft_ms),
                fmt_ms(c.sched_e2e_ms),
                fmt_tbt(c.open_tbt_ms),
                fmt_rate(c.open_output_tok_s),
                f"{c.open_completed}/{c.open_requests}",
                str(c.max_in_flight),
                fmt_ms(c.server_queue_ms),
            ]
        )
    return tabulate(
        rows,
        headers=[
            "Cell", "req/s offered / done", "TTFT p50 / p99", "TTFT from send", "end-to-end",
            "TBT", "output tok/s", "completed", "most in flight", "server queue",
        ],
        tablefmt="simple",
        disable_numparse=True,
        colalign=("left",) + ("right",) * 9,
    )  # fmt: skip


#: the per-turn table's columns (the terminal's and the page's)
CONVERSATION_HEADER = [
    "Cell", "turn", "users", "prompt tokens", "TTFT", "new part tok/s", "output tok/s",
    "hit rate", "should hit (prompts / answers too)",
]  # fmt: skip


def conversation_rows(cells: list[CellRecord]) -> list[list[str]]:
    """The conversation cells (docs/workloads.md, "Conversations"), one row per turn: its
    users, prompt tokens, TTFT, the prefill of its new part, output tok/s, and the server's
    prefix-cache hit rate beside the share the history should hit (prompts cached; answers
    cached too, where the answers' own ids were carried); a cell not measured, one row."""

    def pct(x: float | None) -> str:
        return "—" if x is None else f"{x:.1%}"

    def at(values: tuple[Any, ...] | None, k: int) -> Any:
        return values[k] if values is not None and k < len(values) else None

    rows = []
    for c in cells:
        if not c.measured or not c.turn_users:
            rows.append([str(c.id), c.status.label, *[""] * 7])
            continue
        mark = " ✗" if c.status is Status.FAILED else ""
        for k, users in enumerate(c.turn_users):
            tokens = at(c.turn_prompt_tokens, k)
            rows.append(
                [
                    str(c.id) + mark if k == 0 else "",
                    str(k + 1),
                    str(users),
                    "—" if tokens is None else f"{tokens:,}",
                    fmt_ms(at(c.turn_ttft_ms, k)),
                    fmt_rate(at(c.turn_new_prefill_tok_s, k)),
                    fmt_rate(at(c.turn_output_tok_s, k)),
                    pct(at(c.turn_hit_rate, k)),
                    f"{pct(at(c.turn_expected_hit_share, k))} / "
                    f"{pct(at(c.turn_expected_hit_share_answers, k))}",
                ]
            )
    return rows


def conversation_table(cells: list[CellRecord]) -> str:
    """:func:`conversation_rows` as the terminal's table."""
    return tabulate(
        conversation_rows(cells),
        headers=CONVERSATION_HEADER,
        tablefmt="simple",
        disable_numparse=True,
        colalign=("left",) + ("right",) * 8,
    )


def decode_matrix(cells: list[CellRecord], width: int) -> list[str]:
    """Rows context, columns concurrency. Wide: ``tok/s · TTFT``; compact: two matrices."""
    conc = sorted({c.concurrency for c in cells})
    ctxs = order_contexts(cells)
    by = {(c.context, c.concurrency): c for c in cells}
    wide = width >= 24 + 17 * len(conc)

    def grid(render: Callable[[CellRecord], str]) -> str:
        rows = []
        for ctx in ctxs:
            row = [_row_label(cells, ctx)]
            for n in conc:
                cell = by.get((ctx, n))
                row.append("" if cell is None else render(cell))
            rows.append(row)
        return tabulate(
            rows,
            headers=["Context", *[str(n) for n in conc]],
            tablefmt="simple",
            disable_numparse=True,
            colalign=("left",) + ("right",) * len(conc),
        )

    def both(c: CellRecord) -> str:
        if not c.measured or c.total_tok_s is None:
            return c.status.label
        mark = " ✗" if c.status is Status.FAILED else ""
        if c.tokens == "chunk-count":
            mark += " ≈"  # one token per chunk assumed
        return f"{fmt_rate(c.total_tok_s)} · {fmt_ms(c.ttft_ms)}{mark}"

    def rate(c: CellRecord) -> str:
        if not c.measured or c.total_tok_s is None:
            return _COMPACT_MARK[c.status]
        return fmt_rate(c.total_tok_s) + ("!" if c.status is Status.FAILED else "")

    def ttft(c: CellRecord) -> str:
        if not c.measured or c.ttft_ms is None:
            return _COMPACT_MARK[c.status]
        return f"{c.ttft_ms:,.0f}"

    if wide:
        return ["total tok/s · TTFT, rows context, columns simultaneous requests", grid(both)]
    return [
        "total tok/s (rows context, columns simultaneous requests)",
        grid(rate),
        "",
        "TTFT ms (median)",
        grid(ttft),
    ]


def details_table(cells: list[CellRecord]) -> str:
    """ "All measurements": the page's table (report/columns.py) without its widest columns."""
    from .columns import headers, row

    rows = [row(c, page=False) for c in cells]
    return tabulate(rows, headers=headers(page=False), tablefmt="simple", disable_numparse=True)


def further_figures(cells: list[CellRecord]) -> tuple[list[str], list[list[str]]]:
    """The listed figures (:func:`.figures.listed`) the cells have, as a table: the header (the
    cell, each figure's label) and a row per cell that has any (— where it lacks one); nothing
    when no cell has one."""
    shown = [f for f in figures.listed() if any(getattr(c, f.key) is not None for c in cells)]
    rows = [
        [str(c.id), *(figures.text(f, getattr(c, f.key)) for f in shown)]
        for c in cells
        if any(getattr(c, f.key) is not None for f in shown)
    ]
    return (["Cell", *(f.label for f in shown)], rows) if shown else ([], [])


def replica_line(c: CellRecord) -> str:
    """A decode cell's total tok/s next to each replica's."""
    each = " · ".join(fmt_rate(x) for x in c.replica_tok_s or ())
    return f"  {c.id}: total {fmt_rate(c.total_tok_s)} tok/s; per replica {each}"


def render(
    cells: list[CellRecord],
    width: int,
    verbose: bool,
    notes: list[str],
    objectives: str | None = None,
    capacity: Mapping[str, Mapping[str, Any]] | None = None,
    baseline_capacity: Mapping[str, int] | None = None,
    rate_capacity: Mapping[str, Mapping[str, Any]] | None = None,
) -> list[str]:
    """All lines of the summary section (with --llm-slo's ``objectives``, each context's
    ``capacity`` at them, and with rate cells its ``rate_capacity``: report/slo.py)."""
    from .slo import lines as slo_lines
    from .slo import rate_lines

    prefill = [c for c in cells if c.phase is Phase.PREFILL]
    decode = [c for c in cells if c.phase is Phase.DECODE]
    lines: list[str] = []
    if prefill:
        repeats = max(c.repeats or 1 for c in prefill)
        how = f", median of {repeats} cold requests" if repeats > 1 else ""
        lines += [f"Prefill (cold cache{how}, prompt tok/s by context)", prefill_table(prefill), ""]
    if decode:
        lines += ["Sustained decode", *decode_matrix(decode, width), ""]
        if any(c.status is Status.OVER_CAPACITY for c in decode):
            lines.append(
                "Over capacity: not run because this many requests at this context "
                "would exceed the server's KV cache."
            )
        lines.append("Latencies are medians. TTFT in decode cells is measured on a warm prefix.")
        lines += note_lines(decode)
        lines += [replica_line(c) for c in decode if c.replica_tok_s]
        capacity_lines = slo_lines(objectives, capacity or {}, decode, baseline_capacity)
        if capacity_lines:
            lines += ["", *capacity_lines]
    open_cells = [c for c in cells if c.phase.open_loop]
    if open_cells:
        lines += [
            "Open loop (requests sent at their scheduled times; latencies are medians counted "
            "from the scheduled send)",
            open_table(open_cells),
            "",
        ]
        rated = rate_lines(objectives, rate_capacity or {})
        if rated:
            lines += [*rated, ""]
    talks = [c for c in cells if c.phase is Phase.CONVERSATION]
    if talks:
        lines += [
            "Conversations (users in step; per turn the medians over its users, and the "
            "server's prefix cache over the turn)",
            conversation_table(talks),
            "",
        ]
    if verbose and cells:
        lines += ["", "All measurements", details_table(cells)]
        header, rows = further_figures(cells)
        if rows:
            table = tabulate(
                rows,
                headers=header,
                tablefmt="simple",
                disable_numparse=True,
                colalign=("left",) + ("right",) * (len(header) - 1),
            )
            lines += ["", "More figures", table]
        header, rows = server_table(cells)
        if rows:
            lines += ["", "The server's own figures (its /metrics over each window)"]
            lines.append(
                tabulate(
                    rows,
                    headers=header,
                    tablefmt="simple",
                    disable_numparse=True,
                    colalign=("left",) + ("right",) * (len(header) - 1),
                )
            )
    lines += unmeasured_lines(cells)
    missing = not_exposed(cells)
    if missing:
        lines.append(f"note: {missing}")
    lines += [f"note: {n}" for n in notes]
    return lines


def unmeasured_lines(cells: list[CellRecord]) -> list[str]:
    """Why each cell in error has no figures (cut by a timeout or Ctrl-C, the server failed
    it), one line each: the matrix shows only ERR."""
    return [f"error: {c.id}: {c.reason}" for c in cells if c.status is Status.ERROR and c.reason]


WARMUP_NOTE = "measured by the decode warm-up (its prefill test was not selected)"


def gate_lines(path: object, acc: Accounting, missing_fails: bool = True) -> list[str]:
    """The gate's summary: every baseline cell accounted for (the counts add up to the
    baseline's cells, each judged one regressed, unknown, improved or same), then the
    regressed figures, the improvements, the figures too noisy to tell (with what would decide
    them), the cells not run, not gated, deselected, and the measured cells the baseline has no
    floor for."""
    unknown = f", {len(acc.unknown)} unknown" if acc.unknown else ""
    lines = [
        "",
        f"Baseline {path}: {len(acc.regressed)} regression(s), "
        f"{len(acc.improvements)} improvement(s) beyond tolerance{unknown}",
        f"  {acc.counts()}",
    ]
    lines += [f"  REGRESSION  {c.message()}" for c in acc.regressions]
    lines += [f"  improvement {c.improvement_message()}" for c in acc.improvements]
    word = "UNKNOWN    " if acc.unknown_fails else "unknown    "
    lines += [f"  {word} {c.unknown_message()}" for c in acc.unknowns]
    if acc.unknown:
        lines.append(
            "  (a cell too noisy to tell fails the run: --llm-unknown=fail)"
            if acc.unknown_fails
            else "  (cells too noisy to tell pass: --llm-unknown=fail fails them)"
        )
    if acc.budget_cut:
        lines.append("  re-measurement stopped by --llm-budget: " + ", ".join(acc.budget_cut))
    word = "NOT RUN   " if missing_fails else "not run   "
    lines += [f"  {word}  {cid}: {why}" for cid, why in acc.not_run]
    if acc.not_run:
        lines.append(
            "  (a baseline cell this run could not measure fails the run; "
            "--llm-baseline-missing=warn accepts it)"
            if missing_fails
            else "  (--llm-baseline-missing=warn: cells not run are accepted)"
        )
    lines += [f"  not gated   {cid}: {why}" for cid, why in acc.not_gated]
    if acc.deselected:
        lines.append("  deselected: " + ", ".join(acc.deselected))
    if acc.no_floor:
        lines.append("  no floor (not in the baseline): " + ", ".join(acc.no_floor))
    lines.append(f"  {acc.spread_line()}")
    return lines
