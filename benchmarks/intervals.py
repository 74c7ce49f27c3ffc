"""Intervals, early ends and the interval-aware gate, measured on the simulator (issue 11).

One run of this script measures, on the H200 reference profile with ``noise`` (each engine
step's time varies by that fraction):

1. **Wall time**: the decode matrix with fixed windows of ``--fixed`` seconds, then with
   ``--llm-precision`` (``--precision``, windows between ``--min`` and ``--fixed`` seconds);
   the two runs' figures, each inside the other's interval or not.
2. **Coverage**: ``--runs`` independent runs of the matrix (each its own salt, so its own cold
   prefixes) with ``--window``-second windows. Per cell, the share of runs whose 95 % interval
   holds the mean of all runs (predicted 95 %), and the share of consecutive pairs where one
   run's interval holds the next run's figure (predicted 83 %: P(|Z|·√2 < 1.96)).
3. **The gate**: every run after the first gated against a baseline saved from the first, by
   the gate's own functions (``gate.verdict``), tolerance ``--tolerance``, with the next run as
   the confirmation when a check misses; then ``--slow-runs`` runs on servers 5 % and 10 %
   slower (``speed`` × 0.95, × 0.90). Checks are total and per-request tok/s of each decode cell.

    python -m benchmarks.intervals                       # about 15 minutes
    python -m benchmarks.intervals --runs 20 --slow-runs 8
    python -m benchmarks.intervals --vllm                # real vLLM (CPU build, tiny model)

With ``--vllm`` parts 1 and 2 run against one real vLLM server (``engines.servers``, its
defaults: 1K and 4K × 1 and 4, 512-token outputs) and part 3 is left out: a slower vLLM cannot
be dialled in. Results go to ``benchmarks/results/intervals_vllm.md``.

It drives the measurement core directly (``core.bench.Bench``), as the pytest layer does, and
writes ``benchmarks/results/intervals.md``. A cell the core calls failed or error (its rule:
``core.status``, as in the pytest layer) stops the run.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

from benchmarks import harness
from benchmarks.common import table
from benchmarks.gate_noise import upper_bound
from benchmarks.harness import Figure, cli
from pytest_llmspeed.core.bench import Bench, BenchConfig
from pytest_llmspeed.gate.baseline import CellBaseline
from pytest_llmspeed.gate.verdict import verdict, wants_another
from pytest_llmspeed.results import CellRecord, Outcome, Status
from pytest_llmspeed.sim import SimOptions, running_simulator_process

METRICS = ("total_tok_s", "per_request_tok_s")


@dataclass
class Matrix:
    cells: dict[str, CellRecord]
    wall_s: float


def measure_matrix(
    url: str, args: argparse.Namespace, window: float, precision: float | None
) -> Matrix:
    bench = Bench(
        BenchConfig(
            base_url=url,
            api_key=None,
            model=None,
            api="completions",
            max_output=args.max_output,
            duration=window,
            timeout=120,
            kv_capacity=None,
            precision=precision,
            min_duration=args.min,
        )
    )
    bench.start()
    t0 = time.perf_counter()
    cells: dict[str, CellRecord] = {}
    try:
        for ctx in args.contexts:
            # the cold request that warms P(C); its output is not measured
            valid(bench.prefill_cell(ctx, 16))
            for n in args.concurrency:
                rec = valid(bench.decode_cell(ctx, n))
                cells[str(rec.id)] = rec
    finally:
        bench.close()
    return Matrix(cells, time.perf_counter() - t0)


def valid(rec: CellRecord) -> CellRecord:
    """The record of a valid cell; a cell the core calls failed or error stops the run (its
    figures would say nothing of the intervals)."""
    if rec.status is not Status.VALID:
        sys.exit(f"{rec.id}: {rec.status.value}: {rec.reason}")
    return rec


def within(rec: CellRecord, value: float | None) -> bool:
    lo, hi = rec.total_tok_s_ci or (math.nan, math.nan)
    return value is not None and lo <= value <= hi


def half_width(rec: CellRecord) -> float:
    """Half the interval of total tok/s, relative to the figure (nan without either)."""
    if rec.total_tok_s_ci is None or not rec.total_tok_s:
        return math.nan
    lo, hi = rec.total_tok_s_ci
    return (hi - lo) / 2 / rec.total_tok_s


def entry_of(rec: CellRecord, tolerance: float) -> CellBaseline:
    limits = {m: float(getattr(rec, m)) for m in METRICS if getattr(rec, m)}
    cis = {m: getattr(rec, f"{m}_ci") for m in METRICS if getattr(rec, f"{m}_ci")}
    return CellBaseline(str(rec.id), limits, tolerance, 0, cis)


@dataclass
class GateTally:
    checks: int = 0
    failed: int = 0
    cells: int = 0
    cells_failed: int = 0
    noisy: int = 0
    first_missed: int = 0
    # against the first baseline only: runs independent of each other
    checks_1: int = 0
    failed_1: int = 0


def gate(
    baselines: list[Matrix],
    runs: list[Matrix],
    tolerance: float,
    intervals: bool,
    same: bool = False,
) -> GateTally:
    """Gate each run against a baseline saved from each of ``baselines`` in turn (``same``:
    they are ``runs`` themselves, and a run is not gated against its own baseline); the next
    run gated (cyclic) is the re-measurement when a check misses."""
    tally = GateTally()
    for b, base in enumerate(baselines):
        others = [r for j, r in enumerate(runs) if not (same and j == b)]
        for i, run in enumerate(others):
            again = others[(i + 1) % len(others)]
            for cid, rec in run.cells.items():
                entry = entry_of(base.cells[cid], tolerance)
                if not intervals:
                    entry = replace(entry, intervals={})
                attempts = [rec]
                if wants_another(entry, attempts, 1):
                    tally.first_missed += 1
                    attempts.append(again.cells[cid])
                result = verdict(entry, attempts)
                tally.cells += 1
                tally.cells_failed += result.outcome is Outcome.REGRESSION
                tally.checks += len(result.checks)
                tally.failed += len(result.regressions)
                tally.noisy += len(result.noisy)
                if b == 0:
                    tally.checks_1 += len(result.checks)
                    tally.failed_1 += len(result.regressions)
    return tally


def measure(argv: list[str]) -> harness.Outcome:
    """The parts the arguments ask for: the figures and the page (``--only-wall`` and
    ``--vllm`` are variants with their own files, ``intervals_wall_<precision>`` and
    ``intervals_vllm``)."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--profile", default="h200-qwen3.5-27b-int4")
    ap.add_argument("--noise", type=float, default=0.03)
    ap.add_argument("--speed", type=float, default=1.0)
    ap.add_argument("--contexts", default="8192,32768")
    ap.add_argument("--concurrency", default="1,8,32")
    ap.add_argument("--max-output", type=int, default=4096)
    ap.add_argument("--fixed", type=float, default=30.0)
    ap.add_argument("--precision", type=float, default=0.01)
    ap.add_argument("--min", type=float, default=5.0)
    ap.add_argument("--window", type=float, default=8.0)
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--slow-runs", type=int, default=4)
    ap.add_argument("--tolerance", type=float, default=0.02)
    ap.add_argument("--skip-wall", action="store_true")
    ap.add_argument(
        "--only-wall",
        action="store_true",
        help="part 1 only, written to benchmarks/results/intervals_wall_<precision>.md",
    )
    ap.add_argument("--vllm", action="store_true", help="against real vLLM (parts 1 and 2)")
    ap.add_argument(
        "--pin-client",
        type=int,
        default=None,
        metavar="CPU",
        help="with --vllm: once the server runs, keep this process (the client) on this CPU",
    )
    args = ap.parse_args(argv)
    if args.vllm:
        given = set(argv)
        for flag, value in (
            ("--contexts", "1024,4096"),
            ("--concurrency", "1,4"),
            ("--max-output", 512),
            ("--fixed", 20.0),
            ("--window", 8.0),
            ("--precision", 0.02),
        ):
            if not any(g.startswith(flag) for g in given):
                setattr(args, flag[2:].replace("-", "_"), value)
    args.contexts = [int(c) for c in args.contexts.split(",")]
    args.concurrency = [int(c) for c in args.concurrency.split(",")]
    started = time.perf_counter()

    vllm_url: list[str] = []

    @contextlib.contextmanager
    def sim(speed: float, seed: int) -> Iterator[str]:
        if vllm_url:  # one real server for every part
            yield vllm_url[0]
            return
        with running_simulator_process(
            SimOptions(profile=args.profile, speed=speed, noise=args.noise, seed=seed)
        ) as url:
            yield url

    stack = contextlib.ExitStack()
    if args.vllm:
        from benchmarks.common import running_vllm

        logs = Path(tempfile.mkdtemp(prefix="llmspeed-intervals-vllm-"))
        server = stack.enter_context(running_vllm(logs)).server
        print(f"[intervals] vLLM at {server.url}, its log in {logs}", flush=True)
        vllm_url.append(server.url)
        if args.pin_client is not None:
            # vLLM binds its worker's threads to the CPUs it does not reserve (core 0 of two
            # here, its log says); the client kept off them does not preempt the engine's steps
            os.sched_setaffinity(0, {args.pin_client})
            print(f"[intervals] client pinned to CPU {args.pin_client}", flush=True)
        args.profile = f"real vLLM (CPU build, {server.model}) at {server.url}"

    lines = [
        "# Intervals, early ends and the interval-aware gate "
        + ("(real vLLM)" if args.vllm else "(simulator)"),
        "",
        (
            f"Server: {args.profile}, contexts "
            if args.vllm
            else f"Profile {args.profile}, noise {args.noise}, speed {args.speed}, contexts "
        )
        + f"{args.contexts}, concurrency {args.concurrency}, max output {args.max_output}.",
        "",
    ]
    figures: dict[str, Figure] = {}
    if not args.skip_wall:
        with sim(args.speed, 1) as url:
            fixed = measure_matrix(url, args, args.fixed, None)
        with sim(args.speed, 2) as url:
            early = measure_matrix(url, args, args.fixed, args.precision)
        rows: list[list[object]] = []
        for cid, a in fixed.cells.items():
            b = early.cells[cid]
            rows.append(
                [
                    cid,
                    f"{a.total_tok_s:,.1f}{_pm(a)}",
                    f"{b.total_tok_s:,.1f}{_pm(b)}",
                    f"{b.measured_s:.1f} s" + _why_full(b),
                    "yes" if within(a, b.total_tok_s) and within(b, a.total_tok_s) else "no",
                    _difference(a, b),
                ]
            )
        lines += [
            f"## 1. Wall time: fixed {args.fixed:g} s windows against --llm-precision="
            f"{args.precision:.0%} (min {args.min:g} s)",
            "",
            f"Decode matrix wall time: fixed {fixed.wall_s:.0f} s, with precision "
            f"{early.wall_s:.0f} s (**{early.wall_s / fixed.wall_s:.2f}×**).",
            "",
            *table(
                [
                    "cell",
                    "fixed: total tok/s",
                    "precision: total tok/s",
                    "window",
                    "each in the other's interval",
                    "difference (its 95 % interval)",
                ],
                rows,
            ),
            "",
        ]
        print("\n".join(lines), flush=True)
        figures["wall_ratio"] = Figure(round(early.wall_s / fixed.wall_s, 3), "×", digits=2)
        if args.only_wall:
            name = f"intervals_wall_{args.precision:.0%}".replace("%", "pct")
            return harness.Outcome(figures, lines, settings(args), name=name)

    runs: list[Matrix] = []
    with sim(args.speed, 3) as url:
        for i in range(args.runs):
            runs.append(measure_matrix(url, args, args.window, None))
            print(f"[intervals] no-change run {i + 1}/{args.runs}", flush=True)
    rows = []
    cover_mean = cover_next = pairs = total = 0
    for cid in runs[0].cells:
        recs = [r.cells[cid] for r in runs]
        values = [float(r.total_tok_s or 0) for r in recs]
        mean = statistics.fmean(values)
        hold_mean = sum(within(r, mean) for r in recs)
        hold_next = sum(within(recs[i], values[i + 1]) for i in range(len(recs) - 1))
        cover_mean += hold_mean
        cover_next += hold_next
        total += len(recs)
        pairs += len(recs) - 1
        sd = statistics.stdev(values) / mean if len(values) > 1 else math.nan
        half = statistics.fmean(half_width(r) for r in recs)
        rows.append(
            [
                cid,
                f"{mean:,.1f}",
                f"{sd:.2%}",
                f"±{half:.2%}",
                f"{hold_mean}/{len(recs)}",
                f"{hold_next}/{len(recs) - 1}",
            ]
        )
    lines += [
        f"## 2. Coverage: {args.runs} runs of {args.window:g} s windows",
        "",
        f"Intervals that hold the mean of all runs: **{cover_mean}/{total} "
        f"({cover_mean / total:.1%})**, predicted 95 %. Intervals that hold the next run's "
        f"figure: {cover_next}/{pairs} ({cover_next / pairs:.1%}), predicted 83 %.",
        "",
        *table(
            [
                "cell",
                "mean total tok/s",
                "run-to-run sd",
                "mean half-width",
                "hold the mean",
                "hold the next figure",
            ],
            rows,
        ),
        "",
    ]
    print("\n".join(lines[-8:]), flush=True)
    figures["cover_mean_pct"] = Figure(round(cover_mean / total * 100, 2), "%", "≈ 95 %")
    figures["cover_mean"] = Figure(f"{cover_mean} of {total}")
    figures["cover_next_pct"] = Figure(round(cover_next / pairs * 100, 2), "%", "≈ 83 %")

    if args.vllm:
        stack.close()
        lines.append(f"Whole benchmark: {(time.perf_counter() - started) / 60:.1f} min.")
        return harness.Outcome(figures, lines, settings(args), name="intervals_vllm")
    tallies = {
        ("no change", True): gate(runs, runs, args.tolerance, True, same=True),
        ("no change", False): gate(runs, runs, args.tolerance, False, same=True),
    }
    for factor in (0.95, 0.90):
        slow: list[Matrix] = []
        with sim(args.speed * factor, 4) as url:
            for i in range(args.slow_runs):
                slow.append(measure_matrix(url, args, args.window, None))
                print(f"[intervals] {factor:.2f} run {i + 1}/{args.slow_runs}", flush=True)
        label = f"{1 - factor:.0%} slower"
        tallies[(label, True)] = gate(runs, slow, args.tolerance, True)
        tallies[(label, False)] = gate(runs, slow, args.tolerance, False)
    rows = []
    for (label, with_ci), t in tallies.items():
        head = "no_change" if label == "no change" else f"slower_{label.split()[0].rstrip('%')}"
        key = f"{head}_{'ci' if with_ci else 'flat'}"
        figures[f"{key}_checks_failed"] = Figure(f"{t.failed} of {t.checks}")
        share = round(t.failed / max(t.checks, 1) * 100, 2)
        figures[f"{key}_checks_failed_pct"] = Figure(share, "%")
        # the checks share runs, so they are not independent: the bound is that of the checks
        # against the first baseline only
        bound = (
            f" (95 % bound ≤ {upper_bound(t.failed_1, t.checks_1):.1%}, from the "
            f"{t.failed_1}/{t.checks_1} against the first baseline)"
            if label == "no change"
            else ""
        )
        rows.append(
            [
                label,
                "intervals" if with_ci else "flat (old rule)",
                f"{t.failed}/{t.checks} ({t.failed / max(t.checks, 1):.1%}){bound}",
                f"{t.cells_failed}/{t.cells} ({t.cells_failed / max(t.cells, 1):.1%})",
                t.noisy,
                t.first_missed,
            ]
        )
    lines += [
        f"## 3. The gate at tolerance {args.tolerance:.0%}, confirm 1",
        "",
        "Baselines: each run of part 2 in turn; every other run is gated against it by "
        "`gate.verdict`, and a check that misses is re-measured by the next run gated. Checks: "
        "total and per-request tok/s. The checks share runs, so they are not independent: the "
        "95 % bound on false failures (Clopper-Pearson) is that of the checks against the "
        "first baseline only, whose runs are independent.",
        "",
        *table(
            [
                "server",
                "rule",
                "checks failed",
                "cells failed",
                "noisy (not failed)",
                "first attempts that missed",
            ],
            rows,
        ),
        "",
        f"Whole benchmark: {(time.perf_counter() - started) / 60:.1f} min.",
    ]
    return harness.Outcome(figures, lines, settings(args))


def settings(args: argparse.Namespace) -> dict[str, object]:
    """The run's arguments, as a result records them."""
    return {k: v for k, v in vars(args).items()}


def main() -> None:
    sys.exit(cli("intervals", measure))


def _why_full(rec: CellRecord) -> str:
    """Why a window with --llm-precision ran to its end: a drift flagged (the trend was
    significant and moved the figure by 1 % or more), else the precision not reached."""
    if rec.window_end != "duration":
        return ""
    if rec.drift is not None:
        return f" (drift {rec.drift:+.1%})"
    return f" (±{rec.precision or 0:.2%} reached)"


def _difference(a: CellRecord, b: CellRecord) -> str:
    """b − a as a fraction of a, and whether it lies within its own 95 % interval: the two
    runs are independent, so the half-widths add in quadrature (for each run's interval, the
    distance from its centre — an early end's interval is centred on the full window's
    estimate, not on the figure it measured)."""
    if not (a.total_tok_s_ci and b.total_tok_s_ci and a.total_tok_s):
        return "–"
    centre_a, centre_b = sum(a.total_tok_s_ci) / 2, sum(b.total_tok_s_ci) / 2
    half = math.hypot(
        (a.total_tok_s_ci[1] - a.total_tok_s_ci[0]) / 2,
        (b.total_tok_s_ci[1] - b.total_tok_s_ci[0]) / 2,
    )
    diff = centre_b - centre_a
    return f"{diff / a.total_tok_s:+.2%} (±{half / a.total_tok_s:.2%}): " + (
        "yes" if abs(diff) <= half else "no"
    )


def _pm(rec: CellRecord) -> str:
    if not rec.total_tok_s_ci or not rec.total_tok_s:
        return ""
    return f" ±{(rec.total_tok_s_ci[1] - rec.total_tok_s_ci[0]) / 2 / rec.total_tok_s:.2%}"


if __name__ == "__main__":
    main()
