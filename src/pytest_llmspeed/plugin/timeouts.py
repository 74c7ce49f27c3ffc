"""Cells under pytest-timeout: a cell cut by its timeout stops, is recorded as cut, and leaves
nothing running for the next test (docs/design.md, "A cell cut from outside").

pytest-timeout's own timer cannot stop a cell cleanly. Its signal method raises from a signal
handler wherever the main thread is: inside one of the cell's stream tasks the exception only
ends that task (asyncio keeps a BaseException other than KeyboardInterrupt and SystemExit as
the task's result), so the cell went on and *passed*; out of the event loop it left the
streams pending, and the next cell's run of the loop resumed them. Its thread method ends the
process. So for a test that needs the server the plugin takes the timer over
(``pytest_timeout_set_timer`` is firstresult): the cell's runs get a deadline
(``Bench.deadline``) at which they are cancelled and their streams closed (CellCut), and
pytest-timeout's own timer still runs, GRACE_S later, for a test stuck outside the cell's loop.
"""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING, Any

import pytest

from .selection import needs_server

if TYPE_CHECKING:
    from .session import LLMSpeedRun

#: pytest-timeout's own timer, as a fallback, this long after the cell's deadline
GRACE_S = 5.0


def cut_words(limit: float) -> str:
    return f"cut after {limit:g} s by pytest-timeout"


def item_timeout(item: pytest.Item) -> float | None:
    """The timeout pytest-timeout gives ``item`` (its marker, --timeout, PYTEST_TIMEOUT, the
    ini), in seconds; None for none or 0."""
    marker = item.get_closest_marker("timeout")
    value: Any = None
    if marker is not None:
        value = marker.args[0] if marker.args else marker.kwargs.get("timeout")
    if value is None:
        config = item.config
        value = config.getoption("timeout", None)
        if value is None:
            value = os.environ.get("PYTEST_TIMEOUT") or config.getini("timeout") or None
    try:
        seconds = float(value) if value is not None else None
    except (TypeError, ValueError):
        return None  # pytest-timeout says what is wrong with it
    return seconds if seconds else None


def short_timeouts(items: list[pytest.Item], window: float) -> str | None:
    """One line when a selected decode cell's timeout is shorter than its window (it will be
    cut before it measures anything): both figures and what to change; else None."""
    from .stash import CELL_KEY

    short: dict[float, list[str]] = {}
    for item in items:
        cid = item.stash.get(CELL_KEY, None)
        seconds = item_timeout(item)
        if seconds is None or not needs_server(item):
            continue
        # a user's own test may run a decode cell at a prefill id (its concurrency is known
        # only when it runs): any test with llm_cell but the prefill marker
        uses_cell = "llm_cell" in getattr(item, "fixturenames", ())
        is_decode = (cid is not None and cid.concurrency is not None) or (
            uses_cell and not item.get_closest_marker("prefill")
        )
        if is_decode and seconds <= window:
            named = str(cid) if cid is not None and cid.concurrency is not None else item.name
            short.setdefault(seconds, []).append(named)
    if not short:
        return None
    seconds = min(short)
    cells = [c for group in short.values() for c in group]
    shown = ", ".join(cells[:3]) + (f" and {len(cells) - 3} more" if len(cells) > 3 else "")
    return (
        f"llmspeed: pytest-timeout's {seconds:g} s is shorter than a decode cell's {window:g} s "
        f"window (--llm-duration): {shown} will be cut before the window ends; raise the "
        "timeout (--timeout, @pytest.mark.timeout) or shorten --llm-duration"
    )


class CellTimeouts:
    """pytest-timeout's timer for the tests that need the server (registered only when
    pytest-timeout is there)."""

    def __init__(self, run: LLMSpeedRun):
        self.run = run
        self.warning: str | None = None  # a timeout shorter than a decode cell's window

    @pytest.hookimpl(tryfirst=True)  # before the terminal reporter asks for the lines below
    def pytest_collection_finish(self, session: pytest.Session) -> None:
        if not session.config.option.collectonly:
            self.warning = short_timeouts(session.items, self.run.settings.duration)

    def pytest_report_collectionfinish(self) -> list[str] | None:
        return [self.warning] if self.warning else None

    @pytest.hookimpl(tryfirst=True, optionalhook=True)
    def pytest_timeout_set_timer(self, item: pytest.Item, settings: Any) -> bool | None:
        bench = self.run.server.bench
        if not needs_server(item) or bench is None:
            return None  # pytest-timeout's own timer
        import pytest_timeout  # type: ignore[import-untyped]

        if not settings.disable_debugger_detection and pytest_timeout.is_debugging():
            return None  # under a debugger pytest-timeout does nothing: nor do we
        bench.deadline = _deadline(settings.timeout)
        fallback = getattr(pytest_timeout, "pytest_timeout_set_timer", None)
        if fallback is not None:  # its own method, later: a test stuck outside the cell's loop
            fallback(item, settings._replace(timeout=settings.timeout + GRACE_S))
        return True

    @pytest.hookimpl(tryfirst=True, optionalhook=True)
    def pytest_timeout_cancel_timer(self, item: pytest.Item) -> None:
        bench = self.run.server.bench
        if bench is not None:
            bench.deadline = None
        # None: pytest-timeout's own cancels the fallback timer (item.cancel_timeout)


def _deadline(limit: float) -> Any:
    from ..core.bench import Deadline

    return Deadline(time.perf_counter() + limit, cut_words(limit))
