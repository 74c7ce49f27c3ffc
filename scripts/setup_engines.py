#!/usr/bin/env python3
"""Set up everything the tests start, side by side: real vLLM's CPU build and its tiny model
(then transformers serve, which uses its environment), llama-cpp-python's server (its build,
the longest step, runs while vLLM installs; its model is converted from vLLM's once that is
ready), and Debian's chromium.

Standard library only; the test command (``tox -e tests``) runs it before the tests:

    python scripts/setup_engines.py    # each set-up that is not done yet, at once

Each set-up's lines are printed as they come, prefixed with its name; it exits 1 when any
set-up failed, after all have ended. Run alone, each script does the same for its own part
(``scripts/setup_vllm.py`` and the others); a finished set-up is a marker file and takes a
second.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
#: chains run one after the other; the chains run at once
CHAINS = (
    ("setup_vllm.py", "setup_transformers_serve.py"),
    ("setup_llama_cpp.py",),
    ("setup_browser.py",),
)
#: how long llama-cpp-python's set-up waits for vLLM's before it converts the model
WAIT_S = 1800


def run_chain(chain: tuple[str, ...], failed: list[str], lock: threading.Lock) -> None:
    env = {**os.environ, "LLMSPEED_SETUP_WAIT_S": str(WAIT_S), "PYTHONUNBUFFERED": "1"}
    for script in chain:
        t0 = time.monotonic()
        proc = subprocess.Popen(
            [sys.executable, str(HERE / script)],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
        )
        assert proc.stdout is not None
        for line in proc.stdout:
            with lock:
                print(line.rstrip("\n"), flush=True)
        code = proc.wait()
        with lock:
            print(f"[setup_engines] {script}: exit {code} after {time.monotonic() - t0:.0f} s")
        if code != 0:
            failed.append(script)
            return


def main() -> int:
    t0 = time.monotonic()
    failed: list[str] = []
    lock = threading.Lock()
    threads = [
        threading.Thread(target=run_chain, args=(chain, failed, lock), daemon=True)
        for chain in CHAINS
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    took = time.monotonic() - t0
    if failed:
        print(f"[setup_engines] FAILED: {', '.join(failed)} (after {took:.0f} s)", flush=True)
        return 1
    print(f"[setup_engines] all set up in {took:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
