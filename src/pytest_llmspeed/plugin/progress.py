"""Progress while a matrix runs: one line when a cell starts, one when it ends.

    [12/48] decode[32K-c8] · window 30 s · elapsed 6:12 · about 14 min left
    [12/48] decode[32K-c8] valid: 903.6 tok/s · 112.9 tok/s per request · TTFT 1,199 ms

Each line names the cell that runs. A test of yours names its cell only when it runs
(``llm_cell.decode(llm_prefix, 8)``, :func:`.selection.is_open`): its runner announces each
cell it starts (:meth:`Progress.announce`), the line of the one before is ended and the new
one's begun, under the test's one number; the cold prefill that warms its context first, when
it does, is shown as what it is:

    [1/1] prefill[4K] warm-up · cold prefill · elapsed 0:00 · about 3 s left
    [1/1] prefill[4K] warm-up: 367,496.9 prompt tok/s · TTFT 11 ms
    [1/1] decode[4K-c8] · window 1 s · elapsed 0:00 · about 3 s left
    [1/1] decode[4K-c8]: 15,112.3 tok/s · 1,889.0 tok/s per request · TTFT 13 ms (1 s)

A test run again (pytest-rerunfailures) keeps its number: ``[1/2] decode[1K-c1] (rerun 1)``.

Plain lines, no carriage return and no colour, so they read the same in a CI log as on a
terminal. ``-q`` silences them. In a log (no terminal) a cell is those two lines and nothing
between them: pytest's own progress for the cell — its location, the ``.`` of its result —
is left out (the end line says the outcome), its percentage goes at the end of the end line;
with ``-v``, pytest's line for the test (``llmspeed::test_decode[8K-c1] PASSED [ 66%]``) comes
between them, nothing else. The time left counts what the remaining cells will cost: a decode
cell its window plus the overhead the decode cells so far needed beyond their window (ramp-up,
idle wait, confirmations), a context not warmed yet its prefill at the prefill rate measured so
far; cells the arithmetic skips cost nothing.

On a terminal only (the terminal reporter writes to a TTY, ``TERM`` is not ``dumb``, no live
logging writes onto the same lines; not with ``-q``), a decode window also shows one live line,
rewritten in place about once a second after pytest's own ``llmspeed `` (carriage return,
cursor past it, erase to the end of the line; cut to the terminal's width) and erased before
pytest writes the test's result there:

    llmspeed [3/12] decode[8K-c16] · 12/30 s · 41,230 tokens · 3,512 tok/s now · 16 in flight
"""

from __future__ import annotations

import contextlib
import functools
import os
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import pytest

from ..core.text import printable

if TYPE_CHECKING:
    from collections.abc import Callable, Generator

    from ..core.protocol import DecodeTick
    from ..results import CellId, CellRecord

#: overhead of a decode cell beyond its window before one was measured (seconds)
FIRST_GUESS_OVERHEAD_S = 2.0


def clock(seconds: float) -> str:
    """``6:12``, ``1:02:03``."""
    s = int(seconds)
    h, m = divmod(s // 60, 60)
    return f"{h}:{m:02d}:{s % 60:02d}" if h else f"{m}:{s % 60:02d}"


def duration_words(seconds: float) -> str:
    """``40 s``, ``14 min``, ``1 h 05 min``."""
    if seconds < 90:
        return f"{max(seconds, 0):.0f} s"
    minutes = round(seconds / 60)
    if minutes < 60:
        return f"{minutes} min"
    return f"{minutes // 60} h {minutes % 60:02d} min"


@dataclass
class Progress:
    window_s: float
    total: int
    early_end: bool = False  # --llm-precision: a window may end before window_s
    started: float = field(default_factory=time.monotonic)
    done: int = 0
    #: the cells still to run, in order: (id, context tokens or None, skipped by arithmetic)
    plan: list[tuple[CellId, int | None, bool]] = field(default_factory=list)
    warmed: set[str] = field(default_factory=set)
    overheads: list[float] = field(default_factory=list)
    prefill_rates: list[float] = field(default_factory=list)
    _cell_started: float = 0.0
    #: with --llm-runs: which run, ``run 2/3 · ``
    run_label: str = ""
    #: the planned cells of the tests that name theirs when they run (a decode window each)
    open_cells: set[CellId] = field(default_factory=set)
    #: a trace cell → its replay's length in seconds (its span at --llm-trace-speed)
    replay_s: dict[CellId, float] = field(default_factory=dict)
    #: the running test's rerun (pytest-rerunfailures), 0 on its first run
    rerun: int = 0
    #: cells their first measurement did not decide, measured again after the others
    #: (--llm-budget with a baseline: plugin/pending.py)
    waiting: set[str] = field(default_factory=set)
    _last: str | None = None  # the node id of the test begun last
    #: told of each cell a test's runner starts (the reporter, while a test runs)
    on_cell: Callable[[CellId], None] | None = None

    def next_run(self, label: str, plan: list[tuple[CellId, int | None, bool]]) -> None:
        """--llm-runs: the matrix again, its cells counted from 1."""
        self.run_label, self.plan, self.done, self.warmed = label, list(plan), 0, set()
        self._last, self.rerun = None, 0

    @property
    def head(self) -> str:
        return f"[{self.run_label}{self.done}/{self.total}]"

    def begin(self, nodeid: str, planned: CellId) -> None:
        """A test of the plan starts: counted once, however often it is run again (a rerun
        starts the same test again, before any other)."""
        if nodeid == self._last:
            self.rerun += 1
            return
        self._last, self.rerun = nodeid, 0
        if self.plan and self.plan[0][0] == planned:
            self.plan.pop(0)
        self.done += 1

    def announce(self, cid: CellId) -> None:
        """The running test's runner starts ``cid`` (``CellRunner.decode`` / ``prefill``)."""
        if self.on_cell is not None:
            self.on_cell(cid)

    def name(self, cid: CellId, warmup: bool = False) -> str:
        """``[3/12] decode[8K-c16]``, ``[1/1] prefill[4K] warm-up``, ``… (rerun 1)``."""
        again = f" (rerun {self.rerun})" if self.rerun else ""
        return f"{self.head} {cid}{' warm-up' if warmup else ''}{again}"

    def left_s(self) -> float:
        """Seconds the remaining cells will take, by what the run has measured so far."""
        from ..results import Phase

        overhead = (
            sum(self.overheads) / len(self.overheads) if self.overheads else FIRST_GUESS_OVERHEAD_S
        )
        rate = sorted(self.prefill_rates)[len(self.prefill_rates) // 2] if self.prefill_rates else 0
        left = 0.0
        warmed = set(self.warmed)
        for cid, tokens, skipped in self.plan:
            if skipped:
                continue
            if cid.label not in warmed:
                warmed.add(cid.label)
                if rate and tokens:
                    left += tokens / rate
            if cid.phase in (Phase.DECODE, Phase.RATE) or cid in self.open_cells:
                left += self.window_s + overhead
            elif cid.phase is Phase.TRACE:
                left += self.replay_s.get(cid, 0.0) + overhead
        return left

    def start_line(self, cid: CellId, *, warmup: bool = False, measured: bool = False) -> str:
        """The line a cell starts with (the test begun with :meth:`begin`). ``warmup``: the
        cold prefill that warms the context of a test that names its cell when it runs (a
        decode window is likely to follow); ``measured``: a prefill cell measured before."""
        from ..results import Phase

        self._cell_started = time.monotonic()
        up_to = "≤" if self.early_end else ""
        if cid.phase is Phase.DECODE:
            what = f"window {up_to}{self.window_s:g} s"
        elif cid.phase is Phase.RATE:
            what = f"open loop, sending for {self.window_s:g} s"
        elif cid.phase is Phase.TRACE:
            span = self.replay_s.get(cid)
            what = "trace replayed at its times" + (
                f" ({duration_words(span)} of arrivals)" if span is not None else ""
            )
        elif cid.phase is Phase.CONVERSATION:
            what = f"{cid.concurrency} users in step through {cid.turns} turns"
        else:
            what = "measured when its prefix was warmed" if measured else "cold prefill"
        elapsed = clock(time.monotonic() - self.started)
        left = self.left_s() + (self.window_s if cid.phase is Phase.DECODE or warmup else 0.0)
        left += self.replay_s.get(cid, 0.0)
        return (
            f"{self.name(cid, warmup)} · {what} · elapsed {elapsed} · "
            f"about {duration_words(left)} left"
        )

    def no_cell_line(self, test: str) -> str:
        """A test of yours that ran no cell of its own (its context was warm, it failed before
        its runner started one)."""
        again = f" (rerun {self.rerun})" if self.rerun else ""
        return f"{self.head} {test}{again}: no cell ran"

    def live_line(self, cid: CellId, tick: DecodeTick) -> str:
        """``[3/12] decode[8K-c16] · 12/30 s · 41,230 tokens · 3,512 tok/s now · 16 in flight``"""
        return f"{self.head} {cid} · {self.live_figures(tick)}"

    @staticmethod
    def live_figures(tick: DecodeTick) -> str:
        """The live line without its cell (the start line above names it), for a narrow
        terminal: ``12/30 s · 41,230 tokens · 3,512 tok/s now · 16 in flight``"""
        return (
            f"{tick.elapsed_s:.0f}/{tick.window_s:g} s · {tick.tokens:,} tokens · "
            f"{tick.tok_s_now:,.0f} tok/s now · {tick.in_flight} in flight"
        )

    def end_line(self, cid: CellId, record: CellRecord | None, warmup: bool = False) -> str:
        from ..results import Phase, Status

        took = time.monotonic() - self._cell_started
        self.warmed.add(cid.label)
        # what the cell took, its waits and re-measurements included (not its window)
        spent = f" (took {took:.0f} s)"
        if record is not None and len(record.attempts) > 1:
            spent = f" (took {took:.0f} s, {len(record.attempts)} attempts)"
        head = self.name(cid, warmup)
        if record is None:
            return f"{head} not run"
        if record.phase is Phase.PREFILL and record.prompt_tok_s and record.ttft_ms:
            self.prefill_rates.append(record.prompt_tok_s)
        if record.phase is Phase.DECODE and record.measured:
            self.overheads.append(max(took - self.window_s * max(len(record.attempts), 1), 0.0))
        if not record.measured:
            reason, label = record.reason or "", record.status.label
            if reason.lower().startswith(label.lower()):
                return f"{head} {reason}"
            return f"{head} {label}: {reason}".rstrip(": ")
        status = "" if record.status is Status.VALID else f" {record.status.label}"
        if str(cid) in self.waiting:
            status = " (undecided: measured again after the others)"
        if record.phase.open_loop:
            sched = record.sched_ttft_ms
            return (
                f"{head}{status}: {record.open_completed}/{record.open_requests} requests · "
                + (f"TTFT {sched:,.0f} ms from the schedule · " if sched is not None else "")
                + f"{record.achieved_rate or 0:,.2f} req/s done{spent}"
            )
        if record.phase is Phase.CONVERSATION:
            later, hit = record.conv_ttft_ms, record.conv_hit_rate
            share = record.conv_expected_hit_share
            return (
                f"{head}{status}: {record.conv_turns} turns"
                + (f" · TTFT {later:,.0f} ms after the first" if later is not None else "")
                + (f" · prefix cache {hit:.0%}" if hit is not None else "")
                + (f" (should hit {share:.0%})" if share is not None else "")
                + spent
            )
        if record.phase is Phase.PREFILL:
            return (
                f"{head}{status}: {record.prompt_tok_s:,.1f} prompt tok/s · "
                f"TTFT {record.ttft_ms:,.0f} ms"
            )
        per = (
            f" · {record.per_request_tok_s:,.1f} tok/s per request"
            if record.per_request_tok_s
            else ""
        )
        ttft = f" · TTFT {record.ttft_ms:,.0f} ms" if record.ttft_ms is not None else ""
        return f"{head}{status}: {record.total_tok_s:,.1f} tok/s{per}{ttft}{spent}"


#: the live line's width is left at least this many columns, or it is not drawn
MIN_LIVE_WIDTH = 20


class ProgressReporter:
    """The plugin object that writes the lines (registered when the run is configured).

    ``pytest_runtest_logstart`` / ``logfinish`` run outside output capture (a test's setup and
    teardown run inside it), so the lines reach the terminal or the log as they happen. The
    live line is written during the test, so with capture suspended for each write (as live
    logging does), raw: pytest's count of the current line's width stays its own."""

    def __init__(self, config: pytest.Config):
        self.config = config
        self._live: bool | None = None  # decided at the first cell, when the terminal is set up
        self._log: bool | None = None  # no terminal: likewise
        self._shown: int | None = None  # the live line is drawn after this many columns
        self._fspath: bool | None = None  # pytest's showfspath while a cell runs in a log
        #: pytest's word for the running test when it did not pass (FAILED, ERROR, RERUN: its
        #: letter is left out in a log)
        self._outcome = ""
        self._nodeid = ""  # the running test of the plan
        self._cell: CellId | None = None  # the cell its open start line names
        self._warmup = False  # that line is the warm-up of a test that names its cell
        #: the record of that cell when its line began (the end line shows only a newer one)
        self._before: CellRecord | None = None

    def _live_wanted(self) -> bool:
        """A live line only on a terminal, where a carriage return rewrites a line."""
        reporter = self.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is None or not reporter.isatty or os.environ.get("TERM") == "dumb":
            return False
        try:  # live logging writes records onto the same lines
            log_cli = bool(self.config.getini("log_cli"))
        except ValueError:  # -p no:logging
            log_cli = False
        return not log_cli and self.config.getoption("log_cli_level", None) is None

    def _uncaptured(self) -> contextlib.AbstractContextManager[None]:
        """Output capture suspended: writes reach the terminal, which also answers its width."""
        capman = self.config.pluginmanager.get_plugin("capturemanager")
        return capman.global_and_fixture_disabled() if capman else contextlib.nullcontext()

    def _tick(self, progress: Progress, planned: CellId, tick: DecodeTick) -> None:
        tw = self.config.get_terminal_writer()
        with self._uncaptured():
            at = tw.width_of_current_line  # after pytest's "llmspeed " (the test's id with -v)
            room = tw.fullwidth - at - 1
            if room < MIN_LIVE_WIDTH:
                return
            line = progress.live_line(self._cell or planned, tick)
            if len(line) > room:  # the cell's name first (the start line above has it)
                line = progress.live_figures(tick)
            if len(line) > room:
                line = line[: room - 1] + "…"
            tw.write_raw(f"\r\x1b[{at}C{line}\x1b[K" if at else f"\r{line}\x1b[K", flush=True)
            self._shown = at

    def _erase(self) -> None:
        if self._shown is not None:
            at, self._shown = self._shown, None
            with self._uncaptured():
                self.config.get_terminal_writer().write_raw(
                    f"\r\x1b[{at}C\x1b[K" if at else "\r\x1b[K", flush=True
                )

    def _write(self, line: str) -> None:
        reporter = self.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            reporter.ensure_newline()
            reporter.write_line(_one_line(line))

    def _write_open(self, line: str) -> None:
        """A line left open for pytest to end (``currentfspath`` -2, as pytest marks a line of
        its own in progress): its next line, or the progress it puts at a line's end, starts
        there — no empty line, no line of its own for ``[100%]``."""
        reporter = self.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            reporter.ensure_newline()
            reporter.write(_one_line(line))
            reporter.currentfspath = -2

    def _in_log(self) -> bool:
        """Not a terminal: pytest's own progress for a cell would split its two lines."""
        if self._log is None:
            reporter = self.config.pluginmanager.get_plugin("terminalreporter")
            self._log = reporter is not None and not reporter.isatty
        return self._log

    def _run_and_cell(self, nodeid: str) -> tuple[Progress, CellId, dict[str, CellRecord]] | None:
        from .stash import RUN_KEY

        run = self.config.stash.get(RUN_KEY, None)
        if run is None or run.progress is None:
            return None
        cid = run.selection.node_cells.get(nodeid) or run.selection.trace_cells.get(nodeid)
        return None if cid is None else (run.progress, cid, run.store.cells)

    def _is_open(self, nodeid: str) -> bool:
        """Does this test name its cell only when it runs (:func:`.selection.is_open`)?"""
        from .stash import RUN_KEY

        run = self.config.stash.get(RUN_KEY, None)
        return run is not None and nodeid in run.selection.open

    @pytest.hookimpl(tryfirst=True)  # before pytest writes the test's name
    def pytest_runtest_logstart(self, nodeid: str) -> None:
        found = self._run_and_cell(nodeid)
        if found:
            progress, planned, cells = found
            self._outcome, self._nodeid = "", nodeid
            progress.begin(nodeid, planned)
            line: str | None = None
            if not self._is_open(nodeid):
                line = progress.start_line(planned)
                self._cell, self._warmup, self._before = planned, False, None
            elif str(planned) not in cells:  # its context is cold: the warm-up runs first
                line = progress.start_line(planned, warmup=True)
                self._cell, self._warmup, self._before = planned, True, None
            else:  # the cell is named when its runner starts it
                self._cell, self._warmup, self._before = None, False, cells.get(str(planned))
            progress.on_cell = functools.partial(self._announced, progress, cells)
            if not self._in_log():
                if line is not None:
                    self._write(line)
            elif self.config.get_verbosity() > 0:
                # -v: pytest's line for the test ends this one and follows it
                if line is not None:
                    self._write_open(line)
            else:
                if line is not None:
                    self._write(line)
                reporter = self.config.pluginmanager.get_plugin("terminalreporter")
                if reporter is not None:  # its line of dots: not for this cell
                    self._fspath, reporter.showfspath = reporter.showfspath, False
            if self._live is None:
                self._live = self._live_wanted()
            if self._live:
                self._set_on_tick(functools.partial(self._tick, progress, planned))

    def _announced(self, progress: Progress, cells: dict[str, CellRecord], cid: CellId) -> None:
        """The running test's runner starts ``cid``: the line of the cell shown so far is
        ended (a warm-up, or a cell the test did not run after all) and ``cid``'s begun, under
        the same number. The cell already shown (the built-in suite's): nothing to say."""
        from ..results import Phase

        if cid == self._cell:
            self._warmup = False  # the warm-up is the test's own prefill cell
            return
        lines = []
        if self._cell is not None:
            lines.append(progress.end_line(self._cell, self._fresh(cells), self._warmup))
        measured = cid.phase is Phase.PREFILL and str(cid) in cells
        lines.append(progress.start_line(cid, measured=measured))
        self._cell, self._warmup, self._before = cid, False, cells.get(str(cid))
        self._write_between(lines)

    def _fresh(self, cells: dict[str, CellRecord]) -> CellRecord | None:
        """The shown cell's record, if it was recorded since its line began."""
        record = None if self._cell is None else cells.get(str(self._cell))
        return None if record is self._before else record

    def _write_between(self, lines: list[str]) -> None:
        """Lines written while the test runs (inside output capture): in a log as the cell's
        lines are (with -v the last left open for pytest's line of the test); on a terminal
        each on a line of its own in place of pytest's location (erased where the live line
        may be drawn), then the location again for the test's letter."""
        reporter = self.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is None:
            return
        self._erase()  # the live line of a window the test ran before
        verbose = self.config.get_verbosity() > 0
        with self._uncaptured():
            if self._live and reporter.currentfspath:  # pytest's location: written again
                self.config.get_terminal_writer().write_raw("\r\x1b[K", flush=True)
                reporter.currentfspath = None
            for line in lines[:-1]:
                self._write(line)
            if self._in_log() and verbose:
                self._write_open(lines[-1])
                return
            self._write(lines[-1])
            if not self._in_log() and not verbose and reporter.showfspath:
                reporter.write_fspath_result(self._nodeid, "")

    @pytest.hookimpl(wrapper=True)
    def pytest_report_teststatus(
        self, report: pytest.TestReport
    ) -> Generator[None, tuple[str, str, str], tuple[str, str, str]]:
        """In a log, a cell's result without pytest's letter (``.``, ``F``): its end line says
        it. The word (``PASSED``) stays, for ``-v`` and the short test summary."""
        status = yield
        if (
            self._log
            and status[1]
            and self.config.get_verbosity() <= 0
            and self._run_and_cell(report.nodeid) is not None
        ):
            return (status[0], "", status[2])
        return status

    @pytest.hookimpl(tryfirst=True)  # before pytest writes the result where the line was
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self._erase()
        if report.outcome == "rerun":  # type: ignore[comparison-overlap]  # rerunfailures
            self._outcome = "RERUN"
        elif report.failed and not self._outcome:
            self._outcome = "FAILED" if report.when == "call" else "ERROR"

    def pytest_keyboard_interrupt(self) -> None:
        self._erase()

    def pytest_runtest_logfinish(self, nodeid: str) -> None:
        found = self._run_and_cell(nodeid)
        if found:
            self._erase()
            self._set_on_tick(None)
            progress, planned, cells = found
            progress.on_cell = None
            if self._cell is None:  # no cell shown: one recorded for the test all the same
                record = cells.get(str(planned))  # (its setup failed), or none ran
                if record is not None and record is not self._before:
                    line = progress.end_line(planned, record)
                else:
                    line = progress.no_cell_line(nodeid.rpartition("::")[2])
            elif self._cell == planned and not self._warmup:  # the test's own cell
                record = cells.get(str(planned))
                line = progress.end_line(planned, record)
            else:
                record = self._fresh(cells)
                line = progress.end_line(self._cell, record, self._warmup)
            self._cell = None
            if not self._in_log():
                self._write(line)
                return
            reporter = self.config.pluginmanager.get_plugin("terminalreporter")
            if self._fspath is not None and reporter is not None:
                reporter.showfspath, self._fspath = self._fspath, None
            from ..results import Status

            quiet = self.config.get_verbosity() <= 0  # pytest's F left out of the log
            if quiet and self._outcome and (record is None or record.status is Status.VALID):
                line += f" · test {self._outcome}"
            self._write_open(line)

    def pytest_sessionfinish(self) -> None:
        """pytest ends the last line with its own at the session's end (after its ``[100%]``):
        no line is open for it to end again with an empty one."""
        reporter = self.config.pluginmanager.get_plugin("terminalreporter")
        if self._log and reporter is not None and reporter.currentfspath == -2:
            reporter.currentfspath = None

    def _set_on_tick(self, on_tick: Callable[[DecodeTick], None] | None) -> None:
        from .stash import RUN_KEY

        run = self.config.stash.get(RUN_KEY, None)
        if run is not None:
            run.watch(on_tick)


def _one_line(line: str) -> str:
    """A progress line as one line, made safe (a cell's reason may quote a server)."""
    return printable(line).replace("\n", " ⏎ ")
