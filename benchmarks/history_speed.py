"""What ``python -m pytest_llmspeed history`` costs on 1,000 results files of the demo's matrix
(48 decode cells, 6 contexts × 8 concurrencies, 16 of them over capacity, and 6 prefill cells;
docs/history.md, issue 32: at most 5 s).

The files come from one real run of the plugin on the simulator (the demo's matrix, the
reference profile at 10x, 1 s windows; or ``--template FILE``), each run i its figures times
``exp(0.03 z)`` (3 % noise), a −10 % step from run 600 in decode at 32K and an engine version
bump there. Times the command as a user runs it (a fresh interpreter, reading the folder,
summary printed), then ``--html`` and ``--json`` too, each the best of ``--repeat``.

    python -m benchmarks.history_speed [--template RESULTS.json] [--runs 1000]
"""

from __future__ import annotations

import argparse
import math
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.common import table
from benchmarks.harness import Figure, Outcome, cli
from tests.history_runs import derive, simulator_run

DEMO = ("--llm-duration=1", "--llm-prefill-contexts=8K,16K,32K,64K,128K,max")
ENDPOINT = "sim:h200-qwen3.5-27b-int4?speed=10"


def measure(argv: list[str]) -> Outcome:
    """Seconds ``history`` takes over ``--runs`` results files, without and with its page and
    JSON (the best of ``--repeat``)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--template", type=Path, help="a results file to derive the runs from")
    ap.add_argument("--runs", type=int, default=1000)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="llmspeed-history-"))
    template = args.template or simulator_run(work / "template", *DEMO, endpoint=ENDPOINT)
    rng = random.Random(32)
    step = args.runs * 3 // 5

    def factor(i: int, cell: str, key: str) -> float:
        drop = 0.9 if i >= step and cell.startswith("decode[32K") else 1.0
        return drop * math.exp(0.03 * rng.gauss(0, 1))

    def edit(i: int, doc: dict[str, object]) -> None:
        run = doc["run"]
        assert isinstance(run, dict)
        run["engine_version"] = "0.27.0" if i >= step else "0.26.1"

    folder = work / "runs"
    paths = derive(template, folder, args.runs, factor, edit)
    size = sum(p.stat().st_size for p in paths)
    print(f"{len(paths):,} results files, {size / 1e6:,.1f} MB, in {folder}")
    times: dict[str, float] = {}
    codes: dict[str, int] = {}
    out = ""
    for key, extra in (
        ("summary_s", []),
        ("with_page_s", ["--html", str(work / "h.html"), "--json", str(work / "h.json")]),
    ):
        best = math.inf
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            run = subprocess.run(
                [sys.executable, "-m", "pytest_llmspeed", "history", str(folder), *extra],
                capture_output=True,
                text=True,
            )
            best = min(best, time.perf_counter() - t0)
            out = run.stdout
            if run.returncode not in (0, 1):
                raise RuntimeError(f"history exited {run.returncode}: {run.stderr[-2000:]}")
            codes[key] = run.returncode
        times[key] = best
    full = args.runs >= 1000
    figures = {
        "files": Figure(len(paths), "files"),
        "megabytes": Figure(round(size / 1e6, 1), "MB"),
        "summary_s": Figure(
            round(times["summary_s"], 2), "s", "≤ 5 s" if full else None,
            times["summary_s"] <= 5 if full else None, 1,
        ),
        "with_page_s": Figure(round(times["with_page_s"], 2), "s", digits=1),
        "page_mb": Figure(round((work / "h.html").stat().st_size / 1e6, 1), "MB"),
        "json_mb": Figure(round((work / "h.json").stat().st_size / 1e6, 1), "MB"),
    }  # fmt: skip
    page = [
        f"# `history` over {len(paths):,} results files of the demo matrix",
        "",
        "`benchmarks/history_speed.py` (its docstring says how): the files derived from one "
        "simulator run of the demo's matrix, 3 % noise, a −10 % step in decode at 32K from run "
        f"{step}; timed as a user runs it (a fresh interpreter), the best of {args.repeat}. "
        "Target (issue 32): at most 5 s for 1,000 files.",
        "",
        *table(
            ["figure", "value", "target"],
            [[k, f.text, f.target or ""] for k, f in figures.items()],
            "lrl",
        ),
        "",
        f"Exit status: {codes['summary_s']} (1: a cell's newest segment regressed). The summary:",
        "",
        "```",
        *out.replace(str(work), "$WORK").rstrip().splitlines(),
        "```",
    ]
    return Outcome(figures, page, {**vars(args), "template": str(template), "step": step})


def main() -> None:
    sys.exit(cli("history_speed", measure))


if __name__ == "__main__":
    main()
