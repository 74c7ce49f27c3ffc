"""One pytest session's benchmark run, in ``config.stash``: its parts, each owning its state.

- ``server`` (:mod:`.server`): the server's lifecycle and what the probe found;
- ``store`` (:mod:`.store`): the cells' records, the notes, the files written from them;
- ``gate`` (:mod:`.gating`): the baseline, the warm-ups gated at the end, the accounting;
- ``selection`` (:mod:`.selection`): the built-in suite's rule, the selected cells.

Created at configure time (no network, no heavy import); the server is started only once
collection shows that a selected test needs it (or when a test first asks for it).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..core.errors import LLMSpeedError
from .gating import GateSession
from .selection import Selection
from .server import ServerUnderTest, public_url
from .store import CellStore

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from ..core.client import StreamRecord
    from ..core.protocol import DecodeResult, DecodeTick, PrefillResult
    from ..core.request_log import RequestLog
    from ..results import CellId
    from .ab import ABRun
    from .progress import Progress
    from .settings import Settings

__all__ = ["LLMSpeedRun", "public_url"]


class LLMSpeedRun:
    """One pytest session's benchmark run: the four parts and the progress shown."""

    def __init__(self, settings: Settings):
        self.settings = settings
        self.server = ServerUnderTest(settings)
        self.store = CellStore(settings, self.server)  # ResultsError: bad --llm-compare
        self.selection = Selection(settings)
        self.gate = GateSession(settings, self.server, self.store, self.selection)
        self.progress: Progress | None = None  # the cells' start and end lines
        #: the cells the progress lines plan for, as at the first run (--llm-runs)
        self.plan: list[tuple[CellId, int | None, bool]] = []
        #: sees each decode window about once a second (the live line on a terminal)
        self.on_tick: Callable[[DecodeTick], None] | None = None
        #: pytest's record_testsuite_property, once a cell ran: the run's own JUnit properties
        self.suite_property: Callable[[str, object], None] | None = None
        #: --llm-requests: one row per request, appended as each cell ends (opened when the
        #: server starts: a run that measures nothing leaves no file)
        self.requests: RequestLog | None = None
        self._requests_said = False
        #: the A/B of two versions (--llm-serve-baseline, --llm-endpoint-baseline), or None
        self.ab: ABRun | None = None
        if settings.ab_kind is not None:
            from .ab import ABRun

            self.ab = ABRun(self)
            # the first round's version (its block drawn old new new old, or new old old new)
            self.server.settings = self.ab.arms[self.ab.ledger.arm(0)]

    def start(self) -> None:
        """Start the server, note what it found, check the baseline's settings against it,
        write the first results. Raises LLMSpeedError / ValueError."""
        self.server.start()
        self.store.note(*self.server.notes)
        if self.settings.requests and self.requests is None:
            from ..core.request_log import RequestLog

            self.requests = RequestLog(self.settings.requests)
        try:
            warning = self.gate.check_settings()
            self.gate.check_save()
        except (LLMSpeedError, ValueError):
            self.server.stop()
            raise
        if warning:
            self.store.note(warning)
        slo = self.gate.slo_note()
        if slo:
            self.store.note(slo)
        self.store.write()

    def start_or_say_why(self) -> str | None:
        """Start; when it cannot, the one line that says why (and the server is given up)."""
        from .messages import arm_option, describe

        flag = arm = None
        if self.ab is not None:  # the first round starts its version: say which failed
            arm = self.ab.ledger.arm(0)
            flag = arm_option(arm, bool(self.settings.serve_baseline))
        try:
            self.start()
        except LLMSpeedError as exc:
            why = describe(exc, flag or "--llm-endpoint")
        except ValueError as exc:
            why = str(exc)
        else:
            return None
        if flag is not None:
            why = f"the A/B's {arm} version ({flag}): {why}"
        return self.server.give_up(f"pytest-llmspeed: {why}")

    def stop(self) -> None:
        self.server.stop()
        if self.requests is not None:
            self.requests.close()

    def next_run(self, number: int) -> None:
        """--llm-runs: the previous run's cells added to the baseline, the server restarted
        (a fresh start), run ``number`` begun with no cells. Raises LLMSpeedError /
        ValueError when the restart fails."""
        for line in self.gate.save():
            self.store.note(line)
        self.server.restart()
        self.store.cells.clear()
        self.store.write()
        if self.progress is not None:
            self.progress.next_run(f"run {number}/{self.settings.runs} · ", self.plan)

    def warm(self, context: int | str) -> tuple[int, PrefillResult]:
        """The prefill cell at ``context``: the cold request that warms the shared prefix."""
        from ..core.records import prefill_record
        from ..results import CellId

        tokens, result, first = self.server.warm(context)
        # after a restart the server is warmed again; the prefill cell keeps its figure. One
        # recorded without figures (a test's setup failed before the warm-up) gets them now
        before = self.store.cells.get(str(CellId.prefill(context)))
        if first and (before is None or not before.status.measured):
            self.store.record(prefill_record(context, result))
        return tokens, result

    def log_requests(
        self,
        cid: CellId,
        records: Sequence[StreamRecord],
        due: Sequence[float] | None = None,
        window: tuple[float, float] | None = None,
    ) -> None:
        """A measured cell's requests into --llm-requests (a file that stopped or reached its
        cap says so once, in the run's notes)."""
        if self.requests is None:
            return
        from ..core.request_log import cell_rows

        tags = {}
        if self.ab is not None and self.ab.ledger.rounds:  # which version, which round
            last = self.ab.ledger.rounds[-1]
            tags = {"arm": last.arm, "round": last.index + 1}
        self.requests.cell(cell_rows(str(cid), records, due, tags, window))
        note = self.requests.note()
        if note and not self._requests_said:
            self._requests_said = True
            self.store.note(self.redact(note))

    def decode(self, tokens: int, concurrency: int) -> DecodeResult:
        """A decode cell's measurement, shown live to whoever watches."""
        return self.server.decode(tokens, concurrency, self.on_tick)

    def show_progress(self, progress: Progress | None) -> None:
        self.progress = progress
        if progress is not None:
            self.plan = list(progress.plan)
            if self.settings.runs > 1:
                progress.run_label = f"run 1/{self.settings.runs} · "

    def watch(self, on_tick: Callable[[DecodeTick], None] | None) -> None:
        self.on_tick = on_tick

    def redact(self, text: str) -> str:
        return self.server.redact(text)
