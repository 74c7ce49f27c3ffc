"""Results files as series: read, ordered by time, grouped into runs of comparable settings, and
each cell's gated figures over the runs with their segments (docs/history.md).

A file's document is read through the results model's own schema check (``results.parse``),
and only what a history needs is taken from it: the run's identity and each cell's status and
gated figures with their intervals (building every record, ``results.load``, costs more than
the JSON itself: 1,000 files would take seconds more). No pytest, no output.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from .. import figures
from ..figures import Gate
from ..gate.baseline import COMPARABLE
from ..gate.judge import Judgement, Verdict
from ..results import (
    SCHEMA,
    Z95,
    CellId,
    Pair,
    Phase,
    ResultsError,
    RunInfo,
    Status,
    malformed,
    parse,
    text_of,
)
from .changes import find

#: what a run without the cell is, for a point of no value
MISSING = "missing"
#: the part of a results file's schema name a folder's files are recognised by
_MARK = SCHEMA.rsplit("/", 1)[0] + "/"


@dataclass(frozen=True)
class Run:
    """One results file: where it is, when it ran, on what, and its cells' gated figures."""

    path: str
    started: str
    engine: str | None
    engine_version: str | None
    metadata: Mapping[str, str]
    #: the settings that make runs comparable (gate/baseline.COMPARABLE), as the file says them
    settings: Mapping[str, Any]
    #: cell id → (its status's word, {figure key: (value, 95 % interval or None)})
    cells: Mapping[str, tuple[str, Mapping[str, tuple[float, Pair | None]]]]

    @property
    def key(self) -> str:
        return json.dumps(dict(self.settings), sort_keys=True, default=str)


def gated(phase: Phase | str) -> tuple[figures.Figure, ...]:
    """The figures a history follows for a cell of ``phase``: its floors, the figures the
    stored gate and ``compare`` judge."""
    return tuple(f for f in figures.of_phase(phase) if f.gate is Gate.FLOOR)


_GATED = {phase: gated(phase) for phase in Phase}
_MEASURED = frozenset(s for s in Status if s.measured)


@functools.lru_cache(maxsize=4096)
def _cell(text: str) -> tuple[str, tuple[figures.Figure, ...]]:
    """A cell id as the codec writes it, and the figures a history follows for it (the same
    few ids in every file of a history: parsed once)."""
    cid = CellId.parse(text)
    return str(cid), _GATED[cid.phase]


def read(path: str | os.PathLike[str], text: str | None = None) -> Run:
    """One results file as a :class:`Run`; ResultsError naming it when it cannot be read."""
    source = str(path)
    doc = parse(text_of(path) if text is None else text, source)
    try:
        info = RunInfo.from_v1(doc.get("run") or {})
        cells = {}
        for data in doc.get("cells") or ():
            cid, gated_here = _cell(str(data["id"]))
            status = Status(data["status"])
            found: dict[str, tuple[float, Pair | None]] = {}
            if status in _MEASURED:
                for f in gated_here:
                    value = data.get(f.key)
                    if isinstance(value, int | float) and math.isfinite(value) and value > 0:
                        ci = data.get(f.ci_key)
                        pair = (float(ci[0]), float(ci[1])) if ci else None
                        found[f.key] = (float(value), pair)
            cells[cid] = (status.value, found)
    except (KeyError, ValueError, TypeError, AttributeError, IndexError) as exc:
        raise malformed(source, exc) from None
    settings = {k: info.model if k == "model" else info.settings.get(k) for k in COMPARABLE}
    return Run(
        source, info.started, info.engine, info.engine_version, info.metadata, settings, cells
    )


def files(paths: Sequence[str | os.PathLike[str]]) -> list[tuple[Path, bool]]:
    """The files ``paths`` name, each with whether it was found in a folder: a file as it is,
    a folder's ``*.json`` under it (in order, each once). ResultsError when a path does not
    exist."""
    out: list[tuple[Path, bool]] = []
    seen: set[Path] = set()
    for given in paths:
        p = Path(given)
        if not p.exists():
            raise ResultsError(f"{p}: no such results file or folder")
        found = (
            [(f, True) for f in sorted(p.rglob("*.json")) if f.is_file()]
            if p.is_dir()
            else [(p, False)]
        )
        for f, in_folder in found:
            if f.resolve() not in seen:
                seen.add(f.resolve())
                out.append((f, in_folder))
    return out


def _read(item: tuple[Path, bool]) -> Run | None:
    """A file of :func:`files` as a run; None for a file of a folder that is not a results
    file (its text does not name the results schema: a pytest-benchmark file, a JUnit
    export). ResultsError saying what to do for a results file that cannot be read."""
    path, in_folder = item
    text = text_of(path)
    if in_folder and _MARK not in text:
        return None
    try:
        return read(path, text)
    except ResultsError as exc:
        what = " (or move it out of the folder)" if in_folder else ""
        raise ResultsError(f"{exc}: remove it{what} to read the others") from None


def _workers(files: int) -> int:
    """Processes to read ``files`` results files in: one per core this process may use (at
    most 8) from :data:`PARALLEL_FROM` files on, else 1 (parsing the JSON is most of a large
    history's time)."""
    if files < PARALLEL_FROM:
        return 1
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(1, min(cores or 1, 8))


#: from this many files on, they are read by several processes
PARALLEL_FROM = 200


def read_all(items: list[tuple[Path, bool]]) -> tuple[list[Run], int]:
    """The runs of :func:`files`' files, in their order, and how many were skipped as not
    results files; several processes for many files (one when they cannot be started)."""
    workers = _workers(len(items))
    found: list[Run | None] | None = None
    if workers > 1:
        from concurrent.futures import ProcessPoolExecutor
        from concurrent.futures.process import BrokenProcessPool

        try:
            with ProcessPoolExecutor(workers) as pool:
                found = list(pool.map(_read, items, chunksize=max(1, len(items) // (4 * workers))))
        except (OSError, BrokenProcessPool):  # no processes here: read them in this one
            found = None
    if found is None:
        found = [_read(item) for item in items]
    runs = [r for r in found if r is not None]
    return runs, len(found) - len(runs)


# -- the history of one figure -------------------------------------------------------------


class Point(NamedTuple):
    """One run's figure: its value and interval, or None with what the cell was instead
    (over capacity, failed, missing, ...). ``state`` is the cell's status word or
    :data:`MISSING`. (A tuple: a history of 1,000 runs makes some 100,000 of them.)"""

    run: int  # the run's index in its series
    value: float | None
    ci: Pair | None
    state: str


@dataclass(frozen=True)
class Segment:
    """Runs ``first`` … ``last`` (indices in the series, inclusive) at one level, of ``runs``
    measured points; what changed at its start against the run before it."""

    first: int
    last: int
    runs: int
    level: float
    low: float
    high: float
    engine_version: str | None
    #: (key, before, after): the engine, its version, each --llm-meta key that differs
    changed: tuple[tuple[str, str | None, str | None], ...] = ()
    #: when nothing changed at its start: what changed one measured run before or after it
    #: (a change point found one run early or late, the noise's doing), with the index of
    #: the run it changed at
    changed_near: tuple[tuple[int, str, str | None, str | None], ...] = ()


@dataclass(frozen=True)
class FigureHistory:
    """One cell's figure over a series of runs."""

    cell: str
    figure: str
    #: per run of the series: the figure (None: the cell had none), its interval, the cell's
    #: status word (:data:`MISSING`: not in that run)
    values: tuple[float | None, ...]
    intervals: tuple[Pair | None, ...]
    states: tuple[str, ...]
    segments: tuple[Segment, ...]
    #: the judge's verdict on each change: ``changes[i]`` from segment i to segment i + 1
    changes: tuple[Judgement, ...]
    #: the segment the newest is judged the same as, the one before its previous (the
    #: previous a dip or a rise that did not last); None otherwise
    back_to: int | None = None
    #: the judge's verdict of the newest segment against the one before its previous (None:
    #: fewer than three segments)
    against_earlier: Verdict | None = None

    @property
    def points(self) -> tuple[Point, ...]:
        return tuple(
            Point(i, v, ci, state)
            for i, (v, ci, state) in enumerate(
                zip(self.values, self.intervals, self.states, strict=True)
            )
        )

    @property
    def label(self) -> str:
        return figures.by_key(self.figure).label

    @property
    def newest(self) -> Judgement | None:
        """The verdict between the last two segments (None: one level throughout)."""
        return self.changes[-1] if self.changes else None

    def judged_good(self, segment: int) -> bool:
        """Was ``segment`` a good level: the first, or one whose start the judge did not call
        a regression?"""
        return segment == 0 or self.changes[segment - 1].verdict is not Verdict.REGRESSED

    @property
    def returned(self) -> bool:
        """The newest change undid the previous one (a fall after a rise, a rise after a
        fall) without going beyond the level before it — judged the same as that level
        (:attr:`back_to`), or too close to it to tell — and that level was itself good
        (:meth:`judged_good`): a fall back to a level that was a regression is a regression."""
        if self.newest is None or self.against_earlier is None or len(self.changes) < 2:
            return False
        newest, previous = self.newest.verdict, self.changes[-2].verdict
        undid = {newest, previous} == {Verdict.REGRESSED, Verdict.IMPROVED}
        earlier = len(self.segments) - 3
        return undid and self.against_earlier is not newest and self.judged_good(earlier)

    @property
    def regressed(self) -> bool:
        """The newest segment regressed, and not back to an earlier level (a fall after a
        rise regressed only when it is below the level before the rise too)."""
        return (
            not self.returned
            and self.newest is not None
            and self.newest.verdict is Verdict.REGRESSED
        )

    @property
    def improved(self) -> bool:
        return (
            not self.returned
            and self.newest is not None
            and self.newest.verdict is Verdict.IMPROVED
        )


@dataclass(frozen=True)
class Series:
    """Runs of comparable settings, in time order, and the history of each cell's figures."""

    settings: Mapping[str, Any]
    runs: tuple[Run, ...]
    figures: tuple[FigureHistory, ...] = ()


@dataclass(frozen=True)
class History:
    """Every series the files make, oldest first by their newest run; ``skipped``: files of
    a folder that are not results files."""

    series: tuple[Series, ...]
    tolerance: float
    skipped: int = 0
    files: int = 0

    @property
    def current(self) -> Series:
        """The series of the newest run: the one whose newest segments decide the exit."""
        return self.series[-1]

    def exit_status(self) -> int:
        """1 when the newest segment of some cell's figure regressed (in the series of the
        newest run) and is not back to an earlier level, else 0."""
        return 1 if any(f.regressed for f in self.current.figures) else 0


def build(
    paths: Sequence[str | os.PathLike[str]], tolerance: float = 0.05, window: int | None = None
) -> History:
    """The history of the results files ``paths`` name (files, folders)."""
    if not 0 < tolerance < 1:
        raise ResultsError(f"tolerance {tolerance} must be a fraction in (0, 1), e.g. 0.05")
    runs, skipped = read_all(files(paths))
    if not runs:
        where = ", ".join(str(p) for p in paths)
        raise ResultsError(
            f"{where}: no results files (written by --llm-results) found: give results files "
            "or folders that hold them"
        )
    return of_runs(runs, tolerance, window, skipped=skipped, files=len(runs))


def of_runs(
    runs: Iterable[Run],
    tolerance: float = 0.05,
    window: int | None = None,
    skipped: int = 0,
    files: int = 0,
) -> History:
    """The history of runs read already: ordered by start, grouped, each figure segmented."""
    ordered = sorted(runs, key=lambda r: (r.started, r.path))
    groups: dict[str, list[Run]] = {}
    for run in ordered:
        groups.setdefault(run.key, []).append(run)
    series = sorted(groups.values(), key=lambda g: (g[-1].started, g[-1].path))
    return History(
        tuple(_series(g, tolerance, window) for g in series),
        tolerance,
        skipped,
        files or len(ordered),
    )


def _series(runs: list[Run], tolerance: float, window: int | None) -> Series:
    order: dict[str, None] = {}
    for run in reversed(runs):  # the newest run's order of cells, then older cells
        order.update(dict.fromkeys(c for c in run.cells if c not in order))
    out = []
    for cid in sorted(order, key=_cell_order):
        phase = CellId.parse(cid).phase
        for f in _GATED[phase]:
            out.append(_figure(runs, cid, f.key, tolerance, window))
    return Series(runs[-1].settings, tuple(runs), tuple(out))


def _cell_order(cid: str) -> tuple[int, int, int]:
    """Prefill cells first, then decode, each by context and concurrency."""
    c = CellId.parse(cid)
    context = c.context if isinstance(c.context, int) else 1 << 62
    return (0 if c.phase is Phase.PREFILL else 1, context, c.concurrency or 0)


def _figure(
    runs: list[Run], cid: str, key: str, tolerance: float, window: int | None
) -> FigureHistory:
    n = len(runs)
    values: list[float | None] = [None] * n
    intervals: list[Pair | None] = [None] * n
    states = [MISSING] * n
    measured: list[int] = []
    for i, run in enumerate(runs):
        cell = run.cells.get(cid)
        if cell is None:
            continue
        states[i], found = cell
        figure = found.get(key)
        if figure is not None:
            values[i], intervals[i] = figure
            measured.append(i)
    history = FigureHistory(cid, key, tuple(values), tuple(intervals), tuple(states), (), ())
    if len(measured) < 2:
        return history
    kept = np.array([values[i] for i in measured], dtype=float)
    bounds = np.array(
        [(math.nan, math.nan) if (ci := intervals[i]) is None else ci for i in measured],
        dtype=float,
    )
    # each point's relative standard error, as results.relative_se reads an interval (NaN:
    # none, given the series' mean by the method)
    w2 = ((bounds[:, 1] - bounds[:, 0]) / 2 / kept / Z95) ** 2
    kwargs = {} if window is None else {"window": window}
    found_levels = find(kept, w2, tolerance, figures.gate_of(key) is Gate.FLOOR, **kwargs)
    segments = []
    for level in found_levels.segments:
        first, last = measured[level.start], measured[level.end - 1]
        before = runs[measured[level.start - 1]] if level.start > 0 else None
        near: list[tuple[int, str, str | None, str | None]] = []
        if before is not None and not _changed(before, runs[first]):
            if level.start + 1 < len(measured):  # one run later
                later = measured[level.start + 1]
                near += [(later, *c) for c in _changed(runs[first], runs[later])]
            if level.start >= 2:  # one run earlier
                earlier = measured[level.start - 1]
                near += [
                    (earlier, *c) for c in _changed(runs[measured[level.start - 2]], runs[earlier])
                ]
        segments.append(
            Segment(
                first,
                last,
                level.end - level.start,
                level.level,
                level.low,
                level.high,
                runs[first].engine_version,
                _changed(before, runs[first]) if before is not None else (),
                tuple(near),
            )
        )
    return dataclasses.replace(
        history,
        segments=tuple(segments),
        changes=found_levels.changes,
        back_to=found_levels.back_to,
        against_earlier=found_levels.against_earlier,
    )


def _changed(before: Run, after: Run) -> tuple[tuple[str, str | None, str | None], ...]:
    """What differs between the run before a segment and its first: the engine, its
    version, each --llm-meta key."""
    out = []
    for key, a, b in (
        ("engine", before.engine, after.engine),
        ("engine_version", before.engine_version, after.engine_version),
    ):
        if a != b:
            out.append((key, a, b))
    for key in sorted(set(before.metadata) | set(after.metadata)):
        a, b = before.metadata.get(key), after.metadata.get(key)
        if a != b:
            out.append((key, a, b))
    return tuple(out)
