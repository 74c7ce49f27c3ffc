"""The stored gate's undecided cells measured again after every cell had its first
measurement, unknown ones first, within ``--llm-budget`` (docs/gate.md, "Within a budget: the
undecided cells last, unknown first"); their tests' held outcomes reported once, with the final
verdicts.

In the first pass each test runs as pytest's own protocol runs it, but a test whose cell its
first measurement did not decide (:meth:`GateSession.hold`) keeps its reports. After the last
test those cells are measured again through the gate's one confirmation loop, and each held
test's reports are logged with its cell's final figures: JUnit, the terminal and the results
file see one outcome per test, the final one.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from ..results import CellRecord
    from .gating import PendingCell, PendingTest
    from .session import LLMSpeedRun

#: a held cell's note when the run stopped before its turn came
STOPPED_NOTE = "not measured again: the run stopped first"


def run_protocol(item: pytest.Item, nextitem: pytest.Item | None, run: LLMSpeedRun) -> None:
    """One test of the first pass, as pytest's own protocol runs it; the reports of a test
    whose cells wait are held (:attr:`PendingTest.reports`), the others logged now."""
    from _pytest.runner import runtestprotocol

    ihook = item.ihook
    ihook.pytest_runtest_logstart(nodeid=item.nodeid, location=item.location)
    reports = runtestprotocol(item, nextitem=nextitem, log=False)
    test = run.gate.pending.get(item.nodeid)
    if test is not None:
        test.item, test.reports = item, list(reports)
    else:
        for report in reports:
            ihook.pytest_runtest_logreport(report=report)
    ihook.pytest_runtest_logfinish(nodeid=item.nodeid, location=item.location)


def remeasure(session: pytest.Session, run: LLMSpeedRun) -> None:
    """Measure the waiting cells again (unknown first, within the budget), then report every
    held test once with its cells' final verdicts."""
    gate = run.gate
    order = gate.pending_in_order()
    if not order:
        return
    say = _writer(session.config, run)
    unknown = sum(1 for _, c in order if c.unknown)
    say(
        f"llmspeed: {len(order)} cell(s) the first measurement did not decide, measured again "
        f"now: {unknown} unknown first, then {len(order) - unknown} miss(es) to confirm, "
        f"within --llm-budget ({run.settings.budget:g} s)"
    )
    fresh = run.server.restartable
    progress, run.progress = run.progress, None  # no cell's progress lines: these say it
    try:
        for _, cell in order:
            if session.shouldstop:
                cell.final = run.store.record(_noted(cell.provisional, STOPPED_NOTE))
                continue
            cid = cell.first.id
            if gate.budget_left():
                left = max((run.settings.budget or 0) - gate.remeasuring_s, 0.0)
                why = "unknown" if cell.unknown else "a miss to confirm"
                say(f"llmspeed: {cid} measured again ({why}) · {left:.0f} s of the budget left")
            record, again = gate.confirmed(cell.first, _caught(cell), fresh)
            if again:
                record = _noted(record, run.server.remeasured_words(again))
                outcome = record.gate.outcome.value if record.gate else "not gated"
                say(f"llmspeed: {cid}: {outcome} after {again + 1} measurements")
            dropped = gate.capacity_miss(record)
            if dropped:
                record = _noted(record, dropped)
                cell.failures.append(dropped)
            cell.final = run.store.record(record)
    finally:
        run.progress = progress
        for test in gate.pending.values():
            _report(run, test)
        gate.pending.clear()


def _caught(cell: PendingCell) -> Callable[[], CellRecord | None]:
    """The cell's re-measurement, outside any test: a failure of pytest's (a re-measurement
    that was not valid, a restart that failed) is kept for the test's report and ends the
    cell's re-measurements (judged on what was measured)."""

    def again() -> CellRecord | None:
        try:
            return cell.measure()
        except (pytest.fail.Exception, pytest.skip.Exception) as exc:
            cell.failures.append(str(exc.msg if hasattr(exc, "msg") else exc))
            return None

    return again


def _noted(record: CellRecord, note: str) -> CellRecord:
    return dataclasses.replace(record, notes=(*record.notes, note))


def _report(run: LLMSpeedRun, test: PendingTest) -> None:
    """A held test's reports logged, with its cells' final figures and, when one regressed
    (or its re-measurement failed), its call failed with the words."""
    item = test.item
    if item is None or not test.reports:
        return  # its protocol never ended (interrupted): nothing to report
    finals = [c.final or c.provisional for c in test.cells]
    failures = [r.gate.message for r in finals if r.gate is not None and r.gate.regressions]
    failures += [f for c in test.cells for f in c.failures]
    old = {name for c in test.cells for name, _ in c.provisional.properties()}
    props = [p for r in finals for p in r.properties()]
    ihook = item.ihook
    progress, run.progress = run.progress, None
    try:
        ihook.pytest_runtest_logstart(nodeid=item.nodeid, location=item.location)
        for report in test.reports:
            report.user_properties = [p for p in report.user_properties if p[0] not in old] + props
            if report.when == "call" and report.passed and failures:
                report.outcome = "failed"
                report.longrepr = run.redact("\n".join(failures))
            ihook.pytest_runtest_logreport(report=report)
        ihook.pytest_runtest_logfinish(nodeid=item.nodeid, location=item.location)
    finally:
        run.progress = progress


def _writer(config: pytest.Config, run: LLMSpeedRun) -> Callable[[str], None]:
    reporter = config.pluginmanager.get_plugin("terminalreporter")

    def say(line: str) -> None:
        if reporter is not None:
            reporter.ensure_newline()
            reporter.write_line(run.redact(line))

    return say
