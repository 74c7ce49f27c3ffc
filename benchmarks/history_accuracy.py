"""How often the history's change-point method (history/changes.py, docs/history.md) finds what
it should and nothing else, on series of numbers with 3 % noise between runs and a ±0.5 %
interval on each run (the issue 32 targets, and more seeds than the tests take).

    python -m benchmarks.history_accuracy [--seed 2026]
"""

from __future__ import annotations

import argparse

import numpy as np

from pytest_llmspeed.gate.judge import Verdict
from pytest_llmspeed.history.changes import find

NOISE = 0.03


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, default=2026)
    args = ap.parse_args()
    rng = np.random.default_rng(args.seed)

    def w2(n: int) -> np.ndarray:
        return np.full(n, (0.005 / 1.96) ** 2)

    def series(n: int, at: int, k: float) -> np.ndarray:
        return np.where(np.arange(n) < at, 1.0, k) * np.exp(rng.normal(0, NOISE, n))

    def starts(values: np.ndarray) -> list[int]:
        return [s.start for s in find(values, w2(len(values)), 0.05).segments[1:]]

    rows = []
    hit = sum(
        (lambda s: len(s) == 1 and abs(s[0] - 11) <= 1)(starts(series(20, 11, 0.9)))
        for _ in range(1000)
    )
    rows.append(("−10 % from run 12 of 20: one change, at run 12 ± 1", f"{hit / 10:.1f} %", 1000))
    for n, count in ((40, 2000), (1000, 200)):
        found = sum(len(starts(series(n, 0, 1.0))) for _ in range(count))
        rows.append((f"flat, {n:,} runs: change points per series", f"{found / count:.4f}", count))
    small = sum(len(starts(series(20, 11, 0.99))) for _ in range(1000))
    rows.append(("−1 % from run 12 of 20: change points per series", f"{small / 1000:.4f}", 1000))
    rise = 0
    for _ in range(1000):
        got = find(series(20, 11, 1.1), w2(20), 0.05)
        rise += bool(got.changes) and got.changes[-1].verdict is Verdict.IMPROVED
    rows.append(("+10 % from run 12 of 20: the newest change improved", f"{rise / 10:.1f} %", 1000))
    for k in (2, 3, 5):
        seen = 0
        for _ in range(500):
            got = find(series(30, 30 - k, 0.9), w2(30), 0.05)
            seen += (
                len(got.segments) > 1
                and abs(got.segments[-1].start - (30 - k)) <= 1
                and got.changes[-1].verdict is Verdict.REGRESSED
            )
        rows.append((f"−10 % in the newest {k} of 30 runs: regressed", f"{seen / 5:.1f} %", 500))
    print("| series (3 % noise between runs, ±0.5 % intervals) | found | series |")
    print("| --- | ---: | ---: |")
    for what, value, count in rows:
        print(f"| {what} | {value} | {count:,} |")


if __name__ == "__main__":
    main()
