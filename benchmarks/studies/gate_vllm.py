"""The gate across restarts of real vLLM (CPU build): does an unchanged server pass, and does a
real change fail, when the plugin launches the server itself?

Issue 19's trial, as a user's CI would run it: vLLM (CPU build, the tiny model,
``--max-num-seqs 8``) launched by the plugin with ``--llm-serve``, contexts 1K × concurrency
1, 4, 8, 8 s windows. Each repetition:

1. a baseline from 3 starts: ``--llm-runs=3 --llm-save-baseline=baseline.toml`` (the plugin
   restarts the server between runs);
2. ``--unchanged`` (3) runs of the same command gated against it (``--llm-baseline``, the
   default ``--llm-confirm=1``: a cell past its limit is re-measured after a restart);
3. one run of the server with ``--max-num-seqs 2`` gated against it: its c4 and c8 cells must
   fail (the server runs 2 requests at once).

Every run is ``python -m pytest`` of the built-in suite in a fresh folder. The live verdicts
are the plugin's own (its results file: ``baseline_checks``).

One-run baselines side by side, on the same measurements: each of the baseline's 3 runs (the
file keeps every run's value and interval) is taken alone as a one-run baseline, and every
unchanged run's first measurement is judged against it with the gate's own functions
(``gate.verdict.verdict``); with one confirmation on a fresh start, the confirmation is the
first measurement of the next unchanged run (another start of the same server). The 3-run
baselines are judged the same way (no confirmation; and across repetitions: each unchanged
run against every repetition's baseline), so the two kinds of baseline meet the same runs.

    python -m benchmarks.studies.gate_vllm                 # 2 repetitions, about 40 minutes
    python -m benchmarks.studies.gate_vllm --reps 1 --unchanged 1 --duration 4   # a smoke run

Needs ``python scripts/setup_vllm.py`` to have run. The machine should be quiet: the report
gives the CPU other processes used during each run.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shlex
import shutil
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.common import RESULTS, command, loadavg, machine, table, utc_now, write_page
from benchmarks.gate_noise import Run, lower_bound, run_pytest, upper_bound, wait_idle
from engines.home import Layout, vllm_home
from engines.servers import KV_CACHE_MEMORY_BYTES, MAX_MODEL_LEN, NOT_SET_UP, SERVED_MODEL
from pytest_llmspeed.gate.baseline import Baseline, CellBaseline, FigureRuns
from pytest_llmspeed.gate.baseline import load as load_baseline
from pytest_llmspeed.gate.verdict import past_limit, verdict
from pytest_llmspeed.results import CellId, CellRecord, Outcome, Status

OFFLINE = "HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1"
Pair = tuple[float, float]


def serve_command(max_num_seqs: int) -> str:
    lay = Layout(vllm_home())
    if not lay.installed():
        raise SystemExit(NOT_SET_UP)
    return (
        f"env -u PYTHONPATH {OFFLINE} {shlex.quote(str(lay.python))} "
        f"-m vllm.entrypoints.openai.api_server --model {shlex.quote(str(lay.model))} "
        f"--served-model-name {SERVED_MODEL} --host 127.0.0.1 --port {{port}} "
        f"--max-model-len {MAX_MODEL_LEN} --kv-cache-memory-bytes {KV_CACHE_MEMORY_BYTES} "
        f"--max-num-seqs {max_num_seqs} --disable-uvicorn-access-log"
    )


def pytest_argv(args: argparse.Namespace, max_num_seqs: int, *extra: str) -> list[str]:
    return [
        sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--benchmark-disable", "-q",
        f"--llm-serve={serve_command(max_num_seqs)}",
        "--llm-serve-timeout=300",
        f"--llm-contexts={args.contexts}",
        f"--llm-concurrency={args.concurrency}",
        f"--llm-duration={args.duration:g}",
        "--llm-results=results.json",
        *extra,
    ]  # fmt: skip


# -- the runs --------------------------------------------------------------------------------


@dataclass
class Gated:
    """One gated run: its live cells (with ``baseline_checks``) and how it ran."""

    kind: str  # "unchanged" or "seqs2"
    rep: int
    run: Run
    cells: dict[str, dict[str, Any]] = field(default_factory=dict)

    @property
    def failed_checks(self) -> list[str]:
        return [
            f"{cid} {c['metric']} {c['change']:+.1%}"
            for cid, cell in self.cells.items()
            for c in cell["baseline_checks"]
            if c["verdict"] == "regressed"
        ]

    @property
    def checks(self) -> int:
        return sum(len(cell["baseline_checks"]) for cell in self.cells.values())

    @property
    def restarts(self) -> int:
        return sum(max(0, len(cell.get("attempts", [])) - 1) for cell in self.cells.values())


def live_cells(folder: Path) -> dict[str, dict[str, Any]]:
    path = folder / "results.json"
    if not path.exists():
        return {}
    cells = json.loads(path.read_text())["cells"]
    return {c["id"]: c for c in cells if c.get("baseline_checks")}


def one(args: argparse.Namespace, folder: Path, argv: list[str], label: str) -> Run:
    wait_idle(args.wait_idle, quiet_for=5, no_servers=True)
    run = run_pytest(argv, folder)
    print(
        f"{label}: exit {run.exit_code}, {run.seconds:.0f} s, {run.load_note()}",
        flush=True,
    )
    return run


# -- judging a first measurement offline with the gate's own functions ------------------------


def attempt(cid: str, metric: str, value: float, ci: Any) -> CellRecord:
    """A record holding one figure (and its interval) of one attempt."""
    pair = (float(ci[0]), float(ci[1])) if ci else None
    bare = CellRecord(CellId.parse(cid), Status.VALID)
    return dataclasses.replace(bare, **{metric: value, f"{metric}_ci": pair})  # type: ignore[arg-type]


def single_run(entry: CellBaseline, metric: str, i: int) -> CellBaseline:
    """Run ``i`` of a baseline's cell, alone: a one-run baseline of that figure."""
    runs = entry.figure_runs(metric)
    ci = runs.intervals[i]
    return CellBaseline(
        id=entry.id,
        limits={metric: runs.values[i]},
        tolerance=entry.tolerance,
        line=entry.line,
        intervals={metric: ci} if ci else {},
        runs={metric: FigureRuns((runs.values[i],), (ci,))},
    )


def only(entry: CellBaseline, metric: str) -> CellBaseline:
    """The entry restricted to one figure (its runs and spread kept)."""
    return CellBaseline(
        id=entry.id,
        limits={metric: entry.limits[metric]},
        tolerance=entry.tolerance,
        line=entry.line,
        intervals={k: v for k, v in entry.intervals.items() if k == metric},
        runs={k: v for k, v in entry.runs.items() if k == metric},
        spread={k: v for k, v in entry.spread.items() if k == metric},
    )


def first(cell: dict[str, Any], metric: str) -> tuple[float, Any] | None:
    for c in cell["baseline_checks"]:
        if c["metric"] == metric:
            cis = c.get("values_ci") or []
            return c["values"][0], (cis[0] if cis else None)
    return None


def first_of(g: Gated, cid: str, metric: str) -> tuple[float, Any] | None:
    cell = g.cells.get(cid)
    return first(cell, metric) if cell else None


def judge(entry: CellBaseline, cid: str, metric: str, measured: list[tuple[float, Any]]) -> bool:
    """Does the gate fail this figure, given its attempts (each on a fresh start)?"""
    records = [attempt(cid, metric, v, ci) for v, ci in measured]
    return verdict(entry, records, fresh_starts=True).outcome is Outcome.REGRESSION


def judge_with_confirm(
    entry: CellBaseline,
    cid: str,
    metric: str,
    firsts: list[tuple[float, Any]],
    confirm: int,
) -> bool:
    """The fresh-start rule: a first attempt past its limit takes ``confirm`` more, the next
    runs' first measurements (other starts); the figure fails when the gate says so."""
    measured = firsts[:1]
    records = [attempt(cid, metric, v, ci) for v, ci in measured]
    found = verdict(entry, records, fresh_starts=True).checks
    if confirm and found and past_limit(found[0], [0]):
        measured = firsts[: 1 + confirm]
    return judge(entry, cid, metric, measured)


@dataclass
class Offline:
    checks: int = 0
    failed: int = 0
    examples: list[str] = field(default_factory=list)

    def add(self, failed: bool, what: str) -> None:
        self.checks += 1
        self.failed += failed
        if failed and len(self.examples) < 12:
            self.examples.append(what)

    def rate(self, bound: str = "upper") -> str:
        if not self.checks:
            return "-"
        k, n = self.failed, self.checks
        b = upper_bound(k, n) if bound == "upper" else lower_bound(k, n)
        sign = "≤" if bound == "upper" else "≥"
        return f"{k}/{n} = {100 * k / n:.1f} % ({sign} {100 * b:.1f} %)"


def offline_tables(
    baselines: dict[int, Baseline], unchanged: list[Gated], seqs2: list[Gated]
) -> dict[str, Offline]:
    out: dict[str, Offline] = defaultdict(Offline)
    for g in unchanged:
        same_rep = [u for u in unchanged if u.rep == g.rep]
        later = same_rep[same_rep.index(g) :] + same_rep[: same_rep.index(g)]
        for rep, base in baselines.items():
            tag = "same repetition" if rep == g.rep else "other repetitions"
            for cid, cell in g.cells.items():
                entry = base.cells.get(cid)
                if entry is None:
                    continue
                for metric in entry.limits:
                    got = first(cell, metric)
                    if got is None:
                        continue
                    what = f"rep {g.rep} run vs baseline {rep}: {cid} {metric}"
                    out[f"3 runs, confirm 0, {tag}"].add(
                        judge(only(entry, metric), cid, metric, [got]), what
                    )
                    runs = entry.figure_runs(metric)
                    for i in range(runs.count):
                        one_run = single_run(entry, metric, i)
                        out[f"1 run, confirm 0, {tag}"].add(
                            judge(one_run, cid, metric, [got]), f"{what} (run {i + 1})"
                        )
                        if rep == g.rep:
                            firsts = [f for u in later if (f := first_of(u, cid, metric))]
                            out["1 run, confirm 1 (the next unchanged run), same repetition"].add(
                                judge_with_confirm(one_run, cid, metric, firsts, 1),
                                f"{what} (run {i + 1})",
                            )
    for g in seqs2:
        base = baselines[g.rep]
        for cid, cell in g.cells.items():
            entry = base.cells.get(cid)
            if entry is None or not cid.startswith("decode"):
                continue
            for metric in entry.limits:
                got = first(cell, metric)
                if got is None:
                    continue
                runs = entry.figure_runs(metric)
                for i in range(runs.count):
                    key = f"--max-num-seqs 2, 1 run, confirm 0: {cid}"
                    out[key].add(judge(single_run(entry, metric, i), cid, metric, [got]), "")
    return out


# -- the report ------------------------------------------------------------------------------


def spread_rows(baselines: dict[int, Baseline], unchanged: list[Gated]) -> list[list[object]]:
    """Per cell and figure: every start's value (baseline runs and unchanged runs' firsts)."""
    values: dict[tuple[str, str], list[float]] = defaultdict(list)
    for base in baselines.values():
        for cid, entry in base.cells.items():
            for metric in entry.limits:
                values[cid, metric] += list(entry.figure_runs(metric).values)
    for g in unchanged:
        for cid, cell in g.cells.items():
            for c in cell["baseline_checks"]:
                values[cid, c["metric"]].append(c["values"][0])
    rows: list[list[object]] = []
    for (cid, metric), vs in sorted(values.items()):
        mean = statistics.fmean(vs)
        sd = statistics.stdev(vs) / mean if len(vs) > 1 else 0.0
        rows.append(
            [cid, metric, len(vs), f"{min(vs):,.0f}–{max(vs):,.0f}", f"{mean:,.0f}", f"{sd:.1%}"]
        )
    return rows


def _failures(output: str) -> str:
    found = [ln for ln in output.splitlines() if ln.startswith("FAILED ")]
    return "; ".join(found) or "no FAILED line"


def record(work: Path, kind: str, rep: int, folder: Path, run: Run) -> None:
    """Append one run to ``work/runs.json`` (so ``--report`` can write the page again)."""
    path = work / "runs.json"
    runs = json.loads(path.read_text()) if path.exists() else []
    runs.append(
        {
            "kind": kind,
            "rep": rep,
            "folder": str(folder.relative_to(work)),
            "exit": run.exit_code,
            "failures": _failures(run.output) if run.exit_code else "",
            "seconds": run.seconds,
            "foreign_cpu": run.foreign_cpu,
            "foreign_peak": run.foreign_peak,
        }
    )
    path.write_text(json.dumps(runs, indent=1))


def measure(args: argparse.Namespace, work: Path) -> int:
    """Every repetition's runs, recorded in ``work/runs.json``; non-zero: a baseline failed."""
    for rep in range(1, args.reps + 1):
        folder = work / f"rep{rep}"
        toml = folder / "baseline.toml"
        argv3 = pytest_argv(args, 8, "--llm-runs=3", f"--llm-save-baseline={toml}")
        save = one(args, folder / "baseline", argv3, f"rep {rep}: baseline of 3 starts")
        record(work, "baseline", rep, folder / "baseline", save)
        if save.exit_code not in (0, 1) or not toml.exists():
            print(save.output[-4000:], file=sys.stderr)
            print(f"the baseline runs failed (exit {save.exit_code})", file=sys.stderr)
            return 2
        if save.exit_code:  # a failed cell is not in the baseline: the report says so
            print(f"  {_failures(save.output)}", flush=True)
        gate = f"--llm-baseline={toml}"
        for k in range(1, args.unchanged + 1):
            sub = folder / f"unchanged{k}"
            run = one(args, sub, pytest_argv(args, 8, gate), f"rep {rep}: unchanged {k}")
            record(work, "unchanged", rep, sub, run)
            failed = Gated("unchanged", rep, run, live_cells(sub)).failed_checks
            print(f"  failed checks: {failed or 'none'}", flush=True)
        sub = folder / "seqs2"
        run = one(args, sub, pytest_argv(args, 2, gate), f"rep {rep}: --max-num-seqs 2")
        record(work, "seqs2", rep, sub, run)
        failed = Gated("seqs2", rep, run, live_cells(sub)).failed_checks
        print(f"  failed checks: {failed or 'none'}", flush=True)
    return 0


def collect(work: Path) -> tuple[dict[int, Baseline], list[Run], list[Gated], list[Gated]]:
    baselines: dict[int, Baseline] = {}
    saves: list[Run] = []
    gated: dict[str, list[Gated]] = {"unchanged": [], "seqs2": []}
    for r in json.loads((work / "runs.json").read_text()):
        run = Run(0.0, 0, r["exit"], r["seconds"], output=r.get("failures", ""))
        run.foreign_cpu, run.foreign_peak = r["foreign_cpu"], r["foreign_peak"]
        if r["kind"] == "baseline":
            saves.append(run)
            baselines[r["rep"]] = load_baseline(work / f"rep{r['rep']}" / "baseline.toml")
        else:
            cells = live_cells(work / r["folder"])
            gated[r["kind"]].append(Gated(r["kind"], r["rep"], run, cells))
    return baselines, saves, gated["unchanged"], gated["seqs2"]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=2, help="repetitions of the whole trial")
    ap.add_argument("--unchanged", type=int, default=3, help="unchanged gated runs per rep")
    ap.add_argument("--contexts", default="1K")
    ap.add_argument("--concurrency", default="1,4,8")
    ap.add_argument("--duration", type=float, default=8.0)
    ap.add_argument("--wait-idle", type=float, default=120, metavar="SECONDS")
    ap.add_argument("--keep", type=Path, help="keep every run's folder under this directory")
    ap.add_argument(
        "--report", type=Path, metavar="DIR", help="only write the page, from a --keep folder"
    )
    ap.add_argument("--markdown", type=Path, default=RESULTS / "gate_vllm.md")
    args = ap.parse_args(argv)

    if args.report:
        work, started, load_before = args.report, None, "-"
    else:
        work = args.keep or Path(tempfile.mkdtemp(prefix="gate-vllm-"))
        work.mkdir(parents=True, exist_ok=True)
        started, load_before = time.time(), loadavg()
        try:
            code = measure(args, work)
            if code:
                return code
        except BaseException:
            if args.keep is None:
                shutil.rmtree(work, ignore_errors=True)
            raise
    baselines, saves, unchanged, seqs2 = collect(work)
    if args.keep is None and args.report is None:
        shutil.rmtree(work, ignore_errors=True)
    took = f"{(time.time() - started) / 60:.0f} min" if started else "see the kept runs"

    lines = [
        "# The gate across restarts of real vLLM",
        "",
        f"Command: `{command('benchmarks.studies.gate_vllm', argv)}`. Date: {utc_now()}. "
        f"Machine: {machine()}. Load average before: {load_before}; wall time {took}.",
        "",
        f"vLLM (CPU build, the tiny model) launched by the plugin (`--llm-serve`), "
        f"`--max-num-seqs 8`; contexts {args.contexts} × concurrency {args.concurrency}, "
        f"{args.duration:g} s windows, prefill cells the median of 6 cold requests (the "
        "plugin's default when gating). Per repetition: a baseline from 3 starts "
        f"(`--llm-runs=3 --llm-save-baseline`), {args.unchanged} unchanged runs gated against "
        "it (`--llm-confirm=1`: a cell past its limit re-measured after a restart), then one "
        "run with `--max-num-seqs 2`.",
        "",
        "## The gate as it runs (3-run baseline, live)",
        "",
    ]
    rows: list[list[object]] = []
    for g in [*unchanged, *seqs2]:
        failed = g.failed_checks
        cells = sorted({f.split()[0] for f in failed})
        rows.append(
            [
                g.rep,
                "unchanged" if g.kind == "unchanged" else "`--max-num-seqs 2`",
                g.run.exit_code,
                f"{len(failed)}/{g.checks}",
                ", ".join(cells) or "none",
                g.restarts,
                f"{g.run.seconds:.0f} s",
                f"{g.run.foreign_cpu:.0%}",
            ]
        )
    lines += table(
        [
            "rep",
            "server",
            "exit",
            "checks failed",
            "cells failed",
            "restarts",
            "took",
            "others' CPU",
        ],
        rows,
        "rlrrlrrr",
    )
    n_checks = sum(g.checks for g in unchanged)
    n_failed = sum(len(g.failed_checks) for g in unchanged)
    caught = [
        g.rep
        for g in seqs2
        if {"decode[1K-c4]", "decode[1K-c8]"} <= {f.split()[0] for f in g.failed_checks}
    ]
    lines += [
        "",
        f"**Unchanged server: {n_failed} failing checks of {n_checks}** "
        f"({100 * n_failed / max(n_checks, 1):.1f} %, 95 % bound ≤ "
        f"{100 * upper_bound(n_failed, n_checks):.1f} %). "
        f"**`--max-num-seqs 2`: c4 and c8 failed in {len(caught)} of {len(seqs2)} runs.**",
        "",
        "Failing checks of the unchanged server:",
        "",
        *[f"- rep {g.rep}: {f}" for g in unchanged for f in g.failed_checks],
        *(["- none"] if not n_failed else []),
        "",
        "The `--max-num-seqs 2` runs' failing checks:",
        "",
        *[f"- rep {g.rep}: {f}" for g in seqs2 for f in g.failed_checks],
        "",
        "## One-run baselines side by side (offline, the same measurements)",
        "",
        "Each unchanged run's first measurement judged by `gate.verdict.verdict` against each "
        "baseline: the 3-run baseline, and each of its runs alone (a one-run baseline, as "
        "files were before). Checks of one run share its start, so the bounds (exact, as if "
        "independent) are optimistic.",
        "",
    ]
    offline = offline_tables(baselines, unchanged, seqs2)
    rows = [
        [k, v.rate("lower" if k.startswith("--max") else "upper")]
        for k, v in sorted(offline.items())
    ]
    lines += table(["baseline and rule", "checks failed (95 % bound)"], rows, "lr")
    lines += ["", "## The starts: every start's first measurement", ""]
    lines += table(
        ["cell", "figure", "starts", "range", "mean", "sd"],
        spread_rows(baselines, unchanged),
        "llrrrr",
    )
    lines += ["", "Between-start spread the baselines estimated:", ""]
    for rep, base in baselines.items():
        parts = [
            f"{m} {s.sigma:.1%} ({s.dof} d.f.)" if s.known and s.sigma is not None else f"{m} ?"
            for m, s in base.spread.items()
        ]
        lines.append(f"- rep {rep}: " + ", ".join(parts))
    lines += [
        "",
        "Others' CPU: the share of the machine other processes used during each run "
        f"(baseline runs: {', '.join(f'{s.foreign_cpu:.0%}' for s in saves)}).",
        "",
        "Baseline commands (3 runs each): "
        + "; ".join(
            f"rep {i}: exit {s.exit_code}, {s.seconds:.0f} s"
            + (f" ({s.output}: that cell's run is not in the baseline)" if s.exit_code else "")
            for i, s in enumerate(saves, 1)
        )
        + ".",
    ]
    write_page(args.markdown, lines, "gate-vllm")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
