"""The ``pytest11`` entry point: hooks only; the work is delegated.

Installed but not asked for (no ``--llm-endpoint``, no ``llm_endpoint`` ini key, no
``LLMSPEED_ENDPOINT``), the plugin registers its options, markers and fixtures and does nothing
else: no network, no heavy import. With an endpoint, it still starts nothing until collection
is over: the server is probed, the simulator or the ``--llm-serve`` command started, only when
a selected test needs them (the built-in suite, or a test that uses an ``llm_*`` fixture).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from . import fixtures, settings
from .selection import select_as_pytest_does
from .stash import CELL_KEY, RUN_KEY

if TYPE_CHECKING:
    from collections.abc import Generator

    from ..results import CellId
    from .ab import ABRun
    from .session import LLMSpeedRun

MARKERS = (
    "llmspeed: an LLM serving speed test (pytest-llmspeed)",
    "prefill: a prefill cell (cold-cache prompt throughput and TTFT)",
    "decode: a sustained-decode cell (N requests in flight for a fixed window)",
    "rate: an open-loop cell: requests arriving at a rate, whatever the server does",
    "trace: an open-loop cell: a trace of requests replayed at its times",
    "conversation: a conversation cell: users in step through --llm-turns turns, each prompt "
    "the whole history",
)


def pytest_addoption(parser: pytest.Parser) -> None:
    settings.add_options(parser)


def pytest_configure(config: pytest.Config) -> None:
    for marker in MARKERS:
        config.addinivalue_line("markers", marker)
    config.pluginmanager.register(fixtures, "llmspeed-fixtures")
    if settings.endpoint_of(config) is None:
        return
    conf = settings.load(config)
    from .progress import ProgressReporter
    from .session import LLMSpeedRun

    try:
        config.stash[RUN_KEY] = LLMSpeedRun(conf)
    except ValueError as exc:  # a file that cannot be read (imported only then)
        from ..gate.baseline import BaselineError
        from ..results import ResultsError

        if isinstance(exc, ResultsError):
            raise pytest.UsageError(f"--llm-compare: {exc}") from None
        if isinstance(exc, BaselineError):
            text = str(exc)
            if text.endswith("baseline file not found"):
                text += f". Create one with --llm-save-baseline={conf.baseline}"
            raise pytest.UsageError(f"--llm-baseline: {text}") from None
        raise
    if conf.results and not hasattr(config, "workerinput"):  # (xdist's workers write none)
        from .store import ResultsLock

        config.add_cleanup(ResultsLock(conf.results).release)
    config.pluginmanager.register(ProgressReporter(config), "llmspeed-progress")
    config.pluginmanager.register(SuiteProperties(config), "llmspeed-suite-properties")
    if config.pluginmanager.hasplugin("timeout"):  # pytest-timeout: a cut cell stops cleanly
        from .timeouts import CellTimeouts

        config.pluginmanager.register(CellTimeouts(config.stash[RUN_KEY]), "llmspeed-timeouts")


def _run(config: pytest.Config) -> LLMSpeedRun | None:
    return config.stash.get(RUN_KEY, None)


def _start(run: LLMSpeedRun) -> None:
    """Start the server for the selected tests; a failure stops the run before any cell."""
    problem = run.start_or_say_why()
    if problem:
        raise pytest.UsageError(problem)


@pytest.hookimpl(tryfirst=True)
def pytest_runtestloop(session: pytest.Session) -> bool | None:
    """--llm-runs=N: the selected tests N times, as pytest's own loop runs them once, the
    server restarted between runs and each run's cells added to the baseline (the last one's
    at the session's end). Otherwise pytest's loop."""
    run = _run(session.config)
    if _is_xdist_worker(session.config) and session.shouldstop:
        return True  # refused (pytest_collection_finish): the controller says why, once
    if run is not None and run.ab is not None and run.server.started:
        return _ab_loop(session, run)
    if run is not None and run.server.started and run.gate.defers():
        return _gate_loop(session, run)
    if run is None or run.settings.runs < 2 or not run.server.started:
        return None
    if not _collected(session):
        return True
    items = session.items
    for number in range(1, run.settings.runs + 1):
        if number > 1:
            problem = _next_run(run, number)
            if problem:
                raise session.Interrupted(problem)
        _run_items(session, items)
    return True


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> bool | None:
    """In the first pass of a run whose undecided cells wait (--llm-baseline with
    --llm-budget): pytest's protocol, a waiting test's reports held (plugin/pending.py)."""
    run = _run(item.config)
    if run is None or not run.gate.deferring:
        return None
    from .pending import run_protocol

    run_protocol(item, nextitem, run)
    return True


def _gate_loop(session: pytest.Session, run: LLMSpeedRun) -> bool:
    """--llm-baseline with --llm-budget: every selected test once, the cells its first
    measurement did not decide held; then those measured again, unknown first, within the
    budget, and their tests reported with the final verdicts (docs/gate.md, "Within a
    budget")."""
    from .pending import remeasure

    if not _collected(session):
        return True
    try:
        run.gate.deferring = True
        try:
            _run_items(session, session.items)
        finally:
            run.gate.deferring = False
    finally:
        remeasure(session, run)
    return True


def _collected(session: pytest.Session) -> bool:
    """Collection went well and the tests are to run: collection errors stop the session as
    pytest's own loop stops it; --collect-only runs nothing (False)."""
    if session.testsfailed and not session.config.option.continue_on_collection_errors:
        raise session.Interrupted(
            f"{session.testsfailed} error{'s' if session.testsfailed != 1 else ''} "
            "during collection"
        )
    return not session.config.option.collectonly


def _run_items(session: pytest.Session, items: list[pytest.Item], ab: ABRun | None = None) -> None:
    """Run ``items`` as pytest's own loop does (once more in a run or a round: each test's
    properties are the last measurement's). In an A/B round (``ab``) a cell's test keeps its
    reports (:meth:`ABRun.hold`): it is reported once, with its cell's verdict and every round
    it ran in, so pytest's counts and JUnit hold one case per test."""
    from _pytest.runner import runtestprotocol

    for i, item in enumerate(items):
        item.user_properties.clear()
        nextitem = items[i + 1] if i + 1 < len(items) else None
        if ab is not None and ab.holds(item):  # as pending.run_protocol: progress lines kept
            ihook = item.ihook
            ihook.pytest_runtest_logstart(nodeid=item.nodeid, location=item.location)
            ab.hold(item, runtestprotocol(item, nextitem=nextitem, log=False))
            ihook.pytest_runtest_logfinish(nodeid=item.nodeid, location=item.location)
        else:
            item.config.hook.pytest_runtest_protocol(item=item, nextitem=nextitem)
        if session.shouldfail:
            raise session.Failed(session.shouldfail)
        if session.shouldstop:
            raise session.Interrupted(session.shouldstop)


def _ab_loop(session: pytest.Session, run: LLMSpeedRun) -> bool:
    """The A/B (--llm-serve-baseline, --llm-endpoint-baseline): rounds of the selected tests
    in ABBA order, each on a fresh start of its version, a cell's tests only while it is
    undecided (plugin/ab.py)."""
    from ..core.errors import LLMSpeedError
    from .messages import arm_option, describe

    ab = run.ab
    assert ab is not None
    if not _collected(session):
        return True
    ab.set_items(session.items)
    try:
        index = 0
        while ab.more_rounds(index):
            try:
                ab.begin_round(index)
            except (LLMSpeedError, ValueError) as exc:
                arm = ab.ledger.arm(index)
                flag = arm_option(arm, bool(run.settings.serve_baseline))
                why = describe(exc, flag) if isinstance(exc, LLMSpeedError) else str(exc)
                raise session.Interrupted(
                    run.server.give_up(
                        f"pytest-llmspeed: the A/B stopped before round {index + 1}: starting "
                        f"the {arm} version ({flag}) failed: {why}"
                    )
                ) from None
            _run_items(session, [item for item in session.items if ab.runs_item(item, index)], ab)
            ab.end_round()
            index += 1
        ab.conclude()
    finally:
        ab.at_end()
    return True


def _next_run(run: LLMSpeedRun, number: int) -> str | None:
    """Begin run ``number`` of --llm-runs; why it cannot (the restart failed), else None."""
    from ..core.errors import LLMSpeedError

    try:
        run.next_run(number)
    except (LLMSpeedError, ValueError) as exc:
        return run.server.give_up(
            f"pytest-llmspeed: stopped before run {number}/{run.settings.runs}: restarting the "
            f"server failed: {exc}"
        )
    return None


#: how a refusal under pytest-xdist begins (the controller knows it by these words)
XDIST_REFUSAL = "pytest-llmspeed cannot run speed tests under pytest-xdist"


def _is_xdist_worker(config: pytest.Config) -> bool:
    return hasattr(config, "workerinput")


def xdist_refusal(items: list[pytest.Item]) -> str:
    """The one line a worker stops with when a selected test needs the server (docs/design.md,
    "No two cells at once"): what is wrong and the flag that works whatever addopts holds."""
    from .selection import needs_server

    count = sum(1 for item in items if needs_server(item))
    return (
        f"{XDIST_REFUSAL}: {count} selected test(s) need the LLM server, and two cells at once "
        "on one server give numbers that lie. Add -n 0 to the command (it overrides -n in "
        "addopts): pytest -n 0 ...; tests that need no server still run under -n when none "
        "of the selected tests does"
    )


def _refused_under_xdist(session: pytest.Session) -> bool:
    """On xdist's controller: did a worker refuse (its shouldstop, raised as Interrupted)?"""
    dsession = session.config.pluginmanager.getplugin("dsession")
    return str(getattr(dsession, "shouldstop", "") or "").startswith(XDIST_REFUSAL)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    run = _run(session.config)
    if run is None:
        return
    if _refused_under_xdist(session):  # a usage error, as without xdist: exit 4
        session.exitstatus = pytest.ExitCode.USAGE_ERROR
        run.stop()
        return
    if exitstatus == pytest.ExitCode.USAGE_ERROR:  # nothing ran: nothing to gate or write
        run.stop()
        return
    interrupted = exitstatus == pytest.ExitCode.INTERRUPTED or bool(session.shouldstop)
    if run.gate.fails_session(interrupted) and session.exitstatus in (
        pytest.ExitCode.OK,
        pytest.ExitCode.NO_TESTS_COLLECTED,
    ):
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
    if run.server.restarts:
        run.store.note(
            f"the server was restarted {run.server.restarts} time(s) to re-measure cells on a "
            "fresh start: a miss of the baseline to confirm, or a figure too noisy to tell"
        )
    if _unmeasured(session.config, run, interrupted):
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
    for line in run.gate.save():
        run.store.note(line)
    if run.server.started:
        run.store.write()  # the notes of the session's end reach the file and the page
    run.stop()


#: the options that ask for a verdict or a baseline: given on the command line, a run that
#: measured no cell fails, saying so
_VERDICT_OPTIONS = ("save-baseline", "baseline", "serve-baseline", "endpoint-baseline")


def _unmeasured(config: pytest.Config, run: LLMSpeedRun, interrupted: bool) -> str | None:
    """The line for a run asked on the command line for a verdict or a baseline that measured
    no cell (the selection left none, or no test of the suite ran), or None."""
    from .settings import OPTIONS

    if run.store.cells or interrupted or config.option.collectonly:
        return None
    asked = [
        o.flag for o in OPTIONS if o.name in _VERDICT_OPTIONS and config.getoption(o.dest, None)
    ]
    if not asked:
        return None
    return (
        f"llmspeed: ERROR: {' and '.join(asked)} asked for a verdict or a baseline, but no cell "
        "was measured (the selection left none: check -m, -k and the tests' markers): nothing "
        "was gated or saved"
    )


class SuiteProperties:
    """The run's own JUnit properties, on the test suite: with --llm-slo, the objectives and
    each context's capacity. Its session-finish hook runs first, before junitxml writes the
    file (the plugin's own stays where it was: it stops the server others may still ask
    about)."""

    def __init__(self, config: pytest.Config):
        self.config = config

    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        run = _run(self.config)
        if run is None or run.suite_property is None or not run.settings.slo:
            return
        run.suite_property("llmspeed_slo", run.store.run_info().settings["slo"])
        for context, found in run.store.capacity().items():
            run.suite_property(f"llmspeed_capacity[{context}]", found["requests"] or 0)
        for context, rated in run.store.rate_capacity().items():
            run.suite_property(f"llmspeed_rate_capacity[{context}]", rated["rate"] or 0)


@pytest.hookimpl(optionalhook=True)
def pytest_benchmark_update_machine_info(config: pytest.Config, machine_info: dict) -> None:
    """The server under test is the machine of an LLM speed test."""
    run = _run(config)
    if run is not None and run.server.started:
        info = run.store.run_info()
        machine_info["llm_server"] = {
            "endpoint": info.endpoint,
            "model": info.model,
            "engine": info.engine,
            "engine_version": info.engine_version,
            "max_model_len": info.max_model_len,
            "kv_capacity": info.kv_capacity,
            "kv_capacity_source": info.kv_capacity_source,
        }


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    run = _run(metafunc.config)
    names = metafunc.fixturenames
    if run is not None and "llm_trace" in names and run.settings.trace is not None:
        trace = run.settings.trace  # the trace cell: trace[NAME] (docs/workloads.md)
        metafunc.parametrize("llm_trace", [trace], indirect=True, ids=[trace.name])
    if run is not None and "llm_conversation" in names and run.settings.turns is not None:
        from ..results import CellId as Cid  # a conversation cell per context and concurrency

        conf, turns = run.settings, run.settings.turns
        talks = [(c, n) for c in conf.contexts for n in conf.concurrency]
        metafunc.parametrize(
            "llm_conversation",
            talks,
            indirect=True,
            ids=[Cid.conversation(c, n, turns).param_id for c, n in talks],
        )
    if run is None or "llm_prefix" not in names:
        return
    if any(
        m.name == "parametrize" and "llm_prefix" in str(m.args[0])
        for m in metafunc.definition.iter_markers()
    ):
        return  # the user chose the contexts
    from ..results import CellId

    def ids(contexts: tuple[int | str, ...], concurrency: int | None = None) -> list[str]:
        return [
            CellId.prefill(c).param_id
            if concurrency is None
            else CellId.decode(c, concurrency).param_id
            for c in contexts
        ]

    conf = run.settings
    if "llm_rate" in names:  # an open-loop rate cell per context and rate (docs/workloads.md)
        pairs = [(c, r) for c in conf.contexts for r in conf.rates]
        metafunc.parametrize(
            ("llm_prefix", "llm_rate"),
            pairs,
            indirect=True,
            ids=[CellId.at_rate(c, r).param_id for c, r in pairs],
        )
        return
    if "llm_concurrency" in names:
        if any(
            m.name == "parametrize" and "llm_concurrency" in str(m.args[0])
            for m in metafunc.definition.iter_markers()
        ):
            metafunc.parametrize("llm_prefix", conf.contexts, indirect=True, ids=ids(conf.contexts))
            return
        combos = [(c, n) for c in conf.contexts for n in conf.concurrency]
        metafunc.parametrize(
            ("llm_prefix", "llm_concurrency"),
            combos,
            indirect=True,
            ids=[CellId.decode(c, n).param_id for c, n in combos],
        )
    else:
        metafunc.parametrize(
            "llm_prefix",
            conf.prefill_contexts,
            indirect=True,
            ids=ids(conf.prefill_contexts),
        )


def _suite_nodeid(config: pytest.Config) -> str:
    """``llmspeed`` in the folder where pytest was started: pytest shows a location relative
    to that folder, so the built-in suite reads ``llmspeed::test_decode[8K-c1]`` wherever the
    rootdir is (below it, not ``../../llmspeed``; its JUnit class name has the folder)."""
    try:
        where = config.invocation_params.dir.relative_to(config.rootpath)
    except ValueError:  # started outside the rootdir
        return "llmspeed"
    return (where / "llmspeed").as_posix()


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(
    session: pytest.Session, config: pytest.Config, items: list[pytest.Item]
) -> None:
    """Before ``-m``/``-k``/``--deselect`` select: your tests that use the ``llm_*`` fixtures
    are marked ``llmspeed`` (so the mark expression sees them) and each test's cell is named."""
    run = _run(config)
    if run is None:
        return
    run.selection.mark_own(items)
    _name_cells(run, items)


@pytest.hookimpl(wrapper=True, specname="pytest_collection_modifyitems")
def pytest_collection_modifyitems_suite(
    session: pytest.Session, config: pytest.Config, items: list[pytest.Item]
) -> Generator[None]:
    """After every plugin selected (``-m``, ``-k``, ``--deselect``, a conftest's own hook):
    add the built-in suite if the rule says so (:meth:`Selection.add_suite`), judged on the
    tests that are still selected — a deselected test of yours does not turn it off — and
    select among its tests by the same ``-m``, ``-k`` and ``--deselect``."""
    collected = len(items)
    yield
    run = _run(config)
    if run is None or not run.selection.add_suite(config, items, collected):
        return
    from . import suite

    module = _SuiteModule.from_parent(
        session, path=Path(suite.__file__), nodeid=_suite_nodeid(config)
    )
    # the open-loop and conversation cells only when asked for: --llm-rates, --llm-trace,
    # --llm-turns; the others are not collected at all, so pytest's counts add up
    module.unasked = frozenset(
        name
        for name, asked in (
            ("test_rate", bool(run.settings.rates)),
            ("test_trace", run.settings.trace is not None),
            ("test_conversation", run.settings.turns is not None),
        )
        if not asked
    )
    added = list(session.genitems(module))
    _name_cells(run, added)
    items.extend(select_as_pytest_does(config, added))


class _SuiteModule(pytest.Module):
    """The built-in suite's module, without the tests of cells not asked for."""

    unasked: frozenset[str] = frozenset()

    def collect(self) -> list[pytest.Item | pytest.Collector]:
        return [
            c for c in super().collect() if getattr(c, "originalname", c.name) not in self.unasked
        ]


def _name_cells(run: LLMSpeedRun, items: list[pytest.Item]) -> None:
    """Stash each test's cell (:data:`CELL_KEY`) from its parameters."""
    for item in items:
        callspec = getattr(item, "callspec", None)
        turns = run.settings.turns
        if callspec is not None and "llm_conversation" in callspec.params and turns:
            from ..core.matrix import normalize_context
            from ..results import CellId

            talk, users = callspec.params["llm_conversation"]
            item.stash[CELL_KEY] = CellId.conversation(normalize_context(talk), int(users), turns)
            continue
        if callspec is None or "llm_prefix" not in callspec.params:
            continue
        from ..core.matrix import MatrixError, normalize_context
        from ..results import CellId

        try:
            context = normalize_context(callspec.params["llm_prefix"])
        except MatrixError as exc:
            raise pytest.UsageError(f"{item.nodeid}: llm_prefix parameter: {exc}") from None
        if "llm_rate" in getattr(item, "fixturenames", ()):
            cid = CellId.at_rate(context, float(callspec.params.get("llm_rate", 1)))
        elif "llm_concurrency" in getattr(item, "fixturenames", ()):
            cid = CellId.decode(context, int(callspec.params.get("llm_concurrency", 1)))
        else:
            cid = CellId.prefill(context)
        item.stash[CELL_KEY] = cid


@pytest.hookimpl(tryfirst=True)  # before the terminal reporter writes "collected N items"
def pytest_collection_finish(session: pytest.Session) -> None:
    """Collection is over (after -m, -k, --deselect): start the server if a selected test
    needs it, skip the cells it cannot hold, and plan the progress lines."""
    run = _run(session.config)
    if run is None:
        return
    run.selection.choose(session.items)
    if not run.selection.needs_server or session.config.option.collectonly:
        return  # no network, nothing started
    if _is_xdist_worker(session.config):
        session.shouldstop = xdist_refusal(session.items)
        return
    _start(run)
    for item in session.items:
        cid = item.stash.get(CELL_KEY, None)
        skip = run.server.skip(cid) if cid is not None else None
        if skip:
            item.add_marker(pytest.mark.skip(reason=skip.reason))
    cells = run.selection.cells
    traces = list(run.selection.trace_cells.values())
    if session.config.getoption("verbose") >= 0 and (cells or traces):
        from .progress import Progress

        progress = Progress(
            run.settings.duration,
            len(cells) + len(traces),
            early_end=run.settings.precision is not None,
        )
        progress.plan = [
            (c, run.server.resolve(c.context), run.server.skip(c) is not None) for c in cells
        ] + [(c, None, False) for c in traces]  # a trace: its own times, no window
        speed = run.settings.trace_speed or 1.0
        progress.replay_s = {c: s / speed for c, s in run.selection.trace_spans.items()}
        # a test of yours that names its cell when it runs: counted as one decode window
        progress.open_cells = {run.selection.node_cells[n] for n in run.selection.open}
        run.show_progress(progress)


def pytest_report_collectionfinish(config: pytest.Config) -> list[str] | None:
    """The rule that added or left out the built-in suite; then, when a selected test needs
    the server, what it is (the header a session that measures nothing does without)."""
    run = _run(config)
    if run is None or not run.selection.rule:
        return None
    lines = [f"llmspeed: {run.selection.rule}"]
    if run.selection.needs_server and config.getoption("verbose") >= 0:
        # what runs, not the ini's, each kind of cell with its own settings
        lines += run.server.header(selected=run.selection.words(), phases=run.selection.phases())
        if run.ab is not None:
            lines += run.ab.header()
    return [run.redact(line) for line in lines]


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    cid = item.stash.get(CELL_KEY, None)
    run = _run(item.config)
    excinfo = call.excinfo
    if cid is not None and run is not None and excinfo is not None and call.when == "setup":
        if excinfo.errisinstance(pytest.skip.Exception):
            _record_skip(run, item, cid, str(excinfo.value))
        elif str(cid) not in run.store.cells and run.server.started:
            _record_setup_error(run, item, cid, excinfo)
    return (yield)


def _record_setup_error(
    run: LLMSpeedRun, item: pytest.Item, cid: CellId, excinfo: pytest.ExceptionInfo[BaseException]
) -> None:
    """A cell whose setup failed (its context's prefix was refused, the server stopped, a
    fixture of yours raised): an error, as pytest reports its test, with the reason: the
    plugin's own words, or the exception's type and first line."""
    from ..core.records import unmeasured_record
    from ..results import Status

    lines = str(excinfo.value).strip().splitlines()
    first = lines[0] if lines else ""
    if not excinfo.errisinstance(pytest.fail.Exception):
        first = f"in setup: {excinfo.typename}" + (f": {first}" if first else "")
    reason = run.redact(first)
    record = unmeasured_record(cid, Status.ERROR, reason, run.server.resolve(cid.context))
    run.store.record(record)
    item.user_properties.extend(record.properties())


def _record_skip(run: LLMSpeedRun, item: pytest.Item, cid: CellId, message: str) -> None:
    """A cell skipped before it ran: the arithmetic's status (or not run, with pytest's reason,
    when something else skipped it), recorded once and attached to the test."""
    from ..core.records import unmeasured_record
    from ..results import Status

    record = run.store.cells.get(str(cid))
    if record is None:
        skip = run.server.skip(cid)
        status, reason = (skip.status, skip.reason) if skip else (Status.NOT_RUN, message)
        record = unmeasured_record(cid, status, reason, run.server.resolve(cid.context))
        run.store.record(record)
    item.user_properties.extend(record.properties())


#: the key of pytest's last line that counts the cells a verdict left unknown ("8 passed,
#: 2 unknown in 31.0s"): a category beside the tests', as pytest-rerunfailures' "rerun" is,
#: and one pytest colours yellow, so a run that decided nothing never reads green
UNKNOWN_KEY = "unknown"


def _count_unknowns(reporter: pytest.TerminalReporter, acc: Any, ab: Any, comparison: Any) -> None:
    """Count in pytest's last line the cells whose verdict is unknown: the stored gate's, the
    A/B's and ``--llm-compare``'s (a cell once, whichever judged it)."""
    cells: set[str] = set()
    if acc is not None:
        cells.update(acc.unknown)
    if ab is not None:
        cells.update(c for c, v in ab.get("cells", {}).items() if v.get("verdict") == "unknown")
    if comparison is not None:
        from ..report.compare import Verdict

        cells.update(c.cid for c in comparison.cells if c.verdict is Verdict.UNKNOWN)
    if cells:
        reporter.stats.setdefault(UNKNOWN_KEY, []).extend(sorted(cells))


def pytest_terminal_summary(
    terminalreporter: pytest.TerminalReporter, exitstatus: int, config: pytest.Config
) -> None:
    run = _run(config)
    if run is None:
        return
    if not run.store.cells:
        unmeasured = _unmeasured(config, run, exitstatus == pytest.ExitCode.INTERRUPTED)
        if unmeasured and exitstatus != pytest.ExitCode.USAGE_ERROR:
            terminalreporter.write_line(unmeasured, red=True, bold=True)
        return
    from ..core.text import markdown_inline
    from ..report.markdown import capped, summary
    from ..report.terminal import gate_lines, render

    store, s = run.store, run.settings
    width = config.get_terminal_writer().fullwidth
    terminalreporter.section("llmspeed")
    verbose = config.getoption("verbose") > 0
    cells = list(store.cells.values())
    info = store.run_info()
    objectives = info.settings.get("slo")
    held = run.gate.capacity_held()
    shown = render(
        cells, width, verbose, store.notes, objectives, info.capacity, held, info.rate_capacity
    )
    for line in shown:
        terminalreporter.write_line(run.redact(line))
    baseline, acc = run.gate.baseline, run.gate.accounting()
    if baseline is not None and acc is not None:
        for line in gate_lines(baseline.path, acc, s.baseline_missing == "fail"):
            terminalreporter.write_line(run.redact(line))
    if store.ab is not None:
        from ..report.ab import lines as ab_lines

        for line in ab_lines(store.ab):
            terminalreporter.write_line(run.redact(line))
    comparison = store.comparison()
    if comparison is not None and s.compare:
        from ..report.compare import lines as compare_lines

        for line in compare_lines(comparison, s.compare):
            terminalreporter.write_line(run.redact(line))
    _count_unknowns(
        terminalreporter,
        acc if baseline is not None else None,
        store.ab,
        comparison if s.compare else None,
    )
    if s.results:
        terminalreporter.write_line(f"results: {s.results}")
    if s.requests and run.requests is not None:
        rows = run.requests.rows
        terminalreporter.write_line(f"requests: {s.requests} ({rows:,} rows)")
    for output, path in s.outputs:
        terminalreporter.write_line(f"{output.label}: {path}")
    step_summary = os.environ.get("GITHUB_STEP_SUMMARY")
    if step_summary:
        # the server's strings in the title escaped: they can add no heading, link or HTML
        title = run.server.header(markdown_inline)[0].removeprefix("llmspeed server: ")
        text = summary(
            f"LLM speed: {title}",
            cells,
            store.notes,
            objectives,
            info.capacity,
            info.rate_capacity,
        )
        if comparison is not None and s.compare:
            from ..report.compare import markdown

            text += "\n" + markdown(comparison, s.compare, "this run")
        if store.ab is not None:
            from ..report.ab import markdown as ab_markdown

            text += "\n" + ab_markdown(store.ab)
        try:  # GitHub's limit is the step's whole summary: what earlier steps wrote counts
            written = os.path.getsize(step_summary)
        except OSError:
            written = 0
        with open(step_summary, "a", encoding="utf-8") as fh:
            fh.write(capped(run.redact(text), written))
