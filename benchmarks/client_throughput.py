"""Can the client keep up? 128 streams from the simulator at high speed, client vs server truth.

The simulator runs in its own process (its own core); the client in this one. perf_counter is
CLOCK_MONOTONIC on Linux, shared by both processes, so the server's emission times (/sim/trace)
and the client's arrival times are comparable.

    python -m benchmarks.client_throughput [--speed 3] [--streams 128] [--duration 10]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys

import numpy as np

from benchmarks.common import table
from benchmarks.harness import Figure, Outcome, cli
from pytest_llmspeed.core.client import Connection
from pytest_llmspeed.core.probe import probe
from pytest_llmspeed.core.prompts import PromptFactory
from pytest_llmspeed.core.protocol import negotiate, run_decode, run_prefill
from pytest_llmspeed.sim import SimOptions, running_simulator_process

#: the simulator's own trace is ours to read whole (not a server answer under test)
TRACE_LIMIT = 1 << 30


def server_truth(requests: list[dict], w0: float, w1: float) -> tuple[int, float]:
    tokens = 0
    tbts = []
    for r in requests:
        chunks = r["chunks"]
        tokens += sum(n for t, n in chunks if w0 <= t < w1)
        total = sum(n for _, n in chunks)
        if total >= 2 and chunks[-1][0] > chunks[0][0]:
            tbts.append((chunks[-1][0] - chunks[0][0]) / (total - 1) * 1e3)
    return tokens, float(np.median(tbts))


async def measure_cell(
    url: str, streams: int, duration: float, context: int, max_output: int
) -> dict:
    conn = Connection.open(url, None, 60)
    try:
        server = await probe(conn, None, None)
        factory = PromptFactory(conn, server.model)
        dialect = await negotiate(conn, factory, server.model, "completions")
        await run_prefill(conn, factory, dialect, server.model, context, 16)
        await conn.session.delete(conn.url("/sim/trace"))
        result = await run_decode(
            conn, factory, dialect, server.model, context, streams, max_output, duration
        )
        _, body = await conn.get("/sim/trace", limit=TRACE_LIMIT)
    finally:
        await conn.close()
    w0, w1 = result.window
    tokens, tbt_truth = server_truth(json.loads(body)["requests"], w0, w1)
    s = result.stats
    if s.tbt_ms is None:
        raise RuntimeError(f"{streams} streams: no request streamed two tokens in the window")
    return {
        "streams": streams,
        "client_total_tok_s": round(s.total_tok_s, 1),
        "server_total_tok_s": round(tokens / (w1 - w0), 1),
        "throughput_diff_pct": round((s.output_tokens - tokens) / tokens * 100, 3),
        "client_tbt_ms": round(s.tbt_ms, 4),
        "server_tbt_ms": round(tbt_truth, 4),
        "tbt_diff_ms": round(s.tbt_ms - tbt_truth, 4),
        "tokens_per_chunk": round(result.received_tokens / max(result.received_chunks, 1), 2),
        "avg_active": round(s.avg_active, 2),
    }


def measure(argv: list[str]) -> Outcome:
    """The client's throughput and time between tokens against the simulator's own record."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--speed", type=float, default=3.0)
    ap.add_argument("--streams", type=int, default=128)
    ap.add_argument("--duration", type=float, default=10.0)
    ap.add_argument("--context", type=int, default=1024)
    ap.add_argument("--max-output", type=int, default=1024)
    args = ap.parse_args(argv)
    # the simulator in its own process: its own interpreter, so its own GIL and core
    options = SimOptions(profile="tiny", speed=args.speed, kv_capacity=4 * 1024 * 1024)
    with running_simulator_process(options) as url:
        out = asyncio.run(measure_once(url, args))
    tok_s, tbt = out["client_total_tok_s"], out["tbt_diff_ms"]
    figures = {
        "client_total_tok_s": Figure(tok_s, "tok/s", "≥ 50,000", tok_s >= 50_000),
        "server_total_tok_s": Figure(out["server_total_tok_s"], "tok/s"),
        "throughput_diff_pct": Figure(out["throughput_diff_pct"], "%", digits=3, signed=True),
        "client_tbt_ms": Figure(out["client_tbt_ms"], "ms", digits=4),
        "server_tbt_ms": Figure(out["server_tbt_ms"], "ms", digits=4),
        "tbt_diff_ms": Figure(tbt, "ms", "|·| < 0.2 ms", abs(tbt) < 0.2, digits=3, signed=True),
        "tokens_per_chunk": Figure(out["tokens_per_chunk"], "", digits=2),
        "avg_active": Figure(out["avg_active"], "", digits=1),
    }
    page = [
        f"# Client throughput: {args.streams} streams, client vs the simulator's own record",
        "",
        f"The plugin's decode cell (`core.protocol.run_decode`, {args.context}-token prompts, "
        f"{args.max_output}-token outputs, {args.duration:g} s window) against the simulator "
        f"(tiny profile, speed {args.speed:g}) in its own process; the server's truth is its "
        "trace (`/sim/trace`). Target: ≥ 50,000 tok/s with time between tokens off by < 0.2 ms.",
        "",
        *table(
            ["figure", "client", "server truth (`/sim/trace`)", "difference"],
            [
                [
                    "total tok/s over the window",
                    figures["client_total_tok_s"].text,
                    figures["server_total_tok_s"].text,
                    figures["throughput_diff_pct"].text,
                ],
                [
                    "time between tokens, median",
                    figures["client_tbt_ms"].text,
                    figures["server_tbt_ms"].text,
                    figures["tbt_diff_ms"].text,
                ],
            ],
        ),
        "",
        f"{out['tokens_per_chunk']} tokens per SSE chunk, {out['avg_active']} average active "
        "streams.",
    ]
    return Outcome(figures, page, vars(args))


async def measure_once(url: str, args: argparse.Namespace) -> dict:
    return await measure_cell(url, args.streams, args.duration, args.context, args.max_output)


def main() -> None:
    sys.exit(cli("client_throughput", measure))


if __name__ == "__main__":
    main()
