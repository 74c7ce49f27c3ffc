"""How many tokens per second can one simulator process stream? (It must never be the bottleneck.)

Starts ``python -m pytest_llmspeed.sim`` in its own process pinned to one CPU core (``taskset``
where available), then drives it from this process (pinned to another core) with a minimal
aiohttp client: N concurrent streaming ``/v1/completions`` requests (token-id prompts,
``ignore_eos``, ``continuous_usage_stats``), each restarted as soon as it ends, for D seconds.
Tokens are counted from the rise of ``usage.completion_tokens`` in every chunk. The simulator
runs at a very high ``--speed`` so that its own CPU, not the simulated GPU, is the limit.

Usage: ``python -m benchmarks.sim_throughput [--streams 128] [--seconds 10] [--speed 1000]``
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import shutil
import subprocess
import sys
import time

import aiohttp

from benchmarks.common import cpu_seconds, table
from benchmarks.harness import Figure, Outcome, cli
from pytest_llmspeed.sim import SimOptions, cli_args

MARK = b'"completion_tokens":'


async def _stream_forever(
    session: aiohttp.ClientSession,
    url: str,
    body: dict,
    counts: list[int],
    stop: asyncio.Event,
    errors: list[str],
) -> None:
    while not stop.is_set():
        last = 0
        try:
            async with session.post(url, json=body) as resp:
                if resp.status != 200:
                    errors.append(f"HTTP {resp.status}")
                    await asyncio.sleep(0.01)
                    continue
                tail = b""
                async for data in resp.content.iter_any():
                    # the last complete usage figure in what has arrived so far
                    buf = tail + data
                    end = buf.rfind(b"}}\n\n")
                    at = buf.rfind(MARK, 0, end) if end >= 0 else -1
                    if at >= 0:
                        now = int(buf[at + len(MARK) : buf.index(b"}", at)])
                        counts[0] += now - last
                        last = now
                    tail = buf[-64:]
                    if stop.is_set():
                        break
        except (TimeoutError, aiohttp.ClientError) as exc:
            errors.append(repr(exc))


async def drive(base: str, streams: int, seconds: float, max_tokens: int) -> tuple[int, float]:
    body = {
        "model": "tiny",
        "prompt": list(range(1000, 1064)),
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
    }
    counts = [0]
    errors: list[str] = []
    stop = asyncio.Event()
    conn = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=conn) as session:
        tasks = [
            asyncio.create_task(
                _stream_forever(session, base + "/v1/completions", body, counts, stop, errors)
            )
            for _ in range(streams)
        ]
        await asyncio.sleep(1.0)  # warm-up: every stream started
        start_count, start = counts[0], time.perf_counter()
        await asyncio.sleep(seconds)
        tokens, elapsed = counts[0] - start_count, time.perf_counter() - start
        stop.set()
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    if errors:
        print(f"client errors: {len(errors)} (first: {errors[0]})", file=sys.stderr)
    return tokens, elapsed


def measure(argv: list[str]) -> Outcome:
    """The simulator's throughput to ``--streams`` streams and the CPU it used."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--streams", type=int, default=128)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--speed", type=float, default=1000.0)
    parser.add_argument("--max-tokens", type=int, default=1024)
    parser.add_argument("--stream-interval", type=int, default=1)
    args = parser.parse_args(argv)

    pin = shutil.which("taskset") is not None and (os.cpu_count() or 1) >= 2
    # not running_simulator_process: this needs the child's pid (its CPU time) and its core
    options = SimOptions(profile="tiny", speed=args.speed, stream_interval=args.stream_interval)
    cmd = [sys.executable, "-m", "pytest_llmspeed.sim", *cli_args(options)]
    affinity = os.sched_getaffinity(0)
    if pin:
        cmd = ["taskset", "-c", "0", *cmd]
        os.sched_setaffinity(0, {1})
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        match = re.search(r"http://\S+", line)
        if not match:
            raise RuntimeError(f"simulator did not start: {line!r}")
        base = match.group(0)
        cpu0 = cpu_seconds(proc.pid)
        wall0 = time.perf_counter()
        tokens, elapsed = asyncio.run(drive(base, args.streams, args.seconds, args.max_tokens))
        cpu1 = cpu_seconds(proc.pid)
        if cpu0 is None or cpu1 is None:
            raise RuntimeError("the simulator exited during the run")
        cpu = (cpu1 - cpu0) / (time.perf_counter() - wall0)
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        if pin:
            os.sched_setaffinity(0, affinity)
    rate = tokens / elapsed
    pinned = "yes (server core 0, client core 1)" if pin else "no"
    figures = {
        "total_tok_s": Figure(round(rate, 1), "tok/s", "≥ 50,000", rate >= 50_000, 0),
        "sim_cpu_share": Figure(round(cpu * 100, 1), "% of one core", digits=0),
        "tok_per_sim_cpu_s": Figure(round(rate / max(cpu, 1e-9), 1), "tok/CPU-s", digits=0),
    }
    page = [
        f"# Simulator throughput: tokens/s streamed by one process to {args.streams} streams",
        "",
        "Requirement (issue 2): one simulator process streams at least **50,000 tokens/s** in "
        "total to 128 concurrent streams on one core, so that it is never the bottleneck of a "
        "measurement. How: the docstring of `benchmarks/sim_throughput.py`; the record before "
        "the suite (stream intervals 1 and 4, five runs): `git show "
        "8ae081e:benchmarks/results/sim_throughput.md`.",
        "",
        f"Streams {args.streams}, speed {args.speed:g}, stream interval {args.stream_interval}, "
        f"{args.seconds:g} s after a 1 s warm-up, pinned: {pinned}.",
        "",
        *table(
            ["figure", "value", "target"],
            [[k, f.text, f.target or ""] for k, f in figures.items()],
            "lrl",
        ),
    ]
    return Outcome(figures, page, {**vars(args), "pinned": pin, "tokens": tokens})


def main() -> None:
    sys.exit(cli("sim_throughput", measure))


if __name__ == "__main__":
    main()
