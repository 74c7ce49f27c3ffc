#!/usr/bin/env python3
"""Set up `transformers serve` (a second real engine) beside the vLLM set-up, for its tests.

Standard library only; run it after ``scripts/setup_vllm.py`` (about 2 s):

    python scripts/setup_transformers_serve.py           # install
    python scripts/setup_transformers_serve.py --check   # ready (exit 0) or not (exit 1)

It reuses vLLM's environment (``transformers`` with its ``serve`` command, torch, FastAPI) and
tiny model, and adds under ``$LLMSPEED_VLLM_HOME/transformers-serve/`` (vLLM's environment is
left untouched):

- ``site/``   ``accelerate``, which ``transformers serve`` needs to load a model (without it:
  "Using a `device_map` ... requires `accelerate`"), installed ``--no-deps`` from the package
  index (its dependencies are all in vLLM's environment); put on ``PYTHONPATH``;
- ``model/``  the tiny model without an EOS token (links to its weights and tokenizer; a
  config and generation config without ``eos_token_id``): ``transformers serve`` rejects
  ``ignore_eos`` (HTTP 422), and the random weights draw EOS after ~16 tokens, so outputs would
  never reach their ``max_tokens``;
- ``setup.json``  the marker.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ACCELERATE_SPEC = "accelerate==1.15.0"
MARKER_VERSION = 1


def home() -> Path:
    raw = os.environ.get("LLMSPEED_VLLM_HOME") or "~/.cache/pytest-llmspeed/vllm"
    return Path(raw).expanduser().resolve()


def say(msg: str) -> None:
    print(f"[setup_transformers_serve] {msg}", flush=True)


def ready(root: Path) -> bool:
    try:
        marker = json.loads((root / "transformers-serve" / "setup.json").read_text())
    except (OSError, ValueError):
        return False
    return (
        marker.get("marker_version") == MARKER_VERSION
        and marker.get("accelerate") == ACCELERATE_SPEC
    )


def write_model(source: Path, target: Path) -> None:
    target.mkdir(parents=True, exist_ok=True)
    for item in source.iterdir():
        if item.name in ("config.json", "generation_config.json"):
            continue
        link = target / item.name
        if link.is_symlink() or link.exists():
            link.unlink()
        link.symlink_to(item)
    for name in ("config.json", "generation_config.json"):
        config = json.loads((source / name).read_text())
        config.pop("eos_token_id", None)
        (target / name).write_text(json.dumps(config, indent=2) + "\n")


def setup(root: Path) -> None:
    python = root / "venv" / "bin" / "python"
    model = root / "model"
    if not (python.exists() and (model / "config.json").is_file()):
        raise SystemExit(f"vLLM is not set up under {root}: run scripts/setup_vllm.py first")
    ts = root / "transformers-serve"
    cmd = [str(python), "-m", "pip", "install", "--no-deps", "--upgrade", "--target"]
    cmd += [str(ts / "site"), ACCELERATE_SPEC]
    say("$ " + " ".join(cmd))
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    write_model(model, ts / "model")
    marker = {"marker_version": MARKER_VERSION, "accelerate": ACCELERATE_SPEC}
    (ts / "setup.json").write_text(json.dumps(marker, indent=2) + "\n")
    say(f"ready: {ts}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="say whether it is set up")
    args = parser.parse_args(argv)
    root = home()
    if args.check:
        ok = ready(root)
        say("ready" if ok else "not set up")
        return 0 if ok else 1
    if ready(root):
        say("already set up; nothing to do")
        return 0
    setup(root)
    return 0


if __name__ == "__main__":
    sys.exit(main())
