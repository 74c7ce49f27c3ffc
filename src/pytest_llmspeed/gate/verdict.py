"""The gate's verdicts: pure functions of a baseline entry and a cell's measurements.

The rule (docs/judge.md, "The rule across restarts"): a figure *misses* when it is past its limit
and worse than its reference beyond two levels of noise, the window's (its interval) and the spread
between starts of the server (the baseline's runs). A cell whose attempt misses is measured again,
up to the number of confirmations the user allows (:func:`wants_another`):

- attempts on one start of the server (the default): again while the latest attempt misses;
  a figure *regresses* only when every attempt misses and so does their mean;
- attempts on fresh starts (``fresh_starts=True``: the pytest layer restarted the server for
  each): once the first attempt is past its limit (a miss, or within the noise) every
  confirmation is taken, and the figure regresses when the mean of all misses, judged with
  the fresh-start variance. ``benchmarks/studies/gate_restarts.py`` chose this rule: on the same
  draws (starts 3 % apart, 3 or 5 runs, 4 confirmations) it caught 37 % and 82 % of 10 %
  slowdowns, for 0.16 % and 0.09 % false failures, where stopping at the first attempt that
  passes caught 15 % and 18 %, and confirming only a first attempt that misses 27 % and 45 %.

Each figure's verdict is the judge's (gate/judge.py): the check's change ``ln(value /
reference)``, signed so that positive is better, with its standard error from the windows'
intervals, the reference's error and the spread between starts (:func:`change_of`), is
regressed, improved, same or unknown. On one start a regression also needs every attempt to
miss; attempts that disagree are unknown.

The pytest layer asks for the re-measurements (:func:`confirm`, the one loop) and turns the
verdict into pass or fail; nothing here prints.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from .. import figures
from ..results import CellRecord, Check, GateVerdict, Outcome, Phase, Status, mean_interval
from .baseline import Baseline, CellBaseline
from .judge import Change, Verdict, judge, more_needed, verdict_of
from .noise import Spread, reference_se, with_attempts, within_se

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
    return tuple(judged(c) for c in out)


# -- one check's arithmetic: the noise model and the judge --------------------------------------


def _indices(check: Check, attempts: Sequence[int] | None) -> Sequence[int]:
    return range(len(check.values)) if attempts is None else attempts


def variance(check: Check, attempts: Sequence[int] | None = None) -> float:
    """The relative variance of one attempt, or of the mean of ``attempts`` (indices; all by
    default): the spread between starts and the windows' noise, divided as the attempts shared
    a start or not: ``(σ_b² + mean w²) / n`` on fresh starts, ``σ_b² + mean w² / n`` on one."""
    idx = _indices(check, attempts)
    n = len(idx)
    s2 = (check.spread or 0.0) ** 2
    cis = check.values_ci
    w2 = sum(within_se(check.values[i], cis[i] if i < len(cis) else None) ** 2 for i in idx) / n
    return (s2 + w2) / n if check.fresh_starts else s2 + w2 / n


def change_of(check: Check, attempts: Sequence[int] | None = None) -> Change:
    """The check as the judge's :class:`~.judge.Change`: ``ln(1 + c)`` where c is the relative
    change of the mean of ``attempts`` (all by default) against the reference, positive better
    (a floor's ``X / R − 1``, a ceiling's ``1 − X / R``): a floor's is ``ln(X / R)``, and a
    figure exactly at its limit ``R·(1 ∓ t)`` sits exactly on the judge's ``ln(1 ∓ t)``, so the
    judge's limits are the baseline's floors and ceilings. Its standard error from the
    attempts' variance and the reference's (``√(u_X² + u_R²)``, relative errors as log ones);
    its degrees of freedom those of the spread between starts (None: the spread unknown, the
    normal quantiles)."""
    idx = _indices(check, attempts)
    mean = sum(check.values[i] for i in idx) / len(idx)
    rel = (mean - check.reference) / check.reference
    better = rel if check.is_floor else -rel
    d = math.log1p(better) if better > -1 else -math.inf
    se = math.sqrt(variance(check, idx) + check.reference_u**2)
    df = check.spread_dof if check.spread is not None and check.spread_dof > 0 else None
    return Change(d, se, df, len(idx))


def _tolerance(check: Check) -> float:
    return min(max(check.tolerance, 1e-9), 1 - 1e-9)  # the judge's open interval (0, 1)


def attempt_misses(check: Check, i: int) -> bool:
    """Attempt ``i`` alone is regressed (past its limit, worse beyond the noise)."""
    return mean_misses(check, [i])


def mean_misses(check: Check, attempts: Sequence[int] | None = None) -> bool:
    """The mean of ``attempts`` (all by default) is regressed, with its variance."""
    return verdict_of(change_of(check, attempts), _tolerance(check)) is Verdict.REGRESSED


def past_limit(check: Check, attempts: Sequence[int] | None = None) -> bool:
    """The mean of ``attempts`` is past the limit (regressed, or too noisy to tell)."""
    idx = _indices(check, attempts)
    mean = sum(check.values[i] for i in idx) / len(idx)
    return mean < check.limit if check.is_floor else mean > check.limit


def judged(check: Check) -> Check:
    """The check with its verdict: the judge's on the mean of all the attempts. Attempts on
    one start regress only when every one of them misses too; when they disagree the figure is
    unknown (about how many more measurements would decide it: ``more``)."""
    tolerance = _tolerance(check)
    found = judge(change_of(check), tolerance)
    verdict, more = found.verdict, found.more
    if (
        verdict is Verdict.REGRESSED
        and not check.fresh_starts
        and not all(attempt_misses(check, i) for i in range(len(check.values)))
    ):
        verdict, more = Verdict.UNKNOWN, more_needed(found.change, tolerance)
    return dataclasses.replace(
        check,
        verdict=verdict.value,
        change_se=found.change.se,
        value_se=math.sqrt(variance(check)),
        more=more,
    )


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
    outcome = outcome_of(found)
    if outcome in (Outcome.REGRESSION, Outcome.IMPROVEMENT):
        return GateVerdict(outcome, found, why(entry, attempts))
    return GateVerdict(outcome, found)


def outcome_of(found: Sequence[Check]) -> Outcome:
    """A cell's verdict from its figures': regressed if one regressed, else unknown if one is
    too noisy to tell, else improved if one improved, else same (no figure: same)."""
    for word, outcome in (
        ("regressed", Outcome.REGRESSION),
        ("unknown", Outcome.UNKNOWN),
        ("improved", Outcome.IMPROVEMENT),
    ):
        if any(c.verdict == word for c in found):
            return outcome
    return Outcome.SAME


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
    """Should the cell be measured again? Not once ``confirm`` re-measurements were made.
    While some figure is unknown (what Pinpoint repeats: only what it could not decide). On
    one start: while the latest attempt misses on some figure. On fresh starts (the next
    measurement too): once the first attempt is past its limit on some figure (a miss, or
    within the noise), until every confirmation is taken."""
    if entry is None or not attempts or len(attempts) > confirm:
        return False
    found = checks(entry, attempts, fresh_starts)
    if any(c.unknown for c in found):
        return True
    if fresh_starts:
        return any(past_limit(c, [0]) for c in found)
    return any(attempt_misses(c, len(c.values) - 1) for c in found)


def confirm(
    entry: CellBaseline | None,
    first: CellRecord,
    again: Callable[[], CellRecord | None],
    most: int,
    fresh_starts: bool = False,
    allowed: Callable[[], bool] = lambda: True,
) -> tuple[CellRecord, int]:
    """The one confirmation loop (a test's cell, a warm-up gated at the session's end):
    measure the cell again (``again``; None: the re-measurement failed, judge what was
    measured) while :func:`wants_another` says so, at most ``most`` times, and while
    ``allowed()`` (the time budget: when it stops one, the record's notes say so). The cell's
    record carrying its verdict (:func:`gated`) and how many re-measurements were made."""
    attempts = [first]
    cut = False
    while wants_another(entry, attempts, most, fresh_starts):
        if not allowed():
            cut = True
            break
        nxt = again()
        if nxt is None:
            break
        attempts.append(nxt)
    result = verdict(entry, attempts, fresh_starts)
    if cut:
        result = dataclasses.replace(result, budget_cut=True)
    record = gated(first, result, attempts)
    if cut:  # in words, for a person (the verdict says it: GateVerdict.budget_cut)
        record = dataclasses.replace(record, notes=(*record.notes, BUDGET_NOTE))
    return record, len(attempts) - 1


def gated(record: CellRecord, result: GateVerdict, attempts: Sequence[CellRecord]) -> CellRecord:
    """The cell's record carrying its verdict: failed on a regression (the reason lists the
    regressed figures). Measured more than once, its figures are the attempts' (each listed
    under ``attempts``) and its gateable figures the means the verdict judged
    (:func:`mean_figures`): one number for one figure in every output."""
    changes: dict[str, object] = {"gate": result}
    if len(attempts) > 1:
        metrics = [c.metric for c in result.checks]
        keys = tuple(dict.fromkeys((*metrics, *MEANT, "stability_cv")))
        cis = [f.ci_key for k in keys if (f := figures.by_key(k)).ci]
        changes["attempts"] = tuple(
            {k: getattr(a, k, None) for k in keys}
            | {k: list(ci) for k in cis if (ci := getattr(a, k, None)) is not None}
            for a in attempts
        )
        changes |= mean_figures(attempts)
    if result.outcome is Outcome.REGRESSION:
        changes["status"] = Status.FAILED
        changes["reason"] = "; ".join(c.message() for c in result.regressions) + (
            f"; why: {result.why}" if result.why else ""
        )
    return dataclasses.replace(record, **changes)  # type: ignore[arg-type]


#: the figures a cell measured more than once shows as the mean of its attempts: the gateable
#: ones (each a mean over its window or its cold requests), which a verdict judges that way
MEANT = tuple(f.key for f in figures.FIGURES if f.gate is not None)


def mean_figures(attempts: Sequence[CellRecord], geometric: bool = False) -> dict[str, object]:
    """Each of :data:`MEANT` as the mean over the attempts that measured it: arithmetic, what
    :func:`change_of` judges; ``geometric``, what an A/B judges (in logs) and its table shows
    for each version. With the interval of that mean from theirs (independent attempts: each
    side's half-widths in quadrature over their number, :func:`~..results.mean_interval`)."""
    out: dict[str, object] = {}
    for key in MEANT:
        measured = [a for a in attempts if isinstance(getattr(a, key, None), int | float)]
        if geometric:
            measured = [a for a in measured if getattr(a, key) > 0]
        if not measured:
            continue
        values = [float(getattr(a, key)) for a in measured]
        if geometric:
            mean = math.exp(sum(map(math.log, values)) / len(values))
        else:
            mean = sum(values) / len(values)
        out[key] = mean
        f = figures.by_key(key)
        if not f.ci:
            continue
        cis = [getattr(a, f.ci_key, None) for a in measured]
        out[f.ci_key] = mean_interval(mean, values, cis)
    return out


@dataclass(frozen=True)
class Accounting:
    """Every baseline cell, in one of the places below; the counts add up to the baseline's
    cells.

    Measured and judged: ``regressed``, ``unknown`` (too noisy to tell), ``improved``,
    ``same`` (shown within tolerance), ``passed`` (a stored verdict of an earlier version, which
    did not tell same from unknown). ``not_run`` are cells this run selected but could not
    measure (over capacity, does not fit, refused, stopped): an upgrade that can no longer
    serve a cell has regressed. ``deselected`` are cells the user left out (``-m``, ``-k``,
    options): information."""

    total: int
    same: tuple[str, ...]
    regressed: tuple[str, ...]
    not_gated: tuple[tuple[str, str], ...]  # (cell, why)
    not_run: tuple[tuple[str, str], ...]  # (cell, why)
    deselected: tuple[str, ...]
    no_floor: tuple[str, ...]  # measured cells the baseline has no entry for
    regressions: tuple[Check, ...]  # the regressed figures of the regressed cells
    improvements: tuple[Check, ...]
    #: the figures too noisy to tell (of every cell not regressed): not failures unless
    #: --llm-unknown=fail
    unknowns: tuple[Check, ...] = ()
    runs: int = 1  # runs the baseline was made of
    #: (metric, spread) of the gated figures; every spread unknown: a one-run baseline
    spread: tuple[tuple[str, Spread], ...] = ()
    improved: tuple[str, ...] = ()
    unknown: tuple[str, ...] = ()
    passed: tuple[str, ...] = ()  # an earlier version's stored "passed"
    #: cells whose re-measurements the time budget (--llm-budget) cut short
    budget_cut: tuple[str, ...] = ()
    #: --llm-unknown=fail: a cell too noisy to tell fails the run
    unknown_fails: bool = False

    @property
    def fails(self) -> bool:
        """Regressed cells, or unknown ones under --llm-unknown=fail (cells not run are the
        caller's: --llm-baseline-missing)."""
        return bool(self.regressed) or (self.unknown_fails and bool(self.unknown))

    noisy = property(lambda self: self.unknowns)

    def counts(self) -> str:
        """``14 baseline cell(s): 8 same, 1 improved, 1 unknown, 3 regressed, 1 not run, 0
        deselected, 0 not gated`` (an earlier version's ``passed`` only when there are)."""
        passed = f"{len(self.passed)} passed (stored), " if self.passed else ""
        return (
            f"{self.total} baseline cell(s): {len(self.same)} same, {len(self.improved)} "
            f"improved, {len(self.unknown)} unknown, {passed}{len(self.regressed)} regressed, "
            f"{len(self.not_run)} not run, {len(self.deselected)} deselected, "
            f"{len(self.not_gated)} not gated"
        )

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
        return f"between-run spread of the baseline's {self.runs} runs: {shown}"


def counted(cells: Iterable[CellRecord]) -> str:
    """The gate's verdicts on a run's cells, counted: ``3 regressed, 1 unknown, 0 improved, 8
    same`` (``, 2 passed`` for an earlier version's stored passes); "" when no cell was
    gated. What the page and the job summary say, from the results alone."""
    found = [c.gate.outcome for c in cells if c.gate is not None and c.gate.outcome.judged]
    if not found:
        return ""
    four = (Outcome.REGRESSION, Outcome.UNKNOWN, Outcome.IMPROVEMENT, Outcome.SAME)
    text = ", ".join(f"{found.count(o)} {o.value}" for o in four)
    passed = found.count(Outcome.PASS)
    return text + (f", {passed} passed (an earlier version's verdict)" if passed else "")


def not_gated(record: CellRecord, why: str) -> CellRecord:
    """A measured cell the gate cannot compare with its baseline figure: its verdict says
    so, with why (``Outcome.NOT_GATED``), and a note says it in words."""
    return dataclasses.replace(
        record,
        gate=GateVerdict(Outcome.NOT_GATED, not_gated=why),
        notes=(*record.notes, f"not gated: {why}"),
    )


#: a cell's note when the time budget (--llm-budget) stopped its re-measurements
BUDGET_NOTE = "re-measurement stopped: the time budget (--llm-budget) is spent"
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


def account(
    baseline: Baseline,
    cells: Iterable[CellRecord],
    selected: Iterable[str],
    unknown_fails: bool = False,
) -> Accounting:
    """Where each baseline cell stands after a run. ``selected``: the ids of the cells the run
    set out to measure (its test items after ``-m`` / ``-k``); ``unknown_fails``:
    --llm-unknown=fail."""
    by_id = {str(c.id): c for c in cells}
    chosen = set(selected)
    placed: dict[Outcome, list[str]] = {o: [] for o in Outcome}
    not_gated: list[tuple[str, str]] = []
    not_run: list[tuple[str, str]] = []
    deselected: list[str] = []
    regressions: list[Check] = []
    improvements: list[Check] = []
    unknowns: list[Check] = []
    for cid in baseline.cells:
        cell = by_id.get(cid)
        if cell is None:
            if cid in chosen:
                not_run.append((cid, "not run (the session stopped before it)"))
            else:
                deselected.append(cid)
        elif not cell.measured:
            not_run.append((cid, _why_not_run(cell)))
        elif cell.gate is None or not cell.gate.outcome.judged:
            why = cell.gate.not_gated if cell.gate is not None else ""
            not_gated.append((cid, why or "not judged (the session ended before its gate)"))
        else:
            placed[cell.gate.outcome].append(cid)
            if cell.gate.outcome is Outcome.REGRESSION:
                regressions.extend(cell.gate.regressions)
            else:
                improvements.extend(cell.gate.improvements)
                unknowns.extend(cell.gate.unknowns)
    no_floor = tuple(
        str(c.id) for c in by_id.values() if c.gate and c.gate.outcome is Outcome.NO_FLOOR
    )
    return Accounting(
        total=len(baseline.cells),
        same=tuple(placed[Outcome.SAME]),
        regressed=tuple(placed[Outcome.REGRESSION]),
        not_gated=tuple(not_gated),
        not_run=tuple(not_run),
        deselected=tuple(deselected),
        no_floor=no_floor,
        regressions=tuple(regressions),
        improvements=tuple(improvements),
        unknowns=tuple(unknowns),
        runs=baseline.runs,
        spread=tuple(baseline.spread.items()),
        improved=tuple(placed[Outcome.IMPROVEMENT]),
        unknown=tuple(placed[Outcome.UNKNOWN]),
        passed=tuple(placed[Outcome.PASS]),
        budget_cut=tuple(
            cid
            for cid in baseline.cells
            if (c := by_id.get(cid)) is not None and c.gate is not None and c.gate.budget_cut
        ),
        unknown_fails=unknown_fails,
    )
