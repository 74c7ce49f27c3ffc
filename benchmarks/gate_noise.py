"""How good is the performance gate? False failures on noise, detection of real slow-downs.

Drives the plugin the way a user does: every run is ``python -m pytest`` in a fresh empty
folder against the built-in simulator (``sim:PROFILE?speed=S&noise=F&seed=N``), with
``-p no:cacheprovider --benchmark-disable -q``.

1. One run with ``--llm-save-baseline`` at the base speed (seed ``--seed``) writes the baseline.
2. Gating runs with ``--llm-baseline`` at each speed factor of ``--factors`` (1.0 = no change,
   0.95 = 5 % slower, 0.9 = 10 % slower, relative to the base speed), each with its own seed,
   ``--runs`` of them per factor.
3. Each run's ``--llm-results`` JSON is read: every gated cell has ``baseline`` (passed /
   regressed) and ``baseline_checks`` (one per metric: values per attempt, verdict). A *check* is
   one cell × metric; a cell fails when any of its checks regresses.

At factor 1.0 every failure is a false failure; below 1.0 every cell is affected (the simulator's
speed divides every simulated time), so every check that passes is a missed detection.
The report gives the rates with exact (Clopper-Pearson) 95 % bounds, the raw miss rate of the
first measurement (what the gate would do without ``--llm-confirm``), and per metric the spread
of value / reference at factor 1.0, so a false-failure rate can be traced to its cause.

Usage (from the repository root):

    python -m benchmarks.gate_noise                      # defaults: about 25 minutes
    python -m benchmarks.gate_noise --profile tiny --contexts 1K,4K   # short, noisy prefills
    python -m benchmarks.gate_noise --runs 30,10,12 --factors 1.0,0.95,0.9 --tolerance 0.05
    python -m benchmarks.gate_noise --runs 2 --factors 1.0,0.9 --wait-idle 0   # a smoke run

The machine must be quiet: the simulator runs on this machine (a child process of each pytest
run), so other processes' CPU shows up as a slower server. The benchmark waits
(``--wait-idle``) for a quiet CPU (and no vLLM process before the baseline run), measures the
CPU other processes use during each run (on average and in its busiest second), and measures a
disturbed run again (``--retries``);
the summary says how many runs that took and the load they ran under.

Options of the matrix: --profile, --base-speed, --noise, --start-noise (each run a fresh start
with its own speed factor), --contexts, --concurrency, --duration,
--max-output, --confirm, --prefill-repeats, --tolerance (rewrites the baseline's default
tolerance).
The summary is the page that ``benchmarks.harness`` writes, with its figures as JSON;
``--keep DIR`` keeps every run's folder (its ``results.json`` and ``output.txt``).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.common import (
    cpu_seconds,
    loadavg,
    machine_busy_seconds,
    table,
    vllm_processes,
    wait_quiet,
)
from benchmarks.harness import Figure, Outcome, cli

# -- statistics ------------------------------------------------------------------------------


def _binom_cdf(k: int, n: int, p: float) -> float:
    """P(X ≤ k), X ~ Binomial(n, p), summed in log space (n up to a few thousand)."""
    if p <= 0:
        return 1.0
    if p >= 1:
        return 1.0 if k >= n else 0.0
    lp, lq = math.log(p), math.log1p(-p)
    total = 0.0
    for i in range(k + 1):
        total += math.exp(
            math.lgamma(n + 1) - math.lgamma(i + 1) - math.lgamma(n - i + 1) + i * lp + (n - i) * lq
        )
    return min(total, 1.0)


def _bisect(f: Any, lo: float = 0.0, hi: float = 1.0) -> float:
    for _ in range(60):
        mid = (lo + hi) / 2
        if f(mid):
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def upper_bound(k: int, n: int, alpha: float = 0.05) -> float:
    """One-sided exact (Clopper-Pearson) upper bound of a rate seen k times in n trials.
    For k = 0 it is 1 − alpha^(1/n) ≈ 3/n (the rule of three)."""
    if n == 0:
        return 1.0
    if k >= n:
        return 1.0
    return _bisect(lambda p: _binom_cdf(k, n, p) > alpha)


def lower_bound(k: int, n: int, alpha: float = 0.05) -> float:
    """One-sided exact lower bound of a rate seen k times in n trials."""
    if n == 0 or k == 0:
        return 0.0
    return 1 - upper_bound(n - k, n, alpha)


# -- one pytest run --------------------------------------------------------------------------


@dataclass
class Run:
    factor: float
    seed: int
    exit_code: int
    seconds: float
    cells: list[dict[str, Any]] = field(default_factory=list)
    output: str = ""
    foreign_cpu: float = 0.0  # CPU used by other processes, fraction of the machine
    foreign_peak: float = 0.0  # the same in the busiest second of the run
    servers_seen: bool = False  # a vLLM process existed at some point during the run

    @property
    def disturbed(self) -> bool:
        return self.foreign_cpu > FOREIGN_CPU_LIMIT or self.foreign_peak > FOREIGN_PEAK_LIMIT

    def load_note(self) -> str:
        return (
            f"other processes {self.foreign_cpu:.0%} of the CPU (peak second "
            f"{self.foreign_peak:.0%}){', a vLLM process existed' if self.servers_seen else ''}"
        )


#: a run during which other processes used more than this fraction of the machine's CPU on
#: average, or more than FOREIGN_PEAK_LIMIT in any one second, is measured again: the gate's
#: quality is a property of the gate, not of a neighbour (the simulator shares the pytest
#: process, so a busy CPU looks like a slower server)
FOREIGN_CPU_LIMIT = 0.15
FOREIGN_PEAK_LIMIT = 0.5


def endpoint(args: argparse.Namespace, speed: float, seed: int) -> str:
    spec = f"sim:{args.profile}?speed={speed:g}&noise={args.noise:g}&seed={seed}"
    if args.start_noise:  # each run a fresh start: its own speed factor (fresh OS entropy)
        spec += f"&start_noise={args.start_noise:g}"
    return spec


def pytest_argv(args: argparse.Namespace, speed: float, seed: int, *extra: str) -> list[str]:
    return [
        sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--benchmark-disable", "-q",
        f"--llm-endpoint={endpoint(args, speed, seed)}",
        f"--llm-contexts={args.contexts}",
        f"--llm-concurrency={args.concurrency}",
        f"--llm-duration={args.duration:g}",
        f"--llm-max-output={args.max_output}",
        f"--llm-prefill-repeats={args.prefill_repeats}",
        *extra,
    ]  # fmt: skip


def run_pytest(argv: list[str], folder: Path) -> Run:
    """Run one pytest session; measure its own CPU and everybody else's while it ran (on
    average, and the busiest second)."""
    folder.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LLMSPEED_", "PYTEST_"))}
    env.pop("GITHUB_STEP_SUMMARY", None)
    seen = threading.Event()
    done = threading.Event()
    peak = [0.0]
    ncpu = os.cpu_count() or 1

    def watch(pid: int) -> None:
        last = (time.perf_counter(), machine_busy_seconds(), cpu_seconds(pid))
        tick = 0
        while not done.wait(1.0):
            now = (time.perf_counter(), machine_busy_seconds(), cpu_seconds(pid))
            if now[2] is None or last[2] is None:
                break
            foreign = (now[1] - last[1] - (now[2] - last[2])) / ((now[0] - last[0]) * ncpu)
            peak[0] = max(peak[0], foreign)
            last = now
            tick += 1
            if tick % 2 == 0 and vllm_processes():
                seen.set()

    log = folder / "output.txt"
    busy0, start = machine_busy_seconds(), time.perf_counter()
    with log.open("w") as out:
        proc = subprocess.Popen(argv, cwd=folder, env=env, stdout=out, stderr=subprocess.STDOUT)
        watcher = threading.Thread(target=watch, args=(proc.pid,), daemon=True)
        watcher.start()
        _, status, usage = os.wait4(proc.pid, 0)
    seconds, busy = time.perf_counter() - start, machine_busy_seconds() - busy0
    done.set()
    watcher.join()
    own = usage.ru_utime + usage.ru_stime
    run = Run(0.0, 0, os.waitstatus_to_exitcode(status), seconds, output=log.read_text())
    run.foreign_cpu = max(0.0, busy - own) / (seconds * ncpu)
    run.foreign_peak = peak[0]
    run.servers_seen = seen.is_set() or bool(vllm_processes())
    return run


def gate_run(args: argparse.Namespace, work: Path, baseline: Path, factor: float, seed: int) -> Run:
    folder = work / f"gate-{factor:g}-seed{seed}"
    results = folder / "results.json"
    results.unlink(missing_ok=True)
    argv = pytest_argv(
        args,
        args.base_speed * factor,
        seed,
        f"--llm-baseline={baseline}",
        f"--llm-confirm={args.confirm}",
        f"--llm-results={results}",
    )
    run = run_pytest(argv, folder)
    run.factor, run.seed = factor, seed
    if results.exists():
        run.cells = [
            c for c in json.loads(results.read_text())["cells"] if c.get("baseline_checks")
        ]
    return run


def wait_idle(limit: float, quiet_for: int = 3, no_servers: bool = False) -> float:
    """Wait (at most limit seconds) until other processes have used less than
    FOREIGN_CPU_LIMIT of the CPU for quiet_for seconds (and, with no_servers, no vLLM process
    exists); returns the seconds waited."""
    max_other = FOREIGN_CPU_LIMIT * (os.cpu_count() or 1)
    return wait_quiet(limit, max_other, quiet_for=quiet_for, no_vllm=no_servers, tag="gate-noise")


# -- tallies ---------------------------------------------------------------------------------


@dataclass
class Tally:
    runs: int = 0
    bad_runs: int = 0  # exit code other than 0 (all passed) or 1 (some failed)
    cells: int = 0
    cells_failed: int = 0
    checks: int = 0
    checks_failed: int = 0
    first_misses: int = 0  # checks whose first measurement missed (gate without --llm-confirm)
    remeasured_cells: int = 0
    seconds: float = 0.0
    per_metric: dict[str, list[int]] = field(default_factory=lambda: defaultdict(lambda: [0, 0, 0]))
    failures: list[str] = field(default_factory=list)
    ratios: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    failed_by_check: dict[str, int] = field(default_factory=lambda: defaultdict(int))


def misses(check: dict[str, Any], value: float) -> bool:
    floor = check["limit"] <= check["reference"]
    return value < check["limit"] if floor else value > check["limit"]


def tally(runs: list[Run]) -> Tally:
    t = Tally()
    for run in runs:
        t.runs += 1
        t.seconds += run.seconds
        if run.exit_code not in (0, 1) or not run.cells:
            t.bad_runs += 1
            continue
        for cell in run.cells:
            t.cells += 1
            t.cells_failed += cell["baseline"] == "regressed"
            t.remeasured_cells += len(cell.get("attempts", [])) > 1
            for check in cell["baseline_checks"]:
                metric = check["metric"]
                failed = check["verdict"] == "regressed"
                first = misses(check, check["values"][0])
                t.checks += 1
                t.checks_failed += failed
                t.first_misses += first
                m = t.per_metric[metric]
                m[0] += 1
                m[1] += failed
                m[2] += first
                key = f"{cell['id']} {metric}"
                t.ratios[key].append(check["values"][0] / check["reference"])
                t.failed_by_check[key] += failed
                if failed:
                    shown = ", ".join(f"{v:,.1f}" for v in check["values"])
                    t.failures.append(
                        f"seed {run.seed}: {key} reference {check['reference']:,.1f}, limit "
                        f"{check['limit']:,.1f}, attempts {shown} ({check['change']:+.1%})"
                    )
    return t


def pct(x: float) -> str:
    return f"{100 * x:.1f} %" if x >= 0.001 or x == 0 else f"{100 * x:.2f} %"


def summary(args: argparse.Namespace, tallies: dict[float, Tally], meta: dict[str, Any]) -> str:
    rows = []
    for factor, t in tallies.items():
        if factor == 1.0:
            rate = t.checks_failed / t.checks if t.checks else 0.0
            bound = f"{pct(rate)} (≤ {pct(upper_bound(t.checks_failed, t.checks))})"
            what = "false failures"
        else:
            rate = t.checks_failed / t.checks if t.checks else 0.0
            bound = f"{pct(rate)} (≥ {pct(lower_bound(t.checks_failed, t.checks))})"
            what = "detected"
        cells_rate = t.cells_failed / t.cells if t.cells else 0.0
        rows.append(
            [
                f"{factor:g}", f"{t.runs}{f' ({t.bad_runs} bad)' if t.bad_runs else ''}",
                t.cells, t.checks, t.checks_failed, f"{what} {bound}",
                f"{t.cells_failed} ({pct(cells_rate)})",
                f"{t.first_misses} ({pct(t.first_misses / t.checks if t.checks else 0)})",
                t.remeasured_cells,
            ]
        )  # fmt: skip
    header = ["speed factor", "runs", "cells (failed)", "checks", "checks failed"]
    header += ["rate (95 % bound)", "cells failed", "first measurement missed"]
    out = table([*header, "cells re-measured"], rows, "rrrrrlrrr")
    factors = [f"factor {f:g}" for f in tallies]
    align = "l" + "r" * len(tallies)
    rows = []
    for metric in sorted({m for t in tallies.values() for m in t.per_metric}):
        cells = []
        for t in tallies.values():
            n, failed, first = t.per_metric.get(metric, [0, 0, 0])
            cells.append(f"{failed}/{n} (first {first})")
        rows.append([metric, *cells])
    out += ["", "Per metric (checks failed / checks, first measurement missed):", ""]
    out += table(["metric", *factors], rows, align)
    rows = []
    for key in dict.fromkeys(k for t in tallies.values() for k in t.ratios):
        cells = []
        for t in tallies.values():
            values = t.ratios.get(key, [])
            if not values:
                cells.append("")
                continue
            sd = statistics.stdev(values) if len(values) > 1 else 0.0
            cells.append(
                f"{t.failed_by_check.get(key, 0)}/{len(values)} · "
                f"{statistics.mean(values):.3f} ± {sd:.3f}"
            )
        rows.append([key, *cells])
    out += [
        "",
        "Per check: failed / runs, and first measurement / baseline reference as mean ± sd "
        "(the baseline is one run: its own error shifts every comparison the same way):",
        "",
        *table(["check", *factors], rows, align),
    ]
    for factor, t in tallies.items():
        if factor == 1.0 and t.failures:
            out += ["", f"False failures at factor 1.0 ({len(t.failures)}):", ""]
            out += [f"- {line}" for line in t.failures]
    out += ["", "Conditions: " + ", ".join(f"{k} {v}" for k, v in meta.items())]
    return "\n".join(out)


def measure(argv: list[str]) -> Outcome:
    """A baseline run, then gating runs at each speed factor, interleaved: the share of checks
    and cells that failed at each (the figures) and the summary (the page)."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--runs",
        default="30,10,12",
        help="gating runs per factor: one number, or one per factor (default 30,10,12)",
    )
    ap.add_argument(
        "--factors",
        default="1.0,0.95,0.9",
        help="speed factors relative to the baseline's speed (default 1.0,0.95,0.9)",
    )
    ap.add_argument(
        "--profile",
        default="h200-qwen3.5-27b-int4",
        help="simulator profile (default: the reference H200 profile at speed 1, real timings)",
    )
    ap.add_argument(
        "--base-speed",
        type=float,
        default=1.0,
        help="simulator speed of the baseline run (default 1: not CPU-bound)",
    )
    ap.add_argument("--noise", type=float, default=0.03)
    ap.add_argument(
        "--start-noise",
        type=float,
        default=0.0,
        help="the simulator's between-start noise: each run (a fresh start) draws its own speed "
        "factor, the baseline's run too (default 0)",
    )
    ap.add_argument(
        "--seed",
        type=int,
        default=1,
        help="seed of the baseline run; gating runs use seed+1, seed+2, ...",
    )
    ap.add_argument("--contexts", default="8K,16K")
    ap.add_argument("--concurrency", default="1,4,16")
    ap.add_argument("--duration", type=float, default=2.0)
    ap.add_argument("--max-output", type=int, default=512)
    ap.add_argument("--confirm", type=int, default=1, help="--llm-confirm of the gating runs")
    ap.add_argument(
        "--prefill-repeats",
        type=int,
        default=1,
        help="--llm-prefill-repeats of every run (default 1: one cold request per prefill "
        "cell, the shared protocol's definition)",
    )
    ap.add_argument(
        "--tolerance",
        type=float,
        default=None,
        help="rewrite the baseline's default tolerance (default: keep the plugin's)",
    )
    ap.add_argument(
        "--wait-idle",
        type=float,
        default=1200,
        metavar="SECONDS",
        help="before every run, wait at most this long until other processes use less than "
        f"{FOREIGN_CPU_LIMIT * 100:.0f}%% of the CPU (before the baseline run also: no vLLM "
        "process); default 1200",
    )
    ap.add_argument(
        "--retries",
        type=int,
        default=3,
        help="measure a disturbed run again (other processes used over "
        f"{FOREIGN_CPU_LIMIT * 100:.0f}%% of the CPU on average or "
        f"{FOREIGN_PEAK_LIMIT * 100:.0f}%% in one second), at most this many times (default 3)",
    )
    ap.add_argument(
        "--keep-disturbed",
        action="store_true",
        help="measure on when the baseline run stays disturbed (its page and JSON say how "
        "busy the machine was) instead of giving up",
    )
    ap.add_argument("--keep", type=Path, help="keep every run's folder under this directory")
    args = ap.parse_args(argv)

    factors = [float(f) for f in args.factors.split(",")]
    counts = [int(n) for n in args.runs.split(",")]
    if len(counts) == 1:
        counts *= len(factors)
    if len(counts) != len(factors):
        ap.error("--runs: give one number or one per factor")
    work = args.keep or Path(tempfile.mkdtemp(prefix="gate-noise-"))
    work.mkdir(parents=True, exist_ok=True)
    started = time.time()
    waited = wait_idle(args.wait_idle, quiet_for=15, no_servers=True)
    load_before = loadavg()
    foreign: list[float] = []
    peaks: list[float] = []
    with_servers = 0
    disturbed: list[str] = []
    try:
        baseline = work / "baseline.toml"
        for _ in range(args.retries + 1):
            save = run_pytest(
                pytest_argv(args, args.base_speed, args.seed, f"--llm-save-baseline={baseline}"),
                work / "save",
            )
            if not save.disturbed or _ == args.retries:
                break
            print("  the baseline run was disturbed by other processes: again", flush=True)
            waited += wait_idle(args.wait_idle, quiet_for=15, no_servers=True)
        if save.exit_code != 0 or not baseline.exists():
            print(save.output, file=sys.stderr)
            raise RuntimeError(f"the baseline run failed (exit code {save.exit_code})")
        if args.tolerance is not None:
            text = baseline.read_text()
            text = re.sub(r"(?m)^tolerance = [0-9.]+", f"tolerance = {args.tolerance!r}", text)
            baseline.write_text(text)
        print(
            f"baseline: {endpoint(args, args.base_speed, args.seed)}, {save.seconds:.1f} s, "
            f"{save.load_note()} -> {baseline}",
            flush=True,
        )
        if save.disturbed and not args.keep_disturbed:
            return Outcome(
                skipped=f"the baseline run was disturbed by other processes {args.retries + 1} "
                "times: the machine is not quiet enough to measure the gate",
                settings=vars(args),
            )

        # interleaved (1.0, 0.95, 0.9, 1.0, ...) so that a change of machine load during the
        # benchmark does not fall on one factor; every run has its own seed
        order = [
            f for i in range(max(counts)) for f, n in zip(factors, counts, strict=True) if i < n
        ]
        jobs = [(f, args.seed + 1 + k) for k, f in enumerate(order)]
        runs: dict[float, list[Run]] = {f: [] for f in factors}
        for done, (factor, seed) in enumerate(jobs, 1):
            for attempt in range(args.retries + 1):
                waited += wait_idle(args.wait_idle)
                run = gate_run(args, work, baseline, factor, seed)
                failed = sum(c["baseline"] == "regressed" for c in run.cells)
                print(
                    f"[{done}/{len(jobs)}] factor {factor:g} seed {seed}: exit "
                    f"{run.exit_code}, {failed}/{len(run.cells)} cells failed, "
                    f"{run.seconds:.1f} s, {run.load_note()}"
                    f"{', DISTURBED: measured again' if run.disturbed else ''}",
                    flush=True,
                )
                if not run.disturbed or attempt == args.retries:
                    break
                disturbed.append(f"factor {factor:g} seed {seed}: {failed} cells failed")
            runs[factor].append(run)
            foreign.append(run.foreign_cpu)
            peaks.append(run.foreign_peak)
            with_servers += run.servers_seen
            if run.exit_code not in (0, 1) or not run.cells:
                print(run.output[-3000:], file=sys.stderr)
    finally:
        if args.keep is None:
            shutil.rmtree(work, ignore_errors=True)

    tallies = {f: tally(runs[f]) for f in factors}
    meta = {
        "matrix": f"{args.profile}, contexts {args.contexts}, concurrency {args.concurrency}, "
        f"{args.duration:g} s windows, max output {args.max_output}, prefill repeats "
        f"{args.prefill_repeats}",
        "baseline": endpoint(args, args.base_speed, args.seed),
        "confirm": args.confirm,
        "wall time": f"{time.time() - started:.0f} s (of which waiting for an idle machine "
        f"{waited:.0f} s)",
        "load average (1, 5, 15 min) before the baseline run": load_before,
        "other processes' CPU during the baseline run": save.load_note().removeprefix(
            "other processes "
        ),
        "other processes' CPU during the kept gating runs": (
            f"median {statistics.median(foreign):.1%}, max {max(foreign):.1%}; busiest second "
            f"median {statistics.median(peaks):.1%}, max {max(peaks):.1%}"
            if foreign
            else "-"
        ),
        "kept runs during which a vLLM process existed": with_servers,
        "kept runs disturbed": sum(r.disturbed for rs in runs.values() for r in rs),
        "disturbed runs measured again (not counted)": (
            f"{len(disturbed)} ({'; '.join(disturbed)})" if disturbed else 0
        ),
        "cpus": os.cpu_count(),
        "python": sys.version.split()[0],
    }
    text = summary(args, tallies, meta)
    figures: dict[str, Figure] = {}
    for f, t in tallies.items():
        key = "no_change" if f == 1.0 else f"slower_{round((1 - f) * 100):g}"
        figures[f"{key}_checks_failed"] = Figure(f"{t.checks_failed} of {t.checks}")
        share = round(t.checks_failed / max(t.checks, 1) * 100, 2)
        figures[f"{key}_checks_failed_pct"] = Figure(share, "%")
        figures[f"{key}_cells_failed_pct"] = Figure(
            round(t.cells_failed / max(t.cells, 1) * 100, 2), "%"
        )
        figures[f"{key}_bad_runs"] = Figure(t.bad_runs, "runs")
    kept_disturbed = sum(r.disturbed for rs in runs.values() for r in rs)
    figures["disturbed_runs"] = Figure(kept_disturbed + save.disturbed, "runs")
    return Outcome(
        figures, text.splitlines(), {**vars(args), **{k: str(v) for k, v in meta.items()}}
    )


def main() -> None:
    sys.exit(cli("gate_noise", measure))


if __name__ == "__main__":
    main()
