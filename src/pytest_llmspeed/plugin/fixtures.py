"""Fixtures for LLM speed tests: the server, the warmed prefix, the cell runner.

Example (a test of your own)::

    @pytest.mark.parametrize("llm_prefix", ["32K"], indirect=True)
    def test_chat_at_32k_c8(llm_prefix, llm_cell):
        record = llm_cell.decode(llm_prefix, 8)
        assert record.total_tok_s > 500
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, NoReturn, TypeVar

import pytest

from .stash import RUN_KEY

if TYPE_CHECKING:
    from ..core.bench import Bench
    from ..core.errors import LLMSpeedError
    from ..core.openloop import OpenLoopResult, Trace
    from ..core.probe import ServerInfo
    from ..core.protocol import DecodeResult, PrefillResult
    from ..results import CellId, CellRecord, Status
    from .session import LLMSpeedRun


T = TypeVar("T")


def _is_trace_error(exc: Exception) -> bool:
    from ..core.openloop import TraceError

    return isinstance(exc, TraceError)


def _active_run(request: pytest.FixtureRequest) -> LLMSpeedRun:
    run = request.config.stash.get(RUN_KEY, None)
    if run is None:
        pytest.skip("pytest-llmspeed: no --llm-endpoint given")
    if not run.server.started and run.server.fatal is None:
        problem = run.start_or_say_why()  # a test asked for the server at run time
        if problem:
            request.session.shouldstop = problem
    if run.server.fatal:
        pytest.fail(run.server.fatal, pytrace=False)
    return run


@dataclass(frozen=True)
class WarmPrefix:
    """A context whose shared prefix is cached on the server, with its prefill figures."""

    param: int | str  # the context as given: 8192 or "max"
    tokens: int  # resolved prompt length
    prefill: PrefillResult

    @property
    def label(self) -> str:
        from ..results import context_label

        return context_label(self.param)


@pytest.fixture(scope="session")
def llm_bench(request: pytest.FixtureRequest) -> Bench:
    """The connected benchmark (one event loop, one aiohttp session) for the whole run."""
    run = _active_run(request)
    assert run.server.bench is not None
    return run.server.bench


@pytest.fixture(scope="session")
def llm_server(llm_bench: Bench) -> ServerInfo:
    """What the server is: model, max_model_len, engine, version, KV capacity."""
    assert llm_bench.server is not None
    return llm_bench.server


def _skip(run: LLMSpeedRun, cid: CellId, status: Status, reason: str) -> NoReturn:
    """Record a cell that is not run, then skip its test with the reason."""
    from ..core.records import unmeasured_record

    run.store.record(unmeasured_record(cid, status, reason, run.server.resolve(cid.context)))
    pytest.skip(reason)


@pytest.fixture(scope="session")
def llm_prefix(request: pytest.FixtureRequest) -> WarmPrefix:
    """Warm the shared prefix of a context (its first, cold request is the prefill cell).

    Parametrized with the context (``8K``, ``8192`` or ``max``), indirectly.
    """
    from ..core.errors import CellCut, LLMSpeedError
    from ..core.matrix import normalize_context
    from ..core.status import cell_status
    from ..results import CellId, Status
    from .messages import cell_words

    run = _active_run(request)
    param = getattr(request, "param", None)
    if param is None:
        pytest.fail("llm_prefix needs a context: parametrize it (indirect=True)", pytrace=False)
    context = normalize_context(param)
    cid = CellId.prefill(context)
    skip = run.server.skip(cid)
    if skip:
        _skip(run, cid, skip.status, skip.reason)
    started = time.perf_counter()
    cut: str | None = None
    try:
        tokens, result = run.warm(context)
    except LLMSpeedError as exc:
        status = cell_status(exc)
        if status.status is Status.ERROR:
            _stop_if_fatal(request, run, exc)
    except CellCut as exc:
        cut = str(exc)
    except KeyboardInterrupt:
        _record_cut(run, None, cid, f"cut after {time.perf_counter() - started:.1f} s by Ctrl-C")
        raise
    else:
        return WarmPrefix(context, tokens, result)
    if cut is not None:  # failed outside the except block: no chained traceback
        _record_cut(run, None, cid, cut)
        pytest.fail(f"{cid}: {cut}", pytrace=False)
    from ..core.records import unmeasured_record

    # failed outside the except block: no chained traceback in the report
    reason = run.redact(cell_words(status))
    run.store.record(unmeasured_record(cid, status.status, reason, run.server.resolve(context)))
    pytest.fail(reason if status.status is Status.ERROR else f"{cid}: {reason}", pytrace=False)


def _record_cut(run: LLMSpeedRun, node: pytest.Item | None, cid: CellId, words: str) -> None:
    """A cell stopped from outside (pytest-timeout, Ctrl-C) before its end: an error, with what
    cut it and when, in the results (written at once), the summary and on its test."""
    from ..core.records import unmeasured_record
    from ..results import Status

    record = unmeasured_record(cid, Status.ERROR, words, run.server.resolve(cid.context))
    run.store.record(record)
    if node is not None:
        node.user_properties.extend(record.properties())


def _stop_if_fatal(request: pytest.FixtureRequest, run: LLMSpeedRun, exc: Exception) -> None:
    fatal = run.server.unusable_after(exc)
    if fatal:
        request.session.shouldstop = "pytest-llmspeed: " + fatal


class CellRunner:
    """Runs cells for one test, gates them on the baseline, and attaches their figures to the
    test (JUnit properties, pytest-benchmark entry)."""

    def __init__(self, request: pytest.FixtureRequest, run: LLMSpeedRun):
        self.request = request
        self.run = run

    def _attach(self, record: CellRecord) -> None:
        self.request.node.user_properties.extend(record.properties())

    def prefill(self, prefix: WarmPrefix) -> CellRecord:
        """The prefill cell's record (measured when the prefix was warmed), gated."""
        from ..core.records import prefill_record
        from ..results import CellId

        if self.run.progress is not None:  # the progress lines name the cell that runs
            self.run.progress.announce(CellId.prefill(prefix.param))
        record = self.run.store.cells[str(CellId.prefill(prefix.param))]

        def again() -> CellRecord:
            assert self.run.server.bench is not None
            result = self.run.server.bench.prefill_again(prefix.tokens, prefix.prefill.max_tokens)
            return prefill_record(prefix.param, result)

        return self._finish(record, again)

    def decode(self, prefix: WarmPrefix, concurrency: int) -> CellRecord:
        """Run the sustained-decode cell (prefix context, concurrency); fail on errors or on a
        confirmed miss of the baseline."""
        from ..results import CellId, Status

        cid = CellId.decode(prefix.param, concurrency)
        if self.run.progress is not None:  # the progress lines name the cell that runs
            self.run.progress.announce(cid)
        skip = self.run.server.skip(cid)
        if skip:
            _skip(self.run, cid, skip.status, skip.reason)
        record = self._measure(cid, prefix)
        if record.status is not Status.VALID:
            assert record.reason is not None
            self.run.store.record(record)
            self._attach(record)
            from ..core.errors import LLMSpeedError

            _stop_if_fatal(self.request, self.run, LLMSpeedError(record.reason))
            pytest.fail(f"{cid}: {record.reason}", pytrace=False)

        def again() -> CellRecord:
            rec = self._measure(cid, prefix)
            if rec.status is not Status.VALID:
                pytest.fail(f"{cid} (re-measured): {rec.reason}", pytrace=False)
            return rec

        return self._finish(record, again)

    def rate(self, prefix: WarmPrefix, rate: float) -> CellRecord:
        """Run the open-loop rate cell (prefix context, requests per second): requests sent at
        their scheduled times for --llm-duration (docs/workloads.md); fail on errors or on a
        confirmed miss of the baseline."""
        from ..results import CellId

        cid = CellId.at_rate(prefix.param, rate)
        s = self.run.settings

        def measure() -> OpenLoopResult:
            # the bench of now: a re-measurement's fresh start made a new one
            bench = self.run.server.bench
            assert bench is not None
            cold = s.rate_prompts == "cold"
            return bench.rate(prefix.tokens, rate, s.burstiness, s.rate_seed, cold)

        return self._open(cid, measure, prefix.tokens)

    def conversation(self, context: int | str, users: int) -> CellRecord:
        """Run the conversation cell ``conversation[C-uU-tT]`` (T = --llm-turns): ``users``
        conversations in step (docs/workloads.md, "Conversations"); fail on errors or on a
        confirmed miss of the baseline."""
        from ..core.errors import LLMSpeedError
        from ..core.records import conversation_record, unmeasured_record
        from ..core.status import cell_status
        from ..results import CellId, Status
        from .messages import cell_words

        s = self.run.settings
        if s.turns is None:
            pytest.skip("pytest-llmspeed: no --llm-turns given")
        cid = CellId.conversation(context, users, s.turns)
        if self.run.progress is not None:
            self.run.progress.announce(cid)
        skip = self.run.server.skip(cid)
        if skip:
            _skip(self.run, cid, skip.status, skip.reason)
        bench = self.run.server.bench
        assert bench is not None
        tokens = bench.resolve(context)
        assert tokens is not None  # else skipped above

        def measure() -> CellRecord:
            now = self.run.server.bench  # of now (a fresh start makes a new one)
            assert now is not None
            outcome = self._guarded(
                cid,
                lambda: now.converse(
                    tokens, users, s.turns or 1, s.turn_tokens, s.turn_output, s.think_time
                ),
            )
            if isinstance(outcome, LLMSpeedError):
                found = cell_status(outcome)
                words = self.run.redact(cell_words(found))
                rec = unmeasured_record(cid, found.status, words, tokens)
                self.run.store.record(rec)
                self._attach(rec)
                pytest.fail(
                    words if found.status is Status.ERROR else f"{cid}: {words}", pytrace=False
                )
            rec = conversation_record(cid, outcome, now.config.max_error_rate, tokens)
            return rec.with_status(rec.status, self.run.redact(rec.reason) if rec.reason else None)

        record = measure()
        if record.status is not Status.VALID:
            self.run.store.record(record)
            self._attach(record)
            pytest.fail(f"{cid}: {record.reason}", pytrace=False)

        def again() -> CellRecord:
            rec = measure()
            if rec.status is not Status.VALID:
                pytest.fail(f"{cid} (re-measured): {rec.reason}", pytrace=False)
            return rec

        return self._finish(record, again)

    def trace(self, trace: Trace) -> CellRecord:
        """Replay ``trace`` (--llm-trace) at its times (--llm-trace-speed): the cell
        ``trace[NAME]``; fail on errors or on a confirmed miss of the baseline."""
        from ..results import CellId

        def measure() -> OpenLoopResult:
            bench = self.run.server.bench  # of now (a fresh start makes a new one)
            assert bench is not None
            result = bench.replay(trace, self.run.settings.trace_speed)
            # what the replay left out (rows of 0 tokens, lines past the bounds, requests
            # longer than the server's context): the cell's notes, and the run's, so the
            # terminal's summary says it too
            self.run.store.note(*result.notes)
            return result

        return self._open(CellId.trace(trace.name), measure, None)

    def _open(
        self, cid: CellId, measure: Callable[[], OpenLoopResult], tokens: int | None
    ) -> CellRecord:
        """An open-loop cell: announced, skipped where it cannot run, measured, failed when
        not valid (:func:`~pytest_llmspeed.core.openloop.open_status`), else gated."""
        from ..results import Phase, Status

        if self.run.progress is not None:
            self.run.progress.announce(cid)
        if cid.phase is Phase.RATE:
            skip = self.run.server.skip(cid)
            if skip:
                _skip(self.run, cid, skip.status, skip.reason)
        record = self._measure_open(cid, measure, tokens)
        if record.status is not Status.VALID:
            assert record.reason is not None
            self.run.store.record(record)
            self._attach(record)
            pytest.fail(f"{cid}: {record.reason}", pytrace=False)

        def again() -> CellRecord:
            rec = self._measure_open(cid, measure, tokens)
            if rec.status is not Status.VALID:
                pytest.fail(f"{cid} (re-measured): {rec.reason}", pytrace=False)
            return rec

        return self._finish(record, again)

    def _guarded(self, cid: CellId, measure: Callable[[], T]) -> T | LLMSpeedError:
        """``measure()``, or the core's error that stopped it (a session that cannot go on
        after it is stopped); a cut from outside (pytest-timeout, Ctrl-C) is recorded as the
        cell's error and fails the test (Ctrl-C raised again)."""
        from ..core.errors import CellCut, LLMSpeedError

        started = time.perf_counter()
        try:
            return measure()
        except LLMSpeedError as exc:
            if not _is_trace_error(exc):
                _stop_if_fatal(self.request, self.run, exc)
            return exc
        except CellCut as exc:
            cut = str(exc)
        except KeyboardInterrupt:
            words = f"cut after {time.perf_counter() - started:.1f} s by Ctrl-C"
            _record_cut(self.run, self.request.node, cid, words)
            raise
        # failed outside the except block: no chained traceback
        _record_cut(self.run, self.request.node, cid, cut)
        pytest.fail(f"{cid}: {cut}", pytrace=False)

    def _measure_open(
        self, cid: CellId, measure: Callable[[], OpenLoopResult], tokens: int | None
    ) -> CellRecord:
        """One measurement of an open-loop cell: its record, valid or not; an error that stops
        the cell (a trace that does not fit the server, a cut) fails the test here."""
        from ..core.errors import LLMSpeedError
        from ..core.openloop import open_status
        from ..core.records import open_record, unmeasured_record
        from ..core.status import cell_status
        from ..results import Status
        from .messages import cell_words

        assert self.run.server.bench is not None
        max_error_rate = self.run.server.bench.config.max_error_rate
        outcome = self._guarded(cid, measure)
        if isinstance(outcome, LLMSpeedError):
            if _is_trace_error(outcome):  # its words name the file and the line
                status, words = Status.ERROR, f"--llm-trace={outcome.message}"
            else:
                found = cell_status(outcome)
                status, words = found.status, self.run.redact(cell_words(found))
            rec = unmeasured_record(cid, status, words, tokens)
            self.run.store.record(rec)
            self._attach(rec)
            pytest.fail(words if status is Status.ERROR else f"{cid}: {words}", pytrace=False)
        sent = outcome.sent
        self.run.log_requests(cid, [x.rec for x in sent], [x.due for x in sent])
        state = open_status(outcome, max_error_rate)
        reason = None if state.valid else self.run.redact(cell_words(state))
        return open_record(cid, outcome, max_error_rate, tokens).with_status(state.status, reason)

    def _measure(self, cid: CellId, prefix: WarmPrefix) -> CellRecord:
        """One measurement of a decode cell: its record, valid or not as the core decides
        (:func:`~pytest_llmspeed.core.status.cell_status`); an error that stops the cell at
        once fails the test here."""
        from ..core.errors import LLMSpeedError
        from ..core.records import decode_record, unmeasured_record
        from ..core.status import cell_status
        from ..results import Status
        from .messages import cell_words

        assert cid.concurrency is not None and self.run.server.bench is not None
        max_error_rate = self.run.server.bench.config.max_error_rate
        n = cid.concurrency
        outcome: DecodeResult | LLMSpeedError
        outcome = self._guarded(cid, lambda: self.run.decode(prefix.tokens, n))
        status = cell_status(outcome, max_error_rate)
        reason = None if status.valid else self.run.redact(cell_words(status))
        if isinstance(outcome, LLMSpeedError):
            # failed outside the except block: no chained traceback
            assert reason is not None
            rec = unmeasured_record(cid, status.status, reason)
            self.run.store.record(rec)
            self._attach(rec)
            pytest.fail(
                reason if status.status is Status.ERROR else f"{cid}: {reason}", pytrace=False
            )
        self.run.log_requests(cid, outcome.records, window=outcome.window)
        memory = self.run.server.bench.config.memory
        record = decode_record(prefix.param, outcome, max_error_rate, memory)
        return record.with_status(status.status, reason)

    def _fresh_start(self, record: CellRecord) -> None:
        """Restart the server (or pause) before re-measuring ``record``'s cell; a restart
        that fails stops the run, keeping the first measurement."""
        from ..core.errors import LLMSpeedError
        from ..results import Phase

        # a trace's cell has no context of its own (its id names the trace): its prompts are
        # its own, and no shared prefix is warmed again
        context = None if record.id.phase is Phase.TRACE else record.id.context
        try:
            self.run.server.fresh_start(context)
        except (LLMSpeedError, ValueError) as exc:
            problem = f"restarting the server to re-measure {record.id} failed: {exc}"
        else:
            return
        self.run.store.record(record)
        why = self.run.server.give_up(f"pytest-llmspeed: stopped: {problem}")
        self.request.session.shouldstop = why
        pytest.fail(why, pytrace=False)

    def _finish(self, record: CellRecord, again: Callable[[], CellRecord]) -> CellRecord:
        """Gate on the baseline (re-measuring a miss or an unknown: the gate's one
        confirmation loop, GateSession.confirmed), record, attach, report to pytest-benchmark,
        and fail on a confirmed regression."""
        from . import benchmark

        run = self.run
        if run.ab is not None:  # an A/B judges the cell when its block ends (plugin/ab.py)
            return run.ab.finish(self.request, record)
        if run.gate.baseline is not None:
            first = record

            def measure() -> CellRecord:
                self._fresh_start(first)
                return again()

            fresh = run.server.restartable  # each re-measurement on a fresh start
            waiting = run.gate.hold(self.request.node.nodeid, record, measure, fresh)
            if waiting is not None:  # measured again after every cell (--llm-budget)
                if run.progress is not None:
                    run.progress.waiting.add(str(waiting.id))
                record = run.store.record(waiting)
                self._attach(record)
                benchmark.report(self.request, record)
                return record  # its test's outcome waits for the final verdict
            record, remeasured = run.gate.confirmed(record, measure, fresh)
            if remeasured:
                words = run.server.remeasured_words(remeasured)
                record = dataclasses.replace(record, notes=(*record.notes, words))
        dropped = run.gate.capacity_miss(record)
        if dropped:
            record = dataclasses.replace(record, notes=(*record.notes, dropped))
        record = run.store.record(record)
        self._attach(record)
        benchmark.report(self.request, record)
        failures = [record.gate.message] if record.gate and record.gate.regressions else []
        failures += [dropped] if dropped else []
        if failures:
            pytest.fail("\n".join(failures), pytrace=False)
        return record


@pytest.fixture
def llm_cell(
    request: pytest.FixtureRequest, record_testsuite_property: Callable[[str, object], None]
) -> CellRunner:
    """Runs a cell for this test and attaches its figures to it (and, at the session's end,
    the run's figures to the JUnit test suite: ``record_testsuite_property``)."""
    run = _active_run(request)
    run.suite_property = record_testsuite_property
    return CellRunner(request, run)


@pytest.fixture
def llm_concurrency(request: pytest.FixtureRequest) -> int:
    """Requests in flight for a decode cell (parametrized by the plugin)."""
    return int(getattr(request, "param", 1))


@pytest.fixture
def llm_rate(request: pytest.FixtureRequest) -> float:
    """Requests per second of an open-loop rate cell (parametrized by the plugin from
    --llm-rates)."""
    return float(getattr(request, "param", 1.0))


@pytest.fixture
def llm_conversation(request: pytest.FixtureRequest) -> tuple[int | str, int]:
    """The context and the users of a conversation cell (parametrized by the plugin from
    --llm-contexts and --llm-concurrency when --llm-turns is given)."""
    param = getattr(request, "param", None)
    if param is None:
        pytest.skip("pytest-llmspeed: a conversation cell is parametrized by --llm-turns")
    return param


@pytest.fixture
def llm_trace(request: pytest.FixtureRequest) -> Trace:
    """The trace a trace cell replays (--llm-trace, read and checked when the run began)."""
    trace = getattr(request, "param", None)
    if trace is None:
        trace = _active_run(request).settings.trace
    if trace is None:
        pytest.skip("pytest-llmspeed: no --llm-trace given")
    return trace


__all__ = ["CellRunner", "WarmPrefix"]
