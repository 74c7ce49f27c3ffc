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
from dataclasses import dataclass

from ..results import CellRecord, Check, GateVerdict, Outcome, Status
from .baseline import Baseline, CellBaseline


def checks(entry: CellBaseline, attempts: Sequence[CellRecord]) -> tuple[Check, ...]:
    """One check per figure of the entry that the attempts measured (figures an attempt lacks
    are not checked on that attempt)."""
    out = []
    for metric, reference in entry.limits.items():
        measured = [a for a in attempts if isinstance(getattr(a, metric, None), int | float)]
        if not measured:
            continue
        values = tuple(float(getattr(a, metric)) for a in measured)
        cis = tuple(getattr(a, f"{metric}_ci", None) for a in measured)
        ref_ci = entry.intervals.get(metric)
        out.append(
            Check(
                entry.id,
                metric,
                reference,
                entry.tolerance,
                values,
                ref_ci,
                cis if ref_ci is not None and all(cis) else (),
            )
        )
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


@dataclass(frozen=True)
class Accounting:
    """Every baseline cell, in one of five places; the counts add up to the baseline's cells.

    ``not_run`` are cells this run selected but could not measure (over capacity, does not fit,
    refused, stopped): an upgrade that can no longer serve a cell has regressed. ``deselected``
    are cells the user left out (``-m``, ``-k``, options): information."""

    total: int
    passed: tuple[str, ...]
    regressed: tuple[str, ...]
    not_gated: tuple[tuple[str, str], ...]  # (cell, why)
    not_run: tuple[tuple[str, str], ...]  # (cell, why)
    deselected: tuple[str, ...]
    no_floor: tuple[str, ...]  # measured cells the baseline has no entry for
    regressions: tuple[Check, ...]  # the regressed figures of the regressed cells
    improvements: tuple[Check, ...]
    noisy: tuple[Check, ...] = ()  # past their limit, within the intervals: not failures


NOT_GATED = "not gated: "
_NOT_RUN_WORDS = {
    Status.OVER_CAPACITY: "over capacity",
    Status.DOES_NOT_FIT: "does not fit",
    Status.NOT_RUN: "not run",
    Status.FAILED: "failed",
    Status.ERROR: "error",
}


def _why_not_run(cell: CellRecord) -> str:
    """``does not fit: 16K + 64 = 16,448 > max_model_len 8,192`` (the reason without the
    status words it may start with)."""
    word = _NOT_RUN_WORDS.get(cell.status, cell.status.value)
    reason = cell.reason or ""
    for prefix in (cell.status.value, word):
        if reason.lower().startswith(prefix + ": "):
            reason = reason[len(prefix) + 2 :]
    return f"{word}: {reason}" if reason else word


def account(baseline: Baseline, cells: Iterable[CellRecord], selected: Iterable[str]) -> Accounting:
    """Where each baseline cell stands after a run. ``selected``: the ids of the cells the run
    set out to measure (its test items after ``-m`` / ``-k``)."""
    by_id = {str(c.id): c for c in cells}
    chosen = set(selected)
    passed: list[str] = []
    regressed: list[str] = []
    not_gated: list[tuple[str, str]] = []
    not_run: list[tuple[str, str]] = []
    deselected: list[str] = []
    regressions: list[Check] = []
    improvements: list[Check] = []
    noisy: list[Check] = []
    for cid in baseline.cells:
        cell = by_id.get(cid)
        if cell is None:
            if cid in chosen:
                not_run.append((cid, "not run (the session stopped before it)"))
            else:
                deselected.append(cid)
        elif not cell.measured:
            not_run.append((cid, _why_not_run(cell)))
        elif cell.gate is None or cell.gate.outcome is Outcome.NOT_MEASURED:
            why = next((n for n in cell.notes if n.startswith(NOT_GATED)), NOT_GATED + "?")
            not_gated.append((cid, why.removeprefix(NOT_GATED)))
        elif cell.gate.outcome is Outcome.REGRESSION:
            regressed.append(cid)
            regressions.extend(cell.gate.regressions)
        else:
            passed.append(cid)
            improvements.extend(cell.gate.improvements)
            noisy.extend(cell.gate.noisy)
    no_floor = tuple(
        str(c.id) for c in by_id.values() if c.gate and c.gate.outcome is Outcome.NO_FLOOR
    )
    return Accounting(
        total=len(baseline.cells),
        passed=tuple(passed),
        regressed=tuple(regressed),
        not_gated=tuple(not_gated),
        not_run=tuple(not_run),
        deselected=tuple(deselected),
        no_floor=no_floor,
        regressions=tuple(regressions),
        improvements=tuple(improvements),
        noisy=tuple(noisy),
    )
