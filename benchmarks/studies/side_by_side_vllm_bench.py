"""The plugin and `vllm bench serve` on one real vLLM server at the same time.

Why: run one after the other (``benchmarks/compare_vllm_bench.py``, the sequential paired runs
this script replaced; its page ``benchmarks/results/vllm_bench_compare.md`` stays), the CPU
server's own speed moved by up to 20 % between two back-to-back runs on a 2-core machine (its own
histograms say so), so a 5 % agreement between tools cannot be read from sequential runs. Here
both tools drive the server at once, each with N streams in flight: their requests share the
engine's steps, so whatever the server does, it does to both. What is left between the two
tools' figures is the tools (client, timing, definitions) and the shape of their arrivals.

Each round: the plugin's decode cell starts (its own protocol: N streams restarted at once,
`run_decode` without its idle wait and /metrics reads, since the server is busy with the
other tool on purpose); a moment later `vllm bench serve` runs N-concurrency requests
(random dataset with a shared prefix of C − 32 tokens and 32 new ones, M outputs,
`ignore_eos`, the plugin's `min_tokens` and `stream_options`). The span compared is the time
when both were at N in flight: the plugin's window ∩ vllm's steady part (from its first N
first tokens to the first end after its last send). Over that span, the same definitions on
each tool's own requests:

- TTFT: median over the requests sent inside the span;
- TBT: median of (t_last − t_first)/(n − 1) over requests whose first and last token fall
  inside the span (vllm's TPOT is this formula);
- tok/s: tokens whose chunk arrived inside the span / its length.

vllm's own reported figures (`median_ttft_ms`, `median_tpot_ms`, `output_throughput`, over
its whole run, every moment of which the plugin was also running) are shown beside them.

Cold prefill (before the rounds; ``--prefill-cells 0`` leaves it out), kept from the sequential
comparison: a prefill cell is one request on a cold cache, so here the tools take turns, each on
a quiet machine. The plugin's figure is the median of ``--prefill-cells`` prefill cells, each in
a fresh run (a new prefix); vllm's is ``median_ttft_ms`` of ``--random-prefix-len 0
--random-input-len C --random-output-len 1 --max-concurrency 1`` (every prompt new). A
measurement during which other processes used more than ``--max-other`` cores is made again
(``--retries``).

    python -m benchmarks.studies.side_by_side_vllm_bench            # c = 1 and 8, 5 rounds each
    python -m benchmarks.studies.side_by_side_vllm_bench --workload same-text

Workloads (``--workload``): ``random`` — each tool its own prompts: the plugin's token ids
(shared prefix + 32 unique ids), vllm's random dataset (a shared prefix of C − 32 random ids and
32 more, decoded to text that the server tokenizes again). ``same-text`` — one workload for both:
the plugin sends text prompts (``--llm-prompt-form=text``: its shared prefix P(C) and unique
suffixes, sized with the server's /tokenize), and vllm sends more prompts of the same run (same
P(C), other suffixes) from a JSONL file, its custom dataset without a chat template. Then the
server does the same work for a request of either tool, and only the clients and the arrival
pattern differ.

Needs ``python scripts/setup_vllm.py`` to have run.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.common import (
    RESULTS,
    ROOT,
    OtherCores,
    RunningVllm,
    VllmBenchError,
    command,
    fmt,
    fmt_pct,
    ratio,
    row,
    running_vllm,
    table,
    utc_now,
    vllm_bench,
    vllm_python,
    vllm_versions,
    wait_quiet,
    write_page,
)
from engines.servers import VllmServer
from pytest_llmspeed.core.bench import Bench, BenchConfig
from pytest_llmspeed.core.prompts import SUFFIX_TOKENS as SUFFIX
from pytest_llmspeed.core.protocol import run_decode
from pytest_llmspeed.core.stats import RequestTrace
from pytest_llmspeed.core.status import cell_status
from pytest_llmspeed.core.wire import request_fields

FIGURES = ("ttft_ms", "tbt_ms", "tok_s")
#: two requests sent within this many seconds of each other share their first engine steps
COMPANY_S = 0.02
LABELS = {
    "ttft_ms": "TTFT median, ms",
    "tbt_ms": "time between tokens, ms",
    "tok_s": "output tok/s",
}


def vllm_traces(result: dict[str, Any]) -> list[RequestTrace]:
    """vllm's requests (its ``--save-detailed`` fields) as the plugin's statistics take them:
    one token per chunk, as vllm's own ITL assumes, the last chunk carrying the rest."""
    traces = []
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
            counts[-1] += n_out - len(times)
        traces.append(RequestTrace(start, start + latency, times, counts, finished=True))
    return traces


def vllm_window(traces: list[RequestTrace], n: int) -> tuple[float, float]:
    """The plugin's window over vllm's run: it opens when the first N requests all have their
    first token and closes when fewer than N are in flight for good (the first request to end
    after the last one was sent)."""
    by_start = sorted(traces, key=lambda t: t.t_send)
    w0 = max(t.token_times[0] for t in by_start[:n])
    last_send = by_start[-1].t_send
    w1 = min(t.t_end for t in by_start if t.t_end > last_send)
    return w0, w1


def co_sent(sends: list[float], within_s: float = COMPANY_S) -> float:
    """Mean number of requests sent within ``within_s`` of each request (itself included):
    how bunched the restarts are, which sets how many prefills share a step."""
    t = np.sort(np.asarray(sends))
    lo = np.searchsorted(t, t - within_s, side="left")
    hi = np.searchsorted(t, t + within_s, side="right")
    return float(np.mean(hi - lo))


def span_figures(
    requests: Sequence[tuple[float, Sequence[float], Sequence[int]]], s0: float, s1: float
) -> dict[str, float | None]:
    """One tool's requests, (t_send, token times, tokens per chunk), over the span [s0, s1)."""
    ttfts, tbts = [], []
    tokens = 0
    for t_send, times, counts in requests:
        if not times:
            continue
        if s0 <= t_send < s1:
            ttfts.append((times[0] - t_send) * 1e3)
        total = sum(counts)
        if total >= 2 and times[0] >= s0 and times[-1] < s1 and times[-1] > times[0]:
            tbts.append((times[-1] - times[0]) / (total - 1) * 1e3)
        tokens += sum(c for t, c in zip(times, counts, strict=True) if s0 <= t < s1)
    return {
        "ttft_ms": float(np.median(ttfts)) if ttfts else None,
        "tbt_ms": float(np.median(tbts)) if tbts else None,
        "tok_s": tokens / (s1 - s0),
        "ttft_n": len(ttfts),
        "tbt_n": len(tbts),
    }


def one_round(
    bench: Bench,
    server: VllmServer,
    work: Path,
    name: str,
    n: int,
    *,
    context: int,
    output_len: int,
    prompts: int,
    plugin_s: float,
    delay_s: float,
    seed: int,
    extra: dict[str, Any],
    dataset: Path | None,
    trust_env: bool = True,
    wire: Wire | None = None,
) -> dict[str, Any]:
    """The plugin's decode cell with a ``vllm bench serve`` run inside it."""
    got: dict[str, Any] = {}

    def vllm() -> None:
        time.sleep(delay_s)
        got["launched"] = time.perf_counter()
        try:
            got["vb"], got["cmd"] = vllm_bench(
                server, work, name, prefix_len=context - SUFFIX, input_len=SUFFIX,
                output_len=output_len, concurrency=n, prompts=prompts, seed=seed,
                extra_body=extra, dataset=dataset, trust_env=trust_env,
            )  # fmt: skip
        except VllmBenchError as exc:  # raised again in this thread, below
            got["error"] = exc

    thread = threading.Thread(target=vllm, daemon=True)
    thread.start()
    assert bench.conn and bench.factory and bench.dialect and bench.server
    cell = run_decode(
        bench.conn, bench.factory, bench.dialect, bench.server.model, context, n,
        output_len, plugin_s, watch_metrics=False,
    )  # fmt: skip
    res = bench.run(cell)
    thread.join()
    if "error" in got:
        raise got["error"]
    status = cell_status(res)  # the pytest layer's rule (watch_metrics off: no counter referee)
    if not status.valid:
        sys.exit(f"plugin decode c={n} {status.status.value}: {status.message}")
    vb = got["vb"]
    traces = vllm_traces(vb)
    vw0, vw1 = vllm_window(traces, n)
    pw0, pw1 = res.window
    s0, s1 = max(vw0, pw0), min(vw1, pw1)
    v_start = min(vb["start_times"])
    v_end = max(a + b for a, b in zip(vb["start_times"], vb["latencies"], strict=True))
    row: dict[str, Any] = {
        "name": name,
        "n": n,
        "span_s": s1 - s0,
        "vllm_run_s": v_end - v_start,
        "vllm_startup_s": v_start - got["launched"],
        "vllm_inside_plugin": pw0 <= v_start and v_end <= pw1,
        "cmd": got["cmd"],
    }
    if s1 - s0 < 1.0:
        row["short"] = True
        return row
    plugin_reqs = [(r.t_send, r.token_times, r.token_counts) for r in res.records]
    vllm_reqs = [(t.t_send, list(t.token_times), list(t.token_counts)) for t in traces]
    row["plugin"] = span_figures(plugin_reqs, s0, s1)
    row["vllm"] = span_figures(vllm_reqs, s0, s1)
    row["plugin_cell"] = {
        "ttft_ms": res.stats.ttft_ms,
        "tbt_ms": res.stats.tbt_ms,
        "tok_s": res.stats.total_tok_s,
    }
    row["vllm_own"] = {
        "ttft_ms": vb["median_ttft_ms"],
        "tbt_ms": vb["median_tpot_ms"],
        "tok_s": vb["output_throughput"],
    }
    row["co_sent"] = {
        "plugin": co_sent([r[0] for r in plugin_reqs]),
        "vllm": co_sent([r[0] for r in vllm_reqs]),
    }
    row["requests"] = arrivals(plugin_reqs, vllm_reqs, s0, s1)
    if wire is not None:
        time.sleep(0.2)  # the sniffer's last lines
        row["wire"] = wire.ttfts(s0, s1)
    p, v = row["plugin"], row["vllm"]
    print(
        f"[side-by-side] {name}: span {s1 - s0:.1f} s; TTFT {p['ttft_ms']:.1f} vs "
        f"{v['ttft_ms']:.1f} ms (vllm's own {vb['median_ttft_ms']:.1f}); TBT {p['tbt_ms']:.3f} vs "
        f"{v['tbt_ms']:.3f} ms (vllm's TPOT {vb['median_tpot_ms']:.3f}); tok/s "
        f"{p['tok_s']:.1f} vs {v['tok_s']:.1f}; co-sent {row['co_sent']['plugin']:.2f} vs "
        f"{row['co_sent']['vllm']:.2f}",
        flush=True,
    )
    return row


def text_dataset(bench: Bench, path: Path, context: int, first: int, count: int) -> Path:
    """``count`` more of the plugin's own text prompts at ``context`` (indices ``first`` …, so
    the same shared prefix P(C) and new suffixes) as vllm's custom dataset (JSONL)."""
    assert bench.factory is not None and bench.factory.text
    factory = bench.factory
    with path.open("w") as fh:
        for i in range(first, first + count):
            prompt = bench.run(factory.prompt(context, i))
            fh.write(json.dumps({"prompt": prompt.body["prompt"]}) + "\n")
    return path


def ensure_pandas() -> None:
    """vllm's custom dataset reads its JSONL with pandas, an optional dependency of vLLM's
    benchmarks that ``scripts/setup_vllm.py`` does not install (the tests do not need it):
    install it into vLLM's own environment the first time ``--workload same-text`` runs."""
    python = str(vllm_python())
    if subprocess.run([python, "-c", "import pandas"], capture_output=True).returncode == 0:
        return
    print("[side-by-side] installing pandas into vLLM's environment (its custom dataset needs it)")
    subprocess.run([python, "-m", "pip", "install", "--progress-bar", "off", "pandas"], check=True)


def arrivals(
    plugin: Sequence[tuple[float, Sequence[float], Sequence[int]]],
    vllm: Sequence[tuple[float, Sequence[float], Sequence[int]]],
    s0: float,
    s1: float,
    within_s: float = COMPANY_S,
) -> dict[str, list[list[float]]]:
    """Each tool's requests sent inside the span as [t_send, TTFT ms, company]: company is how
    many requests of *both* tools (itself included) were sent within ``within_s`` of it, so how
    many new prompts its first step most likely shared the server with."""
    sends = np.sort([t for t, times, _ in [*plugin, *vllm] if times])
    out: dict[str, list[list[float]]] = {}
    for name, reqs in (("plugin", plugin), ("vllm", vllm)):
        rows = []
        for t_send, times, _ in reqs:
            if times and s0 <= t_send < s1:
                lo = np.searchsorted(sends, t_send - within_s, side="left")
                hi = np.searchsorted(sends, t_send + within_s, side="right")
                rows.append([t_send, (times[0] - t_send) * 1e3, int(hi - lo)])
        out[name] = rows
    return out


class Wire:
    """``benchmarks.studies.wire_sniffer`` in a child process (needs root), its events kept in
    order."""

    def __init__(self, port: int) -> None:
        self.events: list[dict[str, Any]] = []
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "benchmarks.studies.wire_sniffer", "--port", str(port)],
            stdout=subprocess.PIPE, text=True, cwd=ROOT,
        )  # fmt: skip
        assert self.proc.stdout is not None
        first = self.proc.stdout.readline()
        if '"ready"' not in first:
            sys.exit("wire_sniffer did not start (it needs root for an AF_PACKET socket)")
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.events.append(json.loads(line))

    def ttfts(self, s0: float, s1: float) -> dict[str, list[float]]:
        """Wire TTFT (ms) of each request whose POST reached the server in [s0, s1), by tool:
        ``vllm`` for requests with an x-request-id header, ``plugin`` for the others."""
        open_: dict[int, tuple[float, bool]] = {}
        out: dict[str, list[float]] = {"plugin": [], "vllm": []}
        for e in list(self.events):
            if e["ev"] == "post":
                open_[e["conn"]] = (e["t"], e["rid"])
            elif e["ev"] == "token" and e["conn"] in open_:
                t_post, rid = open_.pop(e["conn"])
                if s0 <= t_post < s1:
                    out["vllm" if rid else "plugin"].append((e["t"] - t_post) * 1e3)
        return out

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait()


def wire_rows(rows: dict[int, list[dict[str, Any]]]) -> tuple[list[str], list[str]]:
    """Per round: each tool's median TTFT on the wire and as the tool measured it; and per N
    the medians over rounds of each tool's client share and of the stopwatches' ratio."""
    out, summary = [], []
    for n, rs in rows.items():
        shares: dict[str, list[float]] = {"plugin": [], "vllm": []}
        watches = []
        for r in rs:
            w = r.get("wire")
            if not w or "plugin" not in r or not w["plugin"] or not w["vllm"]:
                continue
            pw, vw = float(np.median(w["plugin"])), float(np.median(w["vllm"]))
            pt, vt = r["plugin"]["ttft_ms"], r["vllm"]["ttft_ms"]
            shares["plugin"].append(pt - pw)
            shares["vllm"].append(vt - vw)
            watch = ratio(pt / pw, vt / vw)
            watches.append(watch)
            out.append(
                row(
                    r["name"], f"{len(w['plugin'])} / {len(w['vllm'])}", f"{pw:.1f}",
                    f"{vw:.1f}", fmt_pct(ratio(pw, vw)), f"{pt - pw:+.1f}", f"{vt - vw:+.1f}",
                    fmt_pct(ratio(pt, vt)), fmt_pct(watch),
                )
            )  # fmt: skip
        if watches:
            med = float(np.median([x for x in watches if x is not None]))
            summary.append(
                row(
                    n, f"{np.median(shares['plugin']):+.2f}", f"{np.median(shares['vllm']):+.2f}",
                    fmt_pct(med), "yes" if abs(med) <= 5 else "no",
                )
            )  # fmt: skip
    return out, summary


def company_rows(rows: dict[int, list[dict[str, Any]]]) -> list[str]:
    """TTFT pooled over the rounds, all requests and by company at arrival, both tools."""
    out = []
    for n, rs in rows.items():
        pooled: dict[str, list[list[float]]] = {"plugin": [], "vllm": []}
        for r in rs:
            for tool in pooled:
                pooled[tool] += r.get("requests", {}).get(tool, [])
        if not pooled["plugin"] or not pooled["vllm"]:
            continue
        groups: list[tuple[str, Any]] = [("all", lambda k: True)]
        companies = sorted({int(x[2]) for tool in pooled.values() for x in tool})
        groups += [(str(c), lambda k, c=c: k == c) for c in companies]
        for label, keep in groups:
            p = [x[1] for x in pooled["plugin"] if keep(x[2])]
            v = [x[1] for x in pooled["vllm"] if keep(x[2])]
            if len(p) < 3 or len(v) < 3:
                continue
            pm, vm = float(np.median(p)), float(np.median(v))
            out.append(
                row(n, label, len(p), f"{pm:.1f}", len(v), f"{vm:.1f}", fmt_pct(ratio(pm, vm)))
            )
    return out


def ratio_rows(rows: dict[int, list[dict[str, Any]]], other: str, verdict: bool) -> list[str]:
    """Table rows: plugin ÷ ``other`` − 1 (percent) of each figure in each round, the median,
    and with ``verdict`` whether that median is within 5 %."""
    out = []
    for n, rs in rows.items():
        for f in FIGURES:
            each = [ratio(r["plugin"][f], r[other][f]) for r in rs if "plugin" in r]
            rr = [x for x in each if x is not None]
            med = float(np.median(rr)) if rr else None
            cells = [str(n), LABELS[f], ", ".join(map(fmt_pct, rr)), fmt_pct(med)]
            if verdict:
                cells.append("—" if med is None else ("yes" if abs(med) <= 5 else "no"))
            out.append(row(*cells))
    return out


def prefill_lines(meta: dict[str, Any], pre: dict[str, Any]) -> list[str]:
    """The cold-prefill section: each tool's median and their ratio, every figure after."""
    diff = ratio(pre["plugin_ms"], pre["vllm_ms"])
    within = "—" if diff is None else ("yes" if abs(diff) <= 5 else "no")
    c = pre["context"]
    return [
        "",
        "## Cold prefill (the tools in turn, on a quiet machine)",
        "",
        f"Plugin: {pre['cells']} prefill cells, each in a fresh run (a new prefix, so a cold "
        f"cache; `max_tokens` {min(meta['max_output'], 16)}). vllm: `--random-prefix-len 0 "
        f"--random-input-len {c} --random-output-len 1 --max-concurrency 1 --num-prompts "
        f"{pre['prompts']}`, every prompt new. Each measurement started after other processes "
        f"had used < {pre['max_other']:g} cores for 3 s ({pre['waited_s']:.0f} s waited in "
        f"all); {pre['disturbed']} disturbed measurements were made again.",
        "",
        *table(
            [
                "C",
                f"plugin: median of {pre['cells']} prefill cells, ms",
                "vllm: median_ttft_ms, ms",
                "plugin ÷ vllm − 1",
                "within 5 %",
            ],
            [[c, fmt(pre["plugin_ms"]), fmt(pre["vllm_ms"]), fmt_pct(diff), within]],
            "lrrrl",
        ),
        "",
        f"Plugin cells, ms: {', '.join(fmt(x) for x in pre['plugin_all_ms'])}. vllm's TTFTs "
        f"in order, ms (#0 was also sent before its run as vllm's ready check): "
        f"{', '.join(fmt(x) for x in pre['vllm_all_ms'])}.",
    ]


def render(meta: dict[str, Any], rows: dict[int, list[dict[str, Any]]]) -> list[str]:
    out = [
        "# Plugin and `vllm bench serve` side by side on one real vLLM server",
        "",
        "Written by `benchmarks/studies/side_by_side_vllm_bench.py` (its docstring says how); why "
        "and how it differs from the sequential comparison: `docs/peer-comparison.md`.",
        "",
        f"Command: `{meta['cmd']}` ({meta['elapsed_s'] / 60:.1f} min)",
        "",
        f"Date: {meta['date']}. Machine: {meta['cpus']} cores ({meta['machine']}), loopback. "
        f"Server: vLLM {meta['versions'].get('vllm', '?')} CPU build, the tiny model of "
        f"`scripts/setup_vllm.py`, `--stream-interval 1`; server session priority: "
        f"{meta['priority']}. C = {meta['context']}, M = {meta['max_output']}; vllm's "
        "requests carry the plugin's `min_tokens` and `stream_options`.",
        "",
        "Workload: "
        + (
            "**same-text** — both tools send the plugin's text prompts (one shared prefix "
            "P(C), unique suffixes; the plugin with `--llm-prompt-form=text`, vllm the same "
            "run's other prompts as its custom dataset, no chat template)."
            if meta.get("workload") == "same-text"
            else "**random** — the plugin sends its token-id prompts, vllm its random dataset "
            "(text, re-tokenized by the server)."
        )
        + (
            " vllm ran with its aiohttp session **not trusting the environment** "
            "(`--vllm-trust-env off`, a diagnostic: as shipped, aiohttp looks up proxy "
            "variables and netrc for every request, inside vllm's TTFT)."
            if meta.get("vllm_trust_env") == "off"
            else ""
        ),
        "",
        "## Agreement (median over rounds of plugin ÷ vllm − 1, same definitions, same span)",
        "",
        *table(["N", "figure", "each round", "median", "within 5 %"], [], "lllrl"),
    ]
    out += ratio_rows(rows, "vllm", verdict=True)
    out += [
        "",
        "## Against vllm's own report (its whole run, all of it beside the plugin)",
        "",
        *table(
            [
                "N",
                "figure",
                "plugin over the span ÷ vllm's reported figure − 1, each round",
                "median",
            ],
            [],
            "lllr",
        ),
    ]
    out += ratio_rows(rows, "vllm_own", verdict=False)
    wired, wire_summary = wire_rows(rows)
    if wired:
        out += [
            "",
            "## TTFT on the wire (`--wire`)",
            "",
            "`benchmarks/studies/wire_sniffer.py` stamped, in the kernel, when each request's "
            "first segment reached the server's port and when the first segment with output text "
            "left it; medians over the requests sent inside the span. *Wire*: the server's "
            "share of TTFT, the same stopwatch for both tools. *Client share*: the tool's own "
            "median TTFT − its wire median (what its client adds before the request reaches "
            "the socket and after the chunk does).",
            "",
            "*Stopwatches*: (plugin TTFT ÷ its wire TTFT) ÷ (vllm TTFT ÷ its wire TTFT) − 1, "
            "how far the two tools' TTFT clocks differ on requests the server treated alike.",
            "",
            *table(
                [
                    "N",
                    "plugin client share, ms (median of rounds)",
                    "vllm client share, ms",
                    "stopwatches, median of rounds",
                    "within 5 %",
                ],
                [],
                "lrrrl",
            ),
            *wire_summary,
            "",
            *table(
                [
                    "round",
                    "requests on the wire, plugin / vllm",
                    "plugin wire TTFT, ms",
                    "vllm wire TTFT, ms",
                    "wire: plugin ÷ vllm − 1",
                    "plugin client share, ms",
                    "vllm client share, ms",
                    "tools: plugin ÷ vllm − 1",
                    "stopwatches",
                ],
                [],
                "llrrrrrrr",
            ),
            *wired,
        ]
    out += [
        "",
        "## TTFT pooled over the rounds, by company at arrival",
        "",
        "Every request sent inside a round's span, all rounds together. *Company*: how many "
        f"requests of both tools (itself included) were sent within {COMPANY_S * 1e3:.0f} ms "
        "of it, so how many new prompts shared its first steps: requests in the same company "
        "met the same server work, whichever tool sent them.",
        "",
        *table(
            [
                "N",
                "company",
                "plugin requests",
                "plugin median TTFT, ms",
                "vllm requests",
                "vllm median TTFT, ms",
                "plugin ÷ vllm − 1",
            ],
            [],
            "llrrrrr",
        ),
    ]
    out += company_rows(rows)
    if meta.get("prefill"):
        out += prefill_lines(meta, meta["prefill"])
    out += [
        "",
        "## Every round",
        "",
        *table(
            [
                "round",
                "span s",
                "vllm run s",
                "inside plugin's window",
                "plugin TTFT / TBT / tok/s",
                "vllm (same definitions)",
                "vllm's own report",
                "requests sent with all N − 1 others, plugin / vllm",
            ],
            [],
            "lrrlllll",
        ),
    ]

    def trio(d: dict[str, Any]) -> str:
        return f"{fmt(d['ttft_ms'])} / {fmt(d['tbt_ms'], 3)} / {fmt(d['tok_s'])}"

    for rs in rows.values():
        for r in rs:
            first = [r["name"], f"{r['span_s']:.1f}", f"{r['vllm_run_s']:.1f}"]
            if "plugin" not in r:
                out.append(row(*first, r["vllm_inside_plugin"], "span too short", "", "", ""))
                continue
            out.append(
                row(
                    *first, r["vllm_inside_plugin"], trio(r["plugin"]), trio(r["vllm"]),
                    trio(r["vllm_own"]),
                    f"{r['co_sent']['plugin']:.2f} / {r['co_sent']['vllm']:.2f}",
                )
            )  # fmt: skip
    last = "vllm command (last round):" if any(rows.values()) else "vllm command:"
    out += ["", last, "", "    " + shlex.join(meta["vllm_cmd"]), ""]
    return out


def results_page(workload: str | None, trust_env: str | None) -> Path:
    """The default results page of a run with these options (older runs saved neither)."""
    suffix = "_same_text" if workload == "same-text" else ""
    suffix += "_no_trust_env" if trust_env == "off" else ""
    return RESULTS / f"vllm_bench_side_by_side{suffix}.md"


def cold_prefill(
    vllm: RunningVllm, cfg: BenchConfig, work: Path, args: argparse.Namespace
) -> dict[str, Any]:
    """The tools in turn on a cold cache at C (module docstring): vllm's run of new prompts
    first (its ready check absorbs the server's first large request), then the plugin's
    prefill cells, each in a fresh run."""
    server, c = vllm.server, args.context
    pids = vllm.pids()
    waited, disturbed = 0.0, 0

    def quiet() -> None:
        nonlocal waited
        waited += wait_quiet(args.quiet_wait, args.max_other, pids, tag="side-by-side")

    for attempt in range(args.retries + 1):
        quiet()
        name = "prefill" + (f"-a{attempt + 1}" if attempt else "")
        with OtherCores(pids) as load:
            vb, cmd = vllm_bench(
                server, work, name, prefix_len=0, input_len=c, output_len=1, concurrency=1,
                prompts=args.prefill_prompts, seed=1000 + attempt,
            )  # fmt: skip
        if load.cores is not None and load.cores <= args.max_other:
            break
        disturbed += 1
    plugin: list[float] = []
    for _ in range(args.prefill_cells):
        for _attempt in range(args.retries + 1):
            quiet()
            bench = Bench(cfg)  # a fresh run: a new salt, so a new, uncached prefix
            bench.start()
            try:
                with OtherCores(pids) as load:
                    ttft = bench.prefill(c, min(args.max_output, 16)).ttft_ms
            finally:
                bench.close()
            if load.cores is not None and load.cores <= args.max_other:
                break
            disturbed += 1
        plugin.append(ttft)
    pre = {
        "context": c,
        "prompts": args.prefill_prompts,
        "cells": args.prefill_cells,
        "plugin_ms": float(np.median(plugin)),
        "plugin_all_ms": plugin,
        "vllm_ms": vb["median_ttft_ms"],
        "vllm_all_ms": [x * 1e3 for x in vb["ttfts"]],
        "max_other": args.max_other,
        "waited_s": waited,
        "disturbed": disturbed,
        "cmd": cmd,
    }
    print(
        f"[side-by-side] cold prefill: plugin {pre['plugin_ms']:.1f} ms (cells "
        f"{[round(x, 1) for x in plugin]}), vllm median {pre['vllm_ms']:.1f} ms",
        flush=True,
    )
    return pre


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--context", type=int, default=1024, help="C, prompt tokens")
    ap.add_argument("--max-output", type=int, default=256, help="M, output tokens")
    ap.add_argument("--concurrency", default="1,8", help="N values, comma-separated")
    ap.add_argument("--rounds", type=int, default=5, help="rounds per N")
    ap.add_argument("--vllm-seconds", type=float, default=12.0, help="target vllm run length")
    ap.add_argument("--delay", type=float, default=2.0, help="s between the two tools' starts")
    ap.add_argument(
        "--server-nice", type=int, default=10,
        help="autogroup nice of the server's session (0: leave it); see "
        "common.set_server_priority",
    )  # fmt: skip
    ap.add_argument(
        "--prefill-cells", type=int, default=5,
        help="plugin prefill cells (fresh runs) of the cold-prefill comparison (0: none)",
    )  # fmt: skip
    ap.add_argument(
        "--prefill-prompts", type=int, default=9, help="vllm's prompts for the cold prefill"
    )
    ap.add_argument(
        "--max-other", type=float, default=0.2,
        help="cold prefill: cores other processes may use during a measurement before it is "
        "made again",
    )  # fmt: skip
    ap.add_argument("--retries", type=int, default=2, help="cold prefill: remeasurements")
    ap.add_argument(
        "--quiet-wait", type=float, default=300.0,
        help="cold prefill: wait at most this long (s) for a quiet machine before each "
        "measurement",
    )  # fmt: skip
    ap.add_argument("--out", type=Path, default=None, help="the results page (Markdown)")
    ap.add_argument("--work-dir", type=Path, default=None, help="keep logs and JSON here")
    ap.add_argument(
        "--workload", choices=("random", "same-text"), default="random",
        help="random: each tool its own prompts; same-text: both send the plugin's text "
        "prompts (module docstring)",
    )  # fmt: skip
    ap.add_argument(
        "--wire", action="store_true",
        help="also stamp requests and first tokens on the wire "
        "(benchmarks/studies/wire_sniffer.py; root)",
    )  # fmt: skip
    ap.add_argument(
        "--vllm-trust-env", choices=("on", "off"), default="on",
        help="off: vllm's aiohttp session does not trust the environment (a diagnostic: "
        "with it on, aiohttp looks up proxies and netrc per request inside vllm's TTFT)",
    )  # fmt: skip
    ap.add_argument(
        "--render", type=Path, default=None, metavar="JSON",
        help="only write the results page again from a saved side_by_side.json",
    )  # fmt: skip
    args = ap.parse_args()
    if args.render is not None:
        saved = json.loads(args.render.read_text())
        rows_saved = {int(k): v for k, v in saved["rows"].items()}
        meta = saved["meta"]
        out = args.out or results_page(meta.get("workload"), meta.get("vllm_trust_env"))
        write_page(out, render(meta, rows_saved), "side-by-side")
        return
    if args.out is None:
        args.out = results_page(args.workload, args.vllm_trust_env)
    try:
        run(args)
    except VllmBenchError as exc:
        sys.exit(str(exc))


def rounds(
    args: argparse.Namespace,
    server: VllmServer,
    cfg: BenchConfig,
    work: Path,
    rows: dict[int, list[dict[str, Any]]],
    wire: Wire | None,
) -> list[str] | None:
    """Every round of every N, into ``rows``; the last round's vllm command (None: no round)."""
    c, m = args.context, args.max_output
    ns = list(rows)
    bench = Bench(cfg)
    bench.start()
    bench.prefill(c, 16)  # warms the plugin's shared prefix P(C)
    assert bench.dialect is not None
    fields = request_fields(server.model, m, bench.dialect)
    extra = {k: v for k, v in fields.items() if k in ("min_tokens", "stream_options")}
    seed = 2000
    cmd = None
    # vllm's run length per prompt, learnt from each round, sizes the next one
    per_prompt_s: dict[int, float] = {}
    startup_s = 20.0  # vllm's CLI imports torch before its first request; learnt below
    for rnd in range(args.rounds):
        for n in ns if rnd % 2 == 0 else ns[::-1]:
            seed += 1
            guess = per_prompt_s.get(n, 1.0 if n == 1 else 0.3)
            prompts = max(2 * n, round(args.vllm_seconds / guess))
            prompts = (prompts + n - 1) // n * n
            # the plugin's window must outlast vllm's run: vllm starts `delay` s in, takes
            # `startup_s` to import, then sends one readiness request and its prompts
            plugin_s = args.delay + startup_s + 1.5 * prompts * guess + 4.0
            name = f"c{n}-r{rnd + 1}"
            dataset = None
            if args.workload == "same-text":
                # + 1: vllm sends its first prompt once more as a readiness check
                dataset = work / f"{name}.jsonl"
                text_dataset(bench, dataset, c, seed * 1000, prompts + 1)
            result = one_round(
                bench, server, work, name, n, context=c, output_len=m,
                prompts=prompts, plugin_s=plugin_s, delay_s=args.delay, seed=seed,
                extra=extra, dataset=dataset, trust_env=args.vllm_trust_env == "on",
                wire=wire,
            )  # fmt: skip
            per_prompt_s[n] = result["vllm_run_s"] / prompts
            startup_s = result["vllm_startup_s"] + 2.0
            rows[n].append(result)
            cmd = result["cmd"]
    bench.close()
    return cmd


def run(args: argparse.Namespace) -> None:
    """Start the server, measure, write the JSON and the results page."""
    ns = [int(x) for x in args.concurrency.split(",")]
    c, m = args.context, args.max_output
    if args.workload == "same-text":
        ensure_pandas()
    work = args.work_dir or Path(tempfile.mkdtemp(prefix="llmspeed-side-by-side-"))
    work.mkdir(parents=True, exist_ok=True)
    print(f"[side-by-side] logs and JSON under {work}", flush=True)
    t_start = time.monotonic()
    rows: dict[int, list[dict[str, Any]]] = {n: [] for n in ns}
    prefill = None
    with running_vllm(work, nice=args.server_nice) as vllm:
        server = vllm.server
        cfg = BenchConfig(
            base_url=server.url, api_key=None, model=server.model, api="completions",
            max_output=m, duration=1.0, timeout=300.0, kv_capacity=None,
            text_prompts=args.workload == "same-text",
        )  # fmt: skip
        if args.prefill_cells > 0:
            prefill = cold_prefill(vllm, cfg, work, args)
        vllm_cmd = prefill["cmd"] if prefill else []
        wire = Wire(int(server.url.rsplit(":", 1)[1])) if args.wire else None
        try:
            vllm_cmd = rounds(args, server, cfg, work, rows, wire) or vllm_cmd
        finally:
            if wire is not None:
                wire.stop()
    meta = {
        "cmd": command("benchmarks.studies.side_by_side_vllm_bench"),
        "elapsed_s": time.monotonic() - t_start,
        "date": utc_now(),
        "cpus": os.cpu_count(),
        "machine": platform.machine(),
        "versions": vllm_versions(),
        "priority": vllm.priority,
        "context": c,
        "max_output": m,
        "workload": args.workload,
        "vllm_trust_env": args.vllm_trust_env,
        "vllm_cmd": vllm_cmd,
        "prefill": prefill,
    }
    (work / "side_by_side.json").write_text(
        json.dumps({"meta": meta, "rows": rows}, indent=1, default=str)
    )
    md = render(meta, rows)
    print("\n".join(md))
    write_page(args.out, md, "side-by-side")
    print(f"[side-by-side] {meta['elapsed_s'] / 60:.1f} min")


if __name__ == "__main__":
    main()
