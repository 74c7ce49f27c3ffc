"""The whole test command, several times in a row, beside busy cores: do its tests depend on
timing?

A test that passes on a quiet machine and fails under load asserts timing, not behaviour. CI
shares its machine with other work, so such a test fails CI at random. This runs the README's
test command (``python3 -m tox -e tests``: lint, the set-ups' checks, every test, the real
engines included) ``--runs`` times in a row while ``--burners`` processes spin on the CPU
(``python -c "while True: pass"``: two of them take both cores of a 2-core machine), and writes
each run's outcome, duration and failed tests; a failed run's log is kept in
``out/suite_under_load/``.

    python -m benchmarks.studies.suite_under_load --runs 3
    python -m benchmarks.studies.suite_under_load --runs 1 \
        --command "python -m pytest tests/plugin -q"
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.common import RESULTS, ROOT, command, loadavg, machine, table, utc_now, write_page

TEST_COMMAND = "python3 -m tox -e tests"
BURNER = (sys.executable, "-c", "while True: pass")


def _summary(text: str) -> str:
    """pytest's last summary line (``412 passed, 3 skipped in 801.2s``), else tox's."""
    lines = text.splitlines()
    found = next((ln for ln in reversed(lines) if re.search(r" in [\d.]+s( \(|\s*=*$)", ln)), None)
    if found is None:
        found = next((ln for ln in reversed(lines) if ln.strip()), "(no output)")
    return found.strip("= ")


def _failed(text: str) -> list[str]:
    """The tests pytest's short summary lists as failed or in error."""
    return re.findall(r"^(?:FAILED|ERROR) (\S+)", text, re.MULTILINE)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--burners", type=int, default=2, help="busy processes beside the tests")
    parser.add_argument(
        "--command", default=TEST_COMMAND, help=f"the test command (default: {TEST_COMMAND})"
    )
    parser.add_argument("--out", type=Path, default=RESULTS / "suite_under_load.md")
    args = parser.parse_args(argv)

    logs = ROOT / "out" / "suite_under_load"  # not committed (/out* is ignored)
    burners = [subprocess.Popen(BURNER) for _ in range(args.burners)]
    rows = []
    try:
        for i in range(1, args.runs + 1):
            t0 = time.monotonic()
            proc = subprocess.run(
                args.command,
                shell=True,
                cwd=ROOT,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
            took = time.monotonic() - t0
            failed = _failed(proc.stdout)
            kept = ""
            if proc.returncode != 0:  # the evidence of a failure
                logs.mkdir(parents=True, exist_ok=True)
                log = logs / f"run{i}.log"
                log.write_text(proc.stdout)
                kept = f" (log: {log.relative_to(ROOT)})"
            rows.append(
                (i, proc.returncode, f"{took:.0f} s", _summary(proc.stdout), ", ".join(failed))
            )
            print(
                f"[suite_under_load] run {i}: exit {proc.returncode} in {took:.0f} s: "
                f"{_summary(proc.stdout)}{kept}",
                flush=True,
            )
    finally:
        for b in burners:
            b.kill()
            b.wait()
    passed = sum(1 for r in rows if r[1] == 0)
    lines = [
        "# The test command beside busy cores",
        "",
        f"Command: `{command('benchmarks.studies.suite_under_load', argv)}` (each run: "
        f"`{args.command}`). Date: {utc_now()}. Machine: {machine()}, {args.burners} busy "
        f'process(es) beside the tests (`python -c "while True: pass"`), load average at the '
        f"end {loadavg()}.",
        "",
        f"**{passed} of {len(rows)} runs passed.**",
        "",
        *table(["run", "exit", "took", "summary", "failed tests"], rows, "rrll"),
    ]
    write_page(args.out, lines, "suite_under_load")
    return 0 if passed == len(rows) else 1


if __name__ == "__main__":
    sys.exit(main())
