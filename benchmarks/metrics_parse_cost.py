"""What one /metrics sample costs the client: vLLM's whole text parsed with prometheus_client
against only the families a decode cell's snapshot reads (``probe.SNAPSHOT_FAMILIES``).

Starts the real vLLM of ``scripts/setup_vllm.py`` (tiny offline model, ``engines.servers``)
on a free loopback port, sends one request so the counters move, reads /metrics once and times
both parses.

    python -m benchmarks.metrics_parse_cost

Measured 2026-11-30 (2 cores): 51,894 bytes, 629 lines; full parse 14.1–19.1 ms of CPU, filtered
0.62 ms; the same snapshot (docs/peer-comparison.md).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from benchmarks.common import running_vllm, table
from benchmarks.harness import Figure, Outcome, cli
from engines.home import Layout, vllm_home
from engines.servers import NOT_SET_UP
from pytest_llmspeed.core.probe import SNAPSHOT_FAMILIES, parse_metrics, snapshot


def measure(argv: list[str]) -> Outcome:
    """Both parses of one real /metrics sample; skipped when real vLLM is not set up."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work-dir", type=Path, default=None, help="keep the server's log here")
    args = ap.parse_args(argv)
    if not Layout(vllm_home()).installed():
        return Outcome(skipped=NOT_SET_UP, settings={"work_dir": args.work_dir})
    work = args.work_dir or Path(tempfile.mkdtemp(prefix="llmspeed-metrics-"))
    work.mkdir(parents=True, exist_ok=True)
    with running_vllm(work) as vllm:
        url, model = vllm.server.url, vllm.server.model
        body = json.dumps({"model": model, "prompt": [5] * 100, "max_tokens": 20}).encode()
        req = urllib.request.Request(
            f"{url}/v1/completions", body, {"Content-Type": "application/json"}
        )
        urllib.request.urlopen(req, timeout=60).read()
        text = urllib.request.urlopen(f"{url}/metrics", timeout=60).read().decode()
    figures = {
        "bytes": Figure(len(text), "bytes"),
        "lines": Figure(text.count(chr(10)), "lines"),
    }
    for label, families, rounds in (("full", None, 20), ("filtered", SNAPSHOT_FAMILIES, 200)):
        c0 = time.process_time()
        for _ in range(rounds):
            parse_metrics(text, families)
        figures[f"{label}_parse_ms"] = Figure(
            round((time.process_time() - c0) / rounds * 1e3, 3), "ms", digits=2
        )
    same = snapshot(parse_metrics(text)) == snapshot(parse_metrics(text, SNAPSHOT_FAMILIES))
    figures["same_snapshot"] = Figure(same, target="True", met=same)
    page = [
        "# One /metrics sample of real vLLM: parsed whole and filtered",
        "",
        "`benchmarks/metrics_parse_cost.py` (its docstring says how); CPU time per parse.",
        "",
        *table(["figure", "value"], [[k, f.text] for k, f in figures.items()], "lr"),
    ]
    return Outcome(figures, page, {"work_dir": str(work)})


def main() -> None:
    sys.exit(cli("metrics_parse_cost", measure))


if __name__ == "__main__":
    main()
