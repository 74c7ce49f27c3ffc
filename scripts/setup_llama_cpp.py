#!/usr/bin/env python3
"""Set up llama-cpp-python's OpenAI-compatible server (a third real engine) for its tests.

Standard library only; run it after ``scripts/setup_vllm.py`` (about 3.5 min the first time,
well under a second after):

    python scripts/setup_llama_cpp.py           # install
    python scripts/setup_llama_cpp.py --check   # ready (exit 0) or not (exit 1)
    python scripts/setup_llama_cpp.py --force   # redo every step

Everything goes under ``$LLMSPEED_VLLM_HOME/llama-cpp/`` (default
``~/.cache/pytest-llmspeed/vllm/llama-cpp``); vLLM's environment and model are read, never
changed:

- ``venv/``   a virtual environment of its own with ``llama-cpp-python[server]``, built from its
  source distribution for this CPU family with no GPU backend, no OpenMP (ggml's own thread
  pool) and no multimodal library; every package it holds is pinned (``LOCK``);
- ``convert/``  ``convert_hf_to_gguf.py``, its ``conversion`` package and ``gguf-py``, taken
  from the same source distribution (``vendor/llama.cpp``);
- ``model/tiny.gguf``  vLLM's tiny model (``scripts/make_tiny_model.py``) converted to GGUF by
  that converter, run with vLLM's Python (torch, transformers, safetensors). The converter
  refuses a BPE pre-tokenizer whose fingerprint it does not list, as that of a tiny local
  tokenizer; the set-up runs it with that one check relaxed in memory (the tokenizer's
  pre-tokenizer is the GPT-2 byte-level split, ``gpt-2`` in GGUF); no file of it is changed;
- ``setup.log``  the full output of every command; ``setup.json``  the marker: a second run
  whose inputs are unchanged only reads it.

EOS stays in the model: the server ignores ``ignore_eos`` (an unknown field) but honors
``min_tokens``, which the plugin sends with it, by holding back the EOS token until then; the
model's other end-of-generation token (its pad token, ``<|endoftext|>``) is renamed in the
converted copy, so outputs reach their ``max_tokens`` (``model_copy``).
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import shutil
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any

import setup_vllm  # this folder: sys.path[0] for a script; it puts engines/ on the path
from setup_vllm import SetupError, run

from engines.home import LlamaCppLayout as Layout
from engines.home import vllm_home

LLAMA_SPEC = "llama-cpp-python[server]==0.3.36"
# Every package of the server's environment, as the package index resolved them on 2026-12-01.
LOCK = (
    "annotated-doc==0.0.7",
    "annotated-types==0.8.0",
    "anyio==4.16.0",
    "click==8.5.1",
    "diskcache==5.6.3",
    "fastapi==0.165.0",
    "h11==0.16.0",
    "idna==3.20",
    "jinja2==3.1.6",
    "markupsafe==3.0.4",
    "numpy==2.4.6",
    "opentelemetry-api==1.45.2",
    "pydantic==2.14.4",
    "pydantic-core==2.50.5",
    "pydantic-settings==2.16.3",
    "python-dotenv==1.2.4",
    "pyyaml==6.0.4",
    "sse-starlette==3.7.0",
    "starlette==1.10.0",
    "starlette-context==0.3.6",
    "typing-extensions==4.16.0",
    "typing-inspection==0.4.5",
    "uvicorn==0.54.0",
)
# CPU only, for any x86-64 with AVX2 (not -march=native: the cache may outlive the CPU it was
# built on); no OpenMP; no mtmd (multimodal), which the server's completions never load.
CMAKE_ARGS = "-DGGML_NATIVE=OFF -DGGML_OPENMP=OFF -DLLAVA_BUILD=OFF"
MARKER_VERSION = 1
PAD, PAD_RENAMED = "<|endoftext|>", "<|pad|>"
# Runs with vLLM's Python: argv = vendor folder, then the converter's own arguments.
CONVERT = """
import runpy, sys
vendor = sys.argv[1]
sys.path[:0] = [vendor, vendor + "/gguf-py"]
import conversion.base as base
known = base.TextModel.get_vocab_base_pre
def relaxed(self, tokenizer):
    try:
        return known(self, tokenizer)
    except NotImplementedError:  # a tokenizer it has no fingerprint of: GPT-2's split
        return "gpt-2"
base.TextModel.get_vocab_base_pre = relaxed
sys.argv = [vendor + "/convert_hf_to_gguf.py", *sys.argv[2:]]
runpy.run_path(sys.argv[0], run_name="__main__")
"""
VENDOR_PARTS = ("convert_hf_to_gguf.py", "conversion", "gguf-py", "LICENSE")


def say(msg: str) -> None:
    print(f"[setup_llama_cpp] {msg}", flush=True)


def wanted_inputs(lay: Layout) -> dict[str, Any]:
    """What the marker must match for the set-up to count as done."""
    weights = lay.source_model / "model.safetensors"
    digest = hashlib.sha256(weights.read_bytes()).hexdigest() if weights.is_file() else None
    return {
        "marker_version": MARKER_VERSION,
        "llama_spec": LLAMA_SPEC,
        "lock": list(LOCK),
        "cmake_args": CMAKE_ARGS,
        "pad_renamed": PAD_RENAMED,
        "source_weights_sha256": digest,
    }


def readiness(lay: Layout) -> tuple[bool, str]:
    """Cheap check (imports nothing): the marker matches and the files it names exist."""
    try:
        marker = json.loads(lay.marker.read_text())
    except (OSError, ValueError):
        return False, f"no marker file {lay.marker}"
    for key, value in wanted_inputs(lay).items():
        if not isinstance(marker, dict) or marker.get(key) != value:
            return False, f"marker out of date ({key} changed)"
    for path in (lay.python, lay.gguf):
        if not path.exists():
            return False, f"missing {path}"
    return True, "ready"


def step_download(lay: Layout, tmp: Path) -> Path:
    """The source distribution (built from, and the converter's source)."""
    name = LLAMA_SPEC.replace("[server]", "")
    say(f"pip download {name} (its source distribution)")
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:"]
    run(lay, f"downloading {name}", [*cmd, "--progress-bar", "off", "-d", str(tmp), name])
    found = sorted(tmp.glob("llama_cpp_python-*.tar.gz"))
    if not found:
        raise SetupError(f"pip download left no llama_cpp_python-*.tar.gz in {tmp}")
    return found[0]


def step_install(lay: Layout, sdist: Path) -> None:
    shutil.rmtree(lay.venv, ignore_errors=True)
    say(f"creating virtualenv {lay.venv} with {sys.executable}")
    run(lay, "creating the virtualenv", [sys.executable, "-m", "venv", str(lay.venv)])
    say(f"building {LLAMA_SPEC} (about 3.5 min on 2 cores; output goes to {lay.log})")
    t0 = time.monotonic()
    constraints = sdist.parent / "constraints.txt"
    constraints.write_text("\n".join(LOCK) + "\n")
    env = {
        "CMAKE_ARGS": CMAKE_ARGS,
        "CMAKE_BUILD_PARALLEL_LEVEL": str(os.cpu_count() or 2),
        "VIRTUAL_ENV": str(lay.venv),
        "PIP_NO_CACHE_DIR": "1",  # a cached wheel could be another build's
        "PYTHONNOUSERSITE": "1",
    }
    cmd = [str(lay.python), "-m", "pip", "install", "--progress-bar", "off"]
    run(
        lay,
        f"building {LLAMA_SPEC}",
        [*cmd, "-c", str(constraints), f"llama-cpp-python[server] @ {sdist.as_uri()}"],
        env=env,
    )
    say(f"built and installed in {time.monotonic() - t0:.0f} s")


def step_converter(lay: Layout, sdist: Path) -> None:
    """Only the converter's files, from the source distribution's vendor/llama.cpp."""
    shutil.rmtree(lay.convert, ignore_errors=True)
    lay.convert.mkdir(parents=True)
    with tarfile.open(sdist) as tar:
        members = []
        for member in tar.getmembers():
            parts = Path(member.name).parts
            wanted = len(parts) > 3 and parts[3] in VENDOR_PARTS
            if parts[1:3] == ("vendor", "llama.cpp") and wanted and not member.issym():
                member.name = str(Path(*parts[3:]))
                members.append(member)
        tar.extractall(lay.convert, members=members, filter="data")
    if not (lay.convert / "convert_hf_to_gguf.py").is_file():
        raise SetupError(f"no vendor/llama.cpp/convert_hf_to_gguf.py in {sdist.name}")


def step_verify(lay: Layout) -> dict[str, str]:
    say("checking that llama_cpp and its server import")
    code = (
        "import json, llama_cpp, llama_cpp.server.app, fastapi, uvicorn\n"
        "print(json.dumps({'llama_cpp_python': llama_cpp.__version__,"
        " 'fastapi': fastapi.__version__, 'uvicorn': uvicorn.__version__}))\n"
    )
    out = run(lay, "importing llama_cpp", [str(lay.python), "-c", code])
    versions: dict[str, str] = json.loads(out.strip().splitlines()[-1])
    say("versions: " + ", ".join(f"{k} {v}" for k, v in versions.items()))
    return versions


def model_copy(source: Path, target: Path) -> None:
    """The tiny model with one end-of-generation token: links to its files, and a tokenizer
    whose pad token ``<|endoftext|>`` is renamed ``<|pad|>``. llama.cpp ends a generation at
    every token whose text it knows as an end (``<|endoftext|>``, ``<|im_end|>``, ...), while
    ``min_tokens`` holds back only the EOS token (``<|im_end|>``): with the pad token too, the
    random weights end about one output in twenty early."""
    target.mkdir(parents=True)
    for item in source.iterdir():
        if item.name not in ("tokenizer.json", "tokenizer_config.json"):
            (target / item.name).symlink_to(item)
    tok = json.loads((source / "tokenizer.json").read_text())
    vocab = tok["model"]["vocab"]
    vocab[PAD_RENAMED] = vocab.pop(PAD)
    for added in tok["added_tokens"]:
        if added["content"] == PAD:
            added["content"] = PAD_RENAMED
    (target / "tokenizer.json").write_text(json.dumps(tok))
    config = json.loads((source / "tokenizer_config.json").read_text())
    config["pad_token"] = PAD_RENAMED
    (target / "tokenizer_config.json").write_text(json.dumps(config, indent=2))


def step_gguf(lay: Layout, tmp: Path) -> None:
    say(f"converting {lay.source_model} to {lay.gguf}")
    lay.gguf.parent.mkdir(parents=True, exist_ok=True)
    lay.gguf.unlink(missing_ok=True)
    model = tmp / "model"
    model_copy(lay.source_model, model)
    cmd = [str(lay.vllm_python), "-c", CONVERT, str(lay.convert), str(model)]
    cmd += ["--outfile", str(lay.gguf), "--outtype", "f32"]
    env = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "NO_LOCAL_GGUF": ""}
    run(lay, "converting the tiny model to GGUF", cmd, env=env)
    if not lay.gguf.is_file():
        raise SetupError(f"the converter wrote no {lay.gguf}")


def vllm_ready(lay: Layout) -> bool:
    return lay.vllm_python.exists() and (lay.source_model / "config.json").is_file()


def wait_for_vllm(lay: Layout) -> None:
    """The GGUF is converted from vLLM's tiny model with vLLM's Python: when vLLM's set-up
    runs beside this one (scripts/setup_engines.py sets ``LLMSPEED_SETUP_WAIT_S``), wait for
    it to be ready; else, without it, say what to run first."""
    wait = float(os.environ.get("LLMSPEED_SETUP_WAIT_S", "0") or 0)
    deadline = time.monotonic() + wait
    while True:
        # beside it, its marker is written last: ready means complete
        beside = wait and setup_vllm.readiness(setup_vllm.Layout(vllm_home()))[0]
        if beside or (not wait and vllm_ready(lay)):
            return
        if time.monotonic() >= deadline:
            raise SetupError(
                f"vLLM is not set up under {lay.vllm_python.parents[2]}: "
                "run scripts/setup_vllm.py first"
            )
        time.sleep(2)


def setup(lay: Layout, force: bool) -> None:
    if not os.environ.get("LLMSPEED_SETUP_WAIT_S"):
        wait_for_vllm(lay)  # fail at once, before the build
    ok, why = readiness(lay)
    if ok and not force:
        say(f"already set up (marker {lay.marker}); nothing to do")
        return
    t0 = time.monotonic()
    say(f"setting up in {lay.home} ({why})")
    lay.home.mkdir(parents=True, exist_ok=True)
    lay.marker.unlink(missing_ok=True)
    lay.log.write_text(f"setup_llama_cpp.py started {time.strftime('%Y-%m-%d %H:%M:%S')}\n")
    with tempfile.TemporaryDirectory(prefix="llmspeed-llama-cpp-") as tmp:
        sdist = step_download(lay, Path(tmp))
        step_converter(lay, sdist)
        step_install(lay, sdist)
        versions = step_verify(lay)
        wait_for_vllm(lay)
        step_gguf(lay, Path(tmp))
    marker = {
        **wanted_inputs(lay),
        "versions": versions,
        "python": platform.python_version(),
        "venv": str(lay.venv),
        "gguf": str(lay.gguf),
        "finished": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "seconds": round(time.monotonic() - t0, 1),
    }
    lay.marker.write_text(json.dumps(marker, indent=2) + "\n")
    say(f"done in {marker['seconds']} s; ready: {lay.python} -m llama_cpp.server")


def main(argv: list[str] | None = None) -> int:
    errors = (SetupError, OSError, tarfile.TarError)
    lay = Layout(vllm_home())
    return setup_vllm.cli(argv, __doc__ or "", "setup_llama_cpp", lay, readiness, setup, errors)


if __name__ == "__main__":
    sys.exit(main())
