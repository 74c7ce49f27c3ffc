"""The baseline file: throughput floors and latency ceilings per cell, over one or more runs.

A baseline is a commented TOML file, written by the pytest layer's save option and read with
the standard library's ``tomllib``; people edit it by hand. No pytest import here.

A baseline of one run keeps, per figure, its value and its 95 % interval (``total_tok_s``,
``total_tok_s_ci``). A baseline of several runs keeps the runs too: the reference is their mean
(``total_tok_s``), beside each run's value (``total_tok_s_runs``) and interval
(``total_tok_s_runs_ci``, ``[]`` for a run without one); their spread is the between-start
noise the gate allows for (``noise.py``). :func:`save` writes a new file from one run's records,
or adds the run to the file already there when its settings match (:class:`BaselineMismatch`
otherwise).
"""

from __future__ import annotations

import datetime as _dt
import math
import os
import re
import tempfile
import tomllib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .. import figures
from ..figures import Gate
from ..results import CellId, CellRecord, ServerFigures, Status
from .noise import UNKNOWN, Pair, Spread, pooled_spread, t_quantile, within_se

#: run settings that make two runs comparable (a key a file lacks is not compared: files of
#: earlier versions have no "tools" nor "prompt_text")
COMPARABLE = (
    "model", "api", "prompt_form", "max_output", "duration_s", "prefill_repeats", "replicas",
    "tools", "prompt_text",
)  # fmt: skip
#: settings a run must share with a baseline's runs to be added to it: the comparable ones, and
#: the same server software (runs of another version are a change, not a restart)
SAME_RUNS = (*COMPARABLE, "engine", "engine_version")
DEFAULT_TOLERANCE = 0.05


def _gated() -> tuple[str, ...]:
    """The figures a baseline holds (floors, ceilings), in the order a cell writes them."""
    return tuple(f.key for f in figures.gated())


class BaselineError(ValueError):
    """A baseline file that cannot be used; the message names the file and the line."""


class BaselineMismatch(BaselineError):
    """A run that cannot be added to a baseline: its settings differ (one line naming them)."""


@dataclass(frozen=True)
class FigureRuns:
    """One figure of one cell over a baseline's runs: each run's value and 95 % interval."""

    values: tuple[float, ...]
    intervals: tuple[Pair | None, ...] = ()

    def __post_init__(self) -> None:
        if not self.intervals:
            object.__setattr__(self, "intervals", (None,) * len(self.values))
        if len(self.intervals) != len(self.values):
            raise ValueError("one interval (or None) per run")

    @property
    def count(self) -> int:
        return len(self.values)

    @property
    def mean(self) -> float:
        return sum(self.values) / len(self.values)

    def add(self, value: float, interval: Pair | None) -> FigureRuns:
        return FigureRuns((*self.values, value), (*self.intervals, interval))


@dataclass
class CellBaseline:
    id: str
    limits: dict[str, float]  # metric → reference value
    tolerance: float
    line: int
    intervals: dict[str, tuple[float, float]] = field(default_factory=dict)  # a run's 95 % CI
    #: metric → the runs behind the reference (a one-run file: its value and interval)
    runs: dict[str, FigureRuns] = field(default_factory=dict)
    #: metric → the figure's between-start spread, pooled over the baseline (set by load)
    spread: dict[str, Spread] = field(default_factory=dict)
    #: figures written commented out (latency ceilings not gated): kept when a run is added
    ungated: dict[str, FigureRuns] = field(default_factory=dict)
    #: the cell's own tolerance as written (None: the default)
    own_tolerance: float | None = None
    #: the server's own figures, the mean over ``server_runs`` runs (why a cell changed)
    server: ServerFigures | None = None
    server_runs: int = 0

    def figure_runs(self, metric: str) -> FigureRuns:
        """The runs behind a gated figure's reference (one run when the file gives no runs)."""
        found = self.runs.get(metric)
        if found is not None:
            return found
        return FigureRuns((self.limits[metric],), (self.intervals.get(metric),))

    def figure_spread(self, metric: str) -> Spread:
        return self.spread.get(metric, UNKNOWN)


@dataclass
class Baseline:
    path: Path
    run: dict[str, Any]
    tolerance: float
    cells: dict[str, CellBaseline] = field(default_factory=dict)
    #: metric → between-start spread pooled over the cells (unknown: every cell has one run)
    spread: dict[str, Spread] = field(default_factory=dict)
    #: [slo]: the objectives the capacities were measured at (--llm-slo), and each decode
    #: context's capacity at them (0: not even the smallest concurrency met them)
    objectives: str | None = None
    capacity: dict[str, int] = field(default_factory=dict)

    @property
    def runs(self) -> int:
        """How many runs the file was made of (1 for a file without ``runs``)."""
        runs = self.run.get("runs", 1)
        return runs if isinstance(runs, int) and runs >= 1 else 1

    @property
    def spread_unknown(self) -> bool:
        """No gated figure has runs enough to show the between-start spread."""
        return not any(s.known for s in self.spread.values())


def _line_of(text: str, needle: str, after: int = 0) -> int:
    lines = text.splitlines()
    for i in range(after, len(lines)):
        if needle in lines[i]:
            return i + 1
    return after + 1 if after else 1


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


def load(path: str | Path) -> Baseline:
    """Read and check a baseline file; every problem is a BaselineError naming file and line."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise BaselineError(f"{p}: baseline file not found") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise BaselineError(f"{p}: cannot read the baseline file: {exc}") from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise BaselineError(f"{p}: not valid TOML: {exc}") from None

    def err(line: int, what: str) -> BaselineError:
        return BaselineError(f"{p}, line {line}: {what}")

    unknown = set(data) - {"run", "defaults", "cells", "slo"}
    if unknown:
        key = sorted(unknown)[0]
        raise err(
            _line_of(text, key),
            f"unknown table or key {key!r} (expected run, defaults, cells, slo)",
        )
    tolerance = DEFAULT_TOLERANCE
    defaults = data.get("defaults", {})
    if "tolerance" in defaults:
        tolerance = _tolerance(defaults["tolerance"], err(_line_of(text, "tolerance"), ""))
    cells_table = data.get("cells", {})
    if not isinstance(cells_table, dict):
        raise err(_line_of(text, "cells"), "'cells' must be a table of cells")
    baseline = Baseline(p, dict(data.get("run", {})), tolerance)
    if "slo" in data:
        _slo(baseline, data["slo"], text, err)
    for cid, body in cells_table.items():
        header = _line_of(text, f'"{cid}"')
        try:
            CellId.parse(cid)
        except ValueError as exc:
            raise err(header, str(exc)) from None
        if not isinstance(body, dict):
            raise err(header, f"cell {cid} must be a table of figures")
        baseline.cells[cid] = _cell(cid, body, tolerance, header, text, err)
    _pool(baseline)
    return baseline


def _slo(baseline: Baseline, table: Any, text: str, err: Any) -> None:
    """[slo]: ``objectives`` as --llm-slo takes them, ``capacity`` a table of context → whole
    number of requests ≥ 0."""
    from .slo import SLOError, parse

    line = _line_of(text, "[slo]")
    if not isinstance(table, dict) or not isinstance(table.get("objectives"), str):
        raise err(line, '[slo] needs objectives = "..." (as --llm-slo takes them)')
    try:
        parse(table["objectives"])
    except SLOError as exc:
        raise err(
            _line_of(text, "objectives", line - 1),
            f"[slo] objectives = {table['objectives']!r}: {exc}",
        ) from None
    capacity = table.get("capacity", {})
    if not isinstance(capacity, dict):
        raise err(_line_of(text, "capacity", line - 1), "[slo] capacity must be a table")
    for context, n in capacity.items():
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise err(
                _line_of(text, "capacity", line - 1),
                f"[slo] capacity of {context!r} must be a whole number of requests (0: none)",
            )
    extra = set(table) - {"objectives", "capacity"}
    if extra:
        raise err(line, f"[slo]: unknown key {sorted(extra)[0]!r} (objectives, capacity)")
    baseline.objectives = table["objectives"]
    baseline.capacity = {str(k): int(v) for k, v in capacity.items()}


def _pool(baseline: Baseline) -> None:
    """The between-start spread of each gated figure, pooled over the cells, on the baseline
    and on each cell that has the figure."""
    for metric in _gated():
        with_runs = [c.runs[metric] for c in baseline.cells.values() if metric in c.runs]
        if with_runs:
            spread = pooled_spread(((r.values, r.intervals) for r in with_runs), baseline.runs)
            baseline.spread[metric] = spread
            for cell in baseline.cells.values():
                if metric in cell.runs:
                    cell.spread[metric] = spread


def baseline_of(
    runs: Sequence[Sequence[CellRecord]],
    tolerance: float = DEFAULT_TOLERANCE,
    path: str | Path = "<memory>",
) -> Baseline:
    """The baseline several runs' records make, in memory: what :func:`save` run by run and
    :func:`load` would give, without the file's rounding (benchmarks gate with it)."""
    measured: dict[str, dict[str, FigureRuns]] = {}
    for records in runs:
        for rec in records:
            if rec.status is not Status.VALID:
                continue
            cell = measured.setdefault(str(rec.id), {})
            for metric, one, gated in _record_figures(rec):
                if gated:
                    old = cell.get(metric)
                    value, ci = one.values[0], one.intervals[0]
                    cell[metric] = old.add(value, ci) if old else one
    baseline = Baseline(Path(path), {"runs": len(runs)}, tolerance)
    for cid, cell in measured.items():
        limits = {m: r.mean for m, r in cell.items()}
        baseline.cells[cid] = CellBaseline(cid, limits, tolerance, 0, {}, dict(cell))
    _pool(baseline)
    return baseline


def reference_of(
    records: Iterable[CellRecord],
    tolerance: float = DEFAULT_TOLERANCE,
    path: str | Path = "<memory>",
) -> Baseline:
    """The one-run baseline a run's measured records make, in memory, as
    ``--llm-save-baseline`` would write it and :func:`load` read it back: each cell's floors
    with their intervals, rounded as the file rounds them (values to the figure's digits,
    intervals outwards). What ``compare`` judges a later run against, so that it and the
    stored gate give the same verdicts. Every measured record counts (a failed one too:
    ``compare`` compares what both runs measured), where a saved file keeps the valid ones."""
    baseline = Baseline(Path(path), {"runs": 1}, tolerance)
    for rec in records:
        if not rec.measured:
            continue
        limits: dict[str, float] = {}
        intervals: dict[str, Pair] = {}
        for metric, one, gated in _record_figures(rec):
            if not gated:
                continue
            nd = figures.by_key(metric).digits
            limits[metric] = round(one.values[0], nd)
            ci = one.intervals[0]
            if ci is not None:
                intervals[metric] = _outwards(ci, nd)
        if limits:
            cid = str(rec.id)
            baseline.cells[cid] = CellBaseline(cid, limits, tolerance, 0, intervals)
    return baseline


def _interval(value: Any) -> Pair | None:
    """``[low, high]`` of two positive numbers, low ≤ high; None for anything else."""
    pair = value if isinstance(value, list) else []
    nums = [_number(v) for v in pair]
    if len(nums) != 2 or nums[0] is None or nums[1] is None or not 0 < nums[0] <= nums[1]:
        return None
    return (nums[0], nums[1])


def _intervals(items: list[Any]) -> list[Pair | None]:
    """Each run's interval; ``[]`` (a run without one) and a malformed item are None."""
    return [None if v == [] else _interval(v) for v in items]


def _split(key: str) -> tuple[str, str] | None:
    """``total_tok_s_runs_ci`` → (``total_tok_s``, ``_runs_ci``); None for no figure's key."""
    for suffix in ("_runs_ci", "_runs", "_ci", ""):
        if key.endswith(suffix) and key[: len(key) - len(suffix)] in _gated():
            return key[: len(key) - len(suffix)], suffix
    return None


def _cell(
    cid: str,
    body: Mapping[str, Any],
    tolerance: float,
    header: int,
    text: str,
    err: Any,
) -> CellBaseline:
    limits: dict[str, float] = {}
    intervals: dict[str, Pair] = {}
    server: ServerFigures | None = None
    server_runs = 0
    values: dict[str, tuple[float, ...]] = {}
    runs_ci: dict[str, tuple[Pair | None, ...]] = {}
    lines: dict[str, int] = {}
    own: float | None = None
    for key, value in body.items():
        line = _line_of(text, key, header)
        if key == "tolerance":
            own = _tolerance(value, err(line, ""))
            continue
        if key == "server" and isinstance(value, Mapping):  # [cells."ID".server]
            numbers = {k: v for k, v in value.items() if isinstance(v, int | float)}
            server_runs = int(numbers.pop("runs", 1))
            server = ServerFigures.from_dict(numbers)
            continue
        parts = _split(key)
        if parts is None:
            raise err(
                line,
                f"unknown figure {key!r} in {cid} (expected one of {', '.join(_gated())}, their "
                "_ci intervals, _runs and _runs_ci, tolerance)",
            )
        metric, suffix = parts
        lines[key] = line
        if suffix == "":
            number = _number(value)
            if number is None or number <= 0:
                raise err(line, f"{cid} {key} = {value!r} is not a positive number")
            limits[key] = number
        elif suffix == "_ci":
            pair = _interval(value)
            if pair is None:
                raise err(
                    line,
                    f"{cid} {key} = {value!r} must be an interval [low, high] of two positive "
                    "numbers, low ≤ high",
                )
            intervals[metric] = pair
        elif suffix == "_runs":
            nums = [_number(v) for v in value] if isinstance(value, list) else []
            if not nums or any(n is None or n <= 0 for n in nums):
                raise err(
                    line, f"{cid} {key} = {value!r} must be a list of positive numbers, one a run"
                )
            values[metric] = tuple(n for n in nums if n is not None)
        else:
            items = value if isinstance(value, list) else None
            pairs = _intervals(items or [])
            if items is None or any(
                p is None and v != [] for p, v in zip(pairs, items, strict=True)
            ):
                raise err(
                    line,
                    f"{cid} {key} = {value!r} must be a list of intervals [low, high] (two "
                    "positive numbers, low ≤ high), [] for a run without one",
                )
            runs_ci[metric] = tuple(pairs)
    runs: dict[str, FigureRuns] = {}
    for metric, reference in limits.items():
        if metric in values:
            cis = runs_ci.get(metric, ())
            if cis and len(cis) != len(values[metric]):
                raise err(
                    lines[f"{metric}_runs_ci"],
                    f"{cid} {metric}_runs_ci has {len(cis)} interval(s) for "
                    f"{len(values[metric])} run(s) in {metric}_runs",
                )
            runs[metric] = FigureRuns(values[metric], cis)
        else:
            runs[metric] = FigureRuns((reference,), (intervals.get(metric),))
    intervals = {k: v for k, v in intervals.items() if k in limits and k not in values}
    return CellBaseline(
        cid,
        limits,
        tolerance if own is None else own,
        header,
        intervals,
        runs,
        ungated=_commented(text, header, limits),
        own_tolerance=own,
        server=server,
        server_runs=server_runs,
    )


_COMMENTED = re.compile(r"^#\s*([a-z_]+)\s*=\s*(.+)$")


def _commented(text: str, header: int, gated: Iterable[str]) -> dict[str, FigureRuns]:
    """Figures written commented out in a cell's table (``# ttft_ms = 2.1``, its ``_ci``,
    ``_runs``, ``_runs_ci``): not gated, but kept when a run is added. A comment that does not
    read as a figure is left alone."""
    found: dict[str, dict[str, Any]] = {}
    for line in text.splitlines()[header:]:
        stripped = line.strip()
        if stripped.startswith("["):
            break
        m = _COMMENTED.match(stripped)
        parts = _split(m.group(1)) if m else None
        if m is None or parts is None or parts[0] in gated:
            continue
        try:
            value = tomllib.loads(f"v = {m.group(2)}")["v"]
        except tomllib.TOMLDecodeError:
            continue
        found.setdefault(parts[0], {})[parts[1]] = value
    out: dict[str, FigureRuns] = {}
    for metric, keys in found.items():
        value = _number(keys.get(""))
        if value is None or value <= 0:
            continue
        values = keys.get("_runs")
        nums = [_number(v) for v in values] if isinstance(values, list) else []
        if nums and all(n is not None and n > 0 for n in nums):
            cis = keys.get("_runs_ci")
            pairs = _intervals(cis) if isinstance(cis, list) else []
            runs = tuple(n for n in nums if n is not None)
            out[metric] = FigureRuns(runs, tuple(pairs) if len(pairs) == len(runs) else ())
        else:
            out[metric] = FigureRuns((value,), (_interval(keys.get("_ci")),))
    return out


def _tolerance(value: Any, where: BaselineError) -> float:
    number = _number(value)
    if number is None or not 0 <= number < 1:
        raise BaselineError(
            f"{where.args[0].rstrip(': ')}: tolerance = {value!r} must be a fraction between 0 "
            "and 1 (0.05 = 5 %)"
        )
    return number


def mismatches(
    baseline: Baseline, run: Mapping[str, Any], keys: Sequence[str] = COMPARABLE
) -> list[str]:
    """Settings that differ between the baseline's run and this one, in words."""
    out = []
    for key in keys:
        old, new = baseline.run.get(key), run.get(key)
        if old is not None and new is not None and old != new:
            out.append(f"{key} {_word(old)} in the baseline, {_word(new)} now")
    return out


def _word(value: Any) -> str:
    """A setting as a person reads it: a switch on or off (not Python's True and False)."""
    if isinstance(value, bool):
        return "on" if value else "off"
    return str(value)


def check_addable(path: str | Path, run: Mapping[str, Any]) -> Baseline | None:
    """The baseline a run with these settings would be added to by :func:`save`: None when
    there is no file at ``path`` (a new one would be written). :class:`BaselineMismatch` (one
    line) when the file's runs were taken with other settings or another server version;
    :class:`BaselineError` when it is broken. The pytest layer asks before any cell runs."""
    p = Path(path)
    if not p.exists():
        return None
    baseline = load(p)
    diff = mismatches(baseline, run, SAME_RUNS)
    if diff:
        raise BaselineMismatch(
            f"{p} holds runs taken with other settings ({'; '.join(diff)}): a run is added only "
            "to runs of the same settings and server; save to another file, or delete this one "
            "to start a new baseline"
        )
    return baseline


# -- writing -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Saved:
    """What :func:`save` wrote."""

    path: Path
    cells: int  # cells this run gave
    runs: int  # runs the file holds now
    added: bool  # the run was added to a baseline already there
    #: the file's runs that lie outside the others beyond their noise, in words
    #: (:func:`outlying_runs`)
    outliers: tuple[str, ...] = ()

    def message(self) -> str:
        """``baseline: 9 cells written to perf/b.toml`` or ``baseline: run 3 added to
        perf/b.toml (9 cells; 3 runs now)``."""
        if not self.added:
            return f"baseline: {self.cells} cells written to {self.path}"
        return (
            f"baseline: run {self.runs} added to {self.path} ({self.cells} cells; "
            f"{self.runs} runs now)"
        )

    def lines(self) -> list[str]:
        """:meth:`message`, then a line for each run that lies outside the others."""
        return [self.message(), *(f"baseline {self.path}: {o}" for o in self.outliers)]


def _now() -> str:
    return _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")


def _write(path: Path, text: str) -> None:
    """Atomically: a baseline being added to is never left half written."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".llmspeed-", suffix=".toml")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        mask = os.umask(0)
        os.umask(mask)
        os.chmod(tmp, 0o666 & ~mask)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def dump(
    path: str | Path,
    run: dict[str, Any],
    records: list[CellRecord],
    tolerance: float = DEFAULT_TOLERANCE,
) -> int:
    """Write a baseline from measured cell records (replacing any file at ``path``); returns
    the number of cells written."""
    text, count = render(run, records, tolerance, _now())
    _write(Path(path), text)
    return count


def save(
    path: str | Path,
    run: Mapping[str, Any],
    records: Sequence[CellRecord],
    tolerance: float = DEFAULT_TOLERANCE,
    date: str | None = None,
    slo: SLOSaved | None = None,
) -> Saved:
    """Write a baseline from one run's records, or, when ``path`` already holds a baseline,
    add this run to it (:func:`check_addable`: :class:`BaselineMismatch` when its settings
    differ). Adding keeps the file's cells, tolerances and [run] settings, appends this run's
    value and interval to every figure the file's cell has (gated or commented out), adds the
    cells it lacks, and makes each reference the mean of its runs. ``slo``: the objectives
    and each context's capacity at them, written under [slo] (added: the smallest capacity of
    the runs, when the objectives are the file's)."""
    p = Path(path)
    date = date or _now()
    existing = check_addable(p, run)
    if existing is None:
        text, count = render(dict(run), list(records), tolerance, date, slo)
        _write(p, text)
        return Saved(p, count, 1, added=False)
    text, count = render_added(existing, run, records, date, slo)
    _write(p, text)
    try:
        outliers = tuple(outlying_runs(load(p)))
    except BaselineError:  # the file just written reads back; a check never stops a save
        outliers = ()
    return Saved(p, count, existing.runs + 1, added=True, outliers=outliers)


#: a baseline's run lies outside the others when the median over its gated figures of
#: |z| — its figure against the other runs' mean, in units of their spread — passes t's
#: two-sided 99.9 % quantile (docs/gate.md, "A run outside the others")
OUTLIER_LEVEL = 0.9995
#: the least relative spread between runs assumed (as the A/B's floor, gate/ab.py): runs that
#: agree to 0.1 % do not make a 1 % move an outlier
OUTLIER_FLOOR = 0.01


def outlying_runs(baseline: Baseline) -> list[str]:
    """The runs of a baseline of three or more that lie outside the others beyond their noise,
    each in words with its most outlying figure and what to do. Robust by construction: each
    run is judged against the spread of the *other* runs (its own cannot widen it), and by the
    median over every gated figure (a disturbed run moves most cells; one odd cell does not
    make a run odd)."""
    k = baseline.runs
    figs = [
        (cid, metric, fr)
        for cid, cell in baseline.cells.items()
        for metric, fr in cell.runs.items()
        if fr.count == k and min(fr.values) > 0
    ]
    if k < 3 or not figs:
        return []
    out = []
    for r in range(k):
        ss, dof, found = 0.0, 0, []
        for cid, metric, fr in figs:
            logs = [math.log(v) for v in fr.values]
            others = logs[:r] + logs[r + 1 :]
            mean = sum(others) / len(others)
            ss += sum((x - mean) ** 2 for x in others)
            dof += len(others) - 1
            found.append((cid, metric, fr, logs[r] - mean))
        s2 = max(ss / dof, OUTLIER_FLOOR**2)
        q = t_quantile(OUTLIER_LEVEL, dof)
        scored = []
        for cid, metric, fr, d in found:
            w = within_se(fr.values[r], fr.intervals[r])
            scored.append((abs(d) / math.sqrt(s2 * (1 + 1 / (k - 1)) + w * w), cid, metric, fr, d))
        scored.sort(key=lambda z: z[0])
        median = scored[len(scored) // 2][0]
        if median <= q:
            continue
        _, cid, metric, fr, d = scored[-1]
        others = [v for i, v in enumerate(fr.values) if i != r]
        beyond = sum(1 for z in scored if z[0] > q)
        label = figures.by_key(metric).label
        change = f"{math.expm1(d):+.1%}".replace("-", "−")
        out.append(
            f"run {r + 1} of {k} lies outside the others beyond their noise in {beyond} of "
            f"{len(scored)} figures ({cid} {label} {fr.values[r]:,.1f} against "
            f"{min(others):,.1f}–{max(others):,.1f}, {change}): a run disturbed by "
            "other work widens the spread the gate allows for and moves the reference; save "
            "the baseline again on a quiet machine (a new file), or add runs"
        )
    return out


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    text = str(value).replace("\\", "\\\\").replace('"', '\\"')
    return f'"{text}"'


def _outwards(ci: Pair, nd: int) -> Pair:
    """An interval rounded outwards to ``nd`` decimals (rounding never narrows it; a value
    already rounded stays as it is, so adding a run does not widen the earlier runs')."""
    step = 10.0**-nd
    low = max(math.floor(round(ci[0] / step, 6)) * step, step)
    high = math.ceil(round(ci[1] / step, 6)) * step
    return (round(low, nd), round(high, nd))


def _figure(key: str, runs: FigureRuns, nd: int, prefix: str = "") -> list[str]:
    """One run: ``total_tok_s = 6987.0`` and, when measured, ``total_tok_s_ci = [6950.1,
    7023.9]`` (rounded outwards). Several: the mean, ``total_tok_s_runs = [...]`` and, when any
    run has an interval, ``total_tok_s_runs_ci = [[l, h], [], ...]``."""
    values = [round(v, nd) for v in runs.values]
    if len(values) == 1:
        out = [f"{prefix}{key} = {values[0]!r}"]
        ci = runs.intervals[0]
        if ci is not None:
            low, high = _outwards(ci, nd)
            out.append(f"{prefix}{key}_ci = [{low!r}, {high!r}]")
        return out
    mean = round(sum(values) / len(values), nd)
    out = [
        f"{prefix}{key} = {mean!r}",
        f"{prefix}{key}_runs = [{', '.join(repr(v) for v in values)}]",
    ]
    if any(ci is not None for ci in runs.intervals):
        pairs = []
        for ci in runs.intervals:
            if ci is None:
                pairs.append("[]")
            else:
                low, high = _outwards(ci, nd)
                pairs.append(f"[{low!r}, {high!r}]")
        out.append(f"{prefix}{key}_runs_ci = [{', '.join(pairs)}]")
    return out


#: a cell's figures as written: (metric, runs, gated)
_Figures = list[tuple[str, FigureRuns, bool]]


def gated_by_default(figure: figures.Figure, phase: str) -> bool:
    """Is ``figure`` gated in a saved baseline (and by ``compare``) as it is written? The
    floors are; the ceilings are written commented out, except the headline of a kind of
    cell that has no floor (an open-loop cell's TTFT from the scheduled send: its one gated
    figure, which ``compare`` judges it by)."""
    if figure.gate is Gate.FLOOR:
        return True
    if figure.gate is not Gate.CEILING or not figure.headline:
        return False
    return not any(f.in_phase(phase) for f in figures.floors())


def _record_figures(rec: CellRecord) -> _Figures:
    """A valid record's figures in the file's order: floors gated, ceilings commented out
    (:func:`gated_by_default`); a figure the record lacks (or measured as 0, no limit) is
    left out."""
    out: _Figures = []
    for f in figures.gated():
        value = getattr(rec, f.key) if f.in_phase(rec.phase) else None
        if value:
            ci = getattr(rec, f.ci_key) if f.ci else None
            gated = gated_by_default(f, rec.phase)
            out.append((f.key, FigureRuns((float(value),), (ci,)), gated))
    return out


_HEADER = [
    "# pytest-llmspeed baseline: the figures a later run must not fall below (floors) or",
    "# rise above (ceilings), each with a tolerance. Written by --llm-save-baseline;",
    "# edit freely.",
    "# Gate a run with:  pytest --llm-baseline=THIS_FILE ...",
]


def _cells_header() -> list[str]:
    floors = ", ".join(f.key for f in figures.floors())
    ceilings = ", ".join(f.key for f in figures.ceilings())
    return [
        f"# Per cell: floors ({floors}) and optional ceilings",
        f"# ({ceilings}: uncomment to gate latency). 'tolerance = 0.1' overrides the default.",
        *_CELLS_HEADER,
    ]


_CELLS_HEADER = [
    "# A figure's 95 % interval (NAME_ci = [low, high]) makes the gate allow for noise: a",
    "# figure fails only when past its limit and worse than its reference beyond the noise",
    "# of both (docs/gate.md).",
]
_RUNS_HEADER = [
    "# Made of several runs: a figure is the mean of its runs (NAME_runs), each run's 95 %",
    "# interval beside them (NAME_runs_ci; [] for a run without one). Their spread is the",
    "# between-run noise the gate allows for (docs/gate.md, 'Across restarts'). The same",
    "# command with --llm-save-baseline=THIS_FILE adds a run; edit a figure and the gate",
    "# uses your value as the reference.",
]


#: the objectives a run was measured at and each decode context's capacity at them (0: none)
SLOSaved = tuple[str, Mapping[str, int]]


def _slo_lines(slo: SLOSaved | None) -> list[str]:
    if slo is None:
        return []
    objectives, capacity = slo
    pairs = ", ".join(f"{_toml_value(k)} = {v}" for k, v in capacity.items())
    return [
        "[slo]  # the objectives (--llm-slo) and each context's capacity at them: the most",
        "# requests in flight up to which every cell met them (0: none). A run with the same",
        "# objectives fails a cell at or below its context's capacity that misses them.",
        f"objectives = {_toml_value(objectives)}",
        f"capacity = {{ {pairs} }}" if pairs else "capacity = {}",
        "",
    ]


def _render(
    run: Mapping[str, Any],
    tolerance: float,
    cells: Sequence[tuple[str, _Figures, float | None, _Server]],
    runs: int,
    slo: SLOSaved | None = None,
) -> str:
    several = runs > 1
    lines = [*_HEADER, ""]
    if several:
        lines.append(
            "[run]  # the runs the figures come from; a baseline of other settings gives a warning"
        )
    else:
        lines.append(
            "[run]  # the run the figures come from; a baseline of other settings gives a warning"
        )
    for key, value in run.items():
        if value is not None and isinstance(value, str | int | float | bool | list):
            lines.append(f"{key} = {_toml_value(value)}")
    lines += [
        "",
        *_slo_lines(slo),
        "[defaults]",
        f"tolerance = {tolerance!r}  # a cell fails when worse than its reference by more than "
        "this fraction",
        "",
        *_cells_header(),
    ]
    if several:
        lines += _RUNS_HEADER
    for cid, written, own, server in cells:
        lines += ["", f'[cells."{cid}"]']
        for metric, figure_runs, gated in written:
            nd = figures.by_key(metric).digits
            lines += _figure(metric, figure_runs, nd, "" if gated else "# ")
        if own is not None:
            lines.append(f"tolerance = {own!r}")
        if server is not None and server[0].scalars():
            figs, count = server
            lines += ["", f'[cells."{cid}".server]  # {_SERVER_COMMENT}', f"runs = {count}"]
            lines += [f"{name} = {_significant(v)!r}" for name, v in figs.scalars()]
    return "\n".join(lines) + "\n"


#: a cell's server figures as written: (the mean over runs, how many runs)
_Server = tuple[ServerFigures, int] | None
_SERVER_COMMENT = "the server's own figures, mean of the runs: why a cell changed (not gated)"


def _significant(value: float | int) -> float | int:
    """A server figure to 5 significant digits (counts stay integers)."""
    if isinstance(value, int) or value == 0:
        return value
    return float(f"{value:.5g}")


def _server_of(rec: CellRecord) -> _Server:
    return (rec.server, 1) if rec.server is not None else None


def _mean_server(entry: CellBaseline, rec: CellRecord | None) -> _Server:
    """The entry's server figures with this run's added to their mean (counts too: a mean
    count per window)."""
    old = (entry.server, entry.server_runs) if entry.server is not None else None
    new = rec.server if rec is not None else None
    if new is None:
        return old
    if old is None:
        return (new, 1)
    figs, k = old
    merged: dict[str, float] = {}
    before = dict(figs.scalars())
    for name, value in new.scalars():
        prior = before.get(name)
        merged[name] = value if prior is None else (prior * k + value) / (k + 1)
    return (ServerFigures.from_dict(merged), k + 1)


def render(
    run: dict[str, Any],
    records: list[CellRecord],
    tolerance: float = DEFAULT_TOLERANCE,
    date: str = "",
    slo: SLOSaved | None = None,
) -> tuple[str, int]:
    """The baseline file's text for the valid cells of one run's ``records``, and their
    number."""
    cells = [
        (str(rec.id), _record_figures(rec), None, _server_of(rec))
        for rec in records
        if rec.status is Status.VALID
    ]
    return _render({"date": date, **run}, tolerance, cells, 1, slo), len(cells)


def render_added(
    baseline: Baseline,
    run: Mapping[str, Any],
    records: Sequence[CellRecord],
    date: str,
    slo: SLOSaved | None = None,
) -> tuple[str, int]:
    """The text of ``baseline`` with one more run (``records``), and the number of this run's
    cells written. The [run] table keeps the first run's settings and counts the runs and
    their dates."""
    valid = {str(r.id): r for r in records if r.status is Status.VALID}
    cells: list[tuple[str, _Figures, float | None, _Server]] = []
    for cid, entry in baseline.cells.items():
        rec = valid.pop(cid, None)
        new = {m: r for m, r, _ in _record_figures(rec)} if rec is not None else {}
        found: _Figures = []
        for metric in _gated():
            gated = metric in entry.limits
            if gated:
                runs = entry.figure_runs(metric)
            elif metric in entry.ungated:
                runs = entry.ungated[metric]
            else:
                continue  # not in the file (removed by hand): not added back
            if metric in new:
                runs = runs.add(new[metric].values[0], new[metric].intervals[0])
            found.append((metric, runs, gated))
        cells.append((cid, found, entry.own_tolerance, _mean_server(entry, rec)))
    for cid, rec in valid.items():
        cells.append((cid, _record_figures(rec), None, _server_of(rec)))
    count = sum(1 for r in records if r.status is Status.VALID)
    info = dict(baseline.run)
    dates = info.pop("dates", None)
    if not isinstance(dates, list):
        dates = [info["date"]] if isinstance(info.get("date"), str) else []
    info.pop("runs", None)
    first = {"date": info.pop("date", dates[0] if dates else date)}
    first["runs"] = baseline.runs + 1
    first["dates"] = [*dates, date]
    kept: SLOSaved | None = (
        (baseline.objectives, baseline.capacity) if baseline.objectives is not None else None
    )
    if slo is not None and (kept is None or kept[0] == slo[0]):
        # the capacity a later run must hold: the smallest any run measured
        merged = dict(kept[1]) if kept else {}
        for context, n in slo[1].items():
            merged[context] = min(n, merged.get(context, n))
        kept = (slo[0], merged)
    text = _render({**first, **info}, baseline.tolerance, cells, baseline.runs + 1, kept)
    return text, count
