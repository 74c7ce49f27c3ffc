"""The client at scale: memory per event, time from the window's close to the figures, events/s.

Against the lean loopback server (``benchmarks/lean_server.py``, its own process), paced
(128 streams × 2,000 tok/s: 256K events a second) and unpaced (as fast as the socket takes
them: the client is the bottleneck). Each client runs in a fresh process of its own, so its
peak memory is its own:

- plugin: one decode cell (``core.protocol.run_decode``: 1,024-token prompts, 4,096-token
  outputs, the window of ``--duration`` seconds), no ``/metrics`` (the lean server has none);
- vllm: ``vllm bench serve``'s request function (``async_request_openai_completions``, on a
  session built as it builds one), N workers sending requests until ``--duration`` has
  passed, each request read to its end, as ``vllm bench serve --max-concurrency N`` does. It
  runs with the Python of vLLM's environment (``scripts/setup_vllm.py``), found by itself.

Figures:
- memory per event: the process's peak RSS over the cell minus its RSS before, over the events
  received (one event a token here);
- close → figures: from the window's close (its planned end) to ``run_decode`` returning the
  cell's figures; for vllm, from its last request's end to its outputs' figures (the medians
  and percentiles ``vllm bench serve`` computes);
- events/s: the events received inside the window, over the window (vllm: all its events over
  its run).

    python -m benchmarks.client_at_scale [--duration 8] [--streams 128] [--rate 2000]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import resource
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
CONTEXT = 1024
MAX_OUTPUT = 4096


def _rss_kib() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") // 1024


def _peak_kib() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def _rss_of(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") // 1024
    except (OSError, ValueError, IndexError):
        return None


def _children() -> list[int]:
    pid = os.getpid()
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(x) for x in f.read().split()]
    except OSError:
        return []


class _Sampler:
    """The process's RSS every 10 ms, on a thread (the event loop is busy reading), and its
    child processes' (the client processes of ``--llm-client-processes``)."""

    def __init__(self) -> None:
        self.samples: list[tuple[float, int]] = []
        self.child_samples: dict[int, list[tuple[float, int]]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.01):
            now = time.perf_counter()
            self.samples.append((now, _rss_kib()))
            for pid in _children():
                kib = _rss_of(pid)
                if kib is not None:
                    self.child_samples.setdefault(pid, []).append((now, kib))

    def children_growth(self, w0: float) -> int:
        """KiB the child processes grew by from the window's open to their peak."""
        total = 0
        for samples in self.child_samples.values():
            at_open = [kib for t, kib in samples if t >= w0][:1]
            if at_open:
                total += max(kib for _, kib in samples) - at_open[0]
        return total

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def at(self, t: float) -> int:
        """The largest RSS sampled up to ``t``."""
        return max((kib for s, kib in self.samples if s <= t), default=0)


async def _plugin(url: str, streams: int, duration: float, processes: int = 1) -> dict[str, Any]:
    from pytest_llmspeed.core.client import Connection
    from pytest_llmspeed.core.prompts import PromptFactory
    from pytest_llmspeed.core.protocol import run_decode
    from pytest_llmspeed.core.wire import Dialect

    conn = Connection.open(url, None, 60)
    try:
        factory = PromptFactory(conn, "lean")
        await factory.prompt(CONTEXT, 0)
        gc.collect()
        rss0 = _rss_kib()
        sampler = _Sampler()
        result = await run_decode(
            conn, factory, Dialect(), "lean", CONTEXT, streams, MAX_OUTPUT, duration,
            watch_metrics=False, processes=processes,
        )  # fmt: skip
        done = time.perf_counter()
        peak = _peak_kib()
        sampler.stop()
    finally:
        await conn.close()
    s = result.stats
    w0, w1 = result.window
    notes = [n for n in (result.token_note, result.aborted, result.client_note) if n]
    grown = peak - rss0 + sampler.children_growth(w0)
    return {
        "processes": result.client_processes,
        "events": result.received_chunks,
        "window_events": s.output_tokens,
        "events_s": s.output_tokens / s.measured_s if s.measured_s else 0.0,
        "bytes_per_event": grown * 1024 / max(result.received_chunks, 1),
        "peak_mib": grown / 1024,
        "close_to_figures_s": done - w1,
        "cpu_share": result.client_lag.cpu_share if result.client_lag else None,
        "cpu_total": result.client_cpu,
        "at_close_bytes_per_event": (sampler.at(w1) - rss0) * 1024 / max(result.received_chunks, 1),
        "window_s": w1 - w0,
        "requests": s.requests,
        "notes": notes,
    }


async def _vllm(url: str, streams: int, duration: float) -> dict[str, Any]:
    import aiohttp
    import numpy as np
    from vllm.benchmarks.lib.endpoint_request_func import (
        RequestFuncInput,
        async_request_openai_completions,
    )

    connector = aiohttp.TCPConnector(
        limit=streams,
        limit_per_host=streams,
        ttl_dns_cache=300,
        use_dns_cache=True,
        keepalive_timeout=60,
        enable_cleanup_closed=True,
        force_close=False,
    )  # fmt: skip  (as vllm/benchmarks/serve.py 0.32 builds its session)
    session = aiohttp.ClientSession(
        connector=connector, trust_env=True, timeout=aiohttp.ClientTimeout(total=6 * 3600)
    )
    prompt = [100 + i % 3000 for i in range(CONTEXT)]
    outputs: list[Any] = []
    gc.collect()
    rss0 = _rss_kib()
    t0 = time.perf_counter()
    cpu0 = time.process_time()

    async def worker(i: int) -> None:
        k = 0
        while time.perf_counter() < t0 + duration:
            inp = RequestFuncInput(
                prompt=prompt, api_url=url + "/v1/completions", prompt_len=CONTEXT,
                output_len=MAX_OUTPUT, model="lean", model_name="lean", ignore_eos=True,
                request_id=f"bench-{i}-{k}",
            )  # fmt: skip
            outputs.append(await async_request_openai_completions(inp, session))
            k += 1

    await asyncio.gather(*(worker(i) for i in range(streams)))
    end = time.perf_counter()
    cpu = (time.process_time() - cpu0) / (end - t0)
    # the figures vllm bench serve computes from its outputs (serve.calculate_metrics's core)
    ttfts = [o.ttft for o in outputs if o.success]
    itls = [x for o in outputs if o.success for x in o.itl]
    for values in (ttfts, itls):
        np.mean(values), np.median(values), np.percentile(values, [90, 99])
    done = time.perf_counter()
    peak = _peak_kib()
    await session.close()
    events = sum(len(o.itl) + 1 for o in outputs if o.success)
    return {
        "events": events,
        "window_events": events,
        "events_s": events / (end - t0),
        "bytes_per_event": (peak - rss0) * 1024 / max(events, 1),
        "peak_mib": (peak - rss0) / 1024,
        "close_to_figures_s": done - end,
        "cpu_share": cpu,
        "cpu_total": cpu,
        "window_s": end - t0,
        "requests": len(outputs),
        "notes": _failures([o.error for o in outputs if not o.success], len(outputs)),
    }


def _failures(errors: list[str], requests: int) -> list[str]:
    """The failed requests, in one note: how many, and the last line of the first error."""
    if not errors:
        return []
    last = (errors[0] or "").strip().splitlines()[-1:] or ["?"]
    return [f"{len(errors)} of {requests} requests failed: {last[0]}"]


def one(client: str, url: str, streams: int, duration: float, processes: int = 1) -> dict[str, Any]:
    """One client in a fresh process of its own; its figures."""
    env = dict(os.environ)
    python = sys.executable
    if client == "vllm":
        sys.path.insert(0, str(ROOT))
        from benchmarks.common import vllm_python

        python = str(vllm_python())
    env["PYTHONPATH"] = os.pathsep.join(
        x for x in (str(ROOT / "src"), str(ROOT), env.get("PYTHONPATH")) if x
    )
    argv = [python, "-m", "benchmarks.client_at_scale", "--one", client, "--url", url,
            "--streams", str(streams), "--duration", str(duration),
            "--processes", str(processes)]  # fmt: skip
    out = subprocess.run(argv, env=env, cwd=ROOT, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"{client} failed: {out.stderr[-2000:]}")
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


class LeanServer:
    def __init__(self, rate: float) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "benchmarks.lean_server", "--rate", str(rate)],
            cwd=ROOT, stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        assert self.proc.stdout is not None
        self.url = self.proc.stdout.readline().strip()

    def __enter__(self) -> LeanServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.proc.terminate()
        self.proc.wait(10)


HEADER = [
    "server", "client", "events/s", "client CPU (busiest process)", "bytes/event",
    "peak MiB", "close → figures, s", "events in window", "events read", "notes",
]  # fmt: skip


def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--duration", type=float, default=8.0)
    ap.add_argument("--streams", type=int, default=128)
    ap.add_argument("--rate", type=float, default=2000.0, help="paced tok/s per stream")
    ap.add_argument(
        "--clients", default="plugin,plugin*2,vllm", help="plugin, plugin*N (N processes), vllm"
    )
    ap.add_argument("--processes", type=int, default=1, help=argparse.SUPPRESS)
    ap.add_argument("--modes", default="paced,unpaced")
    ap.add_argument("--one", choices=("plugin", "vllm"), help=argparse.SUPPRESS)
    ap.add_argument("--url", help=argparse.SUPPRESS)
    return ap.parse_args(argv)


def main() -> None:
    args = parse(None)
    if args.one:  # one client, in its own process (``one``)
        if args.one == "plugin":
            out = asyncio.run(_plugin(args.url, args.streams, args.duration, args.processes))
        else:
            out = asyncio.run(_vllm(args.url, args.streams, args.duration))
        print(json.dumps(out))
        return
    sys.path.insert(0, str(ROOT))
    from benchmarks.harness import cli

    sys.exit(cli("client_at_scale", measure))


def measure(argv: list[str]) -> Any:
    """Each client against the lean server, paced and unpaced: the figures and the page
    (a ``benchmarks.harness.Outcome``)."""
    from benchmarks.common import machine, table, utc_now
    from benchmarks.harness import Figure, Outcome
    from engines.home import Layout, vllm_home

    args = parse(argv)
    figures: dict[str, Figure] = {}
    skipped: list[str] = []
    rows = []
    for mode in args.modes.split(","):
        rate = args.rate if mode == "paced" else 0.0
        for client in args.clients.split(","):
            name, _, times = client.partition("*")
            if name == "vllm" and not Layout(vllm_home()).installed():
                skipped.append(f"{mode} vllm: real vLLM is not set up (scripts/setup_vllm.py)")
                continue
            with LeanServer(rate) as server:
                r = one(name, server.url, args.streams, args.duration, int(times or 1))
            print(mode, client, json.dumps(r), flush=True)
            key = f"{mode}_{name}{times}"
            figures[f"{key}_events_s"] = Figure(round(r["events_s"]), "events/s")
            per_event = round(r["bytes_per_event"], 1)
            figures[f"{key}_bytes_per_event"] = Figure(per_event, "bytes", digits=0)
            close = round(r["close_to_figures_s"], 3)
            figures[f"{key}_close_to_figures_s"] = Figure(close, "s", digits=2)
            if r.get("cpu_total") is not None:
                cpu_pct = round(r["cpu_total"] * 100, 1)
                figures[f"{key}_cpu"] = Figure(cpu_pct, "% of a core", digits=0)
            client = f"plugin, {times} processes" if times else name
            label = f"{args.streams} × {rate:,.0f} tok/s" if rate else "unpaced"
            cpu, total = r.get("cpu_share"), r.get("cpu_total")
            rows.append([
                label, client, f"{r['events_s']:,.0f}",
                f"{total:.0%} ({cpu:.0%})" if cpu is not None and total is not None else "",
                f"{r['bytes_per_event']:.0f}",
                f"{r['peak_mib']:,.0f}", f"{r['close_to_figures_s']:.2f}",
                f"{r['window_events']:,}", f"{r['events']:,}", "; ".join(r["notes"]) or "",
            ])  # fmt: skip
    lines = [
        "# The client at scale: memory per event, close → figures, events/s",
        "",
        "Written by `benchmarks/client_at_scale.py` (its docstring says how).",
        "",
        f"Date: {utc_now()}. "
        f"Machine: {machine()}, loopback; the lean server in its own process. "
        f"Window {args.duration:g} s, {args.streams} streams, {CONTEXT}-token prompts, "
        f"{MAX_OUTPUT}-token outputs, one token an event.",
        "",
        *table(HEADER, rows, "llrrrrrrrl"),
        "",
        "- **events/s**: events received inside the window, over the window (vllm: all its "
        "events over its run, each request read to its end). Paced, every client reads what "
        "the server sends; unpaced, the server is faster than any client, and this is the "
        "client's ceiling.",
        "- **client CPU**: the client processes' CPU time over the window, together and (in "
        "brackets) the busiest one's, from their heartbeats (one core is 100 %; the parent "
        "counts as a process). The lean server and the client processes share this machine's "
        "cores.",
        "- **bytes/event**: peak RSS over the cell (the client processes' too) minus RSS before "
        "it, over the events received; **close → figures**: from the window's planned end to "
        "the cell's figures (vllm: from its last request's end to its medians and "
        "percentiles).",
        "- **vllm** is `vllm bench serve`'s request function (`async_request_openai_"
        "completions`) on a session built as it builds one, N workers, as `--max-concurrency N` "
        "runs it.",
        "- A note `client: event loop … behind` is the heartbeat saying the client could not "
        "keep up (docs/client-at-scale.md): true unpaced, where the client is the bottleneck.",
        *(f"- Not run: {x}." for x in skipped),
    ]
    return Outcome(figures, lines, {**vars(args), "not_run": skipped})


if __name__ == "__main__":
    main()
