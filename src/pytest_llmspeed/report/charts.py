"""Line charts as inline SVG: no JavaScript, no external file, nothing to download.

Hand-written rather than a plotting library: four small line charts do not justify a
dependency of tens of megabytes for users who never ask for a page, and SVG made here is
plain text a test can read (marks, labels) and any browser draws offline, years later.
Hovering a point shows its value (an SVG ``<title>``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from html import escape

#: colour-blind-safe palette (Okabe and Ito)
#: px between two x labels at least (252K and 256K, a context's max and its limit, would
#: overlap)
MIN_LABEL_GAP = 30.0
PALETTE = ("#0072B2", "#E69F00", "#009E73", "#D55E00", "#CC79A7", "#56B4E9", "#F0E442", "#000000")


@dataclass(frozen=True)
class Series:
    label: str
    points: tuple[tuple[float, float], ...]  # (x, y), x ascending


def nice_ticks(top: float, count: int = 5, bottom: float = 0.0) -> list[float]:
    """Round tick values from ``bottom`` (0: from 0; else the round value at or below it) to
    at least ``top`` (1, 2 or 5 times a power of ten apart)."""
    if top <= bottom or not math.isfinite(top) or not math.isfinite(bottom):
        return [0.0, 1.0] if bottom == 0 else [bottom, bottom + 1.0]
    raw = (top - bottom) / count
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 5, 10) if m * power >= raw)
    first = math.floor(bottom / step + 1e-9)
    n = math.ceil(top / step - 1e-9)
    return [i * step for i in range(first, n + 1)]


def fmt_number(v: float) -> str:
    """Tick and hover labels: 1.2K above ten thousand, thousands separators below."""
    if abs(v) >= 10_000:
        return f"{v / 1000:,.0f}K" if v % 1000 == 0 else f"{v / 1000:,.1f}K"
    if v == int(v):
        return f"{int(v):,}"
    return f"{v:,.1f}" if abs(v) >= 10 else f"{v:,.2f}"


def line_chart(
    title: str,
    series: Sequence[Series],
    x_label: str,
    y_label: str,
    log2_x: bool = False,
    x_format: Callable[[float], str] = fmt_number,
    y_unit: str = "",
    width: int = 640,
    height: int = 360,
) -> str:
    """One chart: lines with a marker per point, axes with units, a legend."""
    series = [s for s in series if s.points]
    left, right, top, bottom = 72, 16, 40, 56
    legend_rows = math.ceil(len(series) / 4) if len(series) > 1 else 0
    bottom += 18 * legend_rows
    plot_w, plot_h = width - left - right, height - top - bottom
    xs = sorted({x for s in series for x, _ in s.points})
    ys = [y for s in series for _, y in s.points]
    parts = [
        f'<svg class="chart" viewBox="0 0 {width} {height}" width="100%" role="img" '
        f'aria-label="{escape(title)}" xmlns="http://www.w3.org/2000/svg">',
        f"<title>{escape(title)}</title>",
        f'<text x="{left}" y="22" class="chart-title">{escape(title)}</text>',
    ]
    if not xs:
        parts.append(f'<text x="{left}" y="{top + 20}">no data</text></svg>')
        return "".join(parts)
    if log2_x:
        lo, hi = math.log2(min(xs)), math.log2(max(xs))

        def fx(x: float) -> float:
            span = hi - lo or 1.0
            return left + (math.log2(x) - lo) / span * plot_w if hi > lo else left + plot_w / 2
    else:
        lo, hi = min(xs), max(xs)

        def fx(x: float) -> float:
            return left + (x - lo) / (hi - lo) * plot_w if hi > lo else left + plot_w / 2

    ticks = nice_ticks(max(ys) * 1.05 if ys else 1.0)
    y_top = ticks[-1] or 1.0

    def fy(y: float) -> float:
        return top + plot_h - y / y_top * plot_h

    for t in ticks:  # grid and y labels
        y = fy(t)
        parts.append(
            f'<line x1="{left}" y1="{y:.1f}" x2="{left + plot_w}" y2="{y:.1f}" class="grid"/>'
            f'<text x="{left - 6}" y="{y + 4:.1f}" class="tick" text-anchor="end">'
            f"{fmt_number(t)}</text>"
        )
    labelled = -math.inf
    for x in xs:  # x labels at the data's own x values (one too close to the last: tick only)
        px = fx(x)
        parts.append(
            f'<line x1="{px:.1f}" y1="{top + plot_h}" x2="{px:.1f}" y2="{top + plot_h + 4}" '
            'class="axis"/>'
        )
        if px - labelled >= MIN_LABEL_GAP:
            labelled = px
            parts.append(
                f'<text x="{px:.1f}" y="{top + plot_h + 18}" class="tick" '
                f'text-anchor="middle">{escape(x_format(x))}</text>'
            )
    parts.append(
        f'<line x1="{left}" y1="{top + plot_h}" x2="{left + plot_w}" y2="{top + plot_h}" '
        f'class="axis"/><line x1="{left}" y1="{top}" x2="{left}" y2="{top + plot_h}" '
        'class="axis"/>'
        f'<text x="{left + plot_w / 2:.1f}" y="{top + plot_h + 38}" class="axis-label" '
        f'text-anchor="middle">{escape(x_label)}</text>'
        f'<text transform="translate(16 {top + plot_h / 2:.1f}) rotate(-90)" '
        f'class="axis-label" text-anchor="middle">{escape(y_label)}</text>'
    )
    for i, s in enumerate(series):
        colour = PALETTE[i % len(PALETTE)]
        path = " ".join(f"{fx(x):.1f},{fy(y):.1f}" for x, y in s.points)
        parts.append(
            f'<polyline points="{path}" fill="none" stroke="{colour}" stroke-width="2" '
            f'class="line" data-series="{escape(s.label)}"/>'
        )
        for x, y in s.points:
            hover = f"{s.label} · {x_format(x)}: {fmt_number(round(y, 1))}{y_unit}"
            parts.append(
                f'<circle cx="{fx(x):.1f}" cy="{fy(y):.1f}" r="3.5" fill="{colour}" '
                f'class="mark"><title>{escape(hover)}</title></circle>'
            )
    if legend_rows:
        for i, s in enumerate(series):
            colour = PALETTE[i % len(PALETTE)]
            lx = left + (i % 4) * (plot_w / 4)
            ly = height - 18 * legend_rows + 18 * (i // 4) + 4
            parts.append(
                f'<rect x="{lx:.1f}" y="{ly - 9}" width="12" height="12" fill="{colour}"/>'
                f'<text x="{lx + 16:.1f}" y="{ly + 1}" class="legend">{escape(s.label)}</text>'
            )
    parts.append("</svg>")
    return "".join(parts)
