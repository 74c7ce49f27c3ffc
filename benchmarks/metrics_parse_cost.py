"""What one /metrics sample costs the client: vLLM's whole text parsed with prometheus_client
against only the families a decode cell's snapshot reads (``probe.SNAPSHOT_FAMILIES``).

Starts the real vLLM of ``scripts/setup_vllm.py`` (tiny offline model) on a free loopback port,
sends one request so the counters move, reads /metrics once and times both parses.

    python benchmarks/metrics_parse_cost.py

Measured 2026-11-30 (2 cores): 51,894 bytes, 629 lines; full parse 14.1–19.1 ms of CPU, filtered
0.62 ms; the same snapshot (docs/peer-comparison.md).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "src"), str(ROOT)]

from pytest_llmspeed.core.probe import SNAPSHOT_FAMILIES, parse_metrics, snapshot  # noqa: E402
from tests.vllm_server import offline_env, vllm_home  # noqa: E402


def main() -> None:
    home = vllm_home()
    python, model = home / "venv" / "bin" / "python", home / "model"
    if not python.exists() or not model.exists():
        sys.exit("real vLLM is not set up: run `python scripts/setup_vllm.py`")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    cmd = [
        str(python), "-m", "vllm.entrypoints.openai.api_server", "--model", str(model),
        "--served-model-name", "tiny", "--host", "127.0.0.1", "--port", str(port),
        "--max-model-len", "20480", "--kv-cache-memory-bytes", str(128 << 20),
        "--disable-uvicorn-access-log",
    ]  # fmt: skip
    env = offline_env(dict(os.environ))
    with open(os.devnull, "wb") as sink:
        proc = subprocess.Popen(cmd, env=env, stdout=sink, stderr=sink, start_new_session=True)
    try:
        for _ in range(240):
            try:
                urllib.request.urlopen(f"{url}/health", timeout=2)
                break
            except OSError:
                if proc.poll() is not None:
                    sys.exit(f"vLLM exited with code {proc.returncode}")
                time.sleep(1)
        body = json.dumps({"model": "tiny", "prompt": [5] * 100, "max_tokens": 20}).encode()
        req = urllib.request.Request(
            f"{url}/v1/completions", body, {"Content-Type": "application/json"}
        )
        urllib.request.urlopen(req, timeout=60).read()
        text = urllib.request.urlopen(f"{url}/metrics", timeout=60).read().decode()
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait()
    print(f"/metrics: {len(text):,} bytes, {text.count(chr(10))} lines")
    for label, families, rounds in (("full", None, 20), ("filtered", SNAPSHOT_FAMILIES, 200)):
        c0 = time.process_time()
        for _ in range(rounds):
            parse_metrics(text, families)
        print(f"{label} parse: {(time.process_time() - c0) / rounds * 1e3:.2f} ms of CPU each")
    same = snapshot(parse_metrics(text)) == snapshot(parse_metrics(text, SNAPSHOT_FAMILIES))
    print(f"same snapshot: {same}")


if __name__ == "__main__":
    main()
