"""Starting and stopping the real engines: vLLM (CPU build), ``transformers serve`` and
llama-cpp-python's server, each on a loopback port of its own, offline, from the set-ups that
``engines.home`` locates. Nothing is downloaded.

Every engine runs under the plugin's own launcher (``pytest_llmspeed.core.launch``, the one
``--llm-serve`` uses): a watchdog leads the engine's process group and stops the group when this
process dies, even by SIGKILL, so no server outlives its test session or benchmark; stopping
sends SIGINT, SIGTERM, then SIGKILL to the whole group. An engine counts as started when its
``/health`` or ``/v1/models`` answers 200.

``StartError`` says why one did not start (not set up, exited, not healthy in time) with its
log's last lines. No pytest here: the tests turn the error into a failed test
(``tests/vllm_server.py``, ``tests/engines/``), the benchmarks into an exit
(``benchmarks/common.py``)::

    servers = Servers(log_dir)
    server = servers.get(stream_interval=1)   # one vLLM per argument set, kept
    chunky = servers.get(stream_interval=4)   # a second one, up to 4 tokens per SSE chunk
    ...
    servers.stop_all()

    with llama_cpp_server(log_dir / "llama-cpp.log") as url:
        ...
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import re
import shlex
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from engines.home import (
    Layout,
    LlamaCppLayout,
    TransformersServeLayout,
    offline_env,
    vllm_home,
)
from pytest_llmspeed.core.errors import redact_secrets
from pytest_llmspeed.core.launch import (
    LaunchedServer,
    LaunchError,
    ServeCommand,
    free_port,
    launch,
    wait_healthy,
)

__all__ = [
    "KV_CACHE_MEMORY_BYTES",
    "LLAMA_CPP_MODEL",
    "LLAMA_CPP_NOT_SET_UP",
    "LLAMA_CPP_N_CTX",
    "MAX_MODEL_LEN",
    "NOT_SET_UP",
    "SERVED_MODEL",
    "START_TIMEOUT_S",
    "TRANSFORMERS_NOT_SET_UP",
    "Servers",
    "StartError",
    "VllmServer",
    "free_port",
    "http_get",
    "llama_cpp_server",
    "running",
    "start",
    "transformers_serve",
]


class StartError(Exception):
    """An engine did not start: it is not set up, it exited, or it was not healthy in time."""


def http_get(url: str, timeout: float = 5.0, api_key: str | None = None) -> tuple[int, str]:
    """(HTTP status, body) of a GET; an HTTP error's status and body too."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        with urllib.request.urlopen(
            urllib.request.Request(url, headers=headers), timeout=timeout
        ) as resp:
            return int(resp.status), resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(errors="replace")


def start(
    name: str,
    words: Sequence[str],
    port: int,
    *,
    env: Mapping[str, str],
    log_path: Path,
    timeout_s: float,
    cwd: Path | None = None,
) -> LaunchedServer:
    """Run ``words`` (an engine listening on loopback ``port``) under the watchdog, its output
    in ``log_path``, and wait until it answers; ``StartError`` (the engine stopped) when it
    exits first or is not healthy within ``timeout_s``."""
    command = ServeCommand(tuple(words), port, redact_secrets(shlex.join(words)))
    server = launch(command, log_path, env=env, cwd=cwd)
    try:
        wait_healthy(server, timeout_s)
    except LaunchError as exc:
        server.stop()
        raise StartError(f"{name} did not start: {exc.message}") from None
    except BaseException:
        server.stop()
        raise
    return server


@contextlib.contextmanager
def running(
    name: str,
    words: Sequence[str],
    port: int,
    *,
    env: Mapping[str, str],
    log_path: Path,
    timeout_s: float,
) -> Iterator[LaunchedServer]:
    """``start``, then the block, then the engine's whole process group stopped."""
    server = start(name, words, port, env=env, log_path=log_path, timeout_s=timeout_s)
    try:
        yield server
    finally:
        server.stop()


# --- vLLM -----------------------------------------------------------------------------------

SERVED_MODEL = "tiny"
MAX_MODEL_LEN = 20480
# The tiny model stores 2 layers x (K, V) x 1 KV head x head_dim 64 x 2 bytes = 512 bytes per
# token, so 128 MiB of KV cache holds 262,144 tokens (2,048 blocks of 128): a 1K/4K/16K x
# concurrency 1/4/16 matrix then has over-capacity cells (16K x 16).
KV_CACHE_MEMORY_BYTES = 128 * 1024 * 1024
START_TIMEOUT_S = float(os.environ.get("LLMSPEED_VLLM_START_TIMEOUT", "240"))
NOT_SET_UP = "real vLLM is not set up: run `python scripts/setup_vllm.py`"

_KV_RE = re.compile(r'^vllm:cache_config_info\{[^}]*kv_cache_size_tokens="(\d+)"', re.MULTILINE)


@dataclass(frozen=True)
class VllmServer:
    """One running vLLM server."""

    url: str  # base URL, no trailing slash, e.g. http://127.0.0.1:41234
    model: str  # the served model name ("tiny")
    max_model_len: int  # as /v1/models reports it
    kv_capacity_tokens: int  # kv_cache_size_tokens of vllm:cache_config_info in /metrics
    log_path: Path
    stream_interval: int
    api_key: str | None  # the server's --api-key (None: no key required)
    model_dir: Path
    startup_s: float  # process start to healthy /health


class Servers:
    """vLLM servers started on demand, each in its own process group, all stopped by
    ``stop_all`` (and when this process exits)."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        # Taken now: a test's monkeypatching (pytester sets HOME to a temporary directory)
        # must change neither where the set-up is found nor the servers' environment.
        self.layout = Layout(vllm_home())
        self.environ = dict(os.environ)
        self.running: dict[tuple[int, str | None], VllmServer] = {}
        self.failed: dict[tuple[int, str | None], str] = {}
        self.launched: dict[str, LaunchedServer] = {}  # a server's URL -> its process
        atexit.register(self.stop_all)

    def get(self, stream_interval: int = 1, *, api_key: str | None = None) -> VllmServer:
        """The server of this argument set, started on first use and kept; a server that
        failed to start is not tried again (the same ``StartError``)."""
        key = (stream_interval, api_key)
        if key in self.running:
            return self.running[key]
        if key in self.failed:
            raise StartError(self.failed[key])
        try:
            server = self.start(stream_interval, api_key=api_key)
        except StartError as exc:
            if self.layout.installed():  # not set up yet: it may be by the next call
                self.failed[key] = str(exc)
            raise
        self.running[key] = server
        return server

    def start(self, stream_interval: int = 1, *, api_key: str | None = None) -> VllmServer:
        """One more server, healthy and probed; ``StartError`` (with the log's last lines)
        when vLLM is not set up, exits or does not become healthy in time."""
        if stream_interval < 1:
            raise ValueError(f"stream_interval must be >= 1, got {stream_interval}")
        lay = self.layout
        if not lay.installed():
            raise StartError(NOT_SET_UP)
        port = free_port()
        keyed = "-apikey" if api_key else ""
        log_path = self.log_dir / f"vllm-stream{stream_interval}{keyed}-port{port}.log"
        words = [
            str(lay.python), "-m", "vllm.entrypoints.openai.api_server",
            "--model", str(lay.model),
            "--served-model-name", SERVED_MODEL,
            "--host", "127.0.0.1",
            "--port", str(port),
            "--max-model-len", str(MAX_MODEL_LEN),
            "--kv-cache-memory-bytes", str(KV_CACHE_MEMORY_BYTES),
            "--stream-interval", str(stream_interval),
            "--disable-uvicorn-access-log",
        ]  # fmt: skip
        if api_key:
            words += ["--api-key", api_key]
        env = {
            **offline_env(self.environ),
            "VIRTUAL_ENV": str(lay.venv),
            "PATH": f"{lay.python.parent}{os.pathsep}{self.environ.get('PATH', '')}",
        }
        launched = start(
            "vLLM",
            words,
            port,
            env=env,
            log_path=log_path,
            timeout_s=START_TIMEOUT_S,
            cwd=self.log_dir,
        )
        startup_s = time.monotonic() - launched.started
        url = launched.command.url
        self.launched[url] = launched
        try:
            _, body = http_get(f"{url}/v1/models", api_key=api_key)
            max_model_len = int(json.loads(body)["data"][0]["max_model_len"])
            _, metrics = http_get(f"{url}/metrics", api_key=api_key)
            match = _KV_RE.search(metrics)
            if match is None:
                raise ValueError("no kv_cache_size_tokens in vllm:cache_config_info of /metrics")
            kv_tokens = int(match.group(1))
        except (OSError, ValueError, KeyError, IndexError) as exc:
            self.launched.pop(url).stop()
            raise StartError(
                f"vLLM at {url} is healthy but could not be probed: {exc}; log {log_path}"
            ) from exc
        return VllmServer(
            url=url,
            model=SERVED_MODEL,
            max_model_len=max_model_len,
            kv_capacity_tokens=kv_tokens,
            log_path=log_path,
            stream_interval=stream_interval,
            api_key=api_key,
            model_dir=lay.model,
            startup_s=startup_s,
        )

    def process_group(self, server: VllmServer) -> int:
        """The id of ``server``'s process group (its watchdog leads it; every process of the
        server is in it)."""
        return self.launched[server.url].pid

    def stop_all(self) -> None:
        while self.launched:
            self.launched.popitem()[1].stop()
        self.running.clear()


# --- transformers serve ---------------------------------------------------------------------

TRANSFORMERS_NOT_SET_UP = (
    "transformers serve is not set up: run `python scripts/setup_transformers_serve.py`"
)


@contextlib.contextmanager
def transformers_serve(
    log_path: Path,
    *,
    words: bool = False,
    home: Path | None = None,
    environ: Mapping[str, str] | None = None,
) -> Iterator[tuple[str, str]]:
    """(base URL, model name) of ``transformers serve --continuous-batching`` serving the tiny
    model without EOS (``words``: the copy that draws words only), for the block."""
    lay = TransformersServeLayout(home or vllm_home())
    if not lay.installed():
        raise StartError(TRANSFORMERS_NOT_SET_UP)
    model = str(lay.model_words if words else lay.model)
    port = free_port()
    # --cb-num-blocks: 64 blocks of 256 tokens (16K tokens; the tests' matrix needs 2 × 1088).
    # Without it continuous batching takes 90 % of the free memory for its KV cache (21 GB of
    # 23 here), and a second server at the same time (another test run's) has the OOM killer
    # end one.
    cmd = [
        str(lay.transformers), "serve", model, "--continuous-batching",
        "--cb-num-blocks", "64", "--device", "cpu", "--host", "127.0.0.1", "--port", str(port),
    ]  # fmt: skip
    # One intra-op thread: torch's default (a thread per core) spins against any other busy
    # process on a 2-core machine. One 64-token request of the words model (5 in a row, beside
    # two busy loops): 2.7-16 s with the default, 0.25-0.55 s with one thread.
    env = {
        **offline_env(os.environ if environ is None else environ),
        "PYTHONPATH": str(lay.site),
        "OMP_NUM_THREADS": "1",
    }
    with running(
        "transformers serve", cmd, port, env=env, log_path=log_path, timeout_s=180
    ) as server:
        yield server.command.url, model


# --- llama-cpp-python's server --------------------------------------------------------------

LLAMA_CPP_MODEL = "tiny"  # the served model's alias
LLAMA_CPP_N_CTX = 2048
LLAMA_CPP_NOT_SET_UP = "llama-cpp-python is not set up: run `python scripts/setup_llama_cpp.py`"


@contextlib.contextmanager
def llama_cpp_server(
    log_path: Path, *, home: Path | None = None, environ: Mapping[str, str] | None = None
) -> Iterator[str]:
    """The base URL of ``python -m llama_cpp.server`` serving the tiny model as GGUF (alias
    ``LLAMA_CPP_MODEL``, context ``LLAMA_CPP_N_CTX``), for the block."""
    lay = LlamaCppLayout(home or vllm_home())
    if not lay.installed():
        raise StartError(LLAMA_CPP_NOT_SET_UP)
    port = free_port()
    cmd = [
        str(lay.python), "-m", "llama_cpp.server", "--model", str(lay.gguf),
        "--model_alias", LLAMA_CPP_MODEL, "--host", "127.0.0.1", "--port", str(port),
        "--n_ctx", str(LLAMA_CPP_N_CTX),
        # a request arriving while another streams would else end that stream early, with
        # [DONE] and no finish_reason: queued instead (the server runs one at a time)
        "--interrupt_requests", "False",
    ]  # fmt: skip
    env = offline_env(os.environ if environ is None else environ)
    with running("llama_cpp.server", cmd, port, env=env, log_path=log_path, timeout_s=60) as s:
        yield s.command.url
