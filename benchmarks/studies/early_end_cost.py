"""What the early-end test (``--llm-precision``) costs the event loop while streams are read.

Every half second the decode loop asks :meth:`_LiveEvents.precise_enough` whether the window
may end; the call runs on the event loop, so while it runs no chunk is read and no timestamp
taken. This replays a window's reads as they would accumulate (N reads spread over 30 s, 60
calls, the reads since the last call appended before each) and times every call; the worst
one is what a chunk's timestamp may be late by. Set against session 6's implementation (a
Python loop over every read per call, and a reads × batches array for the batch counts),
kept here as the reference.

    python -m benchmarks.studies.early_end_cost
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from benchmarks.common import RESULTS, command, machine, table, utc_now, write_page
from pytest_llmspeed.core import intervals
from pytest_llmspeed.core.protocol import _LiveEvents


def _counts_before(
    times: np.ndarray, counts: np.ndarray, w0: float, w1: float, k: int, starts: np.ndarray
) -> np.ndarray:
    """Session 6's batch counts: every chunk through a (chunks × edges) array."""
    out = np.zeros(k)
    edges = np.linspace(w0, w1, k + 1)
    keep = (times >= w0) & (starts < w1)
    t, s0, c = times[keep], starts[keep], counts[keep]
    span = np.maximum(t - s0, 1e-12)
    for i in range(0, len(t), 20_000):
        sl = slice(i, i + 20_000)
        share = np.clip((edges[None, :] - s0[sl, None]) / span[sl, None], 0.0, 1.0)
        out += np.diff(share.T @ c[sl])
    return out


class _Before(_LiveEvents):
    """Session 6's arrays: a Python generator over every read, on every call."""

    def __init__(self) -> None:
        super().__init__()
        self.times: list[float] = []
        self.counts: list[int] = []
        self.starts: list[float] = []

    def arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        return (
            np.fromiter((t for t in self.times), dtype=np.float64),
            np.fromiter((c for c in self.counts), dtype=np.float64),
            np.fromiter((s for s in self.starts), dtype=np.float64),
        )


def replay(live: _LiveEvents, reads: int, streams: int, seed: int = 1) -> list[float]:
    """Milliseconds of each of 60 calls over a 30 s window of ``reads`` reads."""
    rng = np.random.default_rng(seed)
    t = np.sort(rng.uniform(0, 30, reads))
    previous = np.maximum(t - rng.exponential(streams * 30 / reads, reads), 0.0)
    costs = []
    done = 0
    for i in range(1, 61):
        upto = reads * i // 60
        if isinstance(live, _Before):
            live.times.extend(t[done:upto].tolist())
            live.counts.extend([1] * (upto - done))
            live.starts.extend(previous[done:upto].tolist())
        else:  # what update() takes from the streams' tallies since the last call
            live._pieces.append((t[done:upto], np.ones(upto - done), previous[done:upto]))
        done = upto
        t0 = time.perf_counter()
        live.precise_enough(0.0, 30.0 * i / 60, 0.01, 30.0)
        costs.append((time.perf_counter() - t0) * 1e3)
    return costs


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reads", default="30000,300000", help="reads per 30 s window")
    args = ap.parse_args(argv)
    rows = []
    for reads in (int(r) for r in args.reads.split(",")):
        now = replay(_LiveEvents(), reads, 128)
        current = intervals.batch_counts
        intervals.batch_counts = _counts_before  # type: ignore[assignment]  # the old one, put back below
        try:
            before = replay(_Before(), reads, 128)
        finally:
            intervals.batch_counts = current
        rows.append(
            [
                f"{reads:,} ({reads / 30:,.0f} reads/s)",
                f"{max(before):.1f} ms",
                f"{statistics.median(before):.1f} ms",
                f"**{max(now):.1f} ms**",
                f"{statistics.median(now):.1f} ms",
            ]
        )
    lines = [
        "# The early-end test's cost on the event loop",
        "",
        f"Made {utc_now()} on {machine()} with "
        f"`{command('benchmarks.studies.early_end_cost', argv)}`.",
        "60 calls over a 30 s window, 128 streams; one read per token (a server streaming a",
        "token per chunk). The worst call is how late a chunk's timestamp may be.",
        "",
        *table(
            [
                "reads in the window",
                "session 6: worst call",
                "session 6: median",
                "now: worst call",
                "now: median",
            ],
            rows,
        ),
    ]
    write_page(RESULTS / "early_end_cost.md", lines, "early_end_cost")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
