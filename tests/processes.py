"""The processes a test started and expects gone: found by a marker word on their command line
(a seed such as ``--seed 910001``, an API key), whatever process group or parent they have."""

from __future__ import annotations

import time
from pathlib import Path


def processes_with(marker: object) -> list[int]:
    """Live (not zombie) processes whose command line holds ``str(marker)`` as a word."""
    word = str(marker).encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmd = (entry / "cmdline").read_bytes().split(b"\0")
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z" and word in cmd:
            found.append(int(entry.name))
    return found


def gone(marker: object, within: float = 20.0) -> bool:
    """Wait up to ``within`` s for every process with ``marker`` to end; whether they did."""
    deadline = time.monotonic() + within
    while processes_with(marker) and time.monotonic() < deadline:
        time.sleep(0.2)
    return processes_with(marker) == []
