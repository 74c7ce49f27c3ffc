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

from benchmarks.common import loadavg
from tests.history_runs import derive, simulator_run

DEMO = ("--llm-duration=1", "--llm-prefill-contexts=8K,16K,32K,64K,128K,max")
ENDPOINT = "sim:h200-qwen3.5-27b-int4?speed=10"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--template", type=Path, help="a results file to derive the runs from")
    ap.add_argument("--runs", type=int, default=1000)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
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
    print(f"template: {template}")
    for label, extra in (
        ("summary", []),
        (
            "summary, --html and --json",
            ["--html", str(work / "h.html"), "--json", str(work / "h.json")],
        ),
    ):
        best = math.inf
        out = ""
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            run = subprocess.run(
                [sys.executable, "-m", "pytest_llmspeed", "history", str(folder), *extra],
                capture_output=True,
                text=True,
            )
            best = min(best, time.perf_counter() - t0)
            out = run.stdout
            assert run.returncode in (0, 1), run.stderr
        print(f"{label}: {best:.2f} s (best of {args.repeat}; exit {run.returncode})")
    print(f"load average: {loadavg()}")
    print(out.rstrip())
    if (work / "h.html").exists():
        print(
            f"page {(work / 'h.html').stat().st_size / 1e6:.1f} MB, "
            f"json {(work / 'h.json').stat().st_size / 1e6:.1f} MB"
        )


if __name__ == "__main__":
    main()
