"""The simulator's own process (``--llm-endpoint=sim`` runs it as a child): it never outlives
the process that started it, however that one ends."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

PARENT = """
import os, sys
from pytest_llmspeed.sim import SimOptions, running_simulator_process
with running_simulator_process(SimOptions(profile="tiny")) as url:
    print(os.getpid(), url, flush=True)
    sys.stdin.read()  # until killed
"""


def children(pid: int) -> list[int]:
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                out.append(int(entry.name))
    return out


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_a_killed_parent_takes_its_simulator_with_it():
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert parent.stdout is not None
        pid, url = parent.stdout.readline().split()
        assert url.startswith("http://127.0.0.1:")
        (sim,) = children(int(pid))
        assert alive(sim)
        os.kill(int(pid), signal.SIGKILL)  # no finally, no atexit: only the OS closes its pipes
        parent.wait(10)
        deadline = time.monotonic() + 20
        while alive(sim) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not alive(sim), f"the simulator {sim} outlived its killed parent"
    finally:
        if parent.poll() is None:
            parent.kill()
