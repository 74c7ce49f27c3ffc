"""The history of many runs (history/, docs/history.md) as the terminal shows it, as a JSON
document and as a self-contained page: a small inline-SVG chart per cell's figure (each run's
figure with its interval, the segments' levels, the change points, the newest verdict), in the
speed-test page's style (report/page.py's template environment and styles, report/charts.py's
ticks, numbers and palette). Pure functions of a :class:`~pytest_llmspeed.history.History`.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from html import escape
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from ..core.text import for_person
from ..gate.judge import Judgement, Verdict
from ..history import FigureHistory, History, Point, Series
from ..history.series import MISSING
from .charts import PALETTE, fmt_number, nice_ticks

if TYPE_CHECKING:
    from .page import Page

SCHEMA = "pytest-llmspeed/history/v1"
#: a chart draws each point as its own mark, with its value on hover, up to this many runs
#: (beyond, one path of dots: a page of 54 cells × 1,000 runs stays a few MB)
MARKS_UP_TO = 200
_WORDS = {Verdict.REGRESSED: "REGRESSION ", Verdict.IMPROVED: "improvement"}


def _minus(text: str) -> str:
    return text.replace("-", "−")


def _pct(x: float) -> str:
    return _minus(f"{x:+.1%}")


def _run_words(series: Series, i: int) -> str:
    run = series.runs[i]
    return f"run {i + 1:,} of {len(series.runs):,} ({run.started or 'no date'}, {run.path})"


def _changed_words(changed: tuple[tuple[str, str | None, str | None], ...]) -> str:
    return "; ".join(f"{k} {a or '—'} → {b or '—'}" for k, a, b in changed)


def change_line(series: Series, f: FigureHistory) -> str:
    """``decode[32K-c8] total tok/s −10.2% since run 12 of 20 (date, file): 2,103.4 →
    1,889.0 (95 % interval …, tolerance ±5%); engine_version 0.9.1 → 0.9.2``."""
    judgement = f.newest
    assert judgement is not None
    old, new = f.segments[-2], f.segments[-1]
    lo, hi = judgement.change.interval()
    line = (
        f"{f.cell} {f.label} {_pct(judgement.change.relative)} since "
        f"{_run_words(series, new.first)}: {fmt_number(round(old.level, 1))} → "
        f"{fmt_number(round(new.level, 1))} (95 % interval {_pct(lo)} … {_pct(hi)}, tolerance "
        f"±{judgement.tolerance:.0%})"
    )
    if f.back_to is not None and not f.judged_good(f.back_to):
        back = f.segments[f.back_to]
        line += (
            f"; the level of runs {back.first + 1:,}–{back.last + 1:,} "
            f"({fmt_number(round(back.level, 1))}) again, which was itself a regression"
        )
    elif f.back_to is not None:
        back = f.segments[f.back_to]
        line += (
            f"; back to the level of runs {back.first + 1:,}–{back.last + 1:,} "
            f"({fmt_number(round(back.level, 1))}): runs {old.first + 1:,}–{old.last + 1:,} "
            "were a dip or a rise that did not last"
        )
    elif f.returned:
        back = f.segments[-3]
        line += (
            f"; near the level of runs {back.first + 1:,}–{back.last + 1:,} "
            f"({fmt_number(round(back.level, 1))}, too close to tell): runs "
            f"{old.first + 1:,}–{old.last + 1:,} were a dip or a rise that did not last"
        )
    if new.changed:
        line += f"; {_changed_words(new.changed)}"
    for at, key, a, b in new.changed_near:
        side = "later" if at > new.first else "earlier"
        line += f"; {key} {a or '—'} → {b or '—'} one run {side} (at run {at + 1:,})"
    return line


def _settings_words(series: Series) -> str:
    return ", ".join(f"{k} {v}" for k, v in series.settings.items() if v is not None)


def _span(series: Series) -> str:
    first, last = series.runs[0].started, series.runs[-1].started
    return first if first == last else f"{first} … {last}"


def counts(series: Series) -> str:
    """``102 figures of 54 cells: 1 regressed, 0 improved since their last change, 1 back to
    an earlier level, 2 with earlier changes only, 83 at one level, 16 measured in fewer than
    two runs``."""
    figs = series.figures
    cells = len({f.cell for f in figs})
    regressed = sum(f.regressed for f in figs)
    improved = sum(f.improved for f in figs)
    back = sum(f.returned for f in figs)
    earlier = sum(
        1 for f in figs if len(f.segments) > 1 and not (f.regressed or f.improved or f.returned)
    )
    flat = sum(1 for f in figs if len(f.segments) == 1)
    unmeasured = sum(1 for f in figs if not f.segments)
    return (
        f"{len(figs)} figures of {cells} cells: {regressed} regressed, {improved} improved "
        f"since their last change, {back} back to an earlier level, {earlier} with earlier "
        f"changes only, {flat} at one level, "
        f"{unmeasured} measured in fewer than two runs"
    )


def lines(history: History) -> list[str]:
    """The history in the terminal: what was read, the series (when several), each figure
    whose newest segment regressed or improved, the counts."""
    skipped = f" ({history.skipped} other file(s) skipped)" if history.skipped else ""
    out = [
        f"history: {history.files:,} results file(s){skipped}, {len(history.series)} "
        f"series, tolerance ±{history.tolerance:.0%}"
    ]
    several = len(history.series) > 1
    if several:
        out.append(
            "  runs with other settings measure other things: each series is its own history"
        )
    for n, series in enumerate(history.series, start=1):
        prefix = "  "
        if several:
            newest = (
                " (the newest run's: it decides the exit status)"
                if n == len(history.series)
                else ""
            )
            out.append(
                f"  series {n}{newest}: {len(series.runs):,} runs {_span(series)}: "
                f"{_settings_words(series)}"
            )
            prefix = "    "
        else:
            out.append(f"  {len(series.runs):,} runs {_span(series)}")
        for f in series.figures:
            if f.newest is not None and f.newest.verdict in _WORDS:
                word = "back       " if f.returned else _WORDS[f.newest.verdict]
                out.append(f"{prefix}{word} {change_line(series, f)}")
        out.append(f"{prefix}{counts(series)}")
    return out


# -- JSON ----------------------------------------------------------------------------------


def _judgement(j: Judgement) -> dict[str, Any]:
    lo, hi = j.change.interval()
    return {
        "verdict": j.verdict.value,
        "change": round(j.change.relative, 5),
        "interval": [round(lo, 5), round(hi, 5)],
        "words": j.words(),
    }


def document(history: History) -> dict[str, Any]:
    """The history as data (``pytest-llmspeed/history/v1``): each series' runs, and per cell
    and figure the runs' values (null where the cell had none, with its state), the segments
    and the changes between them."""
    out: list[dict[str, Any]] = []
    for series in history.series:
        figs = []
        for f in series.figures:
            figs.append(
                {
                    "cell": f.cell,
                    "figure": f.figure,
                    "values": list(f.values),
                    "intervals": [list(ci) if ci else None for ci in f.intervals],
                    "states": list(f.states),
                    "segments": [
                        {
                            "first_run": s.first,
                            "last_run": s.last,
                            "runs": s.runs,
                            "level": round(s.level, 4),
                            "interval": [round(s.low, 4), round(s.high, 4)],
                            "engine_version": s.engine_version,
                            "changed": {k: [a, b] for k, a, b in s.changed},
                            "changed_near": [
                                {"run": at, "key": k, "before": a, "after": b}
                                for at, k, a, b in s.changed_near
                            ],
                        }
                        for s in f.segments
                    ],
                    "changes": [
                        {"run": s.first, **_judgement(j)}
                        for s, j in zip(f.segments[1:], f.changes, strict=True)
                    ],
                    "back_to": f.back_to,
                    "against_earlier": (
                        f.against_earlier.value if f.against_earlier is not None else None
                    ),
                    "returned": f.returned,
                }
            )
        out.append(
            {
                "settings": dict(series.settings),
                "runs": [
                    {
                        "path": r.path,
                        "started": r.started,
                        "engine": r.engine,
                        "engine_version": r.engine_version,
                        "metadata": dict(r.metadata),
                    }
                    for r in series.runs
                ],
                "figures": figs,
            }
        )
    return {
        "schema": SCHEMA,
        "tolerance": history.tolerance,
        "files": history.files,
        "skipped": history.skipped,
        "series": out,
    }


def write_json(history: History, path: str) -> None:
    """The document, unindented (indenting 1,000 runs' figures takes longer than the rest)."""
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(json.dumps(document(history)) + "\n")


# -- the page ------------------------------------------------------------------------------

_VERDICT_CLASS = {Verdict.REGRESSED: "bad", Verdict.IMPROVED: "good"}


def chart(series: Series, f: FigureHistory, width: int = 380, height: int = 210) -> str:
    """One figure's history as inline SVG: each run's figure (a dot) with its interval (a
    vertical line), a failed run's in the warning colour, a run without the figure as a grey
    tick under the axis (its state on hover), each segment's level and interval as a band,
    each change point as a dashed line with the judge's words."""
    left, right, top, bottom = 58, 10, 44, 30
    plot_w, plot_h = width - left - right, height - top - bottom
    n = len(series.runs)
    newest = f.newest
    verdict = newest.verdict if newest is not None else None
    title = f"{f.cell} · {f.label}"
    badge = f" · {newest.verdict.value} {_pct(newest.change.relative)}" if newest else ""
    parts = [
        f'<svg class="chart history" viewBox="0 0 {width} {height}" width="100%" role="img" '
        f'aria-label="{escape(title + badge)}" xmlns="http://www.w3.org/2000/svg" '
        f'data-cell="{escape(f.cell)}" data-figure="{escape(f.figure)}" '
        f'data-verdict="{verdict.value if verdict else "none"}">',
        f"<title>{escape(title + badge)}</title>",
        f'<text x="{left}" y="16" class="chart-title">{escape(title)}</text>',
    ]
    if badge:
        cls = _VERDICT_CLASS.get(verdict, "warn") if verdict else ""
        parts.append(
            f'<text x="{left}" y="32" class="verdict {cls}">'
            f"{escape(badge.lstrip(' ·'))} (the newest change{_back(f)})</text>"
        )
    have = [i for i, v in enumerate(f.values) if v is not None]
    absent = [i for i, v in enumerate(f.values) if v is None]
    if not have:
        states = sorted(set(f.states))
        parts.append(
            f'<text x="{left}" y="{top + 30}" class="tick">no figure in any run: '
            f"{escape(', '.join(states))}</text></svg>"
        )
        return "".join(parts)
    values = np.array([f.values[i] for i in have], dtype=float)
    bounds = np.array([f.intervals[i] or (math.nan, math.nan) for i in have], dtype=float).reshape(
        -1, 2
    )
    lows = np.fmin(np.where(np.isnan(bounds[:, 0]), values, bounds[:, 0]), values)
    highs = np.fmax(np.where(np.isnan(bounds[:, 1]), values, bounds[:, 1]), values)
    lo_v = min([float(lows.min()), *(s.low for s in f.segments)])
    hi_v = max([float(highs.max()), *(s.high for s in f.segments)])
    pad = (hi_v - lo_v) * 0.08 or abs(hi_v) * 0.05 or 1.0
    ticks = nice_ticks(hi_v + pad, 4, max(lo_v - pad, 0.0))
    y0, y1 = ticks[0], ticks[-1]

    def fx(i: float) -> float:
        return left + (i + 0.5) / n * plot_w

    def fy(v: float) -> float:
        v = min(max(v, y0), y1)
        return top + plot_h - (v - y0) / (y1 - y0) * plot_h

    for t in ticks:
        y = fy(t)
        parts.append(
            f'<line x1="{left}" y1="{y:.1f}" x2="{left + plot_w}" y2="{y:.1f}" class="grid"/>'
            f'<text x="{left - 5}" y="{y + 4:.1f}" class="tick" text-anchor="end">'
            f"{fmt_number(t)}</text>"
        )
    base = top + plot_h
    parts.append(
        f'<line x1="{left}" y1="{base}" x2="{left + plot_w}" y2="{base}" class="axis"/>'
        f'<text x="{left}" y="{base + 22}" class="tick">run 1</text>'
        f'<text x="{left + plot_w}" y="{base + 22}" class="tick" text-anchor="end">'
        f"run {n:,}</text>"
    )
    for s in f.segments:  # the levels: a band (the interval) and a line
        x0, x1 = fx(s.first - 0.5), fx(s.last + 0.5)
        hover = (
            f"runs {s.first + 1:,}–{s.last + 1:,} ({s.runs:,} measured): "
            f"{fmt_number(round(s.level, 1))} (95 % {fmt_number(round(s.low, 1))} … "
            f"{fmt_number(round(s.high, 1))}), engine {s.engine_version or '?'}"
        )
        parts.append(
            f'<rect x="{x0:.1f}" y="{fy(s.high):.1f}" width="{max(x1 - x0, 1):.1f}" '
            f'height="{max(fy(s.low) - fy(s.high), 1):.1f}" class="band"><title>'
            f"{escape(hover)}</title></rect>"
            f'<line x1="{x0:.1f}" y1="{fy(s.level):.1f}" x2="{x1:.1f}" y2="{fy(s.level):.1f}" '
            'class="level"/>'
        )
    for s, j in zip(f.segments[1:], f.changes, strict=True):  # the change points
        x = fx(s.first - 0.5)
        run = series.runs[s.first]
        hover = f"from run {s.first + 1:,} ({run.started}): {j.words()}"
        if s.changed:
            hover += f"; {_changed_words(s.changed)}"
        parts.append(
            f'<line x1="{x:.1f}" y1="{top}" x2="{x:.1f}" y2="{base}" '
            f'class="change {_VERDICT_CLASS.get(j.verdict, "warn")}"><title>{escape(hover)}'
            "</title></line>"
        )
    if n <= MARKS_UP_TO:
        measured = [Point(i, f.values[i], f.intervals[i], f.states[i]) for i in have]
        parts += _marks(series, measured, fx, fy)
    else:  # one path of interval lines and one of dots per kind: coordinates in bulk
        xs = (left + (np.array(have, dtype=float) + 0.5) / n * plot_w).tolist()
        scale = plot_h / (y1 - y0)

        def ys(v: npt.NDArray[np.float64]) -> list[float]:
            return (top + plot_h - (np.clip(v, y0, y1) - y0) * scale).tolist()

        vy = ys(values)
        lo, hi = ys(bounds[:, 0]), ys(bounds[:, 1])
        cis = "".join(
            f"M{x:.1f} {a:.1f}V{b:.1f}"
            for x, a, b in zip(xs, lo, hi, strict=True)
            if not math.isnan(a)
        )
        if cis:
            parts.append(f'<path d="{cis}" class="ci"/>')
        failed = [f.states[i] == "failed" for i in have]
        for kind in (False, True):
            path = "".join(
                f"M{x:.1f} {y:.1f}h0"
                for x, y, bad in zip(xs, vy, failed, strict=True)
                if bad is kind
            )
            if path:
                parts.append(f'<path d="{path}" class="dots {"failed" if kind else "valid"}"/>')
    for i in absent:  # a run without the figure: a tick under the axis, what it was on hover
        x = fx(i)
        word = "not in this run" if f.states[i] == MISSING else f.states[i]
        parts.append(
            f'<line x1="{x:.1f}" y1="{base + 3}" x2="{x:.1f}" y2="{base + 9}" class="absent">'
            f"<title>run {i + 1:,}: {escape(word)}</title></line>"
        )
    parts.append("</svg>")
    return "".join(parts)


def _marks(
    series: Series,
    measured: list[Point],
    fx: Callable[[float], float],
    fy: Callable[[float], float],
) -> list[str]:
    """Each run's figure as its own mark, its value and interval on hover."""
    out = []
    for p in measured:
        assert p.value is not None
        x, y = fx(p.run), fy(p.value)
        kind = "failed" if p.state == "failed" else "valid"
        ci = ""
        if p.ci:
            out.append(
                f'<line x1="{x:.1f}" y1="{fy(p.ci[0]):.1f}" x2="{x:.1f}" '
                f'y2="{fy(p.ci[1]):.1f}" class="ci"/>'
            )
            ci = f" (95 % {fmt_number(round(p.ci[0], 1))} … {fmt_number(round(p.ci[1], 1))})"
        hover = f"run {p.run + 1:,} ({series.runs[p.run].started}): "
        hover += f"{fmt_number(round(p.value, 1))}{ci}" + (" · failed" if kind == "failed" else "")
        out.append(
            f'<circle cx="{x:.1f}" cy="{y:.1f}" r="2.6" class="mark {kind}">'
            f"<title>{escape(hover)}</title></circle>"
        )
    return out


def _back(f: FigureHistory) -> str:
    if f.back_to is None or not f.judged_good(f.back_to):
        return ""
    back = f.segments[f.back_to]
    return f"; back to runs {back.first + 1:,}–{back.last + 1:,}"


def _short(j: Judgement) -> str:
    """``−12.2% (95 % −13.7% … −10.7%): regressed``."""
    lo, hi = j.change.interval()
    return f"{_pct(j.change.relative)} (95 % {_pct(lo)} … {_pct(hi)}): {j.verdict.value}"


def render(history: History) -> Page:
    """The history's page: a section per series (its runs, what changed, a chart per cell's
    figure)."""
    from .page import Page, _environment, _markup  # jinja2 only when a page is written

    sections = []
    for n, series in enumerate(history.series, start=1):
        rows = []
        for f in series.figures:
            for s, j in zip(f.segments[1:], f.changes, strict=True):
                run = series.runs[s.first]
                newest = j is f.newest
                rows.append(
                    {
                        "cell": f.cell,
                        "figure": f.label,
                        "run": f"{s.first + 1:,}",
                        "started": run.started,
                        "path": run.path,
                        "change": _short(j),
                        "changed": _changed_words(s.changed),
                        "cls": _VERDICT_CLASS.get(j.verdict, "warn") if newest else "sub",
                        "newest": "newest" if newest else "",
                    }
                )
        sections.append(
            {
                "heading": f"Series {n}" if len(history.series) > 1 else "Runs",
                "runs": f"{len(series.runs):,} runs · {_span(series)}",
                "settings": _settings_words(series),
                "engines": ", ".join(
                    dict.fromkeys(
                        for_person(f"{r.engine or '?'} {r.engine_version or ''}".strip())
                        for r in series.runs
                    )
                ),
                "counts": counts(series),
                "changes": rows,
                "charts": [_markup(chart(series, f)) for f in series.figures],
            }
        )
    html = (
        _environment()
        .get_template("history.html.j2")
        .render(
            title=f"History of {history.files:,} runs",
            subtitle=lines(history)[0],
            several=len(history.series) > 1,
            tolerance=f"±{history.tolerance:.0%}",
            sections=sections,
            palette=PALETTE,
            schema=SCHEMA,
        )
    )
    return Page(html)
