"""``python -m pytest_llmspeed.sim``: start, serve, stop cleanly on SIGTERM / SIGINT; bad args."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

SRC = str(Path(__file__).resolve().parents[2] / "src")


def _env() -> dict[str, str]:
    return dict(os.environ, PYTHONPATH=os.pathsep.join([SRC, os.environ.get("PYTHONPATH", "")]))


def _start(*args: str) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "pytest_llmspeed.sim", "--port", "0", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_env(),
    )
    assert proc.stdout is not None and proc.stderr is not None
    line = proc.stdout.readline()
    match = re.search(r"listening on (http://127\.0\.0\.1:\d+)", line)
    assert match, (line, proc.stderr.read() if proc.poll() is not None else "")
    return proc, match.group(1)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_cli_serves_and_stops_cleanly(sig: signal.Signals) -> None:
    proc, url = _start("--profile", "tiny", "--speed", "50", "--seed", "3")
    try:
        with urllib.request.urlopen(url + "/health", timeout=5) as resp:
            assert resp.status == 200
        req = urllib.request.Request(
            url + "/v1/completions",
            method="POST",
            data=json.dumps({"prompt": [400, 401], "max_tokens": 5}).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=5) as resp:
            assert json.load(resp)["usage"]["completion_tokens"] == 5
        # a stream left open while the server stops
        stream_req = urllib.request.Request(
            url + "/v1/completions",
            method="POST",
            data=json.dumps({"prompt": [400], "max_tokens": 30000, "stream": True}).encode(),
            headers={"Content-Type": "application/json"},
        )
        held = urllib.request.urlopen(stream_req, timeout=5)
        held.readline()
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=10)
        held.close()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err
    assert "Traceback" not in err and "Error" not in err, err
    assert "stopped" in out


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--speed", "fast"], "invalid float value"),
        (["--profile", "nope"], "invalid choice"),
        (["--kv-capacity", "1000"], "smaller than max_model_len"),
        (["--faults", "boom=1"], "unknown fault"),
        (["--stream-interval", "0"], "stream_interval"),
    ],
)
def test_cli_bad_args(args: list[str], needle: str) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "pytest_llmspeed.sim", *args],
        capture_output=True,
        text=True,
        env=_env(),
        timeout=20,
    )
    assert proc.returncode == 2
    assert needle in proc.stderr and "usage:" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_cli_help_documents_every_option() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "pytest_llmspeed.sim", "--help"],
        capture_output=True,
        text=True,
        env=_env(),
        timeout=20,
    )
    assert proc.returncode == 0
    for opt in (
        "--profile",
        "--host",
        "--port",
        "--speed",
        "--kv-capacity",
        "--max-model-len",
        "--noise",
        "--seed",
        "--api-key",
        "--stream-interval",
        "--faults",
        "h200-qwen3.5-27b-int4",
        "burst503",
        "stall_s",
    ):
        assert opt in proc.stdout, opt
