"""Capacity at the objectives, in words: the terminal's and the job summary's lines, read from
the results model (the run's ``capacity`` and objectives, each cell's ``slo`` and goodput;
docs/slo.md). Pure."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ..gate.slo import Capacity, RateCapacity
from ..results import CellRecord, Phase, order_contexts
from .terminal import fmt_rate


def capacity_line(context: str, entry: Mapping[str, Any]) -> str:
    """A context's capacity as the results file keeps it, in words (``Capacity.line``)."""
    return Capacity(context, entry.get("requests"), entry.get("stopped_by")).line()


def goodput_line(cells: Sequence[CellRecord], context: str) -> str | None:
    """``goodput tok/s c1 2,014 of 2,014 · c8 0 of 7,960`` for a context's decode cells that
    have one, or None."""
    row = sorted(
        (c for c in cells if c.phase is Phase.DECODE and c.context == context),
        key=lambda c: c.concurrency,
    )
    parts = [
        f"c{c.concurrency} {fmt_rate(c.goodput_tok_s)} of {fmt_rate(c.total_tok_s)}"
        for c in row
        if c.goodput_tok_s is not None and c.total_tok_s is not None
    ]
    return "goodput tok/s " + " · ".join(parts) if parts else None


def lines(
    objectives: str | None,
    capacity: Mapping[str, Mapping[str, Any]],
    cells: Sequence[CellRecord],
    baseline: Mapping[str, int] | None = None,
) -> list[str]:
    """The terminal's capacity section: a heading naming the objectives, then per context its
    capacity (against the ``baseline``'s at the same objectives: ``capacity at SLO 32 → 16``)
    and its cells' goodput (output tok/s of the requests that met the per-request bounds, of
    the total)."""
    if not objectives or not capacity:
        return []
    out = [
        f"Capacity at {objectives} (the most requests in flight up to which every cell meets them)"
    ]
    decode = [c for c in cells if c.phase is Phase.DECODE]
    for context in order_contexts(decode):
        if context not in capacity:
            continue
        line = "  " + capacity_line(context, capacity[context])
        if baseline is not None and context in baseline:
            was, now = baseline[context], capacity[context].get("requests") or 0
            if now < was:
                line += f"; DROPPED: capacity at SLO {was} → {now} (baseline)"
            elif now > was:
                line += f"; baseline {was}"
        out.append(line)
        good = goodput_line(decode, context)
        if good:
            out.append("    " + good)
    return out


def markdown(
    objectives: str | None, capacity: Mapping[str, Mapping[str, Any]], cells: Sequence[CellRecord]
) -> list[str]:
    """The job summary's capacity section (Markdown lines), or none."""
    if not objectives or not capacity:
        return []
    out = [f"**Capacity at `{objectives}`** (most requests in flight that meet them)", ""]
    decode = [c for c in cells if c.phase is Phase.DECODE]
    for context in order_contexts(decode):
        if context in capacity:
            out.append(f"- {capacity_line(context, capacity[context])}")
    return [*out, ""]


def rate_markdown(
    objectives: str | None, rate_capacity: Mapping[str, Mapping[str, Any]]
) -> list[str]:
    """The job summary's capacity as an arrival rate (Markdown lines), or none."""
    if not objectives or not rate_capacity:
        return []
    return [
        f"**Capacity as an arrival rate at `{objectives}`** (the highest rate, open loop, "
        "that meets them; latencies from the scheduled send)",
        "",
        *(
            "- " + RateCapacity(context, e.get("rate"), e.get("stopped_by")).line()
            for context, e in rate_capacity.items()
        ),
        "",
    ]


def rate_lines(objectives: str | None, rate_capacity: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """The terminal's rate capacity: a heading naming the objectives, then per context the
    highest arrival rate up to which every rate cell meets them (``RateCapacity.line``)."""
    if not objectives or not rate_capacity:
        return []
    return [
        f"Capacity as an arrival rate at {objectives} (the highest rate, open loop, up to which "
        "every rate cell meets them; latencies from the scheduled send)",
        *(
            "  " + RateCapacity(context, e.get("rate"), e.get("stopped_by")).line()
            for context, e in rate_capacity.items()
        ),
    ]
