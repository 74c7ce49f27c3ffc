"""Fixtures for LLM speed tests: the server, the warmed prefix, the cell runner.

Example (a test of your own)::

    @pytest.mark.parametrize("llm_prefix", ["32K"], indirect=True)
    def test_chat_at_32k_c8(llm_prefix, llm_cell):
        record = llm_cell.decode(llm_prefix, 8)
        assert record["total_tok_s"] > 500
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pytest

from .state import RUN_KEY

if TYPE_CHECKING:
    from .bench import Bench
    from .probe import ServerInfo
    from .protocol import PrefillResult
    from .run import LLMSpeedRun


def _active_run(request: pytest.FixtureRequest) -> LLMSpeedRun:
    run = request.config.stash.get(RUN_KEY, None)
    if run is None:
        pytest.skip("pytest-llmspeed: no --llm-endpoint given")
    if not run.started:
        pytest.skip("pytest-llmspeed: the server was not probed (--collect-only?)")
    if run.fatal:
        pytest.fail(run.fatal, pytrace=False)
    return run


@dataclass(frozen=True)
class WarmPrefix:
    """A context whose shared prefix is cached on the server, with its prefill figures."""

    param: int | str  # as given: 8192 or "max"
    tokens: int  # resolved prompt length
    prefill: PrefillResult

    @property
    def label(self) -> str:
        from .matrix import context_label

        return context_label(self.param)


@pytest.fixture(scope="session")
def llm_bench(request: pytest.FixtureRequest) -> Bench:
    """The connected benchmark (one event loop, one aiohttp session) for the whole run."""
    run = _active_run(request)
    assert run.bench is not None
    return run.bench


@pytest.fixture(scope="session")
def llm_server(llm_bench: Bench) -> ServerInfo:
    """What the server is: model, max_model_len, engine, version, KV capacity."""
    assert llm_bench.server is not None
    return llm_bench.server


@pytest.fixture(scope="session")
def llm_prefix(request: pytest.FixtureRequest) -> WarmPrefix:
    """Warm the shared prefix of a context (its first, cold request is the prefill cell).

    Parametrized with the context (``8K``, ``8192`` or ``max``), indirectly.
    """
    from .client import LLMSpeedError, RequestRejected
    from .matrix import normalize_context

    run = _active_run(request)
    param = getattr(request, "param", None)
    if param is None:
        pytest.fail("llm_prefix needs a context: parametrize it (indirect=True)", pytrace=False)
    param = normalize_context(param)
    reason = run.skip_reason("prefill", param, None)
    if reason:
        pytest.skip(reason)
    try:
        tokens, result = run.warm(param)
    except RequestRejected as exc:
        pytest.skip(f"the server refused the prompt: {run.redact(exc.message)}")
    except LLMSpeedError as exc:
        _stop_if_fatal(request, run, exc)
        pytest.fail(run.redact(str(exc)), pytrace=False)
    return WarmPrefix(param, tokens, result)


def _stop_if_fatal(request: pytest.FixtureRequest, run: LLMSpeedRun, exc: Exception) -> None:
    from .client import AuthError

    if isinstance(exc, AuthError):
        run.fatal = run.redact(f"stopped: {exc}")
    elif not run.healthy():
        run.fatal = run.redact(
            f"stopped: the server at {run.base_url} stopped answering ({exc}). "
            "Results measured so far are kept."
        )
    if run.fatal:
        request.session.shouldstop = "pytest-llmspeed: " + run.fatal


class CellRunner:
    """Runs cells for one test, gates them on the baseline, and attaches their figures to the
    test (JUnit properties, pytest-benchmark entry)."""

    def __init__(self, request: pytest.FixtureRequest, run: LLMSpeedRun):
        self.request = request
        self.run = run

    def _attach(self, record: dict[str, Any]) -> None:
        from .report.records import properties

        self.request.node.user_properties.extend(properties(record))

    def prefill(self, prefix: WarmPrefix) -> dict[str, Any]:
        """The prefill cell's record (measured when the prefix was warmed), gated."""
        from .report import records as R

        record = dict(self.run.cells[R.cell_name("prefill", prefix.param)])

        def again() -> dict[str, Any]:
            assert self.run.bench is not None
            result = self.run.bench.prefill_again(prefix.tokens, prefix.prefill.max_tokens)
            return R.prefill_record(prefix.param, result)

        return self._finish(record, again, samples_ms=record["samples"]["ttft_ms"])

    def decode(self, prefix: WarmPrefix, concurrency: int) -> dict[str, Any]:
        """Run the sustained-decode cell (prefix context, concurrency); fail on errors or on a
        confirmed miss of the baseline."""
        from .client import LLMSpeedError
        from .report import records as R

        reason = self.run.skip_reason("decode", prefix.param, concurrency)
        if reason:
            status = R.TOO_LONG if reason.startswith("exceeds") else R.OVER_CAPACITY
            self.run.record(R.skipped_record("decode", prefix.param, concurrency, status, reason))
            pytest.skip(reason)

        def measure() -> tuple[dict[str, Any], str | None]:
            try:
                result = self.run.decode(prefix.param, prefix.tokens, concurrency)
            except LLMSpeedError as exc:
                _stop_if_fatal(self.request, self.run, exc)
                msg = self.run.redact(str(exc))
                rec = R.skipped_record("decode", prefix.param, concurrency, R.ERROR, msg)
                self.run.record(rec)
                self._attach(rec)
                pytest.fail(msg, pytrace=False)
            record = R.decode_record(prefix.param, result)
            problem = None
            if result.aborted:
                record["status"], problem = R.ERROR, result.aborted
            elif result.wrong_lengths:
                record["status"] = R.FAILED
                problem = (
                    f"the server counted other prompt lengths than {result.context} tokens: "
                    + ", ".join(f"{k:,} ({v}×)" for k, v in sorted(result.wrong_lengths.items()))
                    + "; the figures would be for other prompts (try --llm-prompt-form=ids)"
                )
            elif result.error_rate > self.run.settings.max_error_rate:
                record["status"] = R.FAILED
                problem = (
                    f"{record['errors']} of {record['requests']} requests failed "
                    f"({result.error_rate:.0%} > --llm-max-error-rate "
                    f"{self.run.settings.max_error_rate:g})"
                )
            if problem:
                summary = "; ".join(f"{n}× {msg}" for msg, n in result.errors.items())
                record["reason"] = self.run.redact(problem + (f": {summary}" if summary else ""))
            return record, problem

        record, problem = measure()
        if problem:
            self.run.record(record)
            self._attach(record)
            _stop_if_fatal(self.request, self.run, LLMSpeedError(problem))
            pytest.fail(f"{record['id']}: {record['reason']}", pytrace=False)

        def again() -> dict[str, Any]:
            rec, trouble = measure()
            if trouble:
                pytest.fail(f"{rec['id']} (re-measured): {rec['reason']}", pytrace=False)
            return rec

        return self._finish(record, again, samples_ms=record["samples"]["tbt_ms"])

    def _finish(
        self, record: dict[str, Any], again: Any, samples_ms: list[float]
    ) -> dict[str, Any]:
        """Gate on the baseline (re-measuring a miss), record, attach, report to
        pytest-benchmark, and fail on a confirmed regression."""
        from .baseline import checks_for
        from .report import records as R

        run = self.run
        failures: list[str] = []
        if run.baseline is not None:
            cell = run.baseline.cells.get(record["id"])
            if cell is None:
                run.no_floor.append(record["id"])
                record["baseline"] = "no floor"
            else:
                checks = checks_for(cell, record)
                attempts = [record]
                for _ in range(run.settings.confirm):
                    if not any(c.misses(c.values[-1]) for c in checks):
                        break
                    attempts.append(again())
                    for c in checks:
                        value = attempts[-1].get(c.metric)
                        if isinstance(value, int | float):
                            c.values.append(float(value))
                regressed = [c for c in checks if c.regressed]
                improved = [c for c in checks if c.improved and not c.regressed]
                run.regressions.extend(regressed)
                run.improvements.extend(improved)
                failures = [c.message() for c in regressed]
                record["baseline"] = "regressed" if regressed else "passed"
                record["baseline_checks"] = [
                    {
                        "metric": c.metric,
                        "reference": c.reference,
                        "limit": round(c.limit, 3),
                        "values": c.values,
                        "change": round(c.change, 4),
                        "verdict": "regressed" if c.regressed else "passed",
                    }
                    for c in checks
                ]
                if len(attempts) > 1:
                    metrics = [c.metric for c in checks]
                    record["attempts"] = [
                        {k: a.get(k) for k in (*metrics, "ttft_ms", "stability_cv")}
                        for a in attempts
                    ]
                if regressed:
                    record["status"] = R.FAILED
                    record["reason"] = "; ".join(failures)
        run.record(record)
        self._attach(record)
        self._benchmark(record, samples_ms)
        if failures:
            pytest.fail("\n".join(failures), pytrace=False)
        return record

    def _benchmark(self, record: dict[str, Any], samples_ms: list[float]) -> None:
        """Make the cell a pytest-benchmark entry: its timing samples are the cell's TTFT
        (prefill) or time-between-tokens values (decode), its figures go in extra_info."""
        config = self.request.config
        if not samples_ms or not config.pluginmanager.hasplugin("benchmark"):
            return
        if config.getoption("benchmark_skip", False) or config.getoption(
            "benchmark_disable", False
        ):
            return
        from .report.records import properties

        bench = self.request.getfixturevalue("benchmark")
        bench._mode = "pytest-llmspeed"  # samples come from the cell, not from calls
        bench.group = f"llmspeed {record['phase']}"
        bench.extra_info.update(dict(properties(record)))
        stats = bench._make_stats(1)
        for ms in samples_ms:
            stats.update(ms / 1e3)


@pytest.fixture
def llm_cell(request: pytest.FixtureRequest) -> CellRunner:
    """Runs a cell for this test and attaches its figures to it."""
    return CellRunner(request, _active_run(request))


@pytest.fixture
def llm_concurrency(request: pytest.FixtureRequest) -> int:
    """Requests in flight for a decode cell (parametrized by the plugin)."""
    return int(getattr(request, "param", 1))
