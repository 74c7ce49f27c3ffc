"""The plugin and `vllm bench serve` on one real vLLM server at the same time.

Why: `compare_vllm_bench.py` runs the two tools one after the other. On a 2-core machine
the CPU server's own speed moved by up to 20 % between two back-to-back runs (its own
histograms say so), so a 5 % agreement between tools cannot be read from sequential runs.
Here both tools drive the server at once, each with N streams in flight: their requests
share the engine's steps, so whatever the server does, it does to both. What is left between
the two tools' figures is the tools (client, timing, definitions) and the shape of their
arrivals.

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

    python benchmarks/side_by_side_vllm_bench.py            # c = 1 and 8, 5 rounds each
    python benchmarks/side_by_side_vllm_bench.py --workload same-text

Workloads (``--workload``): ``random`` — each tool its own prompts: the plugin's token ids
(shared prefix + 32 unique ids), vllm's random dataset (a shared prefix of C − 32 random ids and
32 more, decoded to text that the server tokenizes again). ``same-text`` — one workload for both:
the plugin sends text prompts (``--llm-prompt-form=text``: its shared prefix P(C) and unique
suffixes, sized with the server's /tokenize), and vllm sends more prompts of the same run (same
P(C), other suffixes) from a JSONL file, its custom dataset without a chat template. Then the
server does the same work for a request of either tool, and only the clients and the arrival
pattern differ.
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib.util
import json
import os
import platform
import shlex
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location(
    "compare_vllm_bench", ROOT / "benchmarks" / "compare_vllm_bench.py"
)
assert _spec is not None and _spec.loader is not None
cmp = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = cmp
_spec.loader.exec_module(cmp)

from pytest_llmspeed.core.bench import Bench, BenchConfig  # noqa: E402
from pytest_llmspeed.core.protocol import request_fields, run_decode  # noqa: E402
from tests.vllm_server import _Servers, vllm_home  # noqa: E402

FIGURES = ("ttft_ms", "tbt_ms", "tok_s")
#: two requests sent within this many seconds of each other share their first engine steps
COMPANY_S = 0.02
LABELS = {
    "ttft_ms": "TTFT median, ms",
    "tbt_ms": "time between tokens, ms",
    "tok_s": "output tok/s",
}


def span_figures(
    requests: list[tuple[float, list[float], list[int]]], s0: float, s1: float
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
    server: Any,
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
            got["vb"], got["cmd"] = cmp.vllm_bench(
                server, work, name, prefix_len=context - cmp.SUFFIX, input_len=cmp.SUFFIX,
                output_len=output_len, concurrency=n, prompts=prompts, seed=seed,
                extra_body=extra, dataset=dataset, trust_env=trust_env,
            )  # fmt: skip
        except SystemExit as exc:  # vllm_bench exits with its log's tail
            got["error"] = str(exc)

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
        sys.exit(got["error"])
    if res.aborted:
        sys.exit(f"plugin decode c={n} aborted: {res.aborted}")
    vb = got["vb"]
    traces, _ = cmp.vllm_traces(vb)
    vw0, vw1 = cmp.vllm_window(traces, n)
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
        "plugin": cmp.co_sent([r[0] for r in plugin_reqs]),
        "vllm": cmp.co_sent([r[0] for r in vllm_reqs]),
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
    python = str(vllm_home() / "venv" / "bin" / "python")
    if subprocess.run([python, "-c", "import pandas"], capture_output=True).returncode == 0:
        return
    print("[side-by-side] installing pandas into vLLM's environment (its custom dataset needs it)")
    subprocess.run([python, "-m", "pip", "install", "--progress-bar", "off", "pandas"], check=True)


def arrivals(
    plugin: list[tuple[float, list[float], list[int]]],
    vllm: list[tuple[float, list[float], list[int]]],
    s0: float,
    s1: float,
    within_s: float = COMPANY_S,
) -> dict[str, list[list[float]]]:
    """Each tool's requests sent inside the span as [t_send, TTFT ms, company]: company is how
    many requests of *both* tools (itself included) were sent within ``within_s`` of it, so how
    many new prompts its first step most likely shared the server with."""
    sends = np.sort([t for t, times, _ in plugin + vllm if times])
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
    """benchmarks/wire_sniffer.py in a child process (needs root), its events kept in order."""

    def __init__(self, port: int) -> None:
        self.events: list[dict[str, Any]] = []
        self.proc = subprocess.Popen(
            [sys.executable, str(ROOT / "benchmarks" / "wire_sniffer.py"), "--port", str(port)],
            stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        assert self.proc.stdout is not None
        first = self.proc.stdout.readline()
        if '"ready"' not in first:
            sys.exit("wire_sniffer.py did not start (it needs root for an AF_PACKET socket)")
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
                f"| {r['name']} | {len(w['plugin'])} / {len(w['vllm'])} | {pw:.1f} | {vw:.1f} | "
                f"{cmp.fmt_pct(ratio(pw, vw))} | {pt - pw:+.1f} | {vt - vw:+.1f} | "
                f"{cmp.fmt_pct(ratio(pt, vt))} | {cmp.fmt_pct(watch)} |"
            )
        if watches:
            med = float(np.median([x for x in watches if x is not None]))
            summary.append(
                f"| {n} | {np.median(shares['plugin']):+.2f} | {np.median(shares['vllm']):+.2f} "
                f"| {cmp.fmt_pct(med)} | {'yes' if abs(med) <= 5 else 'no'} |"
            )
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
                f"| {n} | {label} | {len(p)} | {pm:.1f} | {len(v)} | {vm:.1f} | "
                f"{cmp.fmt_pct(ratio(pm, vm))} |"
            )
    return out


def ratio(a: float | None, b: float | None) -> float | None:
    """a ÷ b − 1 in percent."""
    return None if a is None or b is None or b == 0 else (a / b - 1) * 100


def ratio_rows(rows: dict[int, list[dict[str, Any]]], other: str, verdict: bool) -> list[str]:
    """Table rows: plugin ÷ ``other`` − 1 (percent) of each figure in each round, the median,
    and with ``verdict`` whether that median is within 5 %."""
    out = []
    for n, rs in rows.items():
        for f in FIGURES:
            rr = [ratio(r["plugin"][f], r[other][f]) for r in rs if "plugin" in r]
            rr = [x for x in rr if x is not None]
            med = float(np.median(rr)) if rr else None
            cells = [str(n), LABELS[f], ", ".join(map(cmp.fmt_pct, rr)), cmp.fmt_pct(med)]
            if verdict:
                cells.append("—" if med is None else ("yes" if abs(med) <= 5 else "no"))
            out.append("| " + " | ".join(cells) + " |")
    return out


def render(meta: dict[str, Any], rows: dict[int, list[dict[str, Any]]]) -> list[str]:
    out = [
        "# Plugin and `vllm bench serve` side by side on one real vLLM server",
        "",
        "Written by `benchmarks/side_by_side_vllm_bench.py` (its docstring says how); why "
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
        "| N | figure | each round | median | within 5 % |",
        "| --- | --- | --- | ---: | --- |",
    ]
    out += ratio_rows(rows, "vllm", verdict=True)
    out += [
        "",
        "## Against vllm's own report (its whole run, all of it beside the plugin)",
        "",
        "| N | figure | plugin over the span ÷ vllm's reported figure − 1, each round | median |",
        "| --- | --- | --- | ---: |",
    ]
    out += ratio_rows(rows, "vllm_own", verdict=False)
    wired, wire_summary = wire_rows(rows)
    if wired:
        out += [
            "",
            "## TTFT on the wire (`--wire`)",
            "",
            "`benchmarks/wire_sniffer.py` stamped, in the kernel, when each request's first "
            "segment reached the server's port and when the first segment with output text "
            "left it; medians over the requests sent inside the span. *Wire*: the server's "
            "share of TTFT, the same stopwatch for both tools. *Client share*: the tool's own "
            "median TTFT − its wire median (what its client adds before the request reaches "
            "the socket and after the chunk does).",
            "",
            "*Stopwatches*: (plugin TTFT ÷ its wire TTFT) ÷ (vllm TTFT ÷ its wire TTFT) − 1, "
            "how far the two tools' TTFT clocks differ on requests the server treated alike.",
            "",
            "| N | plugin client share, ms (median of rounds) | vllm client share, ms | "
            "stopwatches, median of rounds | within 5 % |",
            "| --- | ---: | ---: | ---: | --- |",
            *wire_summary,
            "",
            "| round | requests on the wire, plugin / vllm | plugin wire TTFT, ms | vllm wire "
            "TTFT, ms | wire: plugin ÷ vllm − 1 | plugin client share, ms | vllm client "
            "share, ms | tools: plugin ÷ vllm − 1 | stopwatches |",
            "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
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
        "| N | company | plugin requests | plugin median TTFT, ms | vllm requests | "
        "vllm median TTFT, ms | plugin ÷ vllm − 1 |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    out += company_rows(rows)
    out += [
        "",
        "## Every round",
        "",
        "| round | span s | vllm run s | inside plugin's window | plugin TTFT / TBT / tok/s | "
        "vllm (same definitions) | vllm's own report | requests sent with all N − 1 others, "
        "plugin / vllm |",
        "| --- | ---: | ---: | --- | --- | --- | --- | --- |",
    ]
    for rs in rows.values():
        for r in rs:
            if "plugin" not in r:
                out.append(f"| {r['name']} | {r['span_s']:.1f} | {r['vllm_run_s']:.1f} | "
                           f"{r['vllm_inside_plugin']} | span too short | | | |")  # fmt: skip
                continue

            def trio(d: dict[str, Any]) -> str:
                f = cmp.fmt
                return f"{f(d['ttft_ms'])} / {f(d['tbt_ms'], 3)} / {f(d['tok_s'])}"

            out.append(
                f"| {r['name']} | {r['span_s']:.1f} | {r['vllm_run_s']:.1f} | "
                f"{r['vllm_inside_plugin']} | {trio(r['plugin'])} | {trio(r['vllm'])} | "
                f"{trio(r['vllm_own'])} | {r['co_sent']['plugin']:.2f} / "
                f"{r['co_sent']['vllm']:.2f} |"
            )
    out += ["", "vllm command (last round):", "", "    " + shlex.join(meta["vllm_cmd"]), ""]
    return out


def results_page(workload: str | None, trust_env: str | None) -> Path:
    """The default results page of a run with these options (older runs saved neither)."""
    suffix = "_same_text" if workload == "same-text" else ""
    suffix += "_no_trust_env" if trust_env == "off" else ""
    return ROOT / f"benchmarks/results/vllm_bench_side_by_side{suffix}.md"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--context", type=int, default=1024, help="C, prompt tokens")
    ap.add_argument("--max-output", type=int, default=256, help="M, output tokens")
    ap.add_argument("--concurrency", default="1,8", help="N values, comma-separated")
    ap.add_argument("--rounds", type=int, default=5, help="rounds per N")
    ap.add_argument("--vllm-seconds", type=float, default=12.0, help="target vllm run length")
    ap.add_argument("--delay", type=float, default=2.0, help="s between the two tools' starts")
    ap.add_argument("--server-nice", type=int, default=10, help="as compare_vllm_bench.py")
    ap.add_argument("--out", type=Path, default=None, help="the results page (Markdown)")
    ap.add_argument("--work-dir", type=Path, default=None, help="keep logs and JSON here")
    ap.add_argument(
        "--workload", choices=("random", "same-text"), default="random",
        help="random: each tool its own prompts; same-text: both send the plugin's text "
        "prompts (module docstring)",
    )  # fmt: skip
    ap.add_argument(
        "--wire", action="store_true",
        help="also stamp requests and first tokens on the wire (benchmarks/wire_sniffer.py; "
        "root)",
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
        md = render(saved["meta"], rows_saved)
        meta = saved["meta"]
        out = args.out or results_page(meta.get("workload"), meta.get("vllm_trust_env"))
        out.write_text("\n".join(md))
        print(f"[side-by-side] wrote {out}")
        return
    if args.out is None:
        args.out = results_page(args.workload, args.vllm_trust_env)
    ns = [int(x) for x in args.concurrency.split(",")]
    c, m = args.context, args.max_output
    if args.workload == "same-text":
        ensure_pandas()
    work = args.work_dir or Path(tempfile.mkdtemp(prefix="llmspeed-side-by-side-"))
    work.mkdir(parents=True, exist_ok=True)
    print(f"[side-by-side] logs and JSON under {work}", flush=True)
    t_start = time.monotonic()
    servers = _Servers(work)
    rows: dict[int, list[dict[str, Any]]] = {n: [] for n in ns}
    wire: Wire | None = None
    try:
        server = servers(stream_interval=1)
        priority = cmp.set_server_priority(servers, args.server_nice)
        cfg = BenchConfig(
            base_url=server.url, api_key=None, model=server.model, api="completions",
            max_output=m, duration=1.0, timeout=300.0, kv_capacity=None,
            text_prompts=args.workload == "same-text",
        )  # fmt: skip
        wire = Wire(int(server.url.rsplit(":", 1)[1])) if args.wire else None
        bench = Bench(cfg)
        bench.start()
        bench.prefill(c, 16)  # warms the plugin's shared prefix P(C)
        assert bench.dialect is not None
        fields = request_fields(server.model, m, bench.dialect)
        extra = {k: v for k, v in fields.items() if k in ("min_tokens", "stream_options")}
        seed = 2000
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
                row = one_round(
                    bench, server, work, name, n, context=c, output_len=m,
                    prompts=prompts, plugin_s=plugin_s, delay_s=args.delay, seed=seed,
                    extra=extra, dataset=dataset, trust_env=args.vllm_trust_env == "on",
                    wire=wire,
                )  # fmt: skip
                per_prompt_s[n] = row["vllm_run_s"] / prompts
                startup_s = row["vllm_startup_s"] + 2.0
                rows[n].append(row)
        bench.close()
    finally:
        if wire is not None:
            wire.stop()
        servers.stop_all()
    versions = json.loads((vllm_home() / "setup.json").read_text())["versions"]
    meta = {
        "cmd": "python "
        + " ".join(shlex.quote(a) for a in [os.path.relpath(__file__, ROOT), *sys.argv[1:]]),
        "elapsed_s": time.monotonic() - t_start,
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "cpus": os.cpu_count(),
        "machine": platform.machine(),
        "versions": versions,
        "priority": priority,
        "context": c,
        "max_output": m,
        "workload": args.workload,
        "vllm_trust_env": args.vllm_trust_env,
        "vllm_cmd": rows[ns[-1]][-1]["cmd"],
    }
    (work / "side_by_side.json").write_text(
        json.dumps({"meta": meta, "rows": rows}, indent=1, default=str)
    )
    md = render(meta, rows)
    print("\n".join(md))
    args.out.write_text("\n".join(md))
    print(f"[side-by-side] wrote {args.out} ({meta['elapsed_s'] / 60:.1f} min)")


if __name__ == "__main__":
    main()
