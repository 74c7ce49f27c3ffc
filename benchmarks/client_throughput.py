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

import numpy as np

from benchmarks.common import command
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


async def measure(url: str, streams: int, duration: float, context: int, max_output: int) -> dict:
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--speed", type=float, default=3.0)
    ap.add_argument("--streams", type=int, default=128)
    ap.add_argument("--duration", type=float, default=10.0)
    ap.add_argument("--context", type=int, default=1024)
    ap.add_argument("--max-output", type=int, default=1024)
    args = ap.parse_args()
    # the simulator in its own process: its own interpreter, so its own GIL and core
    options = SimOptions(profile="tiny", speed=args.speed, kv_capacity=4 * 1024 * 1024)
    with running_simulator_process(options) as url:
        out = asyncio.run(measure(url, args.streams, args.duration, args.context, args.max_output))
    print(
        json.dumps(
            {"command": command("benchmarks.client_throughput"), **vars(args), **out}, indent=1
        )
    )
    ok = out["client_total_tok_s"] >= 50_000 and abs(out["tbt_diff_ms"]) < 0.2
    print("PASS" if ok else "FAIL", "(target: >= 50,000 tok/s, |TBT diff| < 0.2 ms)")


if __name__ == "__main__":
    main()
