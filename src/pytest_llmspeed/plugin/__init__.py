"""The ``pytest11`` entry point: hooks only; the work is delegated.

Installed but not asked for (no ``--llm-endpoint``, no ``llm_endpoint`` ini key, no
``LLMSPEED_ENDPOINT``), the plugin registers its options, markers and fixtures and does nothing
else: no network, no heavy import.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from . import fixtures, settings
from .stash import CELL_KEY, RUN_KEY

if TYPE_CHECKING:
    from ..results import CellId
    from .session import LLMSpeedRun

MARKERS = (
    "llmspeed: an LLM serving speed test (pytest-llmspeed)",
    "prefill: a prefill cell (cold-cache prompt throughput and TTFT)",
    "decode: a sustained-decode cell (N requests in flight for a fixed window)",
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
    from ..gate.baseline import BaselineError

    if getattr(config.option, "numprocesses", None) or getattr(config.option, "dist", "no") != "no":
        raise pytest.UsageError(
            "pytest-llmspeed measures one cell at a time: two cells at once on one server give "
            "numbers that lie. Run without pytest-xdist (drop -n / --dist)."
        )
    from ..results import ResultsError
    from .session import LLMSpeedRun

    try:
        config.stash[RUN_KEY] = LLMSpeedRun(conf)
        from .progress import ProgressReporter

        config.pluginmanager.register(ProgressReporter(config), "llmspeed-progress")
    except ResultsError as exc:
        raise pytest.UsageError(f"--llm-compare: {exc}") from None
    except BaselineError as exc:
        text = str(exc)
        if text.endswith("baseline file not found"):
            text += f". Create one with --llm-save-baseline={conf.baseline}"
        raise pytest.UsageError(f"--llm-baseline: {text}") from None


def _run(config: pytest.Config) -> LLMSpeedRun | None:
    return config.stash.get(RUN_KEY, None)


def pytest_sessionstart(session: pytest.Session) -> None:
    run = _run(session.config)
    if run is None or session.config.option.collectonly:
        return
    from ..core.errors import LLMSpeedError
    from .messages import describe

    try:
        run.start()
    except LLMSpeedError as exc:
        raise pytest.UsageError(run.redact(f"pytest-llmspeed: {describe(exc)}")) from None
    except ValueError as exc:
        raise pytest.UsageError(run.redact(f"pytest-llmspeed: {exc}")) from None


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    run = _run(session.config)
    if run is None:
        return
    if run.started and run.baseline is not None:
        interrupted = exitstatus == pytest.ExitCode.INTERRUPTED or bool(session.shouldstop)
        run.gate_warmups(remeasure=not interrupted)
        acc = run.accounting()
        failing = acc is not None and (
            any(c in acc.regressed for c in _warmup_cells(run))
            or (acc.not_run and run.settings.baseline_missing == "fail")
        )
        if failing and session.exitstatus in (
            pytest.ExitCode.OK,
            pytest.ExitCode.NO_TESTS_COLLECTED,
        ):
            session.exitstatus = pytest.ExitCode.TESTS_FAILED
    saved = run.save_baseline()
    if saved:
        run.notes.append(saved)
    if run.started:
        run.write_results()  # the notes of the session's end reach the file and the page
    run.stop()


def _warmup_cells(run: LLMSpeedRun) -> list[str]:
    """Cells gated at the session's end (no test of their own ran)."""
    from ..report.terminal import WARMUP_NOTE

    return [cid for cid, c in run.cells.items() if WARMUP_NOTE in c.notes]


@pytest.hookimpl(optionalhook=True)
def pytest_benchmark_update_machine_info(config: pytest.Config, machine_info: dict) -> None:
    """The server under test is the machine of an LLM speed test."""
    run = _run(config)
    if run is not None and run.started:
        info = run.run_info()
        machine_info["llm_server"] = {
            "endpoint": info.endpoint,
            "model": info.model,
            "engine": info.engine,
            "engine_version": info.engine_version,
            "max_model_len": info.max_model_len,
            "kv_capacity": info.kv_capacity,
            "kv_capacity_source": info.kv_capacity_source,
        }


def pytest_report_header(config: pytest.Config) -> list[str] | None:
    run = _run(config)
    return run.header() if run is not None else None


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    run = _run(metafunc.config)
    names = metafunc.fixturenames
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


_SUITE_MARKERS = re.compile(r"\b(decode|prefill|llmspeed)\b")
_FIXTURES = frozenset({"llm_cell", "llm_prefix", "llm_bench", "llm_server", "llm_concurrency"})


def suite_rule(config: pytest.Config, items: list[pytest.Item]) -> tuple[bool, str]:
    """Add the built-in suite? And the rule that decided, in words (shown after collection)."""
    run = _run(config)
    assert run is not None
    mode = run.settings.builtin_suite
    if mode != "auto":
        return (
            mode == "always",
            f"built-in suite {'added' if mode == 'always' else 'left out'} "
            f"(--llm-builtin-suite={mode})",
        )
    own = [i for i in items if _FIXTURES & set(getattr(i, "fixturenames", ()))]
    if own:
        return False, (
            f"built-in suite left out: {len(own)} test(s) of yours use the llm_* fixtures "
            "(--llm-builtin-suite=always adds it)"
        )
    if not items:
        return True, "built-in suite added: no test of yours was collected"
    markexpr = config.getoption("markexpr", "") or ""
    if _SUITE_MARKERS.search(markexpr):
        return True, f"built-in suite added: -m {markexpr!r} names its markers"
    if config.getoption(settings.OPTIONS[0].dest, None):
        return True, "built-in suite added: --llm-endpoint given on the command line"
    return False, (
        "built-in suite left out: the endpoint comes from the ini file or the environment and "
        "the command asks for no speed test (run with -m decode, -m llmspeed or "
        "--llm-builtin-suite=always)"
    )


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(
    session: pytest.Session, config: pytest.Config, items: list[pytest.Item]
) -> None:
    run = _run(config)
    if run is None:
        return
    add, run.suite_rule = suite_rule(config, items)
    if add:
        from . import suite

        module = pytest.Module.from_parent(session, path=Path(suite.__file__), nodeid="llmspeed")
        items.extend(session.genitems(module))
    for item in items:
        callspec = getattr(item, "callspec", None)
        if callspec is None or "llm_prefix" not in callspec.params:
            continue
        from ..core.matrix import MatrixError, normalize_context
        from ..results import CellId

        try:
            context = normalize_context(callspec.params["llm_prefix"])
        except MatrixError as exc:
            raise pytest.UsageError(f"{item.nodeid}: llm_prefix parameter: {exc}") from None
        if "llm_concurrency" in getattr(item, "fixturenames", ()):
            cid = CellId.decode(context, int(callspec.params.get("llm_concurrency", 1)))
        else:
            cid = CellId.prefill(context)
        item.stash[CELL_KEY] = cid
        skip = run.skip(cid)
        if skip:
            item.add_marker(pytest.mark.skip(reason=skip.reason))


def pytest_collection_finish(session: pytest.Session) -> None:
    run = _run(session.config)
    if run is None:
        return
    cells = [i.stash[CELL_KEY] for i in session.items if CELL_KEY in i.stash]
    run.selected = {str(c) for c in cells}
    run.node_cells = {i.nodeid: i.stash[CELL_KEY] for i in session.items if CELL_KEY in i.stash}
    if run.started and session.config.getoption("verbose") >= 0 and cells:
        from .progress import Progress

        run.progress = Progress(
            run.settings.duration, len(cells), early_end=run.settings.precision is not None
        )
        run.progress.plan = [(c, run.resolve(c.context), run.skip(c) is not None) for c in cells]


def pytest_report_collectionfinish(config: pytest.Config) -> list[str] | None:
    run = _run(config)
    return [f"llmspeed: {run.suite_rule}"] if run is not None and run.suite_rule else None


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    cid = item.stash.get(CELL_KEY, None)
    run = _run(item.config)
    excinfo = call.excinfo
    if cid is not None and run is not None and excinfo is not None and call.when == "setup":
        if excinfo.errisinstance(pytest.skip.Exception):
            _record_skip(run, item, cid, str(excinfo.value))
        elif str(cid) not in run.cells and run.started:
            _record_not_run(run, item, cid, str(excinfo.value))
    return (yield)


def _record_not_run(run: LLMSpeedRun, item: pytest.Item, cid: CellId, message: str) -> None:
    """A cell whose setup failed (its context's prefix was refused, the server stopped):
    not run, with the reason."""
    from ..core.records import unmeasured_record
    from ..results import Status

    reason = run.redact(message.removeprefix("Failed: ").strip().splitlines()[0] if message else "")
    record = unmeasured_record(cid, Status.NOT_RUN, reason, run.resolve(cid.context))
    run.record(record)
    item.user_properties.extend(record.properties())


def _record_skip(run: LLMSpeedRun, item: pytest.Item, cid: CellId, message: str) -> None:
    """A cell skipped before it ran: the arithmetic's status (or not run, with pytest's reason,
    when something else skipped it), recorded once and attached to the test."""
    from ..core.records import unmeasured_record
    from ..results import Status

    record = run.cells.get(str(cid))
    if record is None:
        skip = run.skip(cid)
        status, reason = (skip.status, skip.reason) if skip else (Status.NOT_RUN, message)
        record = unmeasured_record(cid, status, reason, run.resolve(cid.context))
        run.record(record)
    item.user_properties.extend(record.properties())


def pytest_terminal_summary(
    terminalreporter: pytest.TerminalReporter, exitstatus: int, config: pytest.Config
) -> None:
    run = _run(config)
    if run is None or not run.cells:
        return
    from ..report.markdown import summary
    from ..report.terminal import gate_lines, render

    width = config.get_terminal_writer().fullwidth
    terminalreporter.section("llmspeed")
    verbose = config.getoption("verbose") > 0
    cells = list(run.cells.values())
    for line in render(cells, width, verbose, run.notes):
        terminalreporter.write_line(run.redact(line))
    acc = run.accounting()
    if run.baseline is not None and acc is not None:
        missing_fails = run.settings.baseline_missing == "fail"
        for line in gate_lines(run.baseline.path, acc, missing_fails):
            terminalreporter.write_line(run.redact(line))
    comparison = run.comparison()
    if comparison is not None and run.settings.compare:
        from ..report.compare import lines as compare_lines

        for line in compare_lines(comparison, run.settings.compare):
            terminalreporter.write_line(run.redact(line))
    if run.settings.results:
        terminalreporter.write_line(f"results: {run.settings.results}")
    for output, path in run.settings.outputs:
        terminalreporter.write_line(f"{output.label}: {path}")
    step_summary = os.environ.get("GITHUB_STEP_SUMMARY")
    if step_summary:
        text = summary(f"LLM speed: {run.server_line or run.header()[0]}", cells, run.notes)
        if comparison is not None and run.settings.compare:
            from ..report.compare import markdown

            text += "\n" + markdown(comparison, run.settings.compare, "this run")
        with open(step_summary, "a", encoding="utf-8") as fh:
            fh.write(run.redact(text))
