"""How good is the progress line's "about N min left"? Run a matrix, stamp every progress line
as it arrives, and compare each estimate with the time that was really left.

    python -m benchmarks.studies.progress_estimate  # the demo: reference matrix at 10x, 3 s windows

The figure the issue asks for is the estimate at the half-way cell (goal: within 25 % of the
time actually left).
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.common import RESULTS, command, machine, table, utc_now, write_page

LINE = re.compile(r"^\[(\d+)/(\d+)\] (\S+) · .* · about (.+) left$")


def seconds(words: str) -> float:
    """``40 s``, ``14 min``, ``1 h 05 min`` → seconds."""
    total = 0.0
    for value, unit in re.findall(r"(\d+) (h|min|s)\b", words):
        total += int(value) * {"h": 3600, "min": 60, "s": 1}[unit]
    return total


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--endpoint", default="sim:h200-qwen3.5-27b-int4?speed=10")
    parser.add_argument("--duration", default="3")
    parser.add_argument("--out", type=Path, default=RESULTS / "progress_estimate.md")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as work:
        proc = subprocess.Popen(
            [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-W", "ignore",
             f"--llm-endpoint={args.endpoint}", f"--llm-duration={args.duration}"],
            cwd=work, stdout=subprocess.PIPE, text=True, bufsize=1,
        )  # fmt: skip
        assert proc.stdout is not None
        starts: list[tuple[float, int, int, str, float]] = []
        for line in proc.stdout:
            m = LINE.match(line.strip())
            if m:
                i, n, cid, left = int(m[1]), int(m[2]), m[3], seconds(m[4])
                starts.append((time.monotonic(), i, n, cid, left))
        proc.wait()
        end = time.monotonic()
    rows = []
    half = None
    for t, i, n, cid, left in starts:
        actual = end - t
        error = (left - actual) / actual if actual > 0 else 0.0
        rows.append((f"{i}/{n}", cid, f"{left:.0f} s", f"{actual:.0f} s", f"{error:+.0%}"))
        if half is None and i >= n / 2:
            half = (i, n, cid, left, actual, error)
    assert half is not None, "no progress line was seen"
    i, n, cid, left, actual, error = half
    verdict = "within" if abs(error) <= 0.25 else "OUTSIDE"
    lines = [
        "# The progress line's time-left estimate",
        "",
        f"Command: `{command('benchmarks.studies.progress_estimate', argv)}`. Date: {utc_now()}. "
        f"Machine: {machine()}. Matrix: `{args.endpoint}`, {args.duration} s windows.",
        "",
        f"**At the half-way cell ({i}/{n}, {cid}) the estimate was {left:.0f} s; "
        f"{actual:.0f} s were left: {error:+.0%}, {verdict} the goal of ±25 %.**",
        "",
        *table(["cell", "id", "estimated left", "really left", "error"], rows, "llrrr"),
    ]
    write_page(args.out, lines, "progress_estimate")
    return 0 if abs(error) <= 0.25 else 1


if __name__ == "__main__":
    sys.exit(main())
