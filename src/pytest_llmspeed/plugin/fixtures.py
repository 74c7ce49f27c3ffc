"""Fixtures for LLM speed tests: the server, the warmed prefix, the cell runner.

Example (a test of your own)::

    @pytest.mark.parametrize("llm_prefix", ["32K"], indirect=True)
    def test_chat_at_32k_c8(llm_prefix, llm_cell):
        record = llm_cell.decode(llm_prefix, 8)
        assert record.total_tok_s > 500
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, NoReturn

import pytest

from ..results import CellId, CellRecord, Status, context_label
from .stash import RUN_KEY

if TYPE_CHECKING:
    from ..core.bench import Bench
    from ..core.probe import ServerInfo
    from ..core.protocol import DecodeResult, PrefillResult
    from .session import LLMSpeedRun


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
    from ..core.errors import LLMSpeedError, RequestRejected
    from ..core.matrix import normalize_context
    from .messages import describe

    run = _active_run(request)
    param = getattr(request, "param", None)
    if param is None:
        pytest.fail("llm_prefix needs a context: parametrize it (indirect=True)", pytrace=False)
    context = normalize_context(param)
    cid = CellId.prefill(context)
    skip = run.server.skip(cid)
    if skip:
        _skip(run, cid, skip.status, skip.reason)
    try:
        tokens, result = run.warm(context)
    except RequestRejected as exc:
        # The arithmetic says the cell fits: a refusal is the server's failure, not a skip (an
        # upgrade that stops serving 128K prompts must fail the gate).
        failure = (
            Status.FAILED,
            run.redact(f"the server refused a prompt that fits (HTTP {exc.status}: {exc.reason})"),
        )
    except LLMSpeedError as exc:
        _stop_if_fatal(request, run, exc)
        failure = (Status.ERROR, run.redact(describe(exc)))
    else:
        return WarmPrefix(context, tokens, result)
    from ..core.records import unmeasured_record

    # failed outside the except block: no chained traceback in the report
    run.store.record(unmeasured_record(cid, failure[0], failure[1], run.server.resolve(context)))
    pytest.fail(failure[1] if failure[0] is Status.ERROR else f"{cid}: {failure[1]}", pytrace=False)


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

        record = self.run.store.cells[str(CellId.prefill(prefix.param))]

        def again() -> CellRecord:
            assert self.run.server.bench is not None
            result = self.run.server.bench.prefill_again(prefix.tokens, prefix.prefill.max_tokens)
            return prefill_record(prefix.param, result)

        return self._finish(record, again)

    def decode(self, prefix: WarmPrefix, concurrency: int) -> CellRecord:
        """Run the sustained-decode cell (prefix context, concurrency); fail on errors or on a
        confirmed miss of the baseline."""
        cid = CellId.decode(prefix.param, concurrency)
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

    def _measure(self, cid: CellId, prefix: WarmPrefix) -> CellRecord:
        """One measurement of a decode cell: a valid record, or a failed / error one with the
        reason (an error that stops the cell at once fails the test here)."""
        from ..core.errors import LLMSpeedError
        from ..core.records import decode_record, unmeasured_record
        from .messages import describe, with_hint

        assert cid.concurrency is not None
        try:
            result = self.run.decode(prefix.tokens, cid.concurrency)
        except LLMSpeedError as exc:
            _stop_if_fatal(self.request, self.run, exc)
            error: LLMSpeedError | None = exc
        else:
            error = None
        if error is not None:  # failed outside the except block: no chained traceback
            msg = self.run.redact(describe(error))
            rec = unmeasured_record(cid, Status.ERROR, msg)
            self.run.store.record(rec)
            self._attach(rec)
            pytest.fail(msg, pytrace=False)
        record = decode_record(prefix.param, result)
        problem = self._problem(result, record)
        if problem is None:
            return record
        status, text = problem
        summary = "; ".join(f"{n}× {msg}" for msg, n in result.errors.items())
        if summary and "timeout" in result.error_settings:
            summary = with_hint(summary, "timeout")
        return record.with_status(
            status, self.run.redact(text + (f": {summary}" if summary else ""))
        )

    def _problem(self, result: DecodeResult, record: CellRecord) -> tuple[Status, str] | None:
        from .messages import with_hint

        max_rate = self.run.settings.max_error_rate
        if result.aborted:
            return Status.ERROR, with_hint(result.aborted, result.aborted_setting)
        if result.wrong_lengths:
            return Status.FAILED, (
                f"the server counted other prompt lengths than {result.context} tokens: "
                + ", ".join(f"{k:,} ({v}×)" for k, v in sorted(result.wrong_lengths.items()))
                + "; the figures would be for other prompts (try --llm-prompt-form=ids)"
            )
        if result.error_rate > max_rate:
            return Status.FAILED, (
                f"{record.errors} of {record.requests} requests failed "
                f"({result.error_rate:.0%} > --llm-max-error-rate {max_rate:g})"
            )
        from ..core.protocol import counter_disagreement

        disagreement = counter_disagreement(result)
        if disagreement:
            return Status.FAILED, disagreement
        return None

    def _finish(self, record: CellRecord, again: Callable[[], CellRecord]) -> CellRecord:
        """Gate on the baseline (re-measuring a miss), record, attach, report to
        pytest-benchmark, and fail on a confirmed regression."""
        from ..gate.verdict import gated, verdict, wants_another
        from . import benchmark

        run = self.run
        baseline = run.gate.baseline
        if baseline is not None:
            entry = baseline.cells.get(str(record.id))
            attempts = [record]
            while wants_another(entry, attempts, run.settings.confirm):
                attempts.append(again())
            record = gated(record, verdict(entry, attempts), attempts)
        run.store.record(record)
        self._attach(record)
        benchmark.report(self.request, record)
        if record.gate is not None and record.gate.regressions:
            pytest.fail(record.gate.message, pytrace=False)
        return record


@pytest.fixture
def llm_cell(request: pytest.FixtureRequest) -> CellRunner:
    """Runs a cell for this test and attaches its figures to it."""
    return CellRunner(request, _active_run(request))


@pytest.fixture
def llm_concurrency(request: pytest.FixtureRequest) -> int:
    """Requests in flight for a decode cell (parametrized by the plugin)."""
    return int(getattr(request, "param", 1))


__all__ = ["CellRunner", "WarmPrefix"]
