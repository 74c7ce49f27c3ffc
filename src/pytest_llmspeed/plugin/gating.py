"""The gate over one session: the baseline it is held to (its settings checked against the
run's when the server starts), the prefill warm-ups gated at the session's end, the account of
every baseline cell, whether the session fails for them, and the baseline it saves."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from ..core.errors import LLMSpeedError

T = TypeVar("T")

if TYPE_CHECKING:
    from ..gate.baseline import Baseline
    from ..gate.verdict import Accounting
    from ..results import CellRecord
    from .selection import Selection
    from .server import ServerUnderTest
    from .settings import Settings
    from .store import CellStore


@dataclasses.dataclass
class PendingCell:
    """A cell its first measurement did not decide, waiting to be measured again after every
    cell had its first measurement (--llm-budget: docs/gate.md, "Within a budget")."""

    first: CellRecord  # as measured once
    provisional: CellRecord  # the first measurement judged alone: what stands if none follows
    measure: Callable[[], CellRecord]  # a fresh start, then the cell measured again
    unknown: bool  # some figure too noisy to tell (measured again before the misses)
    final: CellRecord | None = None
    #: why its test fails beside a regression (a re-measurement not valid, capacity dropped)
    failures: list[str] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class PendingTest:
    """A test whose outcome waits for its cells' re-measurement: its reports, held."""

    nodeid: str
    cells: list[PendingCell]
    item: Any = None  # the pytest.Item, once its protocol ran
    reports: list[Any] = dataclasses.field(default_factory=list)


class GateSession:
    """The baseline and what the session's end decides with it."""

    def __init__(
        self,
        settings: Settings,
        server: ServerUnderTest,
        store: CellStore,
        selection: Selection,
    ):
        self.settings = settings
        self._server, self._store, self._selection = server, store, selection
        self.baseline: Baseline | None = None
        #: seconds spent re-measuring (confirmations), against --llm-budget
        self.remeasuring_s = 0.0
        #: the prefill cells gated at the session's end, their figures the decode warm-ups'
        self._warmups: set[str] = set()
        #: the first pass of a run whose undecided cells wait (``defers``): set by its loop
        self.deferring = False
        #: the tests whose cells wait to be measured again, by node id, in the order run
        self.pending: dict[str, PendingTest] = {}
        if settings.baseline:
            from ..gate.baseline import load

            self.baseline = load(settings.baseline)  # BaselineError: bad file
            if settings.tolerance_given:  # over the file's default; a cell's own stays
                self.baseline.tolerance = settings.tolerance
                for cell in self.baseline.cells.values():
                    if cell.own_tolerance is None:
                        cell.tolerance = settings.tolerance

    def comparable(self) -> dict[str, Any]:
        """The run settings a baseline must share to be compared with this run."""
        info = self._server.info
        return {
            "model": info.model if info else self.settings.model,
            "api": self.settings.api,
            "prompt_form": self._server.prompt_form,
            "max_output": self.settings.max_output,
            "duration_s": self.settings.duration,
            "prefill_repeats": self.settings.prefill_repeats,
            # several replicas multiply throughput: a baseline of one is not a floor for two
            "replicas": info.replica_count if info else None,
            # tool calls and the user's text change what is measured (None: the default text)
            "tools": self.settings.tools,
            "prompt_text": (
                self.settings.prompt_text.source if self.settings.prompt_text is not None else None
            ),
        }

    def check_settings(self) -> str | None:
        """Once the server is probed: a warning when the baseline was taken with other
        settings (LLMSpeedError with --llm-baseline-strict), else None."""
        from ..gate.baseline import mismatches

        if self.baseline is None:
            return None
        diff = mismatches(self.baseline, self.comparable())
        if not diff:
            return None
        what = f"baseline {self.baseline.path} was taken with other settings: " + "; ".join(diff)
        if self.settings.baseline_strict:
            raise LLMSpeedError(what + " (--llm-baseline-strict)")
        return "warning: " + what

    def slo_note(self) -> str | None:
        """Once: why the baseline's capacities are not gated (it has none for these
        objectives), or None when they are or there is nothing to say."""
        from ..gate.slo import same

        b, bounds = self.baseline, self.settings.slo
        if b is None or b.objectives is None:
            return None
        if not bounds:
            return (
                f"baseline {b.path} records each context's capacity at {b.objectives}: give "
                f"--llm-slo='{b.objectives}' to gate it"
            )
        if not same(b.objectives, bounds):
            from ..gate.slo import text

            return (
                f"baseline {b.path} records capacity at other objectives ({b.objectives}, "
                f"this run {text(bounds)}): capacity not gated"
            )
        return None

    def capacity_held(self) -> dict[str, int] | None:
        """The baseline's capacity per context, when it was taken at this run's objectives."""
        from ..gate.slo import same

        b, bounds = self.baseline, self.settings.slo
        if b is None or b.objectives is None or not bounds or not same(b.objectives, bounds):
            return None
        return dict(b.capacity)

    def capacity_miss(self, record: CellRecord) -> str | None:
        """A decode cell that shows its context's capacity dropped below the baseline's."""
        from ..gate.slo import capacity_miss
        from ..results import Phase

        held = self.capacity_held()
        if held is None or record.id.phase is not Phase.DECODE or record.context not in held:
            return None
        return capacity_miss(held[record.context], record, self.settings.slo)

    def saved_run(self) -> dict[str, Any]:
        """The [run] settings a saved baseline records: the comparable ones, the server."""
        info = self._server.info
        return {
            **self.comparable(),
            "engine": info.engine if info else None,
            "engine_version": info.version if info else None,
            "server": self._server.public_endpoint,
            "kv_capacity": info.kv_capacity if info else None,
        }

    def check_save(self) -> None:
        """Once the server is probed, before any cell runs: can this run be saved to
        --llm-save-baseline (a new file, or runs of the same settings and server)? ValueError,
        one line naming the settings that differ, when it cannot."""
        from ..gate.baseline import BaselineError, check_addable

        if not self.settings.save_baseline:
            return
        try:
            check_addable(self.settings.save_baseline, self.saved_run())
        except BaselineError as exc:
            raise ValueError(f"--llm-save-baseline: {exc}") from None

    def defers(self) -> bool:
        """Do undecided cells wait until every cell was measured once (unknown ones first)?
        With a baseline and --llm-budget, in a run of one pass: without a budget every
        undecided cell is measured again anyway, and the order changes no verdict."""
        s = self.settings
        return self.baseline is not None and s.budget is not None and (s.runs or 1) == 1

    def hold(
        self, nodeid: str, record: CellRecord, measure: Callable[[], CellRecord], fresh: bool
    ) -> CellRecord | None:
        """In the first pass of a deferring run: the cell's record judged on its first
        measurement alone, kept to be measured again after every cell (its test's outcome
        held); None when the first measurement decides it (or the run does not defer)."""
        from ..gate.verdict import confirm, wants_another

        if not self.deferring or self.baseline is None:
            return None
        entry = self.baseline.cells.get(str(record.id))
        if not wants_another(entry, [record], self.settings.confirm, fresh):
            return None
        provisional, _ = confirm(entry, record, lambda: None, 0, fresh_starts=fresh)
        unknown = bool(provisional.gate and provisional.gate.unknowns)
        test = self.pending.setdefault(nodeid, PendingTest(nodeid, []))
        test.cells.append(PendingCell(record, provisional, measure, unknown))
        return provisional

    def pending_in_order(self) -> list[tuple[PendingTest, PendingCell]]:
        """The waiting cells as they are measured again: unknown first, then the misses not
        yet confirmed, each in the order their tests ran."""
        cells = [(t, c) for t in self.pending.values() for c in t.cells]
        return [tc for tc in cells if tc[1].unknown] + [tc for tc in cells if not tc[1].unknown]

    def budget_left(self) -> bool:
        """May another re-measurement start (--llm-budget not yet spent)?"""
        budget = self.settings.budget
        return budget is None or self.remeasuring_s < budget

    def timed(self, measure: Callable[[], T]) -> T:
        """Run one re-measurement (a restart included), counting its time against the
        budget."""
        started = time.monotonic()
        try:
            return measure()
        finally:
            self.remeasuring_s += time.monotonic() - started

    def confirmed(
        self,
        record: CellRecord,
        again: Callable[[], CellRecord | None],
        fresh_starts: bool,
    ) -> tuple[CellRecord, int]:
        """Gate ``record`` on its baseline entry through the one confirmation loop
        (gate/verdict.py's ``confirm``): re-measured with ``again`` (timed against the budget)
        while a figure is unknown or a miss is not yet confirmed, up to --llm-confirm times."""
        from ..gate.verdict import confirm

        assert self.baseline is not None
        return confirm(
            self.baseline.cells.get(str(record.id)),
            record,
            lambda: self.timed(again),
            self.settings.confirm,
            fresh_starts=fresh_starts,
            allowed=self.budget_left,
        )

    def warmup_cells(self) -> list[str]:
        """Cells gated at the session's end (no test of their own ran)."""
        return [cid for cid in self._store.cells if cid in self._warmups]

    def fails_session(self, interrupted: bool) -> bool:
        """At the session's end: gate the warm-ups (re-measuring a miss unless the session
        was interrupted); does the gate fail a session that passed? A regressed warm-up, a
        baseline cell not run when --llm-baseline-missing=fail, a cell too noisy to tell when
        --llm-unknown=fail."""
        if self.baseline is None or not self._server.started:
            return False
        self.gate_warmups(remeasure=not interrupted)
        acc = self.accounting()
        return acc is not None and (
            any(c in acc.regressed for c in self.warmup_cells())
            or (bool(acc.not_run) and self.settings.baseline_missing == "fail")
            or (acc.unknown_fails and bool(acc.unknown))
        )

    def gate_warmups(self, remeasure: bool) -> None:
        """Gate the prefill figures that decode warm-ups measured when no prefill test ran
        (``-m decode``): what a run measures is gated, whatever selected it. A warm-up that is
        not comparable with the baseline's prefill cell says why instead."""
        from ..gate.verdict import not_gated
        from ..report.terminal import WARMUP_NOTE
        from ..results import Phase

        if self.baseline is None:
            return
        store, server = self._store, self._server
        fresh = server.restartable  # each re-measurement on a fresh start
        for cid, record in list(store.cells.items()):
            entry = self.baseline.cells.get(cid)
            if record.id.phase is not Phase.PREFILL:  # a decode cell has its test's verdict
                continue
            if entry is None or not record.measured or record.gate is not None:
                continue
            base_repeats = self.baseline.run.get("prefill_repeats", 1)
            if base_repeats != self.settings.prefill_repeats:
                why = (
                    f"the baseline's prefill is the median of {base_repeats} cold "
                    f"request(s), this warm-up of {self.settings.prefill_repeats}"
                )
                store.record(not_gated(record, why))
                continue
            self._warmups.add(cid)
            notes = [WARMUP_NOTE]  # in words, for a person: warmup_cells() knows it

            def again(record: CellRecord = record, notes: list[str] = notes) -> CellRecord | None:
                return self._prefill_again(record, notes) if remeasure else None

            result, remeasured = self.confirmed(record, again, fresh)
            if remeasured:
                notes.append(server.remeasured_words(remeasured))
            store.record(dataclasses.replace(result, notes=(*result.notes, *notes)))

    def _prefill_again(self, record: CellRecord, notes: list[str]) -> CellRecord | None:
        """A warm-up's prefill measured again on a fresh start; None (and a note) when that
        failed: the cell is gated on what was measured."""
        from ..core.records import prefill_record

        server = self._server
        tokens, max_tokens = record.context_tokens, record.max_tokens
        if server.bench is None or tokens is None or max_tokens is None:
            return None
        try:
            server.fresh_start(record.id.context)
            assert server.bench is not None
            result = server.bench.prefill_again(tokens, max_tokens)
        except (LLMSpeedError, ValueError) as exc:  # gate on what was measured, say so
            notes.append(server.redact(f"re-measurement failed: {exc}"))
            return None
        return prefill_record(record.id.context, result)

    def accounting(self) -> Accounting | None:
        from ..gate.verdict import account

        if self.baseline is None:
            return None
        return account(
            self.baseline,
            self._store.cells.values(),
            self._selection.selected,
            unknown_fails=self.settings.unknown == "fail",
        )

    def save(self) -> list[str]:
        """--llm-save-baseline: write this run's cells as a baseline, or add them as one more
        run to the baseline there; what was done, in words (and each run that lies outside
        the others)."""
        if not self.settings.save_baseline or not self._store.cells:
            return []
        from ..gate.baseline import save

        slo = None
        if self.settings.slo:
            from ..gate.slo import text

            found = self._store.capacity()
            slo = (text(self.settings.slo), {k: v["requests"] or 0 for k, v in found.items()})
        saved = save(
            self.settings.save_baseline,
            self.saved_run(),
            list(self._store.cells.values()),
            tolerance=self.settings.tolerance,
            slo=slo,
        )
        return saved.lines()
