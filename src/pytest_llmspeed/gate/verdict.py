"""The gate's verdicts: pure functions of a baseline entry and a cell's measurements.

The confirm rule (docs/gate.md): a figure *misses* when it is worse than its reference by more
than the tolerance. A cell whose latest attempt misses on any figure is measured again, up to
the number of confirmations the user allows (:func:`wants_another`); a figure *regresses* only
when every attempt misses and so does the mean of the attempts. The pytest layer asks for the
re-measurements and turns the verdict into pass or fail; nothing here measures or prints.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence

from ..results import CellRecord, Check, GateVerdict, Outcome, Status
from .baseline import Baseline, CellBaseline


def checks(entry: CellBaseline, attempts: Sequence[CellRecord]) -> tuple[Check, ...]:
    """One check per figure of the entry that the attempts measured (figures an attempt lacks
    are not checked on that attempt)."""
    out = []
    for metric, reference in entry.limits.items():
        values = tuple(
            float(v) for a in attempts if isinstance(v := getattr(a, metric, None), int | float)
        )
        if values:
            out.append(Check(entry.id, metric, reference, entry.tolerance, values))
    return tuple(out)


def verdict(entry: CellBaseline | None, attempts: Sequence[CellRecord]) -> GateVerdict:
    """The verdict on one cell, given its baseline entry (None: the baseline has no floor for
    it) and its measurements in order (empty: not measured)."""
    if entry is None:
        return GateVerdict(Outcome.NO_FLOOR)
    if not attempts:
        return GateVerdict(Outcome.NOT_MEASURED)
    found = checks(entry, attempts)
    if any(c.regressed for c in found):
        return GateVerdict(Outcome.REGRESSION, found)
    if any(c.improved for c in found):
        return GateVerdict(Outcome.IMPROVEMENT, found)
    return GateVerdict(Outcome.PASS, found)


def wants_another(entry: CellBaseline | None, attempts: Sequence[CellRecord], confirm: int) -> bool:
    """Should the cell be measured again? Yes while the latest attempt misses on some figure
    and fewer than ``confirm`` re-measurements were made."""
    if entry is None or not attempts or len(attempts) > confirm:
        return False
    return any(c.last_misses for c in checks(entry, attempts))


def gated(record: CellRecord, result: GateVerdict, attempts: Sequence[CellRecord]) -> CellRecord:
    """The cell's record carrying its verdict: failed on a regression (the reason lists the
    regressed figures), and the attempts' figures when it was measured more than once."""
    changes: dict[str, object] = {"gate": result}
    if len(attempts) > 1:
        metrics = [c.metric for c in result.checks]
        keys = (*metrics, "ttft_ms", "stability_cv")
        changes["attempts"] = tuple({k: getattr(a, k, None) for k in keys} for a in attempts)
    if result.outcome is Outcome.REGRESSION:
        changes["status"] = Status.FAILED
        changes["reason"] = "; ".join(c.message() for c in result.regressions)
    return dataclasses.replace(record, **changes)  # type: ignore[arg-type]


def not_measured(baseline: Baseline, cells: Iterable[CellRecord]) -> list[str]:
    """Baseline cells without measured figures in this run, with the run's status where the
    cell exists (``decode[32K-c64] (over capacity)``)."""
    by_id = {str(c.id): c for c in cells}
    out = []
    for cid in baseline.cells:
        cell = by_id.get(cid)
        if cell is None:
            out.append(cid)
        elif not cell.measured:
            out.append(f"{cid} ({cell.status.value})")
    return out
