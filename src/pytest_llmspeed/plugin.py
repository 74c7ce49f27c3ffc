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
from .state import CELL_KEY, RUN_KEY

if TYPE_CHECKING:
    from .run import LLMSpeedRun

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
    from .baseline import BaselineError

    if getattr(config.option, "numprocesses", None) or getattr(config.option, "dist", "no") != "no":
        raise pytest.UsageError(
            "pytest-llmspeed measures one cell at a time: two cells at once on one server give "
            "numbers that lie. Run without pytest-xdist (drop -n / --dist)."
        )
    from .run import LLMSpeedRun

    try:
        config.stash[RUN_KEY] = LLMSpeedRun(conf)
    except BaselineError as exc:
        raise pytest.UsageError(f"--llm-baseline: {exc}") from None


def _run(config: pytest.Config) -> LLMSpeedRun | None:
    return config.stash.get(RUN_KEY, None)


def pytest_sessionstart(session: pytest.Session) -> None:
    run = _run(session.config)
    if run is None or session.config.option.collectonly:
        return
    from .client import LLMSpeedError

    try:
        run.start()
    except (LLMSpeedError, ValueError) as exc:
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
        meta = run.metadata()
        machine_info["llm_server"] = {
            k: meta[k]
            for k in (
                "endpoint",
                "model",
                "engine",
                "engine_version",
                "max_model_len",
                "kv_capacity",
                "kv_capacity_source",
            )
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
    from .matrix import cell_id

    conf = run.settings
    if "llm_concurrency" in names:
        if any(
            m.name == "parametrize" and "llm_concurrency" in str(m.args[0])
            for m in metafunc.definition.iter_markers()
        ):
            metafunc.parametrize(
                "llm_prefix", conf.contexts, indirect=True, ids=[cell_id(c) for c in conf.contexts]
            )
            return
        combos = [(c, n) for c in conf.contexts for n in conf.concurrency]
        metafunc.parametrize(
            ("llm_prefix", "llm_concurrency"),
            combos,
            indirect=True,
            ids=[cell_id(c, n) for c, n in combos],
        )
    else:
        metafunc.parametrize(
            "llm_prefix",
            conf.prefill_contexts,
            indirect=True,
            ids=[cell_id(c) for c in conf.prefill_contexts],
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
        from .matrix import MatrixError, normalize_context

        try:
            param = normalize_context(callspec.params["llm_prefix"])
        except MatrixError as exc:
            raise pytest.UsageError(f"{item.nodeid}: llm_prefix parameter: {exc}") from None
        concurrency = callspec.params.get("llm_concurrency")
        phase = "decode" if "llm_concurrency" in getattr(item, "fixturenames", ()) else "prefill"
        item.stash[CELL_KEY] = (phase, param, concurrency)
        reason = run.skip_reason(phase, param, concurrency)
        if reason:
            item.add_marker(pytest.mark.skip(reason=reason))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    cell = item.stash.get(CELL_KEY, None)
    run = _run(item.config)
    excinfo = call.excinfo
    if (
        cell is not None
        and run is not None
        and excinfo is not None
        and call.when == "setup"
        and excinfo.errisinstance(pytest.skip.Exception)
    ):
        _record_skip(run, item, cell, str(excinfo.value))
    return (yield)


def _record_skip(
    run: LLMSpeedRun, item: pytest.Item, cell: tuple[str, int | str, int | None], reason: str
) -> None:
    from .report import records as R

    phase, param, concurrency = cell
    if reason.startswith("Over capacity"):
        status = R.OVER_CAPACITY
    elif reason.startswith("exceeds max_model_len"):
        status = R.TOO_LONG
    else:
        status = R.SKIPPED
    tokens = run.bench.resolve(param) if run.bench is not None else None
    rec = R.skipped_record(phase, param, concurrency, status, reason, tokens)
    if rec["id"] not in run.cells:
        run.record(rec)
    item.user_properties.extend(R.properties(rec))


def baseline_lines(run: LLMSpeedRun) -> list[str]:
    """The gate's summary: regressions, improvements, cells not measured or without floor."""
    if run.baseline is None:
        return []
    from .report import records as R

    measured = {cid for cid, c in run.cells.items() if c["status"] in (R.VALID, R.FAILED)}
    not_measured = [
        f"{cid} ({run.cells[cid]['status']})" if cid in run.cells else cid
        for cid in run.baseline.cells
        if cid not in measured
    ]
    lines = [
        "",
        f"Baseline {run.baseline.path}: {len(run.regressions)} regression(s), "
        f"{len(run.improvements)} improvement(s) beyond tolerance",
    ]
    lines += [f"  REGRESSION  {c.message()}" for c in run.regressions]
    for c in run.improvements:
        delta = f"{c.value / c.reference - 1:+.1%}".replace("-", "−")
        lines.append(
            f"  improvement {c.cell} {c.metric} {c.value:,.1f} vs baseline {c.reference:,.1f}: "
            f"{delta}"
        )
    if not_measured:
        lines.append("  not measured: " + ", ".join(not_measured))
    if run.no_floor:
        lines.append("  no floor (not in the baseline): " + ", ".join(run.no_floor))
    return lines


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    run = _run(config)
    if run is None or not run.cells:
        return
    from .report.terminal import render

    width = terminalreporter._tw.fullwidth
    terminalreporter.section("llmspeed")
    verbose = config.getoption("verbose") > 0
    cells = list(run.cells.values())
    for line in render(cells, width, verbose, run.notes):
        terminalreporter.write_line(run.redact(line))
    for line in baseline_lines(run):
        terminalreporter.write_line(line)
    if run.settings.results:
        terminalreporter.write_line(f"results: {run.settings.results}")
    step_summary = os.environ.get("GITHUB_STEP_SUMMARY")
    if step_summary:
        from .report.markdown import summary

        server = run.header()[0].removeprefix("llmspeed server: ")
        text = summary(
            f"LLM speed: {server}",
            cells,
            [c.message() for c in run.regressions],
            run.notes,
        )
        with open(step_summary, "a", encoding="utf-8") as fh:
            fh.write(run.redact(text))
