"""The ``pytest11`` entry point: hooks only; the work is delegated.

Installed but not asked for (no ``--llm-endpoint``, no ``llm_endpoint`` ini key, no
``LLMSPEED_ENDPOINT``), the plugin registers its options, markers and fixtures and does nothing
else: no network, no heavy import.
"""

from __future__ import annotations

import os
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
    from .session import LLMSpeedRun

    try:
        config.stash[RUN_KEY] = LLMSpeedRun(conf)
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


def pytest_sessionfinish(session: pytest.Session) -> None:
    run = _run(session.config)
    if run is not None:
        saved = run.save_baseline()
        if saved:
            run.notes.append(saved)
        run.stop()


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


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(
    session: pytest.Session, config: pytest.Config, items: list[pytest.Item]
) -> None:
    run = _run(config)
    if run is None:
        return
    mode = run.settings.builtin_suite
    if mode == "always" or (mode == "auto" and not items):
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


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    cid = item.stash.get(CELL_KEY, None)
    run = _run(item.config)
    excinfo = call.excinfo
    if (
        cid is not None
        and run is not None
        and excinfo is not None
        and call.when == "setup"
        and excinfo.errisinstance(pytest.skip.Exception)
    ):
        _record_skip(run, item, cid, str(excinfo.value))
    return (yield)


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
    if run.baseline is not None:
        for line in gate_lines(run.baseline, cells):
            terminalreporter.write_line(line)
    if run.settings.results:
        terminalreporter.write_line(f"results: {run.settings.results}")
    step_summary = os.environ.get("GITHUB_STEP_SUMMARY")
    if step_summary:
        server = run.header()[0].removeprefix("llmspeed server: ")
        text = summary(f"LLM speed: {server}", cells, run.notes)
        with open(step_summary, "a", encoding="utf-8") as fh:
            fh.write(run.redact(text))
