"""The cells of one session and the files written from them: the records (one per cell, a
later one of the same cell replacing it), the run's notes, and the results file with the
registered outputs (``report/outputs.py``), rewritten after every cell so a run that dies
keeps what it measured."""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as _dt
import functools
import platform
import sys
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import pytest

from .. import __version__
from ..core.text import printable, redact_known

if TYPE_CHECKING:
    from ..report.compare import Comparison
    from ..results import CellRecord, Results, RunInfo
    from .server import ServerUnderTest
    from .settings import Settings


class CellStore:
    """The records of the session's cells and what is written from them."""

    def __init__(self, settings: Settings, server: ServerUnderTest):
        self.settings = settings
        self._server = server  # read for what the run is (never written)
        self.cells: dict[str, CellRecord] = {}
        self.notes: list[str] = list(settings.notes)
        self.started_at = _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")
        self.earlier: Results | None = None  # --llm-compare: the run this one is compared with
        #: the A/B's rounds and verdicts (plugin/ab.py), written as the results' "ab" key
        self.ab: dict[str, Any] | None = None
        self.unwritten: set[str] = set()  # outputs that could not be written (said once)
        if settings.compare:
            from ..results import load

            self.earlier = load(settings.compare)  # ResultsError: not a results file

    def note(self, *texts: str) -> None:
        """Add notes for the whole run (each once; secrets and control characters out)."""
        for text in map(printable, texts):
            if text not in self.notes:
                self.notes.append(text)

    def record(self, rec: CellRecord) -> CellRecord:
        """Keep a cell's record (replacing an earlier one of the same cell; a decode cell with
        its verdict against --llm-slo) and rewrite the files; the record kept."""
        factory = self._server.factory
        self.note(*(factory.notes if factory else ()))
        from ..results import Phase

        if self.settings.slo and rec.id.phase is Phase.DECODE:
            from ..gate.slo import judge

            rec = dataclasses.replace(rec, slo=judge(rec, self.settings.slo).words())
        rec = _safe(rec)
        self.cells[str(rec.id)] = rec
        self.write()
        return rec

    def run_info(self) -> RunInfo:
        """What this run is, as the results model records it."""
        from ..results import RunInfo

        server, s = self._server, self.settings
        info, dialect, factory = server.info, server.dialect, server.factory
        return RunInfo(
            tool=f"pytest-llmspeed {__version__}",
            started=self.started_at,
            endpoint=server.public_endpoint,
            # the server's strings as it sent them, its key (if echoed) out: each output
            # shows them through core.text.for_person
            model=_known_out(info.model if info else s.model),
            engine=_known_out(info.engine if info else None),
            engine_version=_known_out(info.version if info else None),
            max_model_len=info.max_model_len if info else None,
            kv_capacity=info.kv_capacity if info else None,
            kv_capacity_source=info.kv_capacity_source if info else None,
            api=dialect.api if dialect else None,
            prompt_form=server.prompt_form,
            notes=tuple(self.notes),
            settings=s.public(),
            salt=factory.salt if factory else None,
            python=sys.version.split()[0],
            platform=platform.platform(),
            pytest=pytest.__version__,
            metadata={**server.machine, **server.engine_packages, **dict(s.meta)},
            launch_command=_known_out(
                s.launch_command or (s.serve_plan.shown if s.serve_plan else None)
            ),
            capacity=self.capacity(),
            rate_capacity=self.rate_capacity(),
        )

    def capacity(self) -> dict[str, dict[str, Any]]:
        """With --llm-slo: each decode context's capacity over the cells so far."""
        if not self.settings.slo:
            return {}
        from ..gate.slo import capacities

        found = capacities(self.cells.values(), self.settings.slo)
        return {k: c.to_dict() for k, c in found.items()}

    def rate_capacity(self) -> dict[str, dict[str, Any]]:
        """With --llm-slo: each context's capacity as an arrival rate over its rate cells so
        far (none without rate cells)."""
        if not self.settings.slo:
            return {}
        from ..gate.slo import rate_capacities

        found = rate_capacities(self.cells.values(), self.settings.slo)
        return {k: c.to_dict() for k, c in found.items()}

    def results(self) -> Results:
        from ..results import Results

        return Results(self.run_info(), tuple(self.cells.values()), self.ab)

    def write(self) -> None:
        """Rewrite the results file and the registered outputs asked for."""
        if not (self.settings.results or self.settings.outputs):
            return
        results = self.results()
        if self.settings.results:
            path = self.settings.results
            self._guarded(path, lambda: results.dump(path))
        if self.settings.outputs:
            comparison = self.comparison(results)
            for output, out in self.settings.outputs:
                self._guarded(out, functools.partial(output.write, results, comparison, out))

    def _guarded(self, path: str, write: Callable[[], None]) -> None:
        """Write one output; one that cannot be written (a full disk, a folder gone) is one
        note naming the path and the cause, once, and the run goes on: the other outputs are
        written, each cell keeps its verdict, and the terminal summary shows the figures."""
        try:
            write()
        except OSError as exc:
            if path not in self.unwritten:
                self.unwritten.add(path)
                self.note(
                    f"{path} could not be written ({exc.strerror or exc}): what was measured "
                    "is in this summary; free the space or give another path"
                )

    def comparison(self, results: Results | None = None) -> Comparison | None:
        """This run against the earlier one (--llm-compare), or None."""
        if self.earlier is None:
            return None
        from ..report.compare import compare

        return compare(self.earlier, results or self.results())


class ResultsLock:
    """The results file's lock for the run's lifetime: ``.NAME.lock`` beside it, held with
    ``flock`` (released when the process ends, however it ends). Two runs writing one results
    file after every cell would each replace the other's: the second is refused."""

    def __init__(self, path: str):
        import fcntl
        import os
        from pathlib import Path

        target = Path(path)
        self.path = target.parent / f".{target.name}.lock"
        self.fd: int | None = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(self.fd, 32, 0).decode("ascii", "replace").strip()
            os.close(self.fd)
            self.fd = None
            who = f" (pid {holder})" if holder.isdigit() else ""
            raise pytest.UsageError(
                f"--llm-results={path}: another run{who} is writing it: give this run another "
                "path, or wait for that one to end"
            ) from None
        os.ftruncate(self.fd, 0)
        os.pwrite(self.fd, str(os.getpid()).encode(), 0)

    def release(self) -> None:
        import os

        if self.fd is not None:
            with contextlib.suppress(OSError):
                self.path.unlink()
            os.close(self.fd)  # the lock goes with it
            self.fd = None


def _known_out(text: str | None) -> str | None:
    return None if text is None else redact_known(text)


def _safe(rec: CellRecord) -> CellRecord:
    """A record as it is kept: every known secret and control character out of its words
    (the reason, the notes, the flags' details, the failed requests' summary: a server's
    error echoed there may hold the key), before anything stores, prints or cuts them."""
    summary = rec.error_summary
    return dataclasses.replace(
        rec,
        reason=None if rec.reason is None else printable(rec.reason),
        notes=tuple(printable(n) for n in rec.notes),
        flags=tuple(dataclasses.replace(f, detail=printable(f.detail)) for f in rec.flags),
        error_summary=None if summary is None else _merged(summary),
    )


def _merged(summary: Mapping[str, int]) -> dict[str, int]:
    """Errors by kind, each kind's words made safe (two kinds that differed only by a secret
    are one)."""
    out: dict[str, int] = {}
    for kind, count in summary.items():
        safe = printable(kind)
        out[safe] = out.get(safe, 0) + count
    return out
