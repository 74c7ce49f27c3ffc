"""The A/B runner (issue 31): old and new versions started alternately, one round (the
selected cells) per start, in ABBA order; each cell judged from its paired changes once its
second block ends, and measured again only while it is unknown and more blocks could decide
it (``--llm-ab-rounds``, ``--llm-budget``). The bookkeeping and arithmetic are
:mod:`..gate.ab`'s; this module switches the servers, feeds the ledger and turns a verdict
into the cell's test outcome.

The test of a cell runs once per round it is measured in, its reports held (:meth:`ABRun.hold`).
When a block ends that decides the cell (or the rounds end), the test is reported once, with
its verdict: failed when the cell regressed (and, under ``--llm-unknown=fail``, when it stays
unknown, or when a round's measurement was not valid), with the change, its interval and,
from both versions' server figures, why; passed otherwise; the verdict and every round's
figures in its JUnit properties. pytest counts one test per cell.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import math
import secrets
import time
from typing import TYPE_CHECKING, Any, Literal

import pytest

if TYPE_CHECKING:
    from ..gate.ab import CellVerdict
    from ..gate.judge import Judgement
    from ..results import CellRecord
    from .session import LLMSpeedRun
    from .settings import Settings

#: the JUnit property that holds a cell's A/B verdict, in the round that decided it
VERDICT_PROPERTY = "ab_verdict"


def old_settings(settings: Settings) -> Settings:
    """The settings of the old version's arm: its command (and endpoint) in place of the new
    one's."""
    if settings.serve_baseline is not None:
        plan = settings.serve_baseline_plan
        return dataclasses.replace(
            settings, serve=settings.serve_baseline, serve_plan=plan, endpoint=plan.url
        )
    assert settings.endpoint_baseline is not None
    return dataclasses.replace(settings, endpoint=settings.endpoint_baseline)


class ABRun:
    """The A/B of one session: the arms, the ledger of rounds, the cells' latest records."""

    def __init__(self, run: LLMSpeedRun):
        from ..gate.ab import Ledger

        s = run.settings
        self.run = run
        self.arms: dict[str, Settings] = {"old": old_settings(s), "new": s}
        seed = s.ab_seed if s.ab_seed is not None else secrets.randbelow(1 << 31)
        self.ledger = Ledger(s.tolerance, seed=seed)
        self.max_rounds = s.ab_rounds - s.ab_rounds % 4
        #: each arm's latest record of each cell (the page and matrix show the new one's)
        self.latest: dict[str, dict[str, CellRecord]] = {"old": {}, "new": {}}
        #: each arm's records of each cell, a round each (the explanation reads the median)
        self.history: dict[str, dict[str, list[CellRecord]]] = {"old": {}, "new": {}}
        #: each arm's server line (engine, version, model) from its first start
        self.server_lines: dict[str, str] = {}
        self.verdicts: dict[str, CellVerdict] = {}  # as each cell was decided
        #: when the rounds past the first two blocks began (what --llm-budget bounds)
        self.extra_from: float | None = None
        self.stopped: str | None = None  # why the rounds ended before their most
        #: --llm-ab-prior's files, each with why it was refused (None: taken), once the first
        #: start has said what machine and model this A/B runs on
        self.prior_files: list[tuple[str, str | None]] = []
        self._items: dict[str, pytest.Item] = {}
        #: a cell's test → its reports of each round it ran in, held until its verdict
        #: (:meth:`hold`): one report per test, the rounds its properties
        self.held: dict[str, list[tuple[str, list[pytest.TestReport]]]] = {}

    def header(self) -> list[str]:
        """What the A/B compares and how, under the server line (the first round's version's:
        the session's first start is its)."""
        s = self.run.settings
        out = []
        for arm, a in self.arms.items():
            what = f"command {a.serve}" if a.serve else f"endpoint {a.endpoint}"
            out.append(f"llmspeed A/B {arm}: {what}")
        budget = f" · budget {s.budget:g} s past the first two blocks" if s.budget else ""
        restarts = "each on a fresh start" if s.ab_kind == "serve" else "no restarts"
        out.append(
            f"llmspeed A/B: 8–{self.max_rounds} rounds in blocks of old, new, new, old or "
            f"new, old, old, new, each drawn at random (--llm-ab-seed={self.ledger.seed}) "
            f"({restarts}) · tolerance ±{s.tolerance:.1%}{budget} · unknown: {s.unknown}"
        )
        return out

    # -- rounds -----------------------------------------------------------------------------

    @property
    def index(self) -> int:
        """The round under way (from 0)."""
        return len(self.ledger.rounds) - 1

    def begin_round(self, index: int) -> None:
        """Round ``index``: start its arm's server (a fresh start; the first round's server is
        the session's first start), open its ledger round."""
        from ..gate.ab import BLOCK, MIN_BLOCKS, Round

        arm = self.ledger.arm(index)
        run = self.run
        if index > 0:
            run.server.switch(self.arms[arm])
            run.store.cells.clear()
        self.server_lines.setdefault(arm, run.server.header()[0].removeprefix("llmspeed "))
        if index == 0 and run.settings.ab_prior:
            self.take_prior()
        if index == MIN_BLOCKS * len(BLOCK) and self.extra_from is None:
            self.extra_from = time.monotonic()
        started = _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")
        self.ledger.rounds.append(Round(index, arm, started_at=started))
        self._round_started = time.monotonic()
        if run.progress is not None:  # the cells this round measures, counted from 1
            plan = [p for p in run.plan if self.ledger.wanted(str(p[0]))]
            run.progress.next_run(self.label(index), plan)
            run.progress.total = len(plan)

    def take_prior(self) -> None:
        """The earlier A/Bs that apply to this one (measured on this machine, with this model)
        become the ledger's prior; the others are kept with why not."""
        from ..gate.prior import pooled, refusal

        run = self.run
        model = run.server.info.model if run.server.info is not None else None
        taken = []
        self.prior_files = []
        for prior in run.settings.ab_prior:
            why = refusal(prior, run.server.machine, model)
            self.prior_files.append((prior.path, why))
            if why is None:
                taken.append(prior)
        self.ledger.prior = pooled(taken)

    def label(self, index: int) -> str:
        """``round 3/16 new · ``; under a budget that decides the rounds, no total (400 is a
        bound, not a plan): ``round 3 new · ``."""
        from .settings import BUDGET_ROUNDS

        of = "" if self.max_rounds == BUDGET_ROUNDS else f"/{self.max_rounds}"
        return f"round {index + 1}{of} {self.ledger.arm(index)} · "

    def end_round(self) -> None:
        """The round's cells that have no figures (failed, error, skipped) into the ledger,
        the arm's latest records kept; after a block, the cells it decides."""
        from ..gate.ab import BLOCK

        r = self.ledger.rounds[-1]
        r.duration_s = time.monotonic() - self._round_started
        for cell, record in self.run.store.cells.items():
            # a selected cell's record only (not a warm-up's whose test was deselected)
            if cell not in r.cells and cell not in self.verdicts and cell in self.items:
                r.missing[cell] = record.reason or record.status.value
            self.latest[r.arm][cell] = record
            if record.status.measured:
                self.history[r.arm].setdefault(cell, []).append(record)
        if (r.index + 1) % len(BLOCK) == 0:
            for cell in self.ledger.end_block(self.max_rounds // len(BLOCK), self.room()):
                self.decide(cell, self.ledger.decided[cell])
        self.write()

    def more_rounds(self, index: int) -> bool:
        """Is round ``index`` worth running: within the most rounds, and, at a block's
        start, some cell undecided that the budget leaves room for."""
        from ..gate.ab import BLOCK, MIN_BLOCKS
        from .settings import BUDGET_ROUNDS

        if index >= self.max_rounds:
            return False
        if index % len(BLOCK):
            return True  # a block is finished once begun
        if index < MIN_BLOCKS * len(BLOCK) and (index == 0 or self.wanted_cells()):
            return True  # the second block runs for the cells the first did not show same
        if not self.wanted_cells():
            if any(v.verdict.value == "unknown" for v in self.verdicts.values()):
                cap = (
                    "the budget allows"
                    if self.run.settings.budget is not None and self.max_rounds == BUDGET_ROUNDS
                    else f"{self.max_rounds} rounds (--llm-ab-rounds) or the budget allow"
                )
                self.stopped = (
                    f"after {index} rounds: the unknown cells need more blocks than {cap}, "
                    "or none would decide them"
                )
            return False
        if self.room() <= 0:
            self.stopped = f"--llm-budget ({self.run.settings.budget:g} s) spent"
            return False
        return True

    def wanted_cells(self) -> list[str]:
        return [c for c in self.ledger.cells() if self.ledger.wanted(c)]

    def room(self) -> int:
        """The blocks the budget still leaves room for (very many without one); the budget
        counts from the first round past the first two blocks, which always run."""
        from ..gate.ab import BLOCK, MIN_BLOCKS

        budget = self.run.settings.budget
        if budget is None or len(self.ledger.rounds) < len(BLOCK):
            return 1 << 30
        rounds = self.ledger.rounds[-len(BLOCK) :]
        per_block = sum(r.duration_s for r in rounds)
        wanted = len(self.wanted_cells())
        measured = max(1, len({c for r in rounds for c in (*r.cells, *r.missing)}))
        estimate = per_block * wanted / measured
        # none of it spent before the rounds past the first two blocks begin
        spent = 0.0 if self.extra_from is None else time.monotonic() - self.extra_from
        left = budget - spent
        free = max(MIN_BLOCKS - len(self.ledger.rounds) // len(BLOCK), 0)  # the first two
        return math.floor(left / estimate) + free if estimate > 0 else 1 << 30

    def runs_item(self, item: pytest.Item, index: int) -> bool:
        """Is ``item`` run in round ``index``: its cell not decided yet (a test that names no
        cell runs in the first round only)."""
        cid = self.run.selection.node_cells.get(item.nodeid)
        if cid is None:
            return index == 0
        if item.nodeid in self.run.selection.open:
            return True
        return self.ledger.wanted(str(cid))

    # -- cells ------------------------------------------------------------------------------

    def finish(self, request: pytest.FixtureRequest, record: CellRecord) -> CellRecord:
        """A cell measured validly in this round: into the ledger, recorded, its figures on
        its test (which passes: the verdict comes when its block ends, as a report of its
        own)."""
        from ..gate.ab import FIGURES, kind_of
        from ..results import relative_se

        cell = str(record.id)
        r = self.ledger.rounds[-1]
        r.cells[cell] = {
            name: float(getattr(record, name))
            for name, _ in FIGURES.get(kind_of(cell), ())
            if isinstance(getattr(record, name, None), int | float)
        }
        r.missing.pop(cell, None)
        r.se[cell] = {}
        for name in r.cells[cell]:
            ci = getattr(record, f"{name}_ci", None)
            if ci is not None:  # the window's or the cold requests' own noise
                r.se[cell][name] = relative_se(r.cells[cell][name], ci)
        record = self.run.store.record(record)
        node = request.node
        node.user_properties.extend(record.properties())
        node.user_properties.append(("ab_round", f"{r.index + 1} {r.arm}"))
        return record

    def decide(self, cell: str, got: CellVerdict) -> None:
        """A cell's verdict is in: kept, written, and reported as its test's outcome."""
        got = self._explained(got)
        self.ledger.decided[cell] = got
        self.verdicts[cell] = got
        self.write()
        item = self.items.get(cell)
        if item is not None:
            self._report(item, got)

    def conclude(self) -> None:
        """The rounds are over: every cell not decided yet gets its verdict as it stands."""
        for cell in self.ledger.cells():
            if cell not in self.verdicts:
                self.decide(cell, self.ledger.judge(cell))

    @property
    def items(self) -> dict[str, pytest.Item]:
        """The cell each built-in test measures → its test (the last one, for a cell named
        twice)."""
        return self._items

    def holds(self, item: pytest.Item) -> bool:
        """Are ``item``'s reports held until its cell's verdict (a test of one cell)?"""
        cid = self.run.selection.node_cells.get(item.nodeid)
        return cid is not None and self._items.get(str(cid)) is item

    def hold(self, item: pytest.Item, reports: list[pytest.TestReport]) -> None:
        """One round's reports of ``item``, kept (the round's label with them)."""
        index = max(len(self.ledger.rounds) - 1, 0)
        label = f"round {index + 1} {self.ledger.arm(index)}"
        self.held.setdefault(item.nodeid, []).append((label, list(reports)))

    def set_items(self, items: list[pytest.Item]) -> None:
        cells = self.run.selection.node_cells
        self._items = {str(cells[i.nodeid]): i for i in items if i.nodeid in cells}

    def _report(self, item: pytest.Item, got: CellVerdict) -> None:
        """The verdict as a test outcome of ``item`` (setup, call and teardown reports, as
        pytest-xdist's controller replays its workers'): the terminal counts it, JUnit holds
        it as a test case with its properties, and a regression (or an unknown under
        --llm-unknown=fail) fails it and so the run."""
        from ..gate.judge import Verdict

        run = self.run
        fails = got.verdict is Verdict.REGRESSED or (
            got.verdict is Verdict.UNKNOWN and run.settings.unknown == "fail"
        )
        words = run.redact(f"{got.cell} A/B {got.words()}")
        if got.explanation:
            words += "\n  why: " + run.redact(got.explanation)
        props: list[tuple[str, object]] = [
            (VERDICT_PROPERTY, got.verdict.value),
            ("ab_change", words.splitlines()[0]),
            ("ab_starts", got.starts),
        ]
        rounds = self.held.pop(item.nodeid, [])
        # each round's figures as properties of the one test case: round 3 (new) total_tok_s
        for label, reports in rounds:
            call = next((r for r in reports if r.when == "call"), None)
            kept = call.user_properties if call is not None else []
            props += [(f"{label} {name}", value) for name, value in kept if name != "ab_round"]
        # a round whose test failed (its measurement not valid) failed it; its words kept
        failures = [
            f"{label}: {r.longreprtext}"
            for label, reports in rounds
            for r in reports
            if r.failed and r.longreprtext
        ]
        last = rounds[-1][1] if rounds else []
        if not any(r.when == "call" for r in last):  # skipped, or never ran: made whole
            last = []
        keywords: dict[str, Literal[1]] = dict.fromkeys(item.keywords, 1)
        progress, run.progress = run.progress, None  # no progress line for a verdict
        try:
            item.ihook.pytest_runtest_logstart(nodeid=item.nodeid, location=item.location)
            if last and not fails:
                for report in last:
                    report.user_properties = props
                    if report.when == "call" and failures and report.passed:
                        report.outcome = "failed"
                        report.longrepr = run.redact("\n".join(failures))
                    item.ihook.pytest_runtest_logreport(report=report)
            else:
                failed_words = "\n".join([words, *failures]) if fails else "\n".join(failures)
                for when in ("setup", "call", "teardown"):
                    failed = bool(fails or failures) and when == "call"
                    report = pytest.TestReport(
                        item.nodeid,
                        item.location,
                        keywords,
                        "failed" if failed else "passed",
                        run.redact(failed_words) if failed else None,
                        when,  # type: ignore[arg-type]
                        user_properties=props,
                    )
                    item.ihook.pytest_runtest_logreport(report=report)
            item.ihook.pytest_runtest_logfinish(nodeid=item.nodeid, location=item.location)
        finally:
            run.progress = progress

    def _explained(self, got: CellVerdict) -> CellVerdict:
        """The verdict with why, from both versions' latest server figures (the decomposition
        of docs/metrics.md), when both have them."""
        from ..gate.judge import Verdict

        if got.verdict not in (Verdict.REGRESSED, Verdict.IMPROVED):
            return got
        line = explain(
            self._median(got.cell, "old"),
            self._median(got.cell, "new"),
            got.figures.get("total_tok_s"),
        )
        return dataclasses.replace(got, explanation=line) if line else got

    def _median(self, cell: str, arm: str) -> CellRecord | None:
        """The arm's record of ``cell`` whose headline figure is its rounds' median (one
        round's server figures, the most typical one: the explanation reads them)."""
        from ..figures import headline

        records = [r for r in self.history[arm].get(cell, []) if r.server is not None]
        if not records:
            return None
        key = headline(records[0].phase).key
        records.sort(key=lambda r: getattr(r, key) or 0.0)
        return records[(len(records) - 1) // 2]

    # -- the end ----------------------------------------------------------------------------

    def final(self) -> dict[str, CellVerdict]:
        """Every cell's verdict: as decided, else judged now (a run that stopped early)."""
        out = self.ledger.finish()
        out.update(self.verdicts)
        return out

    def to_dict(self) -> dict[str, Any]:
        s = self.run.settings
        doc = self.ledger.to_dict(self.final())
        doc.update(
            kind=s.ab_kind,
            arms={
                arm: {
                    "server": self.server_lines.get(arm),
                    "command": self.run.redact(a.serve) if a.serve else None,
                    "endpoint": a.endpoint if a.serve is None else None,
                }
                for arm, a in self.arms.items()
            },
            most_rounds=self.max_rounds,
            budget_s=s.budget,
            stopped=self.stopped,
        )
        if self.prior_files:
            doc["prior"] = {
                **(doc.get("prior") or {}),
                "files": [{"path": path, "refused": why} for path, why in self.prior_files],
            }
        return doc

    def write(self) -> None:
        self.run.store.ab = self.to_dict()
        self.run.store.write()

    def at_end(self) -> None:
        """The session's cells become the new version's latest records (the matrix, the page
        and the figures show the new one); the ledger written; a test whose cell got no
        verdict (the A/B stopped first) reported as its last round left it."""
        from ..gate.verdict import mean_figures

        cells = dict(self.latest["new"])
        for cell, records in self.history["new"].items():
            if cell in cells and len(records) > 1:  # what the A/B's table shows as "new"
                means = mean_figures(records, geometric=True)
                cells[cell] = dataclasses.replace(cells[cell], **means)  # type: ignore[arg-type]
        self.run.store.cells = cells
        self.write()
        for nodeid, rounds in list(self.held.items()):
            item = next((i for i in self._items.values() if i.nodeid == nodeid), None)
            if item is None or not rounds:
                continue
            ihook = item.ihook
            ihook.pytest_runtest_logstart(nodeid=item.nodeid, location=item.location)
            for report in rounds[-1][1]:
                ihook.pytest_runtest_logreport(report=report)
            ihook.pytest_runtest_logfinish(nodeid=item.nodeid, location=item.location)
        self.held.clear()


def explain(old: CellRecord | None, new: CellRecord | None, judged: Judgement | None = None) -> str:
    """Why a cell changed from ``old`` to ``new``, in one line, from their server figures (as
    ``compare`` explains it); "" when either has none. ``judged``: the A/B's judgement of the
    decode cell's total tok/s, whose change heads the line (the verdict's number, not the
    two records' ratio)."""
    from ..report.compare import decomposition

    found = None if old is None or new is None else decomposition(old, new)
    if found is None:
        return ""
    if judged is not None and found.kind == "decode":
        found = dataclasses.replace(found, change=judged.change.relative)
    return found.line()


__all__ = ["VERDICT_PROPERTY", "ABRun", "explain", "old_settings"]
