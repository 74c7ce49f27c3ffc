"""The gate's verdicts: pure functions of a baseline entry and a cell's measurements.

The rule (docs/gate.md, "Across restarts"): a figure *misses* when it is past its limit and
worse than its reference beyond two levels of noise, the window's (its interval) and the
spread between starts of the server (the baseline's runs). A cell whose attempt misses is
measured again, up to the number of confirmations the user allows (:func:`wants_another`):

- attempts on one start of the server (the default): again while the latest attempt misses;
  a figure *regresses* only when every attempt misses and so does their mean;
- attempts on fresh starts (``fresh_starts=True``: the pytest layer restarted the server for
  each): once the first attempt is past its limit (a miss, or within the noise) every
  confirmation is taken, and the figure regresses when the mean of all misses, judged with
  the fresh-start variance. ``benchmarks/gate_restarts.py`` chose this rule: on the same
  draws (starts 3 % apart, 3 or 5 runs, 4 confirmations) it caught 37 % and 82 % of 10 %
  slowdowns, for 0.16 % and 0.09 % false failures, where stopping at the first attempt that
  passes caught 15 % and 18 %, and confirming only a first attempt that misses 27 % and 45 %.

The pytest layer asks for the re-measurements and turns the verdict into pass or fail; nothing
here measures or prints.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from .. import figures
from ..results import CellRecord, Check, GateVerdict, Outcome, Phase, Status
from .baseline import Baseline, CellBaseline
from .noise import Spread, reference_se, with_attempts

#: the summary's line when the between-run spread is unknown
SPREAD_UNKNOWN = (
    "between-run spread unknown (a one-run baseline): make the baseline from several runs, "
    "--llm-runs=3 or --llm-save-baseline=FILE run again"
)


def checks(
    entry: CellBaseline, attempts: Sequence[CellRecord], fresh_starts: bool = False
) -> tuple[Check, ...]:
    """One check per figure of the entry that the attempts measured (figures an attempt lacks
    are not checked on that attempt)."""
    out = []
    for metric, reference in entry.limits.items():
        measured = [a for a in attempts if isinstance(getattr(a, metric, None), int | float)]
        if not measured:
            continue
        values = tuple(float(getattr(a, metric)) for a in measured)
        cis = tuple(getattr(a, f"{metric}_ci", None) for a in measured)
        runs = entry.figure_runs(metric)
        spread = entry.figure_spread(metric)
        if fresh_starts:  # every attempt is one more draw of the start effect
            spread = with_attempts(spread, values, cis)
        one_run = runs.count == 1 and not spread.known
        out.append(
            Check(
                entry.id,
                metric,
                reference,
                entry.tolerance,
                values,
                runs.intervals[0] if runs.count == 1 else None,
                cis if any(cis) else (),
                reference_se=None
                if one_run
                else reference_se(runs.values, runs.intervals, spread.sigma or 0.0),
                spread=spread.sigma,
                spread_dof=spread.dof,
                reference_runs=runs.count,
                quantile=spread.quantile,
                fresh_starts=fresh_starts,
            )
        )
    return tuple(out)


def verdict(
    entry: CellBaseline | None, attempts: Sequence[CellRecord], fresh_starts: bool = False
) -> GateVerdict:
    """The verdict on one cell, given its baseline entry (None: the baseline has no floor for
    it) and its measurements in order (empty: not measured). ``fresh_starts``: every
    re-measurement ran on a fresh start of the server."""
    if entry is None:
        return GateVerdict(Outcome.NO_FLOOR)
    if not attempts:
        return GateVerdict(Outcome.NOT_MEASURED)
    found = checks(entry, attempts, fresh_starts)
    if any(c.regressed for c in found):
        return GateVerdict(Outcome.REGRESSION, found, why(entry, attempts))
    if any(c.improved for c in found):
        return GateVerdict(Outcome.IMPROVEMENT, found, why(entry, attempts))
    return GateVerdict(Outcome.PASS, found)


def why(entry: CellBaseline, attempts: Sequence[CellRecord]) -> str:
    """Why the cell changed against its baseline, from the baseline's server figures (the mean
    of its runs) and the latest attempt's (gate/explain.py); "" when either has none. Decode:
    total tok/s, the reference against the attempts' mean; prefill: the cold TTFT."""
    from .explain import Explanation, Side, explain

    latest = attempts[-1]
    if entry.server is None or latest.server is None:
        return ""
    if latest.phase is Phase.DECODE:
        kind, key = "decode", "total_tok_s"
        reference: float | None = entry.limits.get(key)
    else:
        kind, key = "prefill", "ttft_ms"
        runs = entry.ungated.get(key)
        reference = runs.mean if runs is not None else None
    measured = [float(v) for a in attempts if isinstance(v := getattr(a, key), int | float)]
    if not reference or not measured:
        return ""
    found = explain(
        entry.id,
        kind,  # type: ignore[arg-type]
        Side(reference, entry.server),
        Side(sum(measured) / len(measured), latest.server),
        concurrency=latest.id.concurrency,
    )
    return found.line() if isinstance(found, Explanation) else ""


def wants_another(
    entry: CellBaseline | None,
    attempts: Sequence[CellRecord],
    confirm: int,
    fresh_starts: bool = False,
) -> bool:
    """Should the cell be measured again? Not once ``confirm`` re-measurements were made. On
    one start: while the latest attempt misses on some figure. On fresh starts (the next
    measurement too): once the first attempt is past its limit on some figure (a miss, or
    within the noise), until every confirmation is taken."""
    if entry is None or not attempts or len(attempts) > confirm:
        return False
    found = checks(entry, attempts, fresh_starts)
    if fresh_starts:
        return any(c.past_limit([0]) for c in found)
    return any(c.last_misses for c in found)


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
        changes["reason"] = "; ".join(c.message() for c in result.regressions) + (
            f"; why: {result.why}" if result.why else ""
        )
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
    noisy: tuple[Check, ...] = ()  # past their limit, within the noise: not failures
    runs: int = 1  # runs the baseline was made of
    #: (metric, spread) of the gated figures; every spread unknown: a one-run baseline
    spread: tuple[tuple[str, Spread], ...] = ()

    @property
    def spread_unknown(self) -> bool:
        return not any(s.known for _, s in self.spread)

    def spread_line(self) -> str:
        """What the summary says of the between-run spread: unknown (and how to measure it),
        or its value per figure."""
        if self.spread_unknown:
            return SPREAD_UNKNOWN
        shown = ", ".join(
            f"{figures.by_key(m).label} {s.sigma:.1%} ({s.dof} d.f.)"
            for m, s in self.spread
            if s.sigma is not None
        )
        return f"between-run spread from {self.runs} runs: {shown}"


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
        runs=baseline.runs,
        spread=tuple(baseline.spread.items()),
    )
