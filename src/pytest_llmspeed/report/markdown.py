"""A Markdown summary of the run, appended to ``$GITHUB_STEP_SUMMARY`` on GitHub Actions."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from tabulate import tabulate

from ..core.text import for_person
from ..gate.verdict import counted
from ..results import CellRecord, Outcome, Phase, Status, order_contexts
from .notes import by_kind, which
from .slo import markdown as slo_markdown
from .slo import rate_markdown
from .terminal import fmt_ms, fmt_rate, replica_line


def summary(
    title: str,
    cells: list[CellRecord],
    notes: list[str],
    objectives: str | None = None,
    capacity: Mapping[str, Mapping[str, Any]] | None = None,
    rate_capacity: Mapping[str, Mapping[str, Any]] | None = None,
) -> str:
    """The step summary: prefill table, decode matrix, the capacity at the objectives, the
    gate's verdicts counted, the regressions, the figures too noisy to tell, the run's
    notes."""
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
                    mark = " ❌" if cell.status is Status.FAILED else _mark(cell)
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
    lines += rate_markdown(objectives, rate_capacity or {})
    counts = counted(cells)
    if counts:
        lines += [f"**Against the baseline**: {counts}", ""]
    if regressions:
        lines += ["**Regressions**", ""] + [f"- `{r}`" for r in regressions]
        why = [c.gate.why for c in cells if c.gate and c.gate.regressions and c.gate.why]
        if why:
            lines += ["", "**Why** (the server's own figures against the baseline's)", ""]
            lines += [f"- {w}" for w in why]
        lines.append("")
    unknown = [k.unknown_message() for c in cells if c.gate for k in c.gate.unknowns]
    if unknown:
        lines += ["**Unknown** (too noisy to tell at the tolerance)", ""]
        lines += [f"- `{u}`" for u in unknown] + [""]
    lines += [f"> {note_line(n)}" for n in notes]
    return "\n".join(lines) + "\n"


def _mark(cell: CellRecord) -> str:
    """A gated cell's verdict beside its figure: ❔ unknown, ✅ improved (a regressed cell is
    a failed one: ❌)."""
    if cell.gate is None:
        return ""
    return {Outcome.UNKNOWN: " ❔", Outcome.IMPROVEMENT: " ✅"}.get(cell.gate.outcome, "")


#: GitHub's limit of a step's summary (1 MiB; a larger one is not shown at all)
SUMMARY_LIMIT = 1024 * 1024
#: the characters by which a note could start a heading, a link, a table or emphasis
_NOTE_SPECIAL = re.compile(r"([\\`*_\[\]|~#])")


def note_line(text: str) -> str:
    """A note of the run (the plugin's words, a server's strings in some) as one line of
    Markdown that adds nothing: :func:`~pytest_llmspeed.core.text.for_person` (a longer
    cap: the words are the plugin's), HTML's ``<``, ``>``, ``&`` as entities, and the
    characters of headings, links, tables and emphasis escaped (the rest, ``.`` ``-`` ``(``,
    shows as it is)."""
    text = for_person(text, 2_000)
    text = text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return _NOTE_SPECIAL.sub(r"\\\1", text)


def capped(text: str, written: int = 0, limit: int = SUMMARY_LIMIT) -> str:
    """``text`` cut at a line, with a last line that says so, when it and what the step's
    summary already holds (``written`` bytes) would pass ``limit`` bytes."""
    room = limit - written
    data = text.encode()
    if len(data) <= room:
        return text
    end = "\n> The summary is cut here: GitHub shows at most 1 MiB of a step's summary. "
    end += "The whole run is in the results file and the page.\n"
    keep = data[: max(room - len(end.encode()), 0)].decode(errors="ignore")
    keep = keep[: keep.rfind("\n") + 1] if "\n" in keep else ""
    return keep + end
