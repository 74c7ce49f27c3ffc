"""Real engines beside vLLM, each started by its test module on loopback."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.vllm_server import WATCHDOG, http_get, kill_group


@contextlib.contextmanager
def running(
    name: str, cmd: list[str], env: dict[str, str], ready_url: str, log_path: Path, timeout_s: float
) -> Iterator[None]:
    """Run ``cmd`` under the watchdog (its whole process group dies with the test process)
    until the block ends; the test fails with the log's tail when it exits or is not ready
    (``ready_url`` answering HTTP 200) within ``timeout_s``."""
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-c", WATCHDOG, *cmd],
            stdin=subprocess.PIPE,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            if proc.poll() is not None:
                pytest.fail(f"{name} exited:\n{log_path.read_text()[-3000:]}")
            with contextlib.suppress(OSError):
                if http_get(ready_url, timeout=2.0)[0] == 200:
                    break
            if time.monotonic() > deadline:
                pytest.fail(f"{name} not ready:\n{log_path.read_text()[-3000:]}")
            time.sleep(0.25)
        yield
    finally:
        kill_group(proc)
