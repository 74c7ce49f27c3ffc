"""The terminal report: prefill table and decode matrix, as in the published speed tests."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from tabulate import tabulate

from . import records as R

_MARK = {
    R.OVER_CAPACITY: "Over capacity",
    R.TOO_LONG: "Too long",
    R.FAILED: "FAILED",
    R.ERROR: "ERROR",
    R.SKIPPED: "skipped",
}
_COMPACT_MARK = {
    R.OVER_CAPACITY: "over",
    R.TOO_LONG: "long",
    R.FAILED: "FAIL",
    R.ERROR: "ERR",
    R.SKIPPED: "skip",
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


def _contexts(cells: Iterable[dict[str, Any]]) -> list[str]:
    out: list[str] = []
    for c in cells:
        if c["context"] not in out:
            out.append(c["context"])
    return out


def _row_label(cells: list[dict[str, Any]], ctx: str) -> str:
    shown = next(
        (
            c.get("context_display")
            for c in cells
            if c["context"] == ctx and c.get("context_display")
        ),
        None,
    )
    return f"{ctx} ({shown})" if shown and shown != ctx else ctx


def prefill_table(cells: list[dict[str, Any]]) -> str:
    rows = []
    for c in cells:
        if c["status"] == R.VALID:
            rows.append(
                [_row_label(cells, c["context"]), fmt_rate(c["prompt_tok_s"]), fmt_ms(c["ttft_ms"])]
            )
        else:
            rows.append([c["context"], _MARK.get(c["status"], c["status"]), ""])
    return tabulate(
        rows,
        headers=["Context", "prompt tok/s", "TTFT (cold)"],
        tablefmt="simple",
        disable_numparse=True,
        colalign=("left", "right", "right"),
    )


def decode_matrix(cells: list[dict[str, Any]], width: int) -> list[str]:
    """Rows context, columns concurrency. Wide: ``tok/s · TTFT``; compact: two matrices."""
    conc = sorted({c["concurrency"] for c in cells})
    ctxs = _contexts(cells)
    by = {(c["context"], c["concurrency"]): c for c in cells}
    wide = width >= 24 + 17 * len(conc)

    def grid(render) -> str:
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

    def both(c: dict[str, Any]) -> str:
        if c["status"] not in (R.VALID, R.FAILED) or c.get("total_tok_s") is None:
            return _MARK.get(c["status"], c["status"])
        mark = " ✗" if c["status"] == R.FAILED else ""
        return f"{fmt_rate(c['total_tok_s'])} · {fmt_ms(c['ttft_ms'])}{mark}"

    def rate(c: dict[str, Any]) -> str:
        if c["status"] not in (R.VALID, R.FAILED) or c.get("total_tok_s") is None:
            return _COMPACT_MARK.get(c["status"], c["status"])
        return fmt_rate(c["total_tok_s"]) + ("!" if c["status"] == R.FAILED else "")

    def ttft(c: dict[str, Any]) -> str:
        if c["status"] not in (R.VALID, R.FAILED) or c.get("ttft_ms") is None:
            return _COMPACT_MARK.get(c["status"], c["status"])
        return f"{c['ttft_ms']:,.0f}"

    if wide:
        return ["total tok/s · TTFT, rows context, columns simultaneous requests", grid(both)]
    return [
        "total tok/s (rows context, columns simultaneous requests)",
        grid(rate),
        "",
        "TTFT ms (median)",
        grid(ttft),
    ]


def details_table(cells: list[dict[str, Any]]) -> str:
    rows = []
    for c in cells:
        ok = c.get("total_tok_s") is not None or c.get("prompt_tok_s") is not None
        phase = "Prefill" if c["phase"] == "prefill" else "Sustained decode"
        if not ok:
            rows.append([phase, c["context"], c["concurrency"], c["status"]] + ["—"] * 8)
            continue
        if c["phase"] == "prefill":
            rows.append(
                [
                    phase,
                    c["context"],
                    1,
                    c["status"],
                    fmt_rate(c["prompt_tok_s"]),
                    "—",
                    fmt_ms(c["ttft_ms"]),
                    "—",
                    "—",
                    1,
                    "—",
                    "—",
                ]
            )
        else:
            rows.append(
                [
                    phase,
                    c["context"],
                    c["concurrency"],
                    c["status"],
                    fmt_rate(c["total_tok_s"]),
                    fmt_rate(c["per_request_tok_s"]),
                    fmt_ms(c["ttft_ms"]),
                    fmt_tbt(c["tbt_ms"]),
                    f"{c['avg_active']:.1f}",
                    c["completed"],
                    f"{c['output_tokens']:,}",
                    f"{c['measured_s']:.1f} s",
                ]
            )
    headers = [
        "Phase",
        "Context",
        "Requests",
        "Status",
        "Total tok/s",
        "Per request tok/s",
        "TTFT",
        "Time between tokens",
        "Avg active",
        "Completed",
        "Output tokens",
        "Measured for",
    ]
    return tabulate(rows, headers=headers, tablefmt="simple", disable_numparse=True)


def render(cells: list[dict[str, Any]], width: int, verbose: bool, notes: list[str]) -> list[str]:
    """All lines of the summary section."""
    prefill = [c for c in cells if c["phase"] == "prefill"]
    decode = [c for c in cells if c["phase"] == "decode"]
    lines: list[str] = []
    if prefill:
        repeats = max(c.get("repeats", 1) for c in prefill)
        how = f", median of {repeats} cold requests" if repeats > 1 else ""
        lines += [f"Prefill (cold cache{how}, prompt tok/s by context)", prefill_table(prefill), ""]
    if decode:
        lines += ["Sustained decode", *decode_matrix(decode, width), ""]
        if any(c["status"] == R.OVER_CAPACITY for c in decode):
            lines.append(
                "Over capacity: not run because this many requests at this context "
                "would exceed the server's KV cache."
            )
        lines.append("Latencies are medians. TTFT in decode cells is measured on a warm prefix.")
        flagged = [
            c
            for c in decode
            if c.get("queued")
            or c.get("tokens") == "chunk-count"
            or c.get("early_stops")
            or (c.get("stability_cv") or 0) > 0.1
        ]
        for c in flagged:
            why = []
            if c.get("queued"):
                why.append(
                    f"the server queued requests (effective concurrency "
                    f"{c.get('effective_concurrency')} < {c['concurrency']})"
                )
            if c.get("tokens") == "chunk-count":
                why.append("tokens counted per chunk (estimate: no usage in stream)")
            if c.get("early_stops"):
                why.append(f"{c['early_stops']} request(s) ended before max output")
            if (c.get("stability_cv") or 0) > 0.1:
                why.append(f"unstable: per-second throughput varies {c['stability_cv']:.0%}")
            lines.append(f"  {c['id']}: " + "; ".join(why))
    if verbose and cells:
        lines += ["", "All measurements", details_table(cells)]
    lines += [f"note: {n}" for n in notes]
    return lines
