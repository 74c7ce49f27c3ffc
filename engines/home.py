"""Where the real engines' set-ups live, and the environment their processes run in.

One folder, ``$LLMSPEED_VLLM_HOME`` (default ``~/.cache/pytest-llmspeed/vllm``), holds vLLM's
environment and the tiny model (``scripts/setup_vllm.py``), and beside them llama-cpp-python's
(``llama-cpp/``, ``scripts/setup_llama_cpp.py``) and what ``transformers serve`` adds
(``transformers-serve/``, ``scripts/setup_transformers_serve.py``). The set-up scripts write
these layouts; ``engines.servers`` reads them.

Standard library only: the set-up scripts import it with plain ``python``, before the project is
installed.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

GGUF_NAME = "tiny.gguf"


def vllm_home() -> Path:
    """``$LLMSPEED_VLLM_HOME``, default ``~/.cache/pytest-llmspeed/vllm``. Read it before a
    test points ``HOME`` elsewhere (pytester does)."""
    raw = os.environ.get("LLMSPEED_VLLM_HOME") or "~/.cache/pytest-llmspeed/vllm"
    return Path(raw).expanduser().resolve()


class Layout:
    """vLLM's set-up: its environment, the tiny model, the set-up's log and its marker."""

    def __init__(self, home: Path) -> None:
        self.home = home
        self.venv = home / "venv"
        self.python = self.venv / "bin" / "python"
        self.model = home / "model"
        self.log = home / "setup.log"
        self.marker = home / "setup.json"

    def installed(self) -> bool:
        """The set-up finished and left what a server needs (the set-up script's ``--check``
        also compares the marker with its inputs)."""
        return (
            self.marker.is_file()
            and self.python.exists()
            and (self.model / "config.json").is_file()
            and (self.model / "tokenizer.json").is_file()
        )


class LlamaCppLayout(Layout):
    """llama-cpp-python's set-up under ``llama-cpp/`` (environment, GGUF model, log, marker)
    and what it reads of vLLM's."""

    def __init__(self, vllm: Path) -> None:
        super().__init__(vllm / "llama-cpp")
        self.vllm_python = Layout(vllm).python
        self.source_model = Layout(vllm).model
        self.convert = self.home / "convert"
        self.gguf = self.model / GGUF_NAME

    def installed(self) -> bool:
        return self.marker.is_file() and self.python.exists() and self.gguf.is_file()


class TransformersServeLayout:
    """What ``transformers serve`` adds under ``transformers-serve/``: ``accelerate`` (``site``,
    put on ``PYTHONPATH``) and two EOS-free copies of the tiny model; it runs from vLLM's
    environment."""

    def __init__(self, vllm: Path) -> None:
        self.vllm = Layout(vllm)
        self.home = vllm / "transformers-serve"
        self.python = self.vllm.python
        self.transformers = self.vllm.venv / "bin" / "transformers"
        self.site = self.home / "site"
        self.model = self.home / "model"  # the tiny model as it is (random weights)
        self.model_words = self.home / "model-words"  # the copy that draws words only
        self.words = self.home / "words.json"
        self.marker = self.home / "setup.json"

    def installed(self) -> bool:
        return (
            self.marker.is_file()
            and self.python.exists()
            and self.model.is_dir()
            and self.model_words.is_dir()
        )


def offline_env(base: Mapping[str, str]) -> dict[str, str]:
    """``base`` for a process of an engine's environment: no hub, no telemetry, no user site,
    and none of this project's modules (no ``PYTHONPATH``)."""
    env = {
        **base,
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
        "PYTHONNOUSERSITE": "1",
    }
    env.pop("PYTHONPATH", None)
    return env
