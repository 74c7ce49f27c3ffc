"""The simulator's own process (``--llm-endpoint=sim`` runs it as a child): it never outlives
the process that started it, however that one ends."""

import os
import signal
import subprocess
import sys

from tests.processes import gone, processes_with

MARKER = 910101  # the simulator's seed: finds its process

PARENT = f"""
import os, sys
from pytest_llmspeed.sim import SimOptions, running_simulator_process
with running_simulator_process(SimOptions(profile="tiny", seed={MARKER})) as url:
    print(os.getpid(), url, flush=True)
    sys.stdin.read()  # until killed
"""


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
        assert processes_with(MARKER)  # the simulator runs
        os.kill(int(pid), signal.SIGKILL)  # no finally, no atexit: only the OS closes its pipes
        parent.wait(10)
        assert gone(MARKER), "the simulator outlived its killed parent"
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait(10)
        for pipe in (parent.stdin, parent.stdout):
            if pipe is not None:
                pipe.close()
