"""Two runs side by side — before and after an upgrade — with a verdict per cell.

Pure functions of two :class:`~pytest_llmspeed.results.Results`, judged by the stored-baseline
gate itself: the old run is read as a one-run baseline (:func:`~..gate.baseline.reference_of`,
the floors a ``--llm-save-baseline`` of it would hold, with their intervals) and each cell of
the new run, with its re-measurements when it had some, goes through the gate's
:func:`~..gate.verdict.verdict`: the same noise model (the windows' intervals; a one-run
baseline knows no spread between starts) and the judge's four verdicts (gate/judge.py) —
regressed, improved, same (shown within tolerance) or unknown (too noisy to tell). So
``compare OLD NEW`` and ``pytest --llm-baseline`` on a baseline saved from OLD give the same
verdict on every cell. The matrix shows each cell's headline figure (total tok/s for decode,
prompt tok/s for prefill).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from enum import Enum

from tabulate import tabulate

from .. import figures
from ..gate.baseline import reference_of
from ..gate.explain import Explanation, Side, change_noise, explain
from ..gate.judge import SAME_LEVEL
from ..gate.noise import t_quantile
from ..gate.verdict import change_of, verdict
from ..results import CellRecord, Check, Outcome, Phase, Results, Status, order_contexts

DEFAULT_TOLERANCE = 0.05
#: run settings whose difference makes two runs measure different things
SETTINGS = ("api", "prompt_form", "max_output", "duration_s", "prefill_repeats")


class Verdict(Enum):
    """A cell's verdict: the judge's four (its figures' worst), or why there is none."""

    REGRESSION = "regressed"
    UNKNOWN = "unknown"
    IMPROVEMENT = "improved"
    SAME = "same"
    ONLY_OLD = "only in the old run"
    ONLY_NEW = "only in the new run"
    OVER_CAPACITY = "over capacity in both"
    TOO_LONG = "exceeds max_model_len in both"
    NOT_MEASURED = "not measured in both"

    def counted(self, n: int) -> str:
        """``3 regressed``, ``1 same``."""
        return f"{n} {self.value}"

    @property
    def judged(self) -> bool:
        """One of the judge's four verdicts (both runs measured the cell)."""
        return self in _JUDGED

    @property
    def short(self) -> str:
        """The verdict in a matrix's cell, where a change has no figure."""
        return _SHORT.get(self, self.value)


_SHORT = {
    Verdict.ONLY_OLD: "only old",
    Verdict.ONLY_NEW: "only new",
    Verdict.OVER_CAPACITY: "over capacity",
    Verdict.TOO_LONG: "too long",
    Verdict.NOT_MEASURED: "not measured",
}
_JUDGED = (Verdict.REGRESSION, Verdict.UNKNOWN, Verdict.IMPROVEMENT, Verdict.SAME)
_OF_OUTCOME = {
    Outcome.REGRESSION: Verdict.REGRESSION,
    Outcome.UNKNOWN: Verdict.UNKNOWN,
    Outcome.IMPROVEMENT: Verdict.IMPROVEMENT,
    Outcome.SAME: Verdict.SAME,
}
#: both runs skipped the cell by the same arithmetic: nothing to compare, and nothing missing
_SKIPPED_IN_BOTH = {
    Status.OVER_CAPACITY: Verdict.OVER_CAPACITY,
    Status.DOES_NOT_FIT: Verdict.TOO_LONG,
}


@dataclass(frozen=True)
class CellChange:
    cid: str
    context: str
    concurrency: int | None  # None: prefill
    metric: str
    old: float | None
    new: float | None
    verdict: Verdict
    why: str = ""  # the statuses, when a side has no figure
    #: why it changed, from both runs' server figures (gate/explain.py): for a regression or
    #: an improvement, and for any cell with a finding (preemptions 0 → 41, ...); "" otherwise
    explanation: str = ""
    #: the gate's checks of the cell's figures against the old run's (both measured)
    checks: tuple[Check, ...] = ()
    #: why the cell has no interval, so no verdict (a figure of one cold request): "" when
    #: it has one
    no_interval: str = ""

    @property
    def change(self) -> float | None:
        if self.old is None or self.new is None or self.old == 0:
            return None
        return self.new / self.old - 1

    @property
    def check(self) -> Check | None:
        """The check that decided the verdict: the first of that verdict, else the headline
        figure's."""
        word = self.verdict.value
        decided = [c for c in self.checks if c.verdict == word]
        by_metric = [c for c in self.checks if c.metric == self.metric]
        found = decided or by_metric or list(self.checks)
        return found[0] if found else None

    def decide_words(self) -> str:
        """What would decide an unknown: its missing interval's remedy, or the check's
        ``about 3 more measurement(s) would decide it``."""
        if self.no_interval:
            return f"{ONE_REQUEST_REMEDY} measures one"
        return self.check.more_words() if self.check is not None else ""

    def interval(self) -> str:
        """``95 % interval −12.3% … −7.9%, tolerance ±5%`` of the deciding check's change
        as the line shows it, new / old − 1 (a ceiling's rises when it got worse), or ""
        without one. The judge's own change is positive better (a ceiling's ``1 − X / R``,
        below −100 % once a latency doubled); its standard error gives the interval of
        ``ln(X / R)`` here."""
        c = self.check
        if self.no_interval:
            return f"no interval: {self.no_interval}"
        if c is None:
            return ""
        judged = change_of(c)
        mean = sum(c.values) / len(c.values)
        if mean <= 0 or c.reference <= 0:
            return ""
        q = t_quantile(0.5 + SAME_LEVEL / 2, judged.df)
        log_ratio = math.log(mean / c.reference)
        lo, hi = math.expm1(log_ratio - q * judged.se), math.expm1(log_ratio + q * judged.se)
        return _minus(f"95 % interval {lo:+.1%} … {hi:+.1%}, tolerance ±{c.tolerance:.0%}")


def _minus(text: str) -> str:
    return text.replace("-", "−")


@dataclass(frozen=True)
class Comparison:
    old_label: str
    new_label: str
    differences: tuple[str, ...]  # expected (engine version) and not (settings, model)
    warnings: tuple[str, ...]
    cells: tuple[CellChange, ...]
    #: why no cell's change is explained, when a run has no server figures at all
    unexplained: str | None = None
    #: with --llm-slo in both runs: each context's capacity side by side (docs/slo.md)
    capacity: tuple[str, ...] = ()

    def count(self, verdict: Verdict) -> int:
        return sum(1 for c in self.cells if c.verdict is verdict)

    @property
    def regressions(self) -> list[CellChange]:
        return [c for c in self.cells if c.verdict is Verdict.REGRESSION]

    @property
    def unknowns(self) -> list[CellChange]:
        return [c for c in self.cells if c.verdict is Verdict.UNKNOWN]

    def exit_status(self, unknown_fails: bool = False) -> int:
        """1 on a regression, or an unknown when ``unknown_fails``; else 0."""
        return 1 if self.regressions or (unknown_fails and self.unknowns) else 0


def headline(cell: CellRecord) -> tuple[str, float | None]:
    """The figure a cell is compared by (:func:`.figures.headline` of its phase) and its
    value (None when the cell was not measured)."""
    f = figures.headline(cell.phase)
    return f.key, getattr(cell, f.key) if cell.measured else None


def attempts_of(cell: CellRecord) -> list[CellRecord]:
    """A cell's measurements as the gate judged them: its record, and each re-measurement the
    results file keeps (``attempts``: the checked figures and their intervals) as a record of
    its own."""
    if len(cell.attempts) < 2:
        return [cell]
    out = []
    for attempt in cell.attempts:
        changes = {
            k: (v if not isinstance(v, list) else (float(v[0]), float(v[1])))
            for k, v in attempt.items()
            if hasattr(cell, k)
        }
        out.append(dataclasses.replace(cell, **changes))  # type: ignore[arg-type]
    return out


def judged(old: CellRecord, new: CellRecord, tolerance: float) -> tuple[Verdict, tuple[Check, ...]]:
    """The gate's verdict on ``new`` against ``old`` read as a one-run baseline (its floors,
    with their intervals), and the checks."""
    entry = reference_of([old], tolerance).cells.get(str(old.id))
    fresh = bool(new.gate and new.gate.checks and new.gate.checks[0].fresh_starts)
    found = verdict(entry, attempts_of(new), fresh_starts=fresh)
    checks = found.checks
    if one_request(old, new) and any(change_of(c).se == 0 for c in checks):
        # no noise known on either side: no interval, so no verdict (the judge's flat rule
        # would call a single cold request's +12 % an improvement)
        checks = tuple(
            dataclasses.replace(c, verdict="unknown", more=None) if change_of(c).se == 0 else c
            for c in checks
        )
        return Verdict.UNKNOWN, checks
    return _OF_OUTCOME.get(found.outcome, Verdict.NOT_MEASURED), checks


#: what gives a prefill cell an interval
ONE_REQUEST_REMEDY = "--llm-prefill-repeats=6 (or more: six cold requests a cell)"


def one_request(old: CellRecord, new: CellRecord) -> str:
    """Why a prefill cell's figures have no interval, in words ("" when they have one): a
    cell measured from too few cold requests for one (fewer than six) on a side."""

    def requests(n: int) -> str:
        return "one cold request" if n == 1 else f"{n} cold requests"

    sides = [
        (side, r.repeats or 1)
        for side, r in (("old", old), ("new", new))
        if r.phase is Phase.PREFILL and r.prompt_tok_s_ci is None
    ]
    if not sides:
        return ""
    if len(sides) == 1:
        return f"{requests(sides[0][1])} in the {sides[0][0]} run"
    (_, a), (_, b) = sides
    if a == b:
        return f"{requests(a)} in each run"
    return f"{requests(a)} in the old run, {b} in the new"


def explanation(a: CellRecord, b: CellRecord, verdict: Verdict) -> str:
    """Why the cell changed, in one line (``decode[32K-c8] −10.3%: acceptance length 2.41 →
    1.93 (−19.9%), steps/s ...``): for a regression or an improvement, or when the server's
    figures hold a finding by themselves; "" when either run has no server figures for it."""
    found = decomposition(a, b)
    if found is None:
        return ""
    if verdict in (Verdict.REGRESSION, Verdict.IMPROVEMENT) or found.findings:
        return found.line()
    return ""


def decomposition(a: CellRecord, b: CellRecord) -> Explanation | None:
    """Why a cell moved from record ``a`` to record ``b``, from their server figures (each
    factor judged against the figures' own intervals); None when either has none."""
    if a.server is None or b.server is None or not (a.measured and b.measured):
        return None
    if a.phase is Phase.DECODE:
        kind, fa, fb = "decode", a.total_tok_s, b.total_tok_s
        noise = change_noise(fa or 0.0, a.total_tok_s_ci, fb or 0.0, b.total_tok_s_ci)
    else:
        kind, fa, fb = "prefill", a.ttft_ms, b.ttft_ms
        noise = change_noise(fa or 0.0, a.ttft_ms_ci, fb or 0.0, b.ttft_ms_ci)
    if not fa or not fb:
        return None
    found = explain(
        str(a.id),
        kind,  # type: ignore[arg-type]
        Side(fa, a.server),
        Side(fb, b.server),
        noise={"total": noise} if noise is not None else None,
        concurrency=a.id.concurrency,
    )
    return found if isinstance(found, Explanation) else None


def _unexplained(old: Results, new: Results) -> str | None:
    """One line when a run has no server figures at all (a file written before them, or a
    server without /metrics): no cell's change can be explained."""

    def has(r: Results) -> bool:
        return any(c.server is not None for c in r.cells)

    if has(old) and has(new):
        return None
    if not (has(old) or has(new)):
        which = "neither run has server figures"
    else:
        which = f"the {'old' if not has(old) else 'new'} run has no server figures"
    return (
        f"{which} (a results file written before them, or a server without /metrics): the "
        "changes are not explained"
    )


def compare(old: Results, new: Results, tolerance: float = DEFAULT_TOLERANCE) -> Comparison:
    """Every cell of either run, with both values, the change and a verdict."""
    o, n = old.run, new.run
    differences: list[str] = []
    warnings: list[str] = []
    if o.model != n.model:
        warnings.append(f"comparing two different models: {o.model} (old), {n.model} (new)")
    if o.engine != n.engine:
        warnings.append(f"engine {o.engine} (old), {n.engine} (new)")
    if o.engine_version != n.engine_version:
        differences.append(
            f"engine version {o.engine_version} → {n.engine_version} (an upgrade changes it)"
        )
    for key in SETTINGS:
        a, b = o.settings.get(key), n.settings.get(key)
        if a is not None and b is not None and a != b:
            warnings.append(f"setting {key}: {a} (old), {b} (new): the cells measure other things")
    for key in sorted(set(o.metadata) | set(n.metadata)):
        a, b = o.metadata.get(key), n.metadata.get(key)
        if a != b:
            differences.append(f"{key}: {a or '—'} → {b or '—'}")
    old_cells = {str(c.id): c for c in old.cells}
    new_cells = {str(c.id): c for c in new.cells}
    order = list(old_cells) + [cid for cid in new_cells if cid not in old_cells]
    changes = []
    for cid in order:
        a, b = old_cells.get(cid), new_cells.get(cid)
        ref = b or a
        assert ref is not None
        metric, _ = headline(ref)
        va = headline(a)[1] if a else None
        vb = headline(b)[1] if b else None
        why = ""
        found: tuple[Check, ...] = ()
        if va is not None and vb is not None and a is not None and b is not None:
            verdict, found = judged(a, b, tolerance)
        elif a is None:
            verdict = Verdict.ONLY_NEW
        elif b is None:
            verdict = Verdict.ONLY_OLD
        elif a.status is b.status and a.status in _SKIPPED_IN_BOTH:
            verdict = _SKIPPED_IN_BOTH[a.status]
        else:
            verdict = Verdict.NOT_MEASURED
            why = f"{a.status.value} (old), {b.status.value} (new)"
        changes.append(
            CellChange(
                cid,
                ref.context,
                ref.id.concurrency,
                metric,
                va,
                vb,
                verdict,
                why,
                explanation(a, b, verdict) if a is not None and b is not None else "",
                found,
                one_request(a, b) if verdict is Verdict.UNKNOWN and a and b and found else "",
            )
        )
    return Comparison(
        old_label=f"{o.model} · {o.engine} {o.engine_version or '?'} · {o.started}",
        new_label=f"{n.model} · {n.engine} {n.engine_version or '?'} · {n.started}",
        differences=tuple(differences),
        warnings=tuple(warnings),
        cells=tuple(changes),
        unexplained=_unexplained(old, new),
        capacity=capacity_changes(old, new),
    )


def capacity_changes(old: Results, new: Results) -> tuple[str, ...]:
    """Both runs' capacity at the objectives, side by side: a heading, then per context
    ``8K: 32 → 16 requests (fewer)``; one line when only one run has objectives, or when
    they differ."""
    a, b = old.run.settings.get("slo"), new.run.settings.get("slo")
    if not a and not b:
        return ()
    if not a or not b or not old.run.capacity or not new.run.capacity:
        which = "this run" if b else "the earlier run"
        return (f"capacity at objectives: only {which} had them ({a or b})",)
    if a != b:
        return (f"capacity at other objectives: {a} (old), {b} (new): not compared",)
    out = [f"capacity at {a}:"]
    contexts = list(old.run.capacity) + [k for k in new.run.capacity if k not in old.run.capacity]
    for ctx in contexts:
        ca = old.run.capacity.get(ctx, {}).get("requests")
        cb = new.run.capacity.get(ctx, {}).get("requests")
        ra, rb = ca or 0, cb or 0
        word = " (fewer)" if rb < ra else " (more)" if rb > ra else ""
        if ctx not in old.run.capacity or ctx not in new.run.capacity:
            word = " (measured in one run)"
        out.append(f"{ctx}: {ra} → {rb} requests{word}")
    return tuple(out)


def fmt_change(change: float | None) -> str:
    return "—" if change is None else f"{change:+.1%}".replace("-", "−")


def summary_line(cmp: Comparison) -> str:
    """``32 cell(s): 1 regressed, 0 unknown, 0 improved, 26 same, 5 over capacity in both``:
    the judge's four verdicts always, the other places when some cell is there."""
    counts = ", ".join(v.counted(cmp.count(v)) for v in Verdict if v.judged or cmp.count(v))
    return f"{len(cmp.cells)} cell(s): {counts}"


def lines(cmp: Comparison, old_path: str) -> list[str]:
    """The comparison in the terminal: what differs, the counts, each regression and
    improvement."""
    out = ["", f"Compared with {old_path} ({cmp.old_label})"]
    out += [f"  warning: {w}" for w in cmp.warnings]
    out += [f"  {d}" for d in cmp.differences]
    out.append("  " + summary_line(cmp))
    if cmp.capacity:
        out.append("  " + cmp.capacity[0])
        out += [f"    {line}" for line in cmp.capacity[1:]]
    words = {
        Verdict.REGRESSION: "REGRESSION ",
        Verdict.IMPROVEMENT: "improvement",
        Verdict.UNKNOWN: "unknown    ",
    }
    for c in cmp.cells:
        check = c.check
        if c.verdict in words and check is not None:
            out.append(
                f"  {words[c.verdict]} {c.cid} {check.metric} {check.reference:,.1f} → "
                f"{check.value:,.1f}: {fmt_change(check.value / check.reference - 1)} "
                f"({c.interval()})"
                + (f": {c.decide_words()}" if c.verdict is Verdict.UNKNOWN else "")
            )
            if c.explanation and c.verdict is not Verdict.UNKNOWN:
                out.append(f"      why: {c.explanation}")
            elif c.explanation:
                out.append(f"  finding     {c.explanation}")
        elif c.explanation:
            out.append(f"  finding     {c.explanation}")
    if cmp.unexplained and any(
        c.verdict in (Verdict.REGRESSION, Verdict.IMPROVEMENT) for c in cmp.cells
    ):
        out.append(f"  note: {cmp.unexplained}")
    return out


def change_matrix(cmp: Comparison) -> tuple[list[str], list[tuple[str, list[CellChange | None]]]]:
    """Rows (prefill first, then each decode context) × columns (prefill, concurrencies)."""
    decode = [c for c in cmp.cells if c.concurrency is not None]
    prefill = {c.context: c for c in cmp.cells if c.concurrency is None}
    columns = sorted({c.concurrency for c in decode if c.concurrency is not None})
    by = {(c.context, c.concurrency): c for c in decode}
    contexts: list[str] = []
    for c in cmp.cells:
        if c.context not in contexts:
            contexts.append(c.context)
    rows = [(ctx, [prefill.get(ctx), *[by.get((ctx, n)) for n in columns]]) for ctx in contexts]
    return ["prefill", *[str(n) for n in columns]], rows


def markdown(cmp: Comparison, old_path: str, new_path: str) -> str:
    """The comparison as Markdown (a job summary, a pull-request comment)."""
    header, rows = change_matrix(cmp)

    def show(c: CellChange | None) -> str:
        if c is None:
            return ""
        if c.change is None:
            return c.verdict.short
        mark = {Verdict.REGRESSION: " ❌", Verdict.IMPROVEMENT: " ✅", Verdict.UNKNOWN: " ❔"}.get(
            c.verdict, ""
        )
        return fmt_change(c.change) + mark

    table = tabulate(
        [[ctx, *[show(c) for c in cells]] for ctx, cells in rows],
        headers=["Context", *header],
        tablefmt="github",
        disable_numparse=True,
    )
    parts = [f"## LLM speed: {new_path} compared with {old_path}", ""]
    parts += [f"> warning: {w}" for w in cmp.warnings]
    parts += [f"- {d}" for d in cmp.differences]
    parts += ["", f"**{summary_line(cmp)}**", "", table, ""]
    if cmp.capacity:
        parts += [f"**{cmp.capacity[0].capitalize()}**", ""]
        parts += [f"- {line}" for line in cmp.capacity[1:]]
        parts.append("")
    regressions = [c for c in cmp.cells if c.verdict is Verdict.REGRESSION]
    if regressions:
        parts += ["**Regressions**", ""]
        parts += [
            f"- `{c.cid}` {c.metric} {c.old:,.1f} → {c.new:,.1f}: {fmt_change(c.change)}"
            + (f" — why: {c.explanation}" if c.explanation else "")
            for c in regressions
        ]
    unknown = [c for c in cmp.cells if c.verdict is Verdict.UNKNOWN and c.check is not None]
    if unknown:
        parts += ["", "**Unknown: too noisy to tell**", ""]
        parts += [
            f"- `{c.cid}` {c.metric} {fmt_change(c.change)} ({c.interval()}): {c.decide_words()}"
            for c in unknown
        ]
    findings = [c for c in cmp.cells if c.explanation and c.verdict is not Verdict.REGRESSION]
    if findings:
        parts += ["", "**Why cells changed, and findings**", ""]
        parts += [f"- {c.explanation}" for c in findings]
    if cmp.unexplained and regressions:
        parts += ["", f"_{cmp.unexplained}_"]
    return "\n".join(parts) + "\n"


__all__ = [
    "CellChange",
    "Comparison",
    "Verdict",
    "attempts_of",
    "compare",
    "judged",
    "lines",
    "markdown",
    "order_contexts",
]
