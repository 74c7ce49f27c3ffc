"""The speed-test page: one self-contained HTML file, in the order of the published reference.

A pure function of :class:`~pytest_llmspeed.results.Results` (and, optionally, a comparison
with an earlier run). Jinja2 renders it with autoescaping on — the page shows text from the
server (model names, error messages) and from the user (metadata, a launch command), so
escaping is not left to each call site. Styles are inline, charts are inline SVG
(:mod:`.charts`), and nothing is loaded from anywhere: the file opens offline, from
``file://``, years later.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources
from typing import Any

from .. import figures
from ..core.text import for_person
from ..results import CellRecord, Outcome, Phase, Results, Status, order_contexts
from .charts import Series, line_chart
from .compare import Comparison, Verdict, change_matrix, fmt_change
from .notes import by_kind, row_notes, which
from .server import not_exposed
from .server import table as server_table
from .terminal import (
    CONVERSATION_HEADER,
    conversation_rows,
    fmt_ms,
    fmt_rate,
    further_figures,
    pm,
)

PREFILL_HINT = (
    "prompt tok/s by context length: the first request at each context, on a cold cache "
    "(its prefix never sent before), measured during the decode warm-up; TTFT beside it"
)


@dataclass(frozen=True)
class Page:
    """What a person sends to a colleague."""

    html: str

    def write(self, path: str) -> None:
        """Write the page atomically (a browser never opens half a file)."""
        import os
        import tempfile
        from pathlib import Path

        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=".llmspeed-", suffix=".html")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                fh.write(self.html)
            mask = os.umask(0)
            os.umask(mask)
            os.chmod(tmp, 0o666 & ~mask)  # readable as open() would make it, not 0600
            os.replace(tmp, target)
        except BaseException:  # a full disk: no half page left behind
            Path(tmp).unlink(missing_ok=True)
            raise


def _environment() -> Any:
    import jinja2

    return jinja2.Environment(
        loader=jinja2.FunctionLoader(
            lambda name: (
                resources.files(__package__).joinpath("templates", name).read_text(encoding="utf-8")
            )
        ),
        autoescape=True,
        trim_blocks=True,
        lstrip_blocks=True,
        undefined=jinja2.StrictUndefined,
    )


def _badge(cell: CellRecord) -> tuple[str, str]:
    gate = cell.gate
    if gate is None:
        return "", ""
    if gate.outcome is Outcome.REGRESSION:
        return "regression", "bad"
    if gate.outcome is Outcome.IMPROVEMENT:
        return "improved", "good"
    if gate.outcome is Outcome.SAME:
        return "same", "good"
    if gate.outcome is Outcome.UNKNOWN:
        return "unknown", "warn"
    if gate.outcome is Outcome.PASS:
        return "gate passed", "good"
    return "", ""


def _gate(cells: list[CellRecord]) -> dict[str, Any] | None:
    """The gate's verdicts counted, and each figure too noisy to tell with what would decide
    it; None when no cell was gated."""
    from ..gate.verdict import counted

    counts = counted(cells)
    if not counts:
        return None
    unknown = [k.unknown_message() for c in cells if c.gate for k in c.gate.unknowns]
    return {"counts": f"Against the baseline: {counts}", "unknown": unknown}


def _slo_mark(cell: CellRecord) -> dict[str, str]:
    """A decode cell against --llm-slo on the matrix: a mark ("SLO ✓", "SLO ✗", "SLO ?") and
    its words for the hover text; nothing without objectives."""
    if cell.slo is None:
        return {"slo": "", "slo_cls": "", "slo_text": ""}
    if cell.slo == "meets":
        mark, cls = "SLO ✓", "good"
    elif cell.slo.startswith("misses"):
        mark, cls = "SLO ✗", "bad"
    elif cell.slo.startswith("too close"):
        mark, cls = "SLO ?", "warn"
    else:
        return {"slo": "", "slo_cls": "", "slo_text": cell.slo}
    good = f"; goodput {fmt_rate(cell.goodput_tok_s)} tok/s" if cell.goodput_tok_s else ""
    return {"slo": mark, "slo_cls": cls, "slo_text": f"objectives: {cell.slo}{good}"}


def _capacity(results: Results) -> dict[str, Any] | None:
    """The capacity section: the objectives, a line per context, its goodput line."""
    from .slo import capacity_line, goodput_line

    objectives = results.run.settings.get("slo")
    if not objectives or not results.run.capacity:
        return None
    decode = [c for c in results.cells if c.phase is Phase.DECODE]
    rows = [
        {
            "line": capacity_line(ctx, results.run.capacity[ctx]),
            "goodput": goodput_line(decode, ctx) or "",
        }
        for ctx in order_contexts(decode)
        if ctx in results.run.capacity
    ]
    return {"objectives": objectives, "rows": rows}


def _rate_capacity(results: Results) -> dict[str, Any] | None:
    """The rate capacity section: the objectives, a line per context (``RateCapacity.line``)."""
    from ..gate.slo import RateCapacity

    objectives = results.run.settings.get("slo")
    if not objectives or not results.run.rate_capacity:
        return None
    lines = [
        RateCapacity(context, e.get("rate"), e.get("stopped_by")).line()
        for context, e in results.run.rate_capacity.items()
    ]
    return {"objectives": objectives, "lines": lines}


def _span(labels: list[str]) -> str:
    return labels[0] if len(labels) == 1 else f"{labels[0]}–{labels[-1]}"


def _subtitle(results: Results) -> str:
    run = results.run
    decode = results.phase(Phase.DECODE)
    prefill = results.phase(Phase.PREFILL)
    engine = for_person(run.engine) if run.engine else "engine ?"
    parts = [f"{engine} {for_person(run.engine_version or '')}".strip()]
    if decode:
        ctx = [c.context_display or c.context for c in decode]
        labels = list(dict.fromkeys(ctx))
        conc = sorted({c.concurrency for c in decode})
        parts.append(
            f"{len(labels)} context(s) ({_span(labels)}) × {len(conc)} concurrency level(s) "
            f"({_span([str(n) for n in conc])})"
        )
    if prefill:
        labels = list(dict.fromkeys(c.context_display or c.context for c in prefill))
        parts.append("prefill at " + ", ".join(labels))
    return " · ".join(parts)


def _blocks(results: Results) -> list[dict[str, Any]]:
    run = results.run
    s = run.settings
    meta = dict(run.metadata)
    hardware = [(k, meta.pop(k)) for k in list(meta) if k.lower() in _HARDWARE_KEYS]
    cap = f"{run.kv_capacity:,} tokens" if run.kv_capacity else "unknown"
    blocks = []
    if hardware:
        blocks.append({"heading": "Hardware", "rows": hardware})
    engine_rows = [
        ("Engine", for_person(run.engine or "—")),
        ("Version", for_person(run.engine_version or "—")),
    ]
    engine_rows += [(k, v) for k, v in meta.items()]
    blocks.append({"heading": "Engine", "rows": engine_rows})
    prompt = {"ids": "token-id", "text": "text (sized with /tokenize)"}.get(
        str(run.prompt_form), str(run.prompt_form)
    )
    repeats = s.get("prefill_repeats", 1)
    blocks.append(
        {
            "heading": "Run",
            "rows": [
                ("Served model", for_person(run.model or "—")),
                ("Max model len", f"{run.max_model_len:,}" if run.max_model_len else "unknown"),
                ("KV capacity", f"{cap} ({run.kv_capacity_source or '?'})"),
                ("API", f"{run.api or s.get('api', '—')} ({prompt} prompts)"),
                ("Decode test", "Fixed duration"),
                ("Time per measurement", f"{s.get('duration_s', '?')} s"),
                ("Max output", _tokens(s.get("max_output"))),
                (
                    "Prefill mode",
                    "Measured during decode warm-up"
                    + (f" (median of {repeats} cold requests)" if repeats != 1 else ""),
                ),
                ("Endpoint", run.endpoint),
                ("Benchmark tool", run.tool),
                ("Measured", run.started),
            ],
        }
    )
    return blocks


_HARDWARE_KEYS = {"hardware", "gpu", "gpus", "vram", "cpu", "os", "type", "accelerator", "memory"}


def _prefill_rows(cells: list[CellRecord]) -> list[dict[str, str]]:
    rows = []
    for c in cells:
        label = (
            c.context
            if not c.context_display or c.context_display == c.context
            else (f"{c.context} ({c.context_display})")
        )
        badge, badge_cls = _badge(c)
        if c.measured:
            rows.append(
                {
                    "context": label,
                    "rate": fmt_rate(c.prompt_tok_s),
                    "ttft": f"{fmt_ms(c.ttft_ms)} TTFT",
                    "cls": "failed bad" if c.status is Status.FAILED else "",
                    "badge": badge,
                    "badge_cls": badge_cls,
                }
            )
        else:
            rows.append(
                {
                    "context": label,
                    "rate": c.status.label,
                    "ttft": "",
                    "cls": "skip",
                    "badge": "",
                    "badge_cls": "",
                }
            )
    return rows


def _matrix(cells: list[CellRecord]) -> tuple[list[int], list[dict[str, Any]]]:
    columns = sorted({c.concurrency for c in cells})
    by = {(c.context, c.concurrency): c for c in cells}
    rows = []
    for ctx in order_contexts(cells):
        shown = next((c.context_display for c in cells if c.context == ctx), None)
        label = f"{ctx} ({shown})" if shown and shown != ctx else ctx
        row = []
        for n in columns:
            c = by.get((ctx, n))
            if c is None:
                row.append({"rate": "", "text": ""})
            elif not c.measured or c.total_tok_s is None:
                row.append({"rate": "", "text": c.status.label})
            else:
                badge, badge_cls = _badge(c)
                if c.tokens == "chunk-count":
                    badge, badge_cls = "≈ 1 token per chunk assumed", "warn"
                row.append(
                    {
                        "rate": fmt_rate(c.total_tok_s),
                        "pm": pm(c.total_tok_s, c.total_tok_s_ci).strip(),
                        "ttft": f"{fmt_ms(c.ttft_ms)} TTFT",
                        "cls": "failed" if c.status is Status.FAILED else "",
                        "badge": badge,
                        "badge_cls": badge_cls,
                        **_slo_mark(c),
                    }
                )
        rows.append({"label": label, "cells": row})
    return columns, rows


def _charts(results: Results) -> list[str]:
    decode = [c for c in results.phase(Phase.DECODE) if c.measured]
    prefill = [c for c in results.phase(Phase.PREFILL) if c.measured]

    def by_context(metric: str) -> list[Series]:
        out = []
        for ctx in order_contexts(decode):
            points = tuple(
                (float(c.concurrency), float(v))
                for c in sorted(decode, key=lambda c: c.concurrency)
                if c.context == ctx and (v := getattr(c, metric)) is not None
            )
            out.append(Series(ctx, points))
        return out

    def conc(x: float) -> str:
        return f"{x:g}"

    charts = (
        []
        if not decode
        else [
            line_chart(
                "Total tok/s against requests in flight",
                by_context("total_tok_s"),
                "requests in flight (log₂)",
                "total output tok/s",
                log2_x=True,
                x_format=conc,
                y_unit=" tok/s",
            ),
            line_chart(
                "Per-request tok/s against requests in flight",
                by_context("per_request_tok_s"),
                "requests in flight (log₂)",
                "tok/s seen by one request",
                log2_x=True,
                x_format=conc,
                y_unit=" tok/s",
            ),
            line_chart(
                "Decode TTFT against requests in flight (warm prefix)",
                by_context("ttft_ms"),
                "requests in flight (log₂)",
                "median TTFT (ms)",
                log2_x=True,
                x_format=conc,
                y_unit=" ms",
            ),
        ]
    )
    rates = [c for c in results.phase(Phase.RATE) if c.measured and c.id.rate]
    if rates:  # open loop: latency from the schedule as the offered rate rises, per context

        def per_s(x: float) -> str:
            return f"{x:g}/s"

        charts.append(
            line_chart(
                "TTFT from the schedule against the arrival rate (open loop)",
                [
                    Series(
                        ctx,
                        tuple(
                            (float(c.id.rate or 0.0), float(c.sched_ttft_ms))
                            for c in sorted(rates, key=lambda c: c.id.rate or 0.0)
                            if c.context == ctx and c.sched_ttft_ms is not None
                        ),
                    )
                    for ctx in order_contexts(rates)
                ],
                "arrival rate, requests/s (log₂)",
                "median TTFT from the scheduled send (ms)",
                log2_x=True,
                x_format=per_s,
                y_unit=" ms",
            )
        )
    if prefill:
        ordered = sorted(prefill, key=lambda c: c.context_tokens or 0)
        tokens = [float(c.context_tokens or 0) for c in ordered]

        def k(x: float) -> str:
            return f"{x / 1024:g}K"

        charts.append(
            line_chart(
                "Prefill tok/s against context (cold cache)",
                [
                    Series(
                        "prompt tok/s",
                        tuple(zip(tokens, [c.prompt_tok_s or 0.0 for c in ordered], strict=True)),
                    )
                ],
                "context (tokens, log₂)",
                "prompt tok/s",
                log2_x=True,
                x_format=k,
                y_unit=" tok/s",
            )
        )
        charts.append(
            line_chart(
                "Prefill TTFT against context (cold cache)",
                [
                    Series(
                        "TTFT", tuple(zip(tokens, [c.ttft_ms or 0.0 for c in ordered], strict=True))
                    )
                ],
                "context (tokens, log₂)",
                "TTFT (ms)",
                log2_x=True,
                x_format=k,
                y_unit=" ms",
            )
        )
    return charts


def _details_header() -> list[str]:
    from .columns import headers

    return [*headers(page=True), "Notes"]


def _details(cells: list[CellRecord]) -> list[list[str]]:
    """ "All measurements": every column of report/columns.py, then the cell's notes."""
    from .columns import row

    rows = []
    for c in cells:
        notes = row_notes(c)
        if c.replica_tok_s:
            notes.append(
                "per replica " + " · ".join(f"{fmt_rate(x)} tok/s" for x in c.replica_tok_s)
            )
        if c.reason:
            notes.insert(0, c.reason)
        rows.append([*row(c, page=True), "; ".join(notes)])
    return rows


def _comparison(cmp: Comparison) -> dict[str, Any]:
    header, rows = change_matrix(cmp)
    cls = {
        Verdict.REGRESSION: "delta-bad",
        Verdict.IMPROVEMENT: "delta-good",
        Verdict.UNKNOWN: "warn",
    }

    def cell(c: Any) -> dict[str, str]:
        if c is None:
            return {"text": "", "cls": "", "hover": ""}
        if c.change is None:
            return {"text": c.verdict.short, "cls": "skip", "hover": c.why or c.verdict.value}
        hover = (
            f"{c.cid}: {c.old:,.1f} → {c.new:,.1f} {c.metric} ({c.verdict.value}, {c.interval()})"
        )
        if c.verdict is Verdict.UNKNOWN and c.check is not None:
            hover += f": {c.decide_words()}"
        if c.explanation:  # why, on the cell itself too (the list below has every one)
            hover += f"\nwhy: {c.explanation.split(': ', 1)[-1]}"
        return {"text": fmt_change(c.change), "cls": cls.get(c.verdict, ""), "hover": hover}

    lines = [{"text": f"warning: {w}", "cls": "warn"} for w in cmp.warnings]
    lines += [{"text": d, "cls": "sub"} for d in cmp.differences]
    from .compare import summary_line

    lines.append({"text": summary_line(cmp), "cls": ""})
    why = [
        {"cls": cls.get(c.verdict, ""), "text": c.explanation} for c in cmp.cells if c.explanation
    ]
    if cmp.unexplained and any(
        c.verdict in (Verdict.REGRESSION, Verdict.IMPROVEMENT) for c in cmp.cells
    ):
        lines.append({"text": cmp.unexplained, "cls": "sub"})
    if cmp.capacity:  # each context's capacity at the objectives, side by side
        head, *rest = cmp.capacity
        text = head.capitalize() + (" " + "; ".join(rest) if rest else "")
        lines.append({"text": text, "cls": "bad" if "(fewer)" in text else ""})
    return {
        "why": why,
        "old_label": cmp.old_label,
        "decode_figure": figures.headline(Phase.DECODE).label,
        "prefill_figure": figures.headline(Phase.PREFILL).label,
        "header": lines,
        "columns": header,
        "rows": [{"label": ctx, "cells": [cell(c) for c in cells]} for ctx, cells in rows],
    }


def _ab(doc: Mapping[str, Any]) -> dict[str, Any]:
    """The A/B's section: what was compared, old against new for every cell and figure, the
    counts, why cells changed (report/ab.py's rows, as the terminal shows them)."""
    from .ab import HEAD, counts_line, rows

    cls = {"regressed": "delta-bad", "improved": "delta-good", "unknown": "warn"}
    shown = []
    verdict = ""
    for r in rows(doc):
        verdict = r[1] or verdict  # a cell's later figures: its verdict's colour too
        shown.append({"cells": r, "cls": cls.get(verdict, "")})
    arms = []
    for arm in ("old", "new"):
        a = doc.get("arms", {}).get(arm, {})
        what = for_person(a.get("command") or a.get("endpoint") or "?", 400)
        server = for_person(a.get("server") or "", 400)
        arms.append(f"{arm}: {what}" + (f" · {server}" if server else ""))
    rounds, tolerance = len(doc.get("rounds", ())), doc.get("tolerance", 0.05)
    summary = f"{rounds} rounds on fresh starts in ABBA order · tolerance ±{tolerance:.0%}" + (
        f" · stopped: {doc['stopped']}" if doc.get("stopped") else ""
    )
    why = [
        {"cls": cls.get(v["verdict"], ""), "text": for_person(v["explanation"], 400)}
        for v in doc.get("cells", {}).values()
        if v.get("explanation") and v.get("verdict") in ("regressed", "improved")
    ]
    return {
        "summary": summary,
        "arms": arms,
        "header": HEAD,
        "rows": shown,
        "counts": "verdicts: " + counts_line(doc),
        "why": why,
    }


def render_page(results: Results, comparison: Comparison | None = None) -> Page:
    """The page of one run (and its comparison with an earlier one)."""
    from ..results import SCHEMA

    run = results.run
    cells = list(results.cells)
    decode = [c for c in cells if c.phase is Phase.DECODE]
    prefill = [c for c in cells if c.phase is Phase.PREFILL]
    where = run.metadata.get("hardware") or run.metadata.get("gpu") or run.engine or "a server"
    # the page's title and the server line: the one gate from a server string to a person
    # (no control character, no line break, at most 200 characters; Jinja2 escapes HTML)
    columns, matrix_rows = _matrix(decode)
    further_header, further_rows = further_figures(cells)
    server_header, server_rows = server_table(cells)
    template = _environment().get_template("page.html.j2")
    html = template.render(
        tool=run.tool,
        title=f"{for_person(run.model or 'model ?')} on {for_person(where)}",
        subtitle=_subtitle(results),
        measured=run.started,
        blocks=_blocks(results),
        launch_command=run.launch_command,
        comparison=_comparison(comparison) if comparison else None,
        ab=_ab(results.ab) if results.ab else None,
        gate=_gate(cells),
        prefill_hint=PREFILL_HINT,
        prefill_rows=_prefill_rows(prefill),
        matrix_columns=columns,
        matrix_rows=matrix_rows,
        over_capacity=any(c.status is Status.OVER_CAPACITY for c in decode),
        capacity=_capacity(results),
        rate_capacity=_rate_capacity(results),
        charts=[_markup(c) for c in _charts(results)],
        details_header=_details_header(),
        details_rows=_details(cells),
        further_header=further_header,
        further_rows=further_rows,
        conversation_header=CONVERSATION_HEADER,
        conversation_rows=conversation_rows([c for c in cells if c.phase is Phase.CONVERSATION]),
        server_header=server_header,
        server_rows=server_rows,
        server_missing=not_exposed(cells),
        cell_notes=[
            {"heading": kind.heading, "cells": which(concerned)}
            for kind, concerned in by_kind(cells)
        ],
        notes=list(run.notes),
        schema=SCHEMA,
    )
    return Page(html)


def write(results: Results, comparison: Comparison | None, path: str) -> None:
    """The page of a run written to ``path`` (registered in :mod:`.outputs`)."""
    render_page(results, comparison).write(path)


def _markup(svg: str) -> Any:
    """SVG made by :mod:`.charts` (which escapes every text it puts in) as safe markup."""
    import markupsafe

    return markupsafe.Markup(svg)


def _tokens(value: object) -> str:
    """A token count for the header ("?" when the run did not record it)."""
    return f"{value:,} tokens" if isinstance(value, int) else "? tokens"
