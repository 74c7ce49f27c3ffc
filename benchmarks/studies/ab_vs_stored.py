"""The A/B against a stored baseline on a drifting simulator (issue 31): for an unchanged new
version and ones 5 %, 10 % and 20 % slower, the share of checks regressed / same / unknown /
improved, and the starts per cell, for

- **(a) a 3-run stored baseline** with today's confirmation: ``pytest --llm-serve=OLD
  --llm-runs=3 --llm-save-baseline=b.toml``, then, once the drift has moved on (``--gap``,
  by default two drift periods: the drift's level is then a fresh draw, as for a baseline
  taken last week), ``pytest --llm-serve=NEW --llm-baseline=b.toml --llm-results=r.json``
  once per new version (the four gated against the same baseline, in a random order). A
  check's verdict is what the results file stores in ``cells[].baseline_checks[].verdict``:
  regressed / improved / same / unknown, or an earlier version's ``passed`` (with ``noisy``:
  unknown; with ``improved``: improved), kept as its own column, since "passed" covers both
  "shown within tolerance" and "too noisy to tell". Starts per cell: the baseline's 3 and
  the gated run's attempts (each confirmation a fresh start).
- **(b) the A/B**: ``pytest --llm-serve=NEW --llm-serve-baseline=OLD --llm-tolerance=5%
  --llm-results=r.json``; a check's verdict is ``ab.cells[].figures[].verdict``, the cell's
  starts ``ab.cells[].starts``.

Each arm is ``python -m pytest_llmspeed.sim --port {port} --profile P --speed S --start-noise
0.02 --drift 0.2 --drift-period D --drift-seed N [--slower decode:F,prefill:F,frontend:F]``:
no ``--start-seed``, so each start draws its own start factor from fresh entropy; the drift
is a function of the wall clock and its seed, shared by every start of a trial (old and new
alike, as one machine drifts), and each trial (and each A/B) has its own seed, so trials are
independent. "x % slower" is the engine's times × 1 / (1 − x) (F = x / (1 − x)), so that
its throughput is (1 − x) of the old one's; what the client measures is also reported (the
median change of the checks), since the client's own time per request does not slow.

The drift period is chosen against the rounds, not the seconds: the simulator's clock is
compressed (1 s windows, a tiny profile), so a round (one start and the cells) takes about
5 s here where a real one takes minutes; ``--drift-period 40`` is about 8 rounds, the
model of docs/judge.md's table ("a drift within ±20 % over 8 rounds"), which on a server whose
rounds take 2 minutes is ±20 % over about a quarter of an hour, what the issue saw on real
vLLM (96K → 69K prompt tok/s over 16 minutes of eight starts).

Runs go ``--parallel`` at a time (each a pytest process and one simulator, about a third of a
core); a trial of (a) waits out its gap without holding a slot. No run starts after
``--max-minutes``; the page says what was left out. Every run's folder is kept under the
work directory with ``raw.json`` (every run's verdicts), from which ``--rerender`` writes the
page again.

    python -m benchmarks.studies.ab_vs_stored                      # about 30-35 minutes
    python -m benchmarks.studies.ab_vs_stored --quick              # one trial of each, a smoke test
    python -m benchmarks.studies.ab_vs_stored --only b --trials 20
    python -m benchmarks.studies.ab_vs_stored --only b --prior 3   # (b) with earlier A/Bs

With ``--prior K``, K unchanged A/Bs run first (their own drift seeds; ``work/prior/``), and
every A/B of (b) takes their results files as ``--llm-ab-prior`` (docs/judge.md, "A prior
from earlier A/Bs"), as a nightly job keeps its last A/Bs.
"""

from __future__ import annotations

import argparse
import contextlib
import heapq
import itertools
import json
import math
import os
import random
import shlex
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.common import (
    RESULTS,
    ROOT,
    OtherCores,
    command,
    loadavg,
    machine,
    table,
    utc_now,
    write_page,
)
from benchmarks.gate_noise import lower_bound, upper_bound
from pytest_llmspeed.plugin.settings import AB_PREFILL_REPEATS, GATED_PREFILL_REPEATS

VERDICTS = ("regressed", "same", "unknown", "improved", "passed")
TAG = "ab-vs-stored"


# -- one run ---------------------------------------------------------------------------------


@dataclass
class RunRecord:
    """One pytest run's verdicts: a gated run of (a) or one A/B of (b)."""

    part: str  # "a" or "b"
    trial: int
    slower: float  # 0, 0.05, 0.1, 0.2: the throughput's fraction lost
    drift_seed: int
    rc: int | None = None
    wall_s: float = 0.0
    started: float = 0.0  # seconds since the benchmark began
    #: (cell, figure, verdict, measured change, its standard error) for every check
    checks: list[tuple[str, str, str, float | None, float | None]] = field(default_factory=list)
    #: (cell, cell verdict, starts) for every cell
    cells: list[tuple[str, str, int]] = field(default_factory=list)
    rounds: int = 0  # the A/B's rounds
    empty: list[str] = field(default_factory=list)  # (b): cells with a verdict, no figures
    gap_s: float | None = None  # (a): from the baseline's end to this run's start
    error: str | None = None


def sim_command(args: argparse.Namespace, drift_seed: int, slower: float) -> str:
    """One arm's server command for --llm-serve."""
    cmd = [
        sys.executable, "-m", "pytest_llmspeed.sim", "--port", "{port}",
        "--profile", args.profile, "--speed", f"{args.speed:g}",
        "--start-noise", f"{args.start_noise:g}", "--drift", f"{args.drift:g}",
        "--drift-period", f"{args.drift_period:g}", "--drift-seed", str(drift_seed),
    ]  # fmt: skip
    if slower:
        f = slower / (1 - slower)  # times × 1 + f: throughput × (1 − slower)
        cmd += ["--slower", ",".join(f"{part}:{f:.6g}" for part in args.parts.split(","))]
    return shlex.join(cmd).replace("'{port}'", "{port}")


def prefill_ids(args: argparse.Namespace) -> set[str]:
    return {f"prefill[{c}]" for c in args.prefill_contexts.split(",")}


def matrix(args: argparse.Namespace) -> list[str]:
    return [
        "-p", "no:cacheprovider", "--benchmark-disable", "-q",
        f"--llm-contexts={args.contexts}", f"--llm-prefill-contexts={args.prefill_contexts}",
        f"--llm-concurrency={args.concurrency}", f"--llm-duration={args.duration:g}",
        f"--llm-max-output={args.max_output}",
    ]  # fmt: skip


def pytest_run(folder: Path, argv: list[str], timeout: float = 900) -> tuple[int | None, float]:
    """``python -m pytest ARGV`` in ``folder`` (its output in output.txt): its exit status
    (None: it ran past ``timeout``) and its wall time."""
    folder.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LLMSPEED_", "PYTEST_"))}
    env.pop("GITHUB_STEP_SUMMARY", None)
    t0 = time.monotonic()
    with (folder / "output.txt").open("w") as out:
        out.write(shlex.join(["python", "-m", "pytest", *argv]) + "\n")
        out.flush()
        proc = subprocess.Popen(
            [sys.executable, "-m", "pytest", *argv],
            cwd=folder,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
        try:
            rc: int | None = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            rc = None
    return rc, time.monotonic() - t0


def stored_verdict(check: dict[str, Any]) -> str:
    """A stored check's verdict: one of the four, or an earlier version's "passed"."""
    word = str(check.get("verdict", "passed"))
    if word in VERDICTS:
        if word == "passed" and check.get("noisy"):
            return "unknown"
        if word == "passed" and check.get("improved"):
            return "improved"
        return word
    return f"other:{word}"


def read_gated(rec: RunRecord, path: Path, prefill: set[str]) -> None:
    """(a): every check of every gated cell of a results file (of the prefill cells, those of
    ``prefill``: the A/B's; the gate also gates the prefill a decode warm-up measured)."""
    data = json.loads(path.read_text())
    for cell in data.get("cells", []):
        checks = cell.get("baseline_checks") or []
        if cell["id"].startswith("prefill[") and cell["id"] not in prefill:
            continue
        if not checks:
            if cell.get("baseline") not in (None, "no floor"):
                rec.cells.append((cell["id"], str(cell.get("baseline")), 0))
            continue
        attempts = max(len(c.get("values") or [1]) for c in checks)
        rec.cells.append((cell["id"], str(cell.get("baseline")), 3 + attempts))
        for c in checks:
            rec.checks.append(
                (cell["id"], c["metric"], stored_verdict(c), c.get("change"), c.get("change_se"))
            )


def read_ab(rec: RunRecord, path: Path) -> None:
    """(b): every figure of every cell of the A/B."""
    ab = json.loads(path.read_text()).get("ab")
    if not ab:
        rec.error = "no 'ab' object in the results file"
        return
    rec.rounds = len(ab.get("rounds", []))
    for cid, cell in ab.get("cells", {}).items():
        if not cell.get("figures"):  # a cell the A/B has no figures of: counted apart
            rec.empty.append(f"{cid} {cell.get('verdict')}")
            continue
        rec.cells.append((cid, str(cell.get("verdict")), int(cell.get("starts") or 0)))
        for figure, fig in cell["figures"].items():
            rec.checks.append(
                (cid, figure, str(fig.get("verdict")), fig.get("change"), fig.get("se"))
            )


# -- the schedule ----------------------------------------------------------------------------


class Slots:
    """At most ``n`` runs at once, the waiting ones let in by priority (lowest first), then
    in the order they asked."""

    def __init__(self, n: int):
        self.free = n
        self.cond = threading.Condition()
        self.waiting: list[tuple[int, int]] = []
        self.seq = itertools.count()

    @contextlib.contextmanager
    def slot(self, priority: int) -> Iterator[None]:
        with self.cond:
            me = (priority, next(self.seq))
            heapq.heappush(self.waiting, me)
            while not (self.free > 0 and self.waiting[0] == me):
                self.cond.wait()
            heapq.heappop(self.waiting)
            self.free -= 1
            self.cond.notify_all()
        try:
            yield
        finally:
            with self.cond:
                self.free += 1
                self.cond.notify_all()


#: (a)'s gated runs go before everything else once their gap is over, so that every
#: baseline is gated soon after its gap, whatever (b) has queued
GATED, OTHER = 0, 1


class Schedule:
    """At most ``parallel`` runs at once, none started after ``deadline`` (monotonic)."""

    def __init__(self, parallel: int, deadline: float, t0: float):
        self.slots = Slots(parallel)
        self.deadline = deadline
        self.t0 = t0
        self.lock = threading.Lock()
        self.records: list[RunRecord] = []
        self.skipped: Counter[str] = Counter()
        self.baseline_walls: list[float] = []  # (a)'s baselines, seconds each

    def late(self) -> bool:
        return time.monotonic() > self.deadline

    def add(self, rec: RunRecord) -> None:
        with self.lock:
            self.records.append(rec)
            done = len(self.records)
        verdicts = Counter(v for _, _, v, _, _ in rec.checks)
        print(
            f"[{TAG}] {done:3d} ({rec.part}) trial {rec.trial} {rec.slower:.0%} slower: rc "
            f"{rec.rc}, {rec.wall_s:.0f} s, {dict(verdicts)}"
            + (f", {rec.rounds} rounds" if rec.part == "b" else "")
            + (f" · {rec.error}" if rec.error else "")
            + f" · load {loadavg()}",
            flush=True,
        )


def trial_a(args: argparse.Namespace, sched: Schedule, work: Path, trial: int) -> None:
    """(a): a 3-run baseline, the gap, then each new version gated against it."""
    seed = args.seed + 1000 + trial
    folder = work / "a" / f"t{trial}"
    with sched.slots.slot(OTHER):
        if sched.late():
            sched.skipped["a baseline"] += 1
            return
        rc, wall = pytest_run(
            folder / "baseline",
            [
                *matrix(args),
                f"--llm-serve={sim_command(args, seed, 0.0)}",
                "--llm-runs=3",
                "--llm-save-baseline=b.toml",
            ],
        )
    base_end = time.monotonic()
    sched.baseline_walls.append(wall)
    baseline = folder / "baseline" / "b.toml"
    slowers = list(args.slowers)
    random.Random(seed).shuffle(slowers)
    if rc != 0 or not baseline.exists():
        for slower in slowers:
            sched.add(RunRecord("a", trial, slower, seed, rc, wall, error="baseline failed"))
        return
    time.sleep(max(0.0, base_end + args.gap - time.monotonic()))
    for slower in slowers:
        rec = RunRecord("a", trial, slower, seed, started=time.monotonic() - sched.t0)
        with sched.slots.slot(GATED):
            if sched.late():
                sched.skipped["a gated"] += 1
                continue
            rec.gap_s = time.monotonic() - base_end
            sub = folder / f"slower{slower:g}"
            rec.rc, rec.wall_s = pytest_run(
                sub,
                [
                    *matrix(args),
                    f"--llm-serve={sim_command(args, seed, slower)}",
                    f"--llm-baseline={baseline}",
                    "--llm-results=r.json",
                ],
            )
        try:
            read_gated(rec, sub / "r.json", prefill_ids(args))
        except (OSError, ValueError, KeyError) as exc:
            rec.error = f"results unreadable: {exc}"
        sched.add(rec)


def trial_b(
    args: argparse.Namespace, sched: Schedule, work: Path, trial: int, slower: float
) -> None:
    """(b): one A/B of a new version against the old."""
    seed = args.seed + 2000 + 10 * trial + args.slowers.index(slower)
    rec = RunRecord("b", trial, slower, seed)
    with sched.slots.slot(OTHER):
        if sched.late():
            sched.skipped["b A/B"] += 1
            return
        rec.started = time.monotonic() - sched.t0
        sub = work / "b" / f"t{trial}" / f"slower{slower:g}"
        rec.rc, rec.wall_s = pytest_run(
            sub,
            [
                *matrix(args),
                f"--llm-serve={sim_command(args, seed, slower)}",
                f"--llm-serve-baseline={sim_command(args, seed, 0.0)}",
                f"--llm-tolerance={args.tolerance:g}",
                "--llm-results=r.json",
                *([f"--llm-ab-prior={','.join(args.prior_files)}"] if args.prior_files else []),
            ],
        )
    try:
        read_ab(rec, sub / "r.json")
    except (OSError, ValueError, KeyError) as exc:
        rec.error = f"results unreadable: {exc}"
    sched.add(rec)


def prior_run(args: argparse.Namespace, sched: Schedule, work: Path, k: int) -> Path | None:
    """One unchanged A/B whose results file is a prior of (b)'s A/Bs (None: it failed)."""
    seed = args.seed + 9000 + k
    sub = work / "prior" / f"p{k}"
    with sched.slots.slot(OTHER):
        rc, wall = pytest_run(
            sub,
            [
                *matrix(args),
                f"--llm-serve={sim_command(args, seed, 0.0)}",
                f"--llm-serve-baseline={sim_command(args, seed, 0.0)}",
                f"--llm-tolerance={args.tolerance:g}",
                "--llm-results=r.json",
            ],
        )
    print(f"[{TAG}] prior {k}: rc {rc}, {wall:.0f} s", flush=True)
    path = sub / "r.json"
    return path if rc in (0, 1) and path.exists() else None


# -- the page --------------------------------------------------------------------------------


def pct(x: float) -> str:
    return f"{100 * x:.1f} %" if x >= 0.001 or x == 0 else f"{100 * x:.2f} %"


def share(k: int, n: int) -> str:
    """k of n as a share with its two-sided 95 % (exact, Clopper-Pearson) interval."""
    if n == 0:
        return "–"
    lo = lower_bound(k, n, 0.025)
    hi = upper_bound(k, n, 0.025)
    return f"{k} · {pct(k / n)} ({pct(lo)}–{pct(hi)})"


def label(slower: float) -> str:
    return "unchanged" if slower == 0 else f"{slower:.0%} slower"


def summary(records: list[RunRecord], part: str, slower: float) -> dict[str, Any]:
    runs = [r for r in records if r.part == part and r.slower == slower]
    good = [r for r in runs if r.error is None and r.checks]
    verdicts: Counter[str] = Counter(v for r in good for _, _, v, _, _ in r.checks)
    starts = [s for r in good for _, _, s in r.cells if s > 0]
    changes = [c for r in good for _, _, _, c, _ in r.checks if c is not None]
    ses = [e for r in good for _, _, _, _, e in r.checks if e is not None]
    return {
        "runs": len(runs),
        "good": len(good),
        "failed": len(runs) - len(good),
        "checks": sum(verdicts.values()),
        "verdicts": verdicts,
        "starts": statistics.fmean(starts) if starts else None,
        "most_starts": max(starts) if starts else None,
        "change": statistics.median(changes) if changes else None,
        "se": statistics.median(ses) if ses else None,
        "empty": Counter(e for r in good for e in r.empty),
        "runs_regressed": sum(1 for r in good if any(c[2] == "regressed" for c in r.checks)),
        "wall": statistics.fmean(r.wall_s for r in good) if good else None,
        "rounds": statistics.fmean(r.rounds for r in good) if good and part == "b" else None,
        "gap": statistics.fmean(r.gap_s for r in good if r.gap_s is not None)
        if part == "a" and any(r.gap_s is not None for r in good)
        else None,
    }


def by_cell(records: list[RunRecord], part: str, slower: float) -> dict[str, Counter[str]]:
    out: dict[str, Counter[str]] = defaultdict(Counter)
    for r in records:
        if r.part == part and r.slower == slower and r.error is None:
            for cid, figure, verdict, _, _ in r.checks:
                out[f"{cid} {figure}"][verdict] += 1
    return dict(sorted(out.items()))


def outlier_rounds(work: Path) -> list[str]:
    """(b): every round's figure more than a factor 1.65 from its arm's median in its A/B
    (|ln| > 0.5, beyond what a ±20 % drift can do), or missing beside the cell's other
    figure: what a stalled window looks like."""
    out = []
    for path in sorted(work.glob("b/t*/slower*/r.json")):
        try:
            rounds = json.loads(path.read_text())["ab"]["rounds"]
        except (OSError, ValueError, KeyError, TypeError):
            continue
        values: dict[tuple[str, str, str], list[float]] = defaultdict(list)
        for r in rounds:
            for cid, figs in r["cells"].items():
                for fig, v in figs.items():
                    values[r["arm"], cid, fig].append(v)
        figures_of: dict[str, set[str]] = defaultdict(set)
        for _, cid, fig in values:
            figures_of[cid].add(fig)
        where = f"{path.parent.parent.name}, {path.parent.name.removeprefix('slower')} slower"
        for r in rounds:
            for cid, figs in r["cells"].items():
                for fig in sorted(figures_of[cid] - set(figs)):
                    out.append(f"{where}: round {r['round']} ({r['arm']}) {cid} {fig} missing")
                for fig, v in figs.items():
                    med = statistics.median(values[r["arm"], cid, fig])
                    if v > 0 and med > 0 and abs(math.log(v / med)) > 0.5:
                        out.append(
                            f"{where}: round {r['round']} ({r['arm']}) {cid} {fig} {v:,.0f} "
                            f"(the arm's median {med:,.0f})"
                        )
    return out


def plugin_source() -> str:
    """Which pytest_llmspeed the runs used: this checkout's commit, or the folder on
    PYTHONPATH (with the commit a COMMIT file beside its src/ names)."""
    import pytest_llmspeed

    src = Path(pytest_llmspeed.__file__).resolve().parents[1]
    if src == ROOT / "src":
        head = subprocess.run(
            ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(ROOT), "status", "--porcelain", "src"],
            capture_output=True,
            text=True,
        ).stdout.strip()
        return f"this checkout's src/ at {head}" + (" (with uncommitted changes)" if dirty else "")
    marker = src.parent / "COMMIT"
    commit = marker.read_text().strip()[:7] if marker.exists() else "unknown commit"
    return f"{src} (a copy of src/ at {commit}, on PYTHONPATH)"


def page(meta: dict[str, Any], records: list[RunRecord]) -> list[str]:
    slowers = meta["slowers"]
    a = meta["args"]
    lines = [
        "# The A/B against a stored baseline, on a drifting simulator",
        "",
        f"Command: `{meta['command']}`. Date: {meta['date']}. Machine: {meta['machine']}; "
        f"load average before {meta['load_before']}, after {meta['load_after']}; other "
        f"processes used {meta['other_cores'] or 0:.2f} cores on average over the run. Wall time "
        f"{meta['wall_min']:.1f} min, {a['parallel']} runs at a time. Plugin: "
        f"{meta['plugin']}.",
        "",
        "## The setup",
        "",
        f"- **The simulator**: `{meta['example_old']}`; the new version adds `--slower "
        f"{','.join(p + ':F' for p in a['parts'].split(','))}` with F = x / (1 − x) for "
        "x % slower (its throughput (1 − x) of the old one's). No `--start-seed`: every "
        "start draws its own start factor. The drift seed is the trial's: shared by every "
        "start of the trial (old and new, baseline and gated runs), a new one for each trial "
        "and each A/B, so trials are independent.",
        f"- **The drift**: ±{a['drift']:.0%} with a period of {a['drift_period']:g} s of wall "
        "clock, a smooth curve through a level drawn uniform in [−1, 1] each period. The "
        "simulator's clock is compressed (tiny profile, "
        f"{a['duration']:g} s windows): a round — one start and the cells — took "
        f"{meta['round_s']:.1f} s here, so one period is about "
        f"{a['drift_period'] / max(meta['round_s'], 0.1):.0f} rounds (docs/judge.md's model: "
        "±20 % over 8 rounds). On a real server whose round takes 2 minutes that is ±20 % "
        f"over about {2 * a['drift_period'] / max(meta['round_s'], 0.1):.0f} minutes.",
        f"- **The matrix**: decode `--llm-contexts={a['contexts']} "
        f"--llm-concurrency={a['concurrency']}` (total and per-request tok/s), prefill "
        f"`--llm-prefill-contexts={a['prefill_contexts']}` (prompt tok/s, the median of "
        f"{GATED_PREFILL_REPEATS} cold requests when gated or saved, of {AB_PREFILL_REPEATS} "
        "in the A/B), `--llm-duration="
        f"{a['duration']:g} --llm-max-output={a['max_output']}`. "
        f"{len(a['prefill_contexts'].split(','))} prefill contexts, not one: the A/B pools "
        "a block's spread over the cells of a kind, and one "
        "prefill context gives it one degree of freedom a block (docs/judge.md).",
        f"- **Tolerance** {a['tolerance']:.0%} for both (the baseline file's default; "
        f"`--llm-tolerance={a['tolerance']:g}` for the A/B). A *check* is one figure of one "
        "cell.",
        "- **(a) the stored baseline**: per trial `pytest --llm-serve=OLD --llm-runs=3 "
        "--llm-save-baseline=b.toml`, then after a gap of at least "
        f"{a['gap']:g} s ({a['gap'] / a['drift_period']:g} drift periods: the drift's level "
        "a fresh draw) `pytest --llm-serve=NEW --llm-baseline=b.toml --llm-results=r.json`, "
        "today's confirmation (`--llm-confirm=1`, on a fresh start), once for each new "
        "version against the same baseline, in a random order. Verdicts from "
        "`cells[].baseline_checks[].verdict`; starts per cell = the baseline's 3 + the gated "
        "run's attempts.",
        "- **(b) the A/B**: `pytest --llm-serve=NEW --llm-serve-baseline=OLD "
        f"--llm-tolerance={a['tolerance']:g} --llm-results=r.json` (at most "
        "`--llm-ab-rounds=16`, no budget). Verdicts from `ab.cells[].figures[].verdict`, "
        "starts from `ab.cells[].starts`."
        + (
            f" With `--llm-ab-prior` of {len(meta['prior_files'])} earlier unchanged A/Bs "
            "of the same matrix (their own drift seeds), run first: "
            + ", ".join(f"`{p}`" for p in meta["prior_files"])
            + " (their starts not counted in the starts per cell)."
            if meta.get("prior_files")
            else ""
        ),
        "",
        "## The figures",
        "",
        "Checks by verdict: count · share (exact 95 % interval, as if the checks were "
        "independent: they are not, the checks of one run share its starts and its drift, "
        "so the interval is too narrow; the runs column counts independent trials). "
        "*Measured* is the median change of the checks against the old version (the "
        "baseline's reference, or the A/B's paired change).",
        "",
    ]
    rows = []
    for part in ("a", "b"):
        for slower in slowers:
            s = summary(records, part, slower)
            if not s["runs"]:
                continue
            v = s["verdicts"]
            n = s["checks"]
            name = "(a) stored, 3 runs" if part == "a" else "(b) A/B"
            rows.append(
                [
                    name,
                    label(slower),
                    "–" if s["change"] is None else f"{100 * s['change']:+.1f} %",
                    n,
                    share(v["regressed"], n),
                    share(v["same"], n),
                    share(v["unknown"], n),
                    share(v["improved"], n),
                    *([share(v["passed"], n)] if meta["any_passed"] else []),
                    "–" if s["starts"] is None else f"{s['starts']:.1f} (≤ {s['most_starts']})",
                    f"{s['runs_regressed']} of {s['good']}"
                    + (f" ({s['failed']} failed)" if s["failed"] else ""),
                ]
            )
    lines += table(
        [
            "", "new version", "measured", "checks", "regressed", "same", "unknown",
            "improved", *(["passed"] if meta["any_passed"] else []), "starts / cell",
            "runs with a regression",
        ],
        rows,
        "llrr" + "r" * (5 + meta["any_passed"]) + "r",
    )  # fmt: skip
    lines += [
        "",
        "Cost and noise: mean wall time per run (the pytest process), rounds per A/B, the "
        "gap from a baseline's end to the gated run's start, and the median standard error "
        "of a check's change (relative; the gate's `change_se`, the A/B's `se`).",
        "",
    ]
    rows = []
    for part in ("a", "b"):
        for slower in slowers:
            s = summary(records, part, slower)
            if s["good"]:
                rows.append(
                    [
                        "(a) gated run" if part == "a" else "(b) A/B",
                        label(slower),
                        f"{s['wall']:.0f} s",
                        "–" if s["rounds"] is None else f"{s['rounds']:.1f}",
                        "–" if s["gap"] is None else f"{s['gap']:.0f} s",
                        "–" if s["se"] is None else pct(s["se"]),
                    ]
                )
    lines += table(
        [
            "", "new version", "wall per run", "rounds", "gap after the baseline",
            "standard error of a change (median)",
        ],
        rows,
        "llrrrr",
    )  # fmt: skip
    if meta.get("baseline_wall"):
        lines += [
            "",
            f"(a)'s baselines (3 runs each): {meta['baseline_wall']:.0f} s each on average.",
        ]
    lines += ["", "## The A/B's targets (issue 31)", ""]
    targets = []
    b0 = summary(records, "b", 0.0)
    b10 = summary(records, "b", 0.1)
    if b0["checks"]:
        n, k = b0["checks"], b0["verdicts"]["regressed"]
        ub = upper_bound(k, n)
        targets.append(
            [
                "unchanged regressed ≤ 0.5 %",
                f"{k} of {n} ({pct(k / n)}; 95 % upper bound {pct(ub)})",
                "met" if ub <= 0.005 else ("not shown" if k / n <= 0.005 else "not met"),
            ]
        )
        k = b0["verdicts"]["same"]
        lb = lower_bound(k, n)
        targets.append(
            [
                "unchanged same ≥ 80 %",
                f"{k} of {n} ({pct(k / n)}; 95 % lower bound {pct(lb)})",
                "met" if lb >= 0.8 else ("not shown" if k / n >= 0.8 else "not met"),
            ]
        )
    if b10["checks"]:
        n, k = b10["checks"], b10["verdicts"]["regressed"]
        lb = lower_bound(k, n)
        targets.append(
            [
                "10 % slower regressed ≥ 90 %",
                f"{k} of {n} ({pct(k / n)}; 95 % lower bound {pct(lb)})",
                "met" if lb >= 0.9 else ("not shown" if k / n >= 0.9 else "not met"),
            ]
        )
    starts = [
        s for r in records if r.part == "b" and r.error is None for _, _, s in r.cells if s > 0
    ]
    if starts:
        mean = statistics.fmean(starts)
        targets.append(
            [
                "starts per cell ≤ 8 on average",
                f"{mean:.2f} over {len(starts)} cells of every A/B",
                "met" if mean <= 8 else "not met",
            ]
        )
    lines += table(["target", "measured", ""], targets)
    lines += [
        "",
        "*met*: the 95 % one-sided bound is on the target's side; *not shown*: the share is, "
        "its bound not (too few checks to tell); *not met*: the share itself is not.",
        "",
        "## By figure",
        "",
        "The shares for each judged figure apart (decode: both cells; prefill: every "
        "context), with the median standard error of a change:",
        "",
    ]
    rows = []
    for part in ("a", "b"):
        for slower in slowers:
            for kind in ("total_tok_s", "per_request_tok_s", "prompt_tok_s"):
                picked = [
                    c for r in records if r.part == part and r.slower == slower and not r.error
                    for c in r.checks if c[1] == kind
                ]  # fmt: skip
                if not picked:
                    continue
                got = Counter(c[2] for c in picked)
                ses = [c[4] for c in picked if c[4] is not None]
                rows.append(
                    [
                        "(a)" if part == "a" else "(b)",
                        label(slower),
                        kind,
                        len(picked),
                        *[pct(got[v] / len(picked)) for v in VERDICTS[:4]],
                        pct(statistics.median(ses)) if ses else "–",
                    ]
                )
    lines += table(
        ["", "new version", "figure", "checks", "regressed", "same", "unknown", "improved",
         "se (median)"],
        rows,
        "lllrrrrrr",
    )  # fmt: skip
    lines += [
        "",
        "## By cell",
        "",
        "Each check's verdicts (r regressed, s same, u unknown, i improved, p passed):",
        "",
    ]
    cells = sorted(
        {c for part in ("a", "b") for slower in slowers for c in by_cell(records, part, slower)}
    )
    header = ["check"] + [f"({part}) {label(s)}" for part in ("a", "b") for s in slowers]
    rows = []
    for c in cells:
        row = [c]
        for part in ("a", "b"):
            for slower in slowers:
                got = by_cell(records, part, slower).get(c, Counter())
                row.append(" ".join(f"{got[v]}{v[0]}" for v in VERDICTS if got[v]) or "–")
        rows.append(row)
    lines += table(header, rows)
    empty: Counter[str] = Counter(e for r in records if r.part == "b" for e in r.empty)
    errors = [r for r in records if r.error]
    odd = meta.get("outliers") or []
    if odd:
        lines += [
            "",
            "## Odd rounds",
            "",
            f"(b): {len(odd)} figures of a round more than a factor 1.65 from their arm's "
            "median in their A/B, or missing beside the cell's other figure (a stalled "
            "window on the loaded machine); each enters the spread the A/B pools over every "
            "cell:",
            "",
            *[f"- {o}" for o in odd],
        ]
    lines += [
        "",
        "## Left out",
        "",
        "- (a): the stored gate also gates the prefill cells a decode warm-up measured "
        "(of the decode contexts); they are left out so that both parts count the same "
        "checks.",
    ]
    if empty:
        lines.append(
            "- (b): cells in the A/B's `cells` with a verdict and no figures (counted in its "
            "`counts` and the summary's, not here): "
            + ", ".join(f"{e} ({n} A/Bs)" for e, n in sorted(empty.items()))
        )
    if errors or meta["skipped"]:
        for r in errors:
            lines.append(
                f"- ({r.part}) trial {r.trial}, {label(r.slower)}: {r.error} (exit status {r.rc})"
            )
        for what, n in meta["skipped"].items():
            lines.append(f"- {n} × {what}: not started, past --max-minutes")
    return lines


# -- main ------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=12, help="trials of each part and version")
    ap.add_argument("--only", choices=("a", "b"), help="only (a) the stored baseline or (b)")
    ap.add_argument("--quick", action="store_true", help="one trial, a shorter gap: a smoke")
    ap.add_argument("--slowers", default="0,0.05,0.1,0.2", help="the new versions' slowdowns")
    ap.add_argument("--parts", default="decode,prefill,frontend", help="what --slower slows")
    ap.add_argument("--profile", default="tiny")
    ap.add_argument("--speed", type=float, default=1.0)
    ap.add_argument("--start-noise", type=float, default=0.02)
    ap.add_argument("--drift", type=float, default=0.2)
    ap.add_argument("--drift-period", type=float, default=60.0, help="seconds")
    ap.add_argument("--gap", type=float, help="(a): seconds from baseline to gated runs")
    ap.add_argument("--tolerance", type=float, default=0.05)
    ap.add_argument("--contexts", default="1K")
    ap.add_argument("--prefill-contexts", default="2K,4K,8K,16K")
    ap.add_argument("--concurrency", default="1,8")
    ap.add_argument("--duration", type=float, default=1.0)
    ap.add_argument("--max-output", type=int, default=256)
    ap.add_argument("--parallel", type=int, default=3, help="runs at once")
    ap.add_argument("--max-minutes", type=float, default=32.0, help="no run starts after")
    ap.add_argument("--seed", type=int, default=3100)
    ap.add_argument("--prior", type=int, default=0, help="(b): earlier A/Bs as --llm-ab-prior")
    ap.add_argument("--work", type=Path, help="keep every run's folder here")
    ap.add_argument("--markdown", type=Path, default=RESULTS / "ab_vs_stored.md")
    ap.add_argument("--rerender", type=Path, help="write the page again from a raw.json")
    args = ap.parse_args(argv)
    if args.rerender:
        raw = json.loads(args.rerender.read_text())
        records = [RunRecord(**r) for r in raw["records"]]
        raw["meta"]["outliers"] = outlier_rounds(args.rerender.parent)
        write_page(args.markdown, page(raw["meta"], records), TAG)
        return 0
    if args.quick:
        args.trials = 1
    args.slowers = [float(s) for s in args.slowers.split(",")]
    if args.gap is None:
        args.gap = (1.0 if args.quick else 2.0) * args.drift_period
    work = args.work or Path(tempfile.mkdtemp(prefix="ab-vs-stored-"))
    work.mkdir(parents=True, exist_ok=True)
    print(f"[{TAG}] runs in {work}; plugin: {plugin_source()}", flush=True)
    t0 = time.monotonic()
    load_before = loadavg()
    others = OtherCores()
    others.__enter__()
    sched = Schedule(args.parallel, t0 + 60 * args.max_minutes, t0)
    args.prior_files = []
    if args.prior:
        with ThreadPoolExecutor(args.prior) as ex:
            found = list(ex.map(lambda k: prior_run(args, sched, work, k), range(args.prior)))
        args.prior_files = [str(p) for p in found if p is not None]
    jobs: list[tuple[Any, ...]] = []
    for trial in range(args.trials):  # trial-major: every version progresses alike
        if args.only != "b":
            jobs.append((trial_a, args, sched, work, trial))
        if args.only != "a":
            jobs += [(trial_b, args, sched, work, trial, s) for s in args.slowers]
    with ThreadPoolExecutor(len(jobs)) as ex:
        futures = []
        for job in jobs:
            futures.append(ex.submit(job[0], *job[1:]))
            time.sleep(0.05)  # roughly in order for the slots
        for fut in futures:
            fut.result()
    records = sched.records
    others.__exit__(None, None, None)
    # a round's wall time, from the A/Bs (their rounds), else the gated runs
    ab_rounds = [
        json.loads((p).read_text())["ab"]["rounds"] for p in work.glob("b/t*/slower*/r.json")
    ]
    round_s = [r["duration_s"] for rounds in ab_rounds for r in rounds if len(r["cells"]) > 2]
    per_round = [
        rec.wall_s / rec.rounds for rec in records if rec.part == "b" and rec.rounds and rec.checks
    ]
    bwall = sched.baseline_walls
    meta = {
        "command": command("benchmarks.studies.ab_vs_stored", argv),
        "date": utc_now(),
        "machine": machine(),
        "load_before": load_before,
        "load_after": loadavg(),
        "other_cores": others.cores,
        "wall_min": (time.monotonic() - t0) / 60,
        "plugin": plugin_source(),
        "slowers": args.slowers,
        "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "example_old": sim_command(args, args.seed + 1000, 0.0).replace(sys.executable, "python"),
        "round_s": statistics.median(per_round) if per_round else 5.0,
        "round_cells_s": statistics.median(round_s) if round_s else None,
        "baseline_wall": statistics.fmean(bwall) if bwall else None,
        "any_passed": any(v == "passed" for r in records for _, _, v, _, _ in r.checks),
        "skipped": dict(sched.skipped),
        "outliers": outlier_rounds(work),
        "prior_files": [str(Path(p).relative_to(work)) for p in args.prior_files],
    }
    (work / "raw.json").write_text(
        json.dumps({"meta": meta, "records": [asdict(r) for r in records]}, indent=1)
    )
    lines = page(meta, records)
    write_page(args.markdown, lines, TAG)
    print("\n".join(lines))
    print(f"[{TAG}] raw: {work / 'raw.json'}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
