"""--llm-requests (docs/outputs.md, "One row per request"): one JSON line per request of every
decode and open-loop cell, written as each cell ends, whose rows give back the cell's figures:
its completed requests, its TTFT's median and sample, its gaps and its end-to-end latency, and
an open-loop cell's requests and their schedule.

Chance: none. The file keeps times to the microsecond, so a value within a few microseconds
of a window's edge may fall either side of it here: such values are counted and the counts
allowed to differ by them (a median compared only where none is)."""

from __future__ import annotations

import json
import statistics

import numpy as np
import pytest

from pytest_llmspeed.core.request_log import KEYS

pytestmark = pytest.mark.slow  # three cells on the simulator

ARGS = (
    "--llm-endpoint=sim:tiny?speed=1&seed=5",
    "--llm-contexts=1K",
    "--llm-concurrency=4",
    "--llm-duration=1",
    "--llm-max-output=64",
    "--llm-rates=8",
    "--llm-results=r.json",
    "--llm-requests=out/requests.jsonl",
    "-p",
    "no:randomly",
)


def _arrivals(row):
    """A row's arrivals of output: its first, then each gap after it (s)."""
    return row["first_s"] + np.concatenate(([0.0], np.cumsum(row["gaps_ms"]) / 1e3))


def test_the_rows_give_back_each_cells_figures(pytester):
    result = pytester.runpytest(*ARGS)
    result.assert_outcomes(passed=3)
    lines = (pytester.path / "out" / "requests.jsonl").read_text().splitlines()
    rows = [json.loads(line) for line in lines]
    result.stdout.fnmatch_lines([f"requests: out/requests.jsonl ({len(rows):,} rows)"])
    assert all(list(row) == list(KEYS) for row in rows)  # every key, in order: one table
    cells = {c["id"]: c for c in json.loads((pytester.path / "r.json").read_text())["cells"]}

    decode = [r for r in rows if r["cell"] == "decode[1K-c4]"]
    fig = cells["decode[1K-c4]"]
    w0, w1 = decode[0]["window_open_s"], decode[0]["window_close_s"]
    assert {r["attempt"] for r in decode} == {1} and len(decode) == fig["requests"]
    # the file keeps times to 1 µs and gaps to 1 µs, added up: a value within EDGE of a
    # window's edge may fall either side of it here (none is left to chance)
    edge = 2e-6

    def near(t):
        return abs(t - w0) < edge or abs(t - w1) < edge

    done = [r for r in decode if r["status"] == "finished" and w0 <= r["last_s"] < w1]
    unsure = sum(r["status"] == "finished" and near(r["last_s"]) for r in decode)
    assert abs(len(done) - fig["completed"]) <= unsure and fig["completed"] == fig["e2e_n"]
    if not unsure:
        assert statistics.median(r["e2e_ms"] for r in done) == pytest.approx(
            fig["e2e_ms"], abs=0.01
        )
    firsts = [r["ttft_ms"] for r in decode if r["first_s"] is not None and r["first_s"] < w1]
    unsure = sum(r["first_s"] is not None and near(r["first_s"]) for r in decode)
    assert abs(len(firsts) - fig["ttft_n"]) <= unsure
    if not unsure:
        assert statistics.median(firsts) == pytest.approx(fig["ttft_ms"], abs=0.01)
    times = [
        (g, t)
        for r in decode
        if r["gaps_ms"]
        for g, t in zip(r["gaps_ms"], _arrivals(r)[1:], strict=True)
    ]
    gaps = [g for g, t in times if w0 <= t < w1]
    # an arrival is its first plus a sum of at most 63 gaps, each rounded by 0.5 µs at most
    unsure = sum(abs(t - w0) < 4e-5 or abs(t - w1) < 4e-5 for _, t in times)
    assert abs(len(gaps) - fig["itl_n"]) <= unsure
    if not unsure:
        assert float(np.median(gaps)) == pytest.approx(fig["itl_ms"], abs=0.01)

    rate = [r for r in rows if r["cell"] == "rate[1K-r8]"]
    fig = cells["rate[1K-r8]"]
    assert len(rate) == fig["open_requests"]
    assert sum(r["status"] == "finished" for r in rate) == fig["open_completed"]
    assert all(r["due_s"] is not None and r["window_open_s"] is None for r in rate)
    assert sorted(r["due_s"] for r in rate) == [r["due_s"] for r in rate]  # sent in order
