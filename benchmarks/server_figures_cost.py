"""What the server's figures cost a decode cell: its figures with them and without, alternating.

A decode cell reads ``/metrics`` at its window's open, at its close and about once a second
between (docs/metrics.md). With the server's figures (``run_decode(keep_server=True)``, the
default) those same reads parse more families (``server_figures.ALL_FAMILIES`` at the edges,
``GAUGE_FAMILIES`` at the polls); without (``keep_server=False``) only the referee's and the
queue's (``probe.SNAPSHOT_FAMILIES``). Either way each read is one GET whose text is parsed
after the window, so what may differ is the CPU after the cell, not the window's figures.
This measures both:

1. **The decode figures**, ``--rounds`` rounds of one cell with and one without, the order
   alternating (with-without, then without-with, ...): total tok/s, TTFT and TBT, each with
   its 95 % interval; per round whether each value lies in the other's interval; over the
   rounds the paired relative difference (with / without − 1) with a t interval. Against the
   simulator in its own process by default, ``--url`` a running server, ``--vllm`` the real
   vLLM of ``scripts/setup_vllm.py`` (tiny offline model, started and stopped here).
2. **The parse**, a micro-benchmark on real vLLM 0.32 /metrics texts (``tests/data/metrics/``):
   CPU per read of the old parse (``SNAPSHOT_FAMILIES``, one ``MetricsSnapshot``) against the
   new (``EDGE_FAMILIES`` / ``POLL_FAMILIES``, a ``MetricsSnapshot`` and a ``ServerSnapshot``
   from the one parse), and of ``window_figures``.

Writes ``benchmarks/results/server_figures_cost.md`` (``--out`` elsewhere). Run it on a quiet
machine (``--wait-quiet`` waits for one)::

    python -m benchmarks.server_figures_cost --rounds 8
"""

from __future__ import annotations

import argparse
import asyncio
import math
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from benchmarks.common import ROOT, fmt, loadavg, table, wait_quiet
from benchmarks.harness import Figure, Outcome, cli
from pytest_llmspeed.core import protocol
from pytest_llmspeed.core.client import Connection
from pytest_llmspeed.core.intervals import Interval, t_quantile
from pytest_llmspeed.core.probe import SNAPSHOT_FAMILIES, parse_metrics, probe, snapshot
from pytest_llmspeed.core.prompts import PromptFactory
from pytest_llmspeed.core.protocol import (
    EDGE_FAMILIES,
    POLL_FAMILIES,
    DecodeResult,
    MetricsRead,
    negotiate,
    run_decode,
    run_prefill,
)
from pytest_llmspeed.core.server_figures import snapshot_from_samples, window_figures
from pytest_llmspeed.sim import SimOptions, running_simulator_process

DATA = ROOT / "tests" / "data" / "metrics"
MODES = ("with", "without")


# --- the parse --------------------------------------------------------------------------------


def cpu_ms(fn: Callable[[], object], rounds: int) -> float:
    """CPU milliseconds of one call, the median of 5 batches of ``rounds`` calls."""
    batches = []
    for _ in range(5):
        c0 = time.process_time()
        for _ in range(rounds):
            fn()
        batches.append((time.process_time() - c0) / rounds * 1e3)
    return statistics.median(batches)


def parse_row(name: str, rounds: int) -> list[str]:
    """CPU per read of one real vLLM text: the full parse, the old one, the new edge and poll."""
    text = (DATA / f"vllm-0.32-cpu-{name}.txt").read_text()

    def full() -> object:
        return parse_metrics(text)

    def old() -> object:
        return snapshot(parse_metrics(text, SNAPSHOT_FAMILIES))

    def new(families: frozenset[str]) -> Callable[[], object]:
        def both() -> object:
            samples = parse_metrics(text, families)
            return snapshot(samples), snapshot_from_samples(samples, 0.0)

        return both

    return [
        f"`{name}` ({len(text):,} B)",
        f"{cpu_ms(full, max(rounds // 20, 1)):.2f}",
        f"{cpu_ms(old, rounds):.2f}",
        f"{cpu_ms(new(EDGE_FAMILIES), rounds):.2f}",
        f"{cpu_ms(new(POLL_FAMILIES), rounds):.2f}",
    ]


def parse_rows(rounds: int) -> list[list[str]]:
    """CPU per read, old parse against new, on each real vLLM text, and per window."""
    rows = [parse_row(name, rounds) for name in ("during", "after", "ngram-after")]
    before = snapshot_from_samples(
        parse_metrics((DATA / "vllm-0.32-cpu-before.txt").read_text(), EDGE_FAMILIES), 0.0
    )
    after = snapshot_from_samples(
        parse_metrics((DATA / "vllm-0.32-cpu-after.txt").read_text(), EDGE_FAMILIES), 60.0
    )
    during = snapshot_from_samples(
        parse_metrics((DATA / "vllm-0.32-cpu-during.txt").read_text(), POLL_FAMILIES), 30.0
    )
    polls = [during] * 60
    rows.append(
        [
            "`window_figures` (60 polls)",
            "",
            "",
            f"{cpu_ms(lambda: window_figures(before, after, polls), rounds):.2f}",
            "",
        ]
    )
    return rows


# --- the decode figures -----------------------------------------------------------------------


@dataclass
class Cell:
    mode: str
    total: float
    total_ci: Interval | None
    ttft: float | None
    ttft_ci: Interval | None
    tbt: float | None
    tbt_ci: Interval | None
    reads: int  # /metrics reads in the window (open, polls, close)
    parse_ms: float  # CPU of their parse, after the window
    steps_per_s: float | None  # the server's figures (with only)


@contextmanager
def parse_timer() -> Iterator[list[float]]:
    """CPU seconds of every ``MetricsRead.parse`` inside the block."""
    spent: list[float] = []
    real = MetricsRead.parse

    def timed(self: MetricsRead, families: frozenset[str]) -> object:
        c0 = time.process_time()
        try:
            return real(self, families)
        finally:
            spent.append(time.process_time() - c0)

    MetricsRead.parse = timed  # type: ignore[assignment,method-assign]  # put back below
    try:
        yield spent
    finally:
        MetricsRead.parse = real  # type: ignore[method-assign]


@contextmanager
def recording_reads() -> Iterator[list[MetricsRead]]:
    """Every /metrics read a decode cell makes inside the block."""
    reads: list[MetricsRead] = []
    real = protocol._read

    async def recording(conn: object) -> MetricsRead:
        read = await real(conn)  # type: ignore[arg-type]
        reads.append(read)
        return read

    protocol._read = recording  # type: ignore[assignment]  # put back below
    try:
        yield reads
    finally:
        protocol._read = real


async def measure_cells(url: str, args: argparse.Namespace) -> list[Cell]:
    conn = Connection.open(url, None, 120)
    cells: list[Cell] = []
    try:
        server = await probe(conn, None, None)
        if not server.has_metrics:
            raise SystemExit(f"{url} has no /metrics: nothing to measure")
        factory = PromptFactory(conn, server.model)
        dialect = await negotiate(conn, factory, server.model, "completions")
        await run_prefill(conn, factory, dialect, server.model, args.context, 16)
        for i in range(args.rounds):
            order = MODES if i % 2 == 0 else MODES[::-1]
            for mode in order:
                with recording_reads() as reads, parse_timer() as spent:
                    result = await run_decode(
                        conn,
                        factory,
                        dialect,
                        server.model,
                        args.context,
                        args.concurrency,
                        args.max_output,
                        args.duration,
                        keep_server=mode == "with",
                    )
                cells.append(cell(mode, result, reads, spent))
                print(f"[server_figures_cost] round {i + 1} {mode}: {line(cells[-1])}", flush=True)
    finally:
        await conn.close()
    return cells


def cell(mode: str, r: DecodeResult, reads: list[MetricsRead], spent: list[float]) -> Cell:
    s = r.stats
    return Cell(
        mode=mode,
        total=s.total_tok_s,
        total_ci=s.total_ci,
        ttft=s.ttft_ms,
        ttft_ci=s.ttft_ci,
        tbt=s.tbt_ms,
        tbt_ci=s.tbt_ci,
        reads=sum(1 for x in reads if x.t0 >= r.window[0]),
        parse_ms=sum(spent) * 1e3,
        steps_per_s=r.server.steps_per_s if r.server else None,
    )


def line(c: Cell) -> str:
    return (
        f"{fmt(c.total)} tok/s {ci(c.total_ci)}, TTFT {fmt(c.ttft, 2)} ms, "
        f"TBT {fmt(c.tbt, 3)} ms, {c.reads} reads, parse {c.parse_ms:.1f} ms of CPU"
    )


def ci(i: Interval | None, digits: int = 1) -> str:
    return "–" if i is None else f"[{i.low:,.{digits}f}, {i.high:,.{digits}f}]"


def inside(value: float | None, interval: Interval | None) -> bool | None:
    if value is None or interval is None:
        return None
    return interval.low <= value <= interval.high


def paired(cells: list[Cell], attr: str) -> tuple[float, float] | None:
    """Mean relative difference with / without − 1 over the rounds, and its 95 % t half-width
    (None under two rounds)."""
    with_ = [getattr(c, attr) for c in cells if c.mode == "with"]
    without = [getattr(c, attr) for c in cells if c.mode == "without"]
    diffs = [a / b - 1 for a, b in zip(with_, without, strict=True) if a and b]
    if len(diffs) < 2:
        return None
    half = t_quantile(0.975, len(diffs) - 1) * statistics.stdev(diffs) / math.sqrt(len(diffs))
    return statistics.fmean(diffs), half


def median_of(cells: list[Cell], attr: str) -> float | None:
    values = [v for c in cells if (v := getattr(c, attr)) is not None]
    return statistics.median(values) if values else None


def figure_rows(cells: list[Cell]) -> list[list[str]]:
    rows = []
    for attr, name, digits in (
        ("total", "total tok/s", 1),
        ("ttft", "TTFT ms", 2),
        ("tbt", "TBT ms", 3),
    ):
        by = {m: [c for c in cells if c.mode == m] for m in MODES}
        agree = 0
        rounds = 0
        for a, b in zip(by["with"], by["without"], strict=True):
            va, vb = getattr(a, attr), getattr(b, attr)
            ia, ib = getattr(a, f"{attr}_ci"), getattr(b, f"{attr}_ci")
            both = (inside(va, ib), inside(vb, ia))
            if None not in both:
                rounds += 1
                agree += all(both)
        diff = paired(cells, attr)
        rows.append(
            [
                name,
                fmt(median_of(by["with"], attr), digits),
                fmt(median_of(by["without"], attr), digits),
                f"{agree} of {rounds}",
                "–" if diff is None else f"{diff[0]:+.2%} ± {diff[1]:.2%}",
            ]
        )
    return rows


def figures_of(cells: list[Cell], parse: list[list[str]]) -> dict[str, Figure]:
    """The suite's figures: each decode figure's paired difference (with / without − 1, in
    percent) and its 95 % half-width, and the parse of one edge read of real vLLM's /metrics
    (the text after a window)."""
    figures: dict[str, Figure] = {}
    for attr in ("total", "ttft", "tbt"):
        diff = paired(cells, attr)
        if diff is not None:
            figures[f"{attr}_diff_pct"] = Figure(
                round(diff[0] * 100, 3), "%", digits=2, signed=True
            )
            figures[f"{attr}_diff_halfwidth_pct"] = Figure(round(diff[1] * 100, 3), "%", digits=2)
    for row_ in parse:
        if row_[0].startswith("`after`"):
            try:
                figures["edge_parse_ms"] = Figure(float(row_[3]), "ms", digits=2)
                figures["full_parse_ms"] = Figure(float(row_[1]), "ms", digits=2)
            except ValueError:
                pass
            break
    return figures


def measure(argv: list[str]) -> Outcome:
    """Decode cells with and without the server's figures, alternating, and the parse of one
    read: the figures and the page."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=8, help="pairs of cells (default 8)")
    ap.add_argument("--duration", type=float, default=10.0, help="decode window, s")
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--context", type=int, default=1024)
    ap.add_argument("--max-output", type=int, default=4096)
    ap.add_argument("--speed", type=float, default=1.0, help="the simulator's speed")
    ap.add_argument("--url", help="a running server instead of the simulator")
    ap.add_argument("--vllm", action="store_true", help="start the real vLLM of setup_vllm.py")
    ap.add_argument("--parse-rounds", type=int, default=200, help="calls per parse batch")
    ap.add_argument("--wait-quiet", type=float, default=0.0, help="wait up to S s for quiet")
    args = ap.parse_args(argv)

    waited = wait_quiet(args.wait_quiet, 0.3, tag="server_figures_cost") if args.wait_quiet else 0
    load_before = loadavg()
    parse = parse_rows(args.parse_rounds)
    if args.url:
        target = args.url
        cells = asyncio.run(measure_cells(args.url, args))
    elif args.vllm:
        from benchmarks.common import running_vllm

        with running_vllm(Path(tempfile.mkdtemp(prefix="llmspeed-figures-cost-"))) as vllm:
            target = f"real vLLM ({vllm.server.model})"
            cells = asyncio.run(measure_cells(vllm.server.url, args))
    else:
        options = SimOptions(profile="tiny", speed=args.speed)
        target = f"the simulator (tiny, speed {args.speed:g}, its own process)"
        with running_simulator_process(options) as url:
            cells = asyncio.run(measure_cells(url, args))

    per_cell = [
        [
            str(i // 2 + 1),
            c.mode,
            f"{fmt(c.total)} {ci(c.total_ci)}",
            f"{fmt(c.ttft, 2)} {ci(c.ttft_ci, 2)}",
            f"{fmt(c.tbt, 3)} {ci(c.tbt_ci, 3)}",
            str(c.reads),
            f"{c.parse_ms:.1f}",
            fmt(c.steps_per_s),
        ]
        for i, c in enumerate(cells)
    ]
    lines = [
        "# The server's figures: what they cost a decode cell",
        "",
        f"Load average {load_before} before (waited {waited:.0f} s for a quiet machine)."
        if args.wait_quiet
        else f"Load average {load_before} before.",
        "",
        "## The decode figures, with the server's figures and without",
        "",
        f"Against {target}: context {args.context:,}, concurrency {args.concurrency}, "
        f"{args.duration:g} s windows, {args.rounds} rounds, the order alternating. *with*: the "
        "window's /metrics reads parse every series of the server's figures (edges) and their "
        "gauges (polls); *without*: only the referee's and the queue's series. Both parse "
        "after the window. In the other's interval: rounds where each value lies inside the "
        "other cell's 95 % interval. Paired difference: with / without − 1, mean over the "
        "rounds ± its 95 % t half-width.",
        "",
        *table(
            [
                "figure",
                "with (median)",
                "without (median)",
                "in the other's interval",
                "paired difference",
            ],
            figure_rows(cells),
            "lrrrr",
        ),
        "",
        *table(
            [
                "round",
                "mode",
                "total tok/s [95 %]",
                "TTFT ms [95 %]",
                "TBT ms [95 %]",
                "reads",
                "parse ms CPU",
                "server steps/s",
            ],
            per_cell,
            "llrrrrrr",
        ),
        "",
        "## The parse of one read (real vLLM 0.32 CPU /metrics)",
        "",
        "CPU ms per call, median of 5 batches of "
        f"{args.parse_rounds} calls (the full parse: of {max(args.parse_rounds // 20, 1)}). "
        "Old: `SNAPSHOT_FAMILIES`, the `MetricsSnapshot`. New: the one parse of a window's "
        "edge (`EDGE_FAMILIES`) or poll (`POLL_FAMILIES`), both snapshots from it. Before "
        "issue 20 a poll's old parse ran inside the window; now every parse runs after it.",
        "",
        *table(
            ["text", "full parse", "old (snapshot families)", "new: edge", "new: poll"],
            parse,
            "lrrrr",
        ),
    ]
    return Outcome(figures_of(cells, parse), lines, vars(args))


def main() -> None:
    sys.exit(cli("server_figures_cost", measure))


if __name__ == "__main__":
    main()
