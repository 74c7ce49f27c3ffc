"""A Markdown summary of the run, appended to ``$GITHUB_STEP_SUMMARY`` on GitHub Actions."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tabulate import tabulate

from ..results import CellRecord, Phase, Status, order_contexts
from .notes import by_kind, which
from .slo import markdown as slo_markdown
from .terminal import fmt_ms, fmt_rate, replica_line


def summary(
    title: str,
    cells: list[CellRecord],
    notes: list[str],
    objectives: str | None = None,
    capacity: Mapping[str, Mapping[str, Any]] | None = None,
) -> str:
    """The step summary: prefill table, decode matrix, the capacity at the objectives, the
    regressions, the run's notes."""
    lines = [f"## {title}", ""]
    prefill = [c for c in cells if c.phase is Phase.PREFILL]
    decode = [c for c in cells if c.phase is Phase.DECODE]
    regressions = [k.message() for c in cells if c.gate for k in c.gate.regressions]
    if prefill:
        rows = [
            [c.context, fmt_rate(c.prompt_tok_s), fmt_ms(c.ttft_ms)]
            if c.status is Status.VALID
            else [c.context, c.status.value, ""]
            for c in prefill
        ]
        lines += [
            "**Prefill** (cold cache)",
            "",
            tabulate(
                rows,
                headers=["Context", "prompt tok/s", "TTFT"],
                tablefmt="github",
                disable_numparse=True,
            ),
            "",
        ]
    if decode:
        conc = sorted({c.concurrency for c in decode})
        ctxs = order_contexts(decode)
        by = {(c.context, c.concurrency): c for c in decode}
        rows = []
        for ctx in ctxs:
            row: list[str] = [ctx]
            for n in conc:
                cell = by.get((ctx, n))
                if cell is None:
                    row.append("")
                elif cell.total_tok_s is None:
                    row.append(cell.status.value.capitalize())
                else:
                    mark = " ❌" if cell.status is Status.FAILED else ""
                    row.append(f"{fmt_rate(cell.total_tok_s)} · {fmt_ms(cell.ttft_ms)}{mark}")
            rows.append(row)
        lines += [
            "**Sustained decode**: total tok/s · TTFT; rows context, columns requests in flight",
            "",
            tabulate(
                rows, headers=["Context", *map(str, conc)], tablefmt="github", disable_numparse=True
            ),
            "",
        ]
        kinds = by_kind(decode)
        if kinds:
            lines += ["**Notes on cells**", ""]
            lines += [f"- {kind.heading}: {which(concerned, '`')}" for kind, concerned in kinds]
            lines.append("")
        replicas = [f"- {replica_line(c).strip()}" for c in decode if c.replica_tok_s]
        if replicas:
            lines += ["**Per replica** (total tok/s of each)", "", *replicas, ""]
        lines += slo_markdown(objectives, capacity or {}, decode)
    if regressions:
        lines += ["**Regressions**", ""] + [f"- `{r}`" for r in regressions]
        why = [c.gate.why for c in cells if c.gate and c.gate.regressions and c.gate.why]
        if why:
            lines += ["", "**Why** (the server's own figures against the baseline's)", ""]
            lines += [f"- {w}" for w in why]
        lines.append("")
    lines += [f"> {n}" for n in notes]
    return "\n".join(lines) + "\n"
