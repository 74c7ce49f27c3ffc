"""The test suite, several times in a row, beside a busy core: do its tests depend on timing?

A test that passes on a quiet machine and fails under load asserts timing, not behaviour. This
runs ``pytest`` (by default everything but the real-vLLM tests) ``--runs`` times while
``--burners`` processes spin on the CPU (a 2-core machine with one core taken is what CI
looks like beside another job), and writes each run's outcome and duration.

    python -m benchmarks.suite_under_load --runs 5
"""

from __future__ import annotations

import argparse
import multiprocessing
import re
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.common import RESULTS, ROOT, command, loadavg, machine, table, utc_now, write_page


def _spin() -> None:  # a process that takes one core until it is killed
    while True:
        pass


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--burners", type=int, default=1, help="busy processes beside the tests")
    parser.add_argument(
        "--pytest-args",
        default="-m 'not vllm' -p no:cacheprovider -q",
        help="arguments of each pytest run",
    )
    parser.add_argument("--out", type=Path, default=RESULTS / "suite_under_load.md")
    args = parser.parse_args(argv)

    burners = [multiprocessing.Process(target=_spin, daemon=True) for _ in range(args.burners)]
    for b in burners:
        b.start()
    rows = []
    try:
        for i in range(1, args.runs + 1):
            t0 = time.monotonic()
            proc = subprocess.run(
                f"{sys.executable} -m pytest {args.pytest_args}",
                shell=True,
                cwd=ROOT,
                capture_output=True,
                text=True,
            )
            took = time.monotonic() - t0
            last = next(
                (ln for ln in reversed(proc.stdout.splitlines()) if re.search(r" in [\d.]+s", ln)),
                "(no summary line)",
            )
            failed = re.findall(r"^FAILED (\S+)", proc.stdout, re.MULTILINE)
            rows.append((i, proc.returncode, f"{took:.0f} s", last.strip("= "), ", ".join(failed)))
            print(f"[suite_under_load] run {i}: exit {proc.returncode} in {took:.0f} s: {last}")
    finally:
        for b in burners:
            b.kill()
    passed = sum(1 for r in rows if r[1] == 0)
    lines = [
        "# The test suite under a parallel CPU load",
        "",
        f"Command: `{command('benchmarks.suite_under_load', argv)}`. Date: {utc_now()}. "
        f"Machine: {machine()}, {args.burners} busy process(es) beside the tests, load average "
        f"at the end {loadavg()}.",
        "",
        f"**{passed} of {len(rows)} runs passed.**",
        "",
        *table(["run", "exit", "took", "pytest's summary", "failed tests"], rows, "rrll"),
    ]
    write_page(args.out, lines, "suite_under_load")
    return 0 if passed == len(rows) else 1


if __name__ == "__main__":
    sys.exit(main())
