"""The gate against a server whose speed differs from start to start: false failures at no
change and slowdowns caught, for baselines of 1, 3 and 5 runs and 0 to 8 confirmations.

The simulator's ``start_noise=S`` draws a speed factor for each start (as a real server's
memory layout, kernels and threads differ from start to start); ``noise`` adds the window's
own noise. This measures a *pool* of runs through the plugin, each ``python -m pytest`` of the
built-in suite in a fresh folder, so each run is a fresh start with its own factor:

- ``--pool`` runs at each speed factor of ``--factors`` (1.0 unchanged, 0.95 and 0.9: 5 % and
  10 % slower), each with its own seed (its windows' noise and its start factor), prefill
  cells the median of 6 cold requests as when gating.

Then trials draw from the pool, with the gate's own functions (``gate.baseline.baseline_of``,
``gate.verdict.wants_another`` and ``verdict`` with ``fresh_starts=True``): a baseline of k
runs drawn from the unchanged runs, a gated run drawn from a factor's runs (never one of the
baseline's), and each confirmation the same cell of one more run of that factor — another
fresh start, exactly what ``--llm-confirm`` takes with the plugin restarting the server. The
pool is measured once and judged many ways, so every rule meets the same measurements.

Trials reuse the pool's runs, so they are not independent: the rates are estimates of the
gate on this pool, and their spread between pools is larger than a binomial bound suggests;
``benchmarks/studies/gate_restarts.py`` gives the same rule's rates on synthetic draws in their
thousands. This benchmark shows they hold with the plugin's real measurements.

    python -m benchmarks.studies.gate_start_noise        # about 25 minutes
    python -m benchmarks.studies.gate_start_noise --start-noise 0.03 --pool 8,4,4 --trials 200
"""

from __future__ import annotations

import argparse
import os
import random
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from benchmarks.common import RESULTS, command, loadavg, machine, table, utc_now, write_page
from pytest_llmspeed.gate.baseline import baseline_of
from pytest_llmspeed.gate.verdict import verdict, wants_another
from pytest_llmspeed.results import CellRecord, Outcome, Status
from pytest_llmspeed.results import load as load_results


def endpoint(args: argparse.Namespace, start_noise: float, factor: float, seed: int) -> str:
    return (
        f"sim:{args.profile}?speed={args.base_speed * factor:g}&noise={args.noise:g}"
        f"&seed={seed}&start_noise={start_noise:g}&start_seed={seed}"
    )


def pool_run(
    args: argparse.Namespace, folder: Path, start_noise: float, factor: float, seed: int
) -> list[CellRecord] | None:
    """One run of the built-in suite on a fresh start; its valid records (None: it failed)."""
    folder.mkdir(parents=True, exist_ok=True)
    argv = [
        sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--benchmark-disable", "-q",
        f"--llm-endpoint={endpoint(args, start_noise, factor, seed)}",
        f"--llm-contexts={args.contexts}",
        f"--llm-concurrency={args.concurrency}",
        f"--llm-duration={args.duration:g}",
        f"--llm-max-output={args.max_output}",
        "--llm-prefill-repeats=6",
        "--llm-results=results.json",
    ]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LLMSPEED_", "PYTEST_"))}
    env.pop("GITHUB_STEP_SUMMARY", None)
    with (folder / "output.txt").open("w") as out:
        code = subprocess.call(argv, cwd=folder, env=env, stdout=out, stderr=subprocess.STDOUT)
    results = folder / "results.json"
    if code != 0 or not results.exists():
        return None
    return [c for c in load_results(results).cells if c.status is Status.VALID]


@dataclass
class Tally:
    checks: int = 0
    failed: int = 0
    measurements: int = 0
    cells: int = 0
    cells_failed: int = 0

    def rate(self) -> float:
        return self.failed / self.checks if self.checks else 0.0


def judge(
    pool: dict[float, list[list[CellRecord]]],
    runs: int,
    factor: float,
    confirms: list[int],
    trials: int,
    rng: random.Random,
) -> dict[int, Tally]:
    """Trials of one baseline size and one factor, every confirmation count on the same
    draws."""
    out = {c: Tally() for c in confirms}
    unchanged = list(range(len(pool[1.0])))
    most = max(confirms)
    for _ in range(trials):
        chosen = rng.sample(unchanged, runs)
        baseline = baseline_of([pool[1.0][i] for i in chosen])
        others = [i for i in range(len(pool[factor])) if factor != 1.0 or i not in set(chosen)]
        order = rng.sample(others, min(len(others), 1 + most))
        for confirm in confirms:
            tally = out[confirm]
            for cid, entry in baseline.cells.items():
                cells = [
                    rec for i in order for rec in pool[factor][i] if str(rec.id) == cid
                ]  # the cell on each start, in order
                if not cells:
                    continue
                attempts = cells[:1]
                while wants_another(entry, attempts, confirm, fresh_starts=True):
                    if len(attempts) == len(cells):
                        break
                    attempts.append(cells[len(attempts)])
                result = verdict(entry, attempts, fresh_starts=True)
                tally.cells += 1
                tally.cells_failed += result.outcome is Outcome.REGRESSION
                for check in result.checks:
                    tally.checks += 1
                    tally.failed += check.regressed
                    tally.measurements += len(check.values)
    return out


def pct(x: float) -> str:
    return f"{100 * x:.1f} %" if x >= 0.001 or x == 0 else f"{100 * x:.2f} %"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--start-noise", default="0.03,0.1", help="between-start noises to measure")
    ap.add_argument("--factors", default="1.0,0.95,0.9")
    ap.add_argument("--pool", default="24,12,12", help="runs per factor (one, or one each)")
    ap.add_argument("--baseline-runs", default="1,3,5")
    ap.add_argument("--confirms", default="0,1,2,4,8")
    ap.add_argument("--trials", type=int, default=2000, help="trials per baseline size, factor")
    ap.add_argument("--profile", default="h200-qwen3.5-27b-int4")
    ap.add_argument("--base-speed", type=float, default=1.0)
    ap.add_argument("--noise", type=float, default=0.03, help="the window's own noise")
    ap.add_argument("--contexts", default="8K")
    ap.add_argument("--concurrency", default="1,4,16")
    ap.add_argument("--duration", type=float, default=2.0)
    ap.add_argument("--max-output", type=int, default=512)
    ap.add_argument("--parallel", type=int, default=2, help="pool runs at once")
    ap.add_argument("--seed", type=int, default=1900)
    ap.add_argument("--keep", type=Path, help="keep every run's folder under this directory")
    ap.add_argument("--markdown", type=Path, default=RESULTS / "gate_start_noise.md")
    args = ap.parse_args(argv)

    noises = [float(s) for s in args.start_noise.split(",")]
    factors = [float(f) for f in args.factors.split(",")]
    sizes = [int(n) for n in args.pool.split(",")]
    sizes = sizes * len(factors) if len(sizes) == 1 else sizes
    baseline_runs = [int(k) for k in args.baseline_runs.split(",")]
    confirms = [int(c) for c in args.confirms.split(",")]
    if 1.0 not in factors or len(sizes) != len(factors):
        ap.error("--factors must include 1.0, and --pool give one size or one per factor")
    work = args.keep or Path(tempfile.mkdtemp(prefix="gate-start-noise-"))
    started, load_before = time.time(), loadavg()
    lines = [
        "# The gate against a server whose speed differs from start to start",
        "",
        f"Command: `{command('benchmarks.studies.gate_start_noise', argv)}`. Date: {utc_now()}. "
        f"Machine: {machine()}; load average before: {load_before}.",
        "",
        f"Simulator `{args.profile}` at speed {args.base_speed:g} × factor, window noise "
        f"{args.noise:g}, contexts {args.contexts} × concurrency {args.concurrency}, "
        f"{args.duration:g} s windows, max output {args.max_output}, prefill cells the median "
        f"of 6 cold requests; {args.parallel} runs at a time. A pool of fresh starts per "
        f"factor ({', '.join(f'{n} at {f:g}' for n, f in zip(sizes, factors, strict=True))}), "
        f"then {args.trials} trials per baseline size and factor drawn from it (see the "
        "script's docstring). Tolerance 5 %. A *check* is one cell × one gated figure; at "
        "factor 1 every failed check is a false failure, below 1 every check is affected.",
    ]
    seed = args.seed
    for noise in noises:
        jobs = []
        for factor, size in zip(factors, sizes, strict=True):
            for k in range(size):
                seed += 1
                folder = work / f"s{noise:g}" / f"f{factor:g}-{k}"
                jobs.append((factor, folder, seed, noise))
        t0 = time.time()
        with ThreadPoolExecutor(args.parallel) as ex:
            done = list(ex.map(lambda j: (j[0], pool_run(args, j[1], j[3], j[0], j[2])), jobs))
        pool: dict[float, list[list[CellRecord]]] = defaultdict(list)
        failed_runs = 0
        for factor, records in done:
            if records is None:
                failed_runs += 1
            else:
                pool[factor].append(records)
        print(
            f"start noise {noise:g}: {len(jobs)} runs in {time.time() - t0:.0f} s, "
            f"{failed_runs} failed",
            flush=True,
        )
        rng = random.Random(args.seed)
        results: dict[tuple[int, float], dict[int, Tally]] = {}
        for runs in baseline_runs:
            for factor in factors:
                results[runs, factor] = judge(pool, runs, factor, confirms, args.trials, rng)
        lines += [
            "",
            f"## Starts {noise:.0%} apart",
            "",
            f"Pool: {', '.join(f'{len(pool[f])} runs at {f:g}' for f in factors)}"
            f"{f' ({failed_runs} runs failed and were left out)' if failed_runs else ''}; "
            f"measured in {(time.time() - t0) / 60:.0f} min.",
            "",
            "Checks failed — at factor 1 false failures, below it slowdowns caught "
            "(measurements per check in brackets):",
            "",
        ]
        rows = []
        for (runs, factor), by_confirm in results.items():
            rows.append(
                [
                    runs,
                    f"{factor:g}",
                    *[
                        f"{pct(t.rate())} ({t.measurements / max(t.checks, 1):.2f})"
                        for t in by_confirm.values()
                    ],
                ]
            )
        lines += table(
            ["baseline runs", "factor", *[f"confirm {c}" for c in confirms]],
            rows,
            "rr" + "r" * len(confirms),
        )
        rows = [
            [
                runs,
                f"{factor:g}",
                *[pct(t.cells_failed / max(t.cells, 1)) for t in by_confirm.values()],
            ]
            for (runs, factor), by_confirm in results.items()
            if factor != 1.0
        ]
        lines += ["", "Affected cells caught (a cell fails when any of its checks does):", ""]
        lines += table(
            ["baseline runs", "factor", *[f"confirm {c}" for c in confirms]],
            rows,
            "rr" + "r" * len(confirms),
        )
    lines += ["", f"Wall time {(time.time() - started) / 60:.0f} min; runs kept in {work}."]
    write_page(args.markdown, lines, "gate-start-noise")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
