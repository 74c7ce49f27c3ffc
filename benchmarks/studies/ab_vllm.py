"""The A/B runner on real vLLM (CPU build), launched by the plugin (issue 31's "Done when"):
does one command against itself regress no cell, and does the same command with
``--max-num-seqs 2`` (the new version: at most 2 requests run at once) regress decode c8 with
the explanation naming the cap on running requests, and never call c4 same?

Each A/B is one ``python -m pytest`` of the built-in suite in a fresh folder, as a user's CI
would run it: ``--llm-serve="NEW" --llm-serve-baseline="OLD"``, contexts 1K × concurrency 4, 8
(the cells prefill[1K], decode[1K-c4], decode[1K-c8]), ``--llm-ab-rounds`` starts at most. The
A/Bs alternate: self, capped, self, capped, self (``--same 3 --capped 2``), so a machine that
gets busier meets both kinds. The verdicts are the plugin's own (its results file's ``ab``).

    python -m benchmarks.studies.ab_vllm                      # 5 A/Bs of 8 starts: about an hour
    python -m benchmarks.studies.ab_vllm --same 1 --capped 0  # one A/B, a smoke run
    python -m benchmarks.studies.ab_vllm --report DIR         # the page again, from --keep's DIR

Needs ``python scripts/setup_vllm.py`` to have run. The page is written after every A/B (a
run cut short keeps what it measured); it gives the CPU other processes used during each.
"""

from __future__ import annotations

import argparse
import datetime as dt
import itertools
import json
import shlex
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.common import RESULTS, command, loadavg, machine, table, utc_now, write_page
from benchmarks.gate_noise import run_pytest, wait_idle
from engines.home import Layout, vllm_home
from engines.servers import KV_CACHE_MEMORY_BYTES, MAX_MODEL_LEN, NOT_SET_UP, SERVED_MODEL

OFFLINE = "HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1"
CAP = "--max-num-seqs 2"


def serve_command(extra: str = "") -> str:
    """vLLM's own command line, as the tests' servers run it (``extra`` appended)."""
    lay = Layout(vllm_home())
    if not lay.installed():
        raise SystemExit(NOT_SET_UP)
    return (
        f"env -u PYTHONPATH {OFFLINE} {shlex.quote(str(lay.python))} "
        f"-m vllm.entrypoints.openai.api_server --model {shlex.quote(str(lay.model))} "
        f"--served-model-name {SERVED_MODEL} --host 127.0.0.1 --port {{port}} "
        f"--max-model-len {MAX_MODEL_LEN} --kv-cache-memory-bytes {KV_CACHE_MEMORY_BYTES} "
        f"--disable-uvicorn-access-log {extra}"
    ).strip()


def pytest_argv(args: argparse.Namespace, kind: str) -> list[str]:
    new = serve_command(CAP if kind == "capped" else "")
    return [
        sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:randomly",
        "--benchmark-disable", "-q",
        f"--llm-serve={new}",
        f"--llm-serve-baseline={serve_command()}",
        "--llm-serve-timeout=300",
        f"--llm-contexts={args.contexts}",
        f"--llm-concurrency={args.concurrency}",
        f"--llm-duration={args.duration:g}",
        f"--llm-max-output={args.max_output}",
        f"--llm-ab-rounds={args.rounds}",
        f"--llm-tolerance={args.tolerance}",
        "--llm-results=results.json",
    ]  # fmt: skip


def plan(args: argparse.Namespace) -> list[str]:
    """The A/Bs in the order run: self and capped alternating, the rest at the end."""
    same, capped = ["same"] * args.same, ["capped"] * args.capped
    out: list[str] = []
    while same or capped:
        for q in (same, capped):
            if q:
                out.append(q.pop())
    return out


# -- the runs --------------------------------------------------------------------------------


def measure(args: argparse.Namespace, work: Path, started: float, load_before: str) -> None:
    done = json.loads((work / "runs.json").read_text()) if (work / "runs.json").exists() else []
    for i, kind in enumerate(plan(args), 1):
        if i <= len(done):
            continue
        folder = work / f"ab{i}-{kind}"
        waited = wait_idle(args.wait_idle, quiet_for=5, no_servers=True)
        load = loadavg()
        run = run_pytest(pytest_argv(args, kind), folder)
        print(
            f"A/B {i} ({kind}): exit {run.exit_code}, {run.seconds:.0f} s, {run.load_note()}",
            flush=True,
        )
        done.append(
            {
                "index": i,
                "kind": kind,
                "folder": folder.name,
                "exit": run.exit_code,
                "seconds": run.seconds,
                "foreign_cpu": run.foreign_cpu,
                "foreign_peak": run.foreign_peak,
                "load_before": load,
                "waited_s": waited,
                "tail": "\n".join(run.output.splitlines()[-40:]),
            }
        )
        (work / "runs.json").write_text(json.dumps(done, indent=1))
        write(args, work, started, load_before)


# -- the page --------------------------------------------------------------------------------


def _pct(x: float | None) -> str:
    return "–" if x is None else f"{x:+.1%}".replace("-", "−")


def _interval(f: dict[str, Any]) -> str:
    lo, hi = f.get("interval") or (None, None)
    return f"{_pct(lo)} … {_pct(hi)}"


def _ab(work: Path, r: dict[str, Any]) -> dict[str, Any] | None:
    path = work / r["folder"] / "results.json"
    if not path.exists():
        return None
    doc: dict[str, Any] | None = json.loads(path.read_text()).get("ab")
    return doc


def _switches_s(ab: dict[str, Any]) -> list[float]:
    """Each round after the first: the seconds from the previous round's end to this one's
    start (stopping one server, starting the other until it answers), from the rounds'
    ``started_at`` (whole seconds) and ``duration_s``."""
    out = []
    rounds = ab["rounds"]
    for prev, cur in itertools.pairwise(rounds):
        t0 = dt.datetime.fromisoformat(prev["started_at"]).timestamp() + prev["duration_s"]
        out.append(dt.datetime.fromisoformat(cur["started_at"]).timestamp() - t0)
    return out


def write(args: argparse.Namespace, work: Path, started: float | None, load_before: str) -> None:
    runs = json.loads((work / "runs.json").read_text()) if (work / "runs.json").exists() else []
    took = sum(r["seconds"] for r in runs)
    wall = f"{(time.time() - started) / 60:.0f} min" if started else "see the kept runs"
    lines = [
        "# The A/B on real vLLM",
        "",
        f"Command: `{command('benchmarks.studies.ab_vllm', args.argv)}`. Date: {utc_now()}. "
        f"Machine: {machine()}, shared with other work. Load average before: {load_before}; "
        f"wall time {wall} ({took / 60:.0f} min in the A/Bs).",
        "",
        "vLLM (CPU build, the tiny model) launched by the plugin: `--llm-serve=NEW "
        "--llm-serve-baseline=OLD`, OLD vLLM's own command (the tests' servers' arguments), "
        f"NEW the same command (**self**) or with `{CAP}` (**capped**: at most 2 requests "
        f"run at once). Contexts {args.contexts} × concurrency {args.concurrency}, "
        f"{args.duration:g} s windows, max output {args.max_output}, tolerance "
        f"{args.tolerance}, at most {args.rounds} rounds (blocks of old new new old, or "
        "its mirror at random in the plugin since bbc0e4b; a round is the selected cells on "
        "one fresh start). The verdicts are the plugin's (the results "
        "file's `ab`).",
        "",
        "## Verdicts",
        "",
    ]
    rows: list[list[object]] = []
    summary: dict[str, list[dict[str, Any]]] = {"same": [], "capped": []}
    for r in runs:
        ab = _ab(work, r)
        if ab is None:
            rows.append([r["index"], r["kind"], r["exit"], "no results file", "", "", "", ""])
            continue
        summary[r["kind"]].append(ab)
        counts = ab["counts"]
        verdicts = ", ".join(f"{c} {v['verdict']}" for c, v in ab["cells"].items())
        starts = [v["starts"] for v in ab["cells"].values()]
        rows.append(
            [
                r["index"],
                "self" if r["kind"] == "same" else f"`{CAP}`",
                r["exit"],
                verdicts,
                " · ".join(f"{n} {k}" for k, n in counts.items() if n),
                f"{sum(starts) / max(len(starts), 1):.1f}",
                f"{r['seconds'] / 60:.1f} min",
                f"{r['foreign_cpu']:.0%}",
            ]
        )
    lines += table(
        ["A/B", "new", "exit", "verdict per cell", "counts", "starts per cell", "took", "others"],
        rows,
        "rlrllrrr",
    )
    regressed_self = [
        c for ab in summary["same"] for c, v in ab["cells"].items() if v["verdict"] == "regressed"
    ]
    c8 = [ab["cells"].get("decode[1K-c8]", {}).get("verdict") for ab in summary["capped"]]
    c4 = [ab["cells"].get("decode[1K-c4]", {}).get("verdict") for ab in summary["capped"]]
    named = [
        "running " in (ab["cells"].get("decode[1K-c8]", {}).get("explanation") or "")
        for ab in summary["capped"]
    ]
    n_self = sum(len(ab["cells"]) for ab in summary["same"])
    lines += [
        "",
        f"- **Self: {len(regressed_self)} of {n_self} cells regressed** over "
        f"{len(summary['same'])} A/B(s)"
        + (f" ({', '.join(regressed_self)})" if regressed_self else "")
        + ".",
        f"- **`{CAP}`: decode[1K-c8] regressed in {c8.count('regressed')} of {len(c8)}**; the "
        f"explanation names the running requests in {sum(named)} of {len(named)}; "
        f"decode[1K-c4]: {', '.join(str(v) for v in c4) or '–'} (same in {c4.count('same')}).",
        "",
        "Starts per cell: the rounds a cell was measured in (8 = two blocks, the fewest a "
        "regression can be called on).",
        "",
    ]
    for r in runs:
        ab = _ab(work, r)
        new = "self" if r["kind"] == "same" else CAP
        lines += [f"## A/B {r['index']}: {new}", ""]
        switches = _switches_s(ab) if ab else []
        lines.append(
            f"Exit {r['exit']}, {r['seconds']:.0f} s; others' CPU {r['foreign_cpu']:.0%} "
            f"(busiest second {r['foreign_peak']:.0%}); load before {r['load_before']}."
            + (
                " From one round's end to the next one's start (a stop and a start): "
                f"{', '.join(f'{s:.0f}' for s in switches)} s."
                if switches
                else ""
            )
        )
        lines.append("")
        if ab is None:
            lines += ["No results file. The output's end:", "", "```", r["tail"], "```", ""]
            continue
        if ab.get("stopped"):
            lines += [f"Stopped: {ab['stopped']}.", ""]
        frows: list[list[object]] = []
        for cell, v in ab["cells"].items():
            figs = v.get("figures") or {}
            if not figs:
                frows.append([cell, v["verdict"], "–", "–", "–", v["starts"], v.get("missing")])
            for name, f in figs.items():
                frows.append(
                    [
                        cell,
                        v["verdict"],
                        name,
                        _pct(f["change"]),
                        _interval(f),
                        v["starts"],
                        f"{f['verdict']}" + (f", more {f['more']}" if f.get("more") else ""),
                    ]
                )
        lines += table(
            ["cell", "verdict", "figure", "change", "95 % interval", "starts", "figure's verdict"],
            frows,
            "lllrrrl",
        )
        why = [(c, v["explanation"]) for c, v in ab["cells"].items() if v.get("explanation")]
        lines += ["", "Explanations:" if why else "Explanations: none given.", ""]
        lines += [f"- `{c}`: {e}" for c, e in why]
        if why:
            lines.append("")
        # every round's headline figures: the spread between starts as measured
        cells = list(ab["cells"])
        head = {"decode": "total_tok_s", "prefill": "prompt_tok_s"}
        rrows = []
        for rnd in ab["rounds"]:
            vals = []
            for c in cells:
                got = rnd["cells"].get(c, {}).get(head[c.partition("[")[0]])
                vals.append("–" if got is None else f"{got:,.0f}")
            rrows.append([rnd["round"], rnd["arm"], *vals, f"{rnd['duration_s']:.0f} s"])
        lines += table(
            ["round", "arm", *(f"{c} {head[c.partition('[')[0]]}" for c in cells), "measuring"],
            rrows,
            "rl" + "r" * (len(cells) + 1),
        )
        lines.append("")
    write_page(args.markdown, lines, "ab-vllm")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--same", type=int, default=3, help="A/Bs of the command against itself")
    ap.add_argument("--capped", type=int, default=2, help=f"A/Bs against `{CAP}`")
    ap.add_argument("--contexts", default="1K")
    ap.add_argument("--concurrency", default="4,8")
    ap.add_argument("--duration", type=float, default=4.0)
    ap.add_argument("--max-output", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=8, help="--llm-ab-rounds")
    ap.add_argument("--tolerance", default="5%")
    ap.add_argument("--wait-idle", type=float, default=30, metavar="SECONDS")
    ap.add_argument("--keep", type=Path, help="keep every A/B's folder here (and resume)")
    ap.add_argument(
        "--report", type=Path, metavar="DIR", help="only write the page, from a --keep folder"
    )
    ap.add_argument("--markdown", type=Path, default=RESULTS / "ab_vllm.md")
    args = ap.parse_args(argv)
    args.argv = sys.argv[1:] if argv is None else argv
    if args.report:
        write(args, args.report, None, "-")
        return 0
    work = args.keep or Path(tempfile.mkdtemp(prefix="ab-vllm-"))
    work.mkdir(parents=True, exist_ok=True)
    started, load_before = time.time(), loadavg()
    try:
        measure(args, work, started, load_before)
    finally:
        if args.keep is None:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
