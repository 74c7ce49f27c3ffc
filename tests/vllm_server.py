"""pytest plugin: a real vLLM (CPU build) server for tests marked ``vllm``.

List it in ``tests/conftest.py``: ``pytest_plugins = ["tests.vllm_server"]`` (or run pytest with
``-p tests.vllm_server``). It gives the session-scoped fixture ``vllm_server``, a callable::

    def test_x(vllm_server):
        server = vllm_server()                    # stream_interval=1
        chunky = vllm_server(stream_interval=4)   # a second server, up to 4 tokens per SSE chunk
        locked = vllm_server(api_key="secret")    # a third, started with --api-key secret

Each distinct argument set starts one server, once per session, and every server's whole process
group is killed at the end of the session. The server runs from the virtualenv and the tiny
random-weight model that ``scripts/setup_vllm.py`` writes under ``$LLMSPEED_VLLM_HOME`` (default
``~/.cache/pytest-llmspeed/vllm``); nothing is downloaded. When that setup is missing, the fixture
fails the test (it never skips): CI must notice a missing vLLM.

Benchmarks start servers with the same class, outside pytest (``benchmarks/common.py``)::

    servers = Servers(log_dir)
    server = servers.start(stream_interval=1)   # raises StartError instead of failing a test
    ...
    servers.stop_all()
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

__all__ = [
    "KV_CACHE_MEMORY_BYTES",
    "MAX_MODEL_LEN",
    "NOT_SET_UP",
    "SERVED_MODEL",
    "START_TIMEOUT_S",
    "WATCHDOG",
    "Servers",
    "StartError",
    "VllmServer",
    "free_port",
    "http_get",
    "installation",
    "kill_group",
    "offline_env",
    "vllm_home",
    "vllm_server",
]

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
    """One running server."""

    url: str  # base URL, no trailing slash, e.g. http://127.0.0.1:41234
    model: str  # the served model name ("tiny")
    max_model_len: int  # as /v1/models reports it
    kv_capacity_tokens: int  # kv_cache_size_tokens of vllm:cache_config_info in /metrics
    log_path: Path
    stream_interval: int
    api_key: str | None  # the server's --api-key (None: no key required)
    model_dir: Path
    startup_s: float  # process start to healthy /health


def vllm_home() -> Path:
    """Where ``scripts/setup_vllm.py`` puts vLLM's environment and the model."""
    raw = os.environ.get("LLMSPEED_VLLM_HOME") or "~/.cache/pytest-llmspeed/vllm"
    return Path(raw).expanduser().resolve()


def installation(home: Path) -> tuple[Path, Path] | None:
    """(venv python, model dir) when scripts/setup_vllm.py has finished, else None."""
    python = home / "venv" / "bin" / "python"
    model = home / "model"
    ready = (
        (home / "setup.json").is_file()
        and python.exists()
        and (model / "config.json").is_file()
        and (model / "tokenizer.json").is_file()
    )
    return (python, model) if ready else None


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def http_get(url: str, timeout: float = 5.0, api_key: str | None = None) -> tuple[int, str]:
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        with urllib.request.urlopen(
            urllib.request.Request(url, headers=headers), timeout=timeout
        ) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(errors="replace")


def _tail(path: Path, lines: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


# Runs (with this interpreter, stdlib only) as the leader of the server's process group. It
# starts the server, then waits for the server to exit or for EOF on its stdin, a pipe whose
# write end only this test process holds: if pytest dies, even by SIGKILL, the pipe closes and
# the watchdog stops the whole group, so no server outlives its session. (vLLM ignores a
# SIGTERM that arrives while it is still starting, so parent-death signals are not enough.)
WATCHDOG = """
import os, signal, subprocess, sys, threading, time
server = subprocess.Popen(sys.argv[1:], stdin=subprocess.DEVNULL)
signal.signal(signal.SIGTERM, signal.SIG_IGN)  # after the fork: the server keeps the default
eof = threading.Event()
threading.Thread(target=lambda: (sys.stdin.buffer.read(), eof.set()), daemon=True).start()
while server.poll() is None and not eof.wait(0.5):
    pass
if server.poll() is None:
    print("[watchdog] the test process is gone: stopping the server", flush=True)
    os.killpg(0, signal.SIGTERM)
    deadline = time.monotonic() + 15
    while server.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    time.sleep(2)
    os.killpg(0, signal.SIGKILL)
sys.exit(server.returncode)
"""


def kill_group(proc: subprocess.Popen[bytes], grace_s: float = 20.0) -> None:
    """Stop a server started by Servers: SIGTERM to its group, then SIGKILL what is left."""
    pgid = proc.pid  # start_new_session=True: the watchdog leads its own group
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGTERM)  # the watchdog ignores it and exits with the server
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=grace_s)
        time.sleep(1.0)  # let the engine core finish its own shutdown
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=10)
    if proc.stdin is not None:
        with contextlib.suppress(OSError):
            proc.stdin.close()


def offline_env(base: dict[str, str]) -> dict[str, str]:
    """``base`` for a process of vLLM's environment: no hub, no telemetry, no user site, and
    none of the test tree's modules (no PYTHONPATH)."""
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


class Servers:
    """Starts servers on demand, one per argument set, and stops them all at the end.

    Called (the fixture's factory), it keeps one server per argument set and fails the test
    when a server cannot start; ``start`` starts one more server and raises ``StartError``."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        # Taken when the session fixture is set up: a test's monkeypatching (pytester sets
        # HOME to a temporary directory) must change neither where the setup is found nor the
        # server's environment.
        self.home = vllm_home()
        self.environ = dict(os.environ)
        self.running: dict[tuple[int, str | None], VllmServer] = {}
        self.failed: dict[tuple[int, str | None], str] = {}
        self.procs: list[subprocess.Popen[bytes]] = []
        self.groups: dict[str, int] = {}  # a server's URL -> its process group
        atexit.register(self.stop_all)

    def __call__(self, stream_interval: int = 1, *, api_key: str | None = None) -> VllmServer:
        if stream_interval < 1:
            raise ValueError(f"stream_interval must be >= 1, got {stream_interval}")
        key = (stream_interval, api_key)
        if key in self.running:
            return self.running[key]
        if key in self.failed:
            pytest.fail(self.failed[key], pytrace=False)
        if installation(self.home) is None:
            pytest.fail(NOT_SET_UP, pytrace=False)
        try:
            server = self.start(stream_interval, api_key=api_key)
        except StartError as exc:
            self.failed[key] = str(exc)
            pytest.fail(str(exc), pytrace=False)
        self.running[key] = server
        return server

    def start(self, stream_interval: int = 1, *, api_key: str | None = None) -> VllmServer:
        """Start one more server and wait until it is healthy; ``StartError`` (with the log's
        last lines) when vLLM is not set up, exits or does not become healthy in time."""
        if stream_interval < 1:
            raise ValueError(f"stream_interval must be >= 1, got {stream_interval}")
        found = installation(self.home)
        if found is None:
            raise StartError(NOT_SET_UP)
        return self._start(found[0], found[1], stream_interval, api_key)

    def process_group(self, server: VllmServer) -> int:
        """The id of ``server``'s process group (its watchdog leads it; every process of the
        server is in it)."""
        return self.groups[server.url]

    def _start(
        self, python: Path, model_dir: Path, stream_interval: int, api_key: str | None
    ) -> VllmServer:
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        keyed = "-apikey" if api_key else ""
        log_path = self.log_dir / f"vllm-stream{stream_interval}{keyed}-port{port}.log"
        cmd = [
            str(python), "-m", "vllm.entrypoints.openai.api_server",
            "--model", str(model_dir),
            "--served-model-name", SERVED_MODEL,
            "--host", "127.0.0.1",
            "--port", str(port),
            "--max-model-len", str(MAX_MODEL_LEN),
            "--kv-cache-memory-bytes", str(KV_CACHE_MEMORY_BYTES),
            "--stream-interval", str(stream_interval),
            "--disable-uvicorn-access-log",
        ]  # fmt: skip
        if api_key:
            cmd += ["--api-key", api_key]
        env = {
            **offline_env(self.environ),
            "VIRTUAL_ENV": str(python.parent.parent),
            "PATH": f"{python.parent}{os.pathsep}{self.environ.get('PATH', '')}",
        }
        t0 = time.monotonic()
        with log_path.open("wb") as log:
            shown = " ".join("***" if api_key and arg == api_key else arg for arg in cmd)
            log.write(f"$ {shown}\n".encode())
            log.flush()
            proc = subprocess.Popen(
                [sys.executable, "-c", WATCHDOG, *cmd],
                stdin=subprocess.PIPE,  # never written; closes when this process dies
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=str(self.log_dir),
                start_new_session=True,  # own process group: the engine core dies with it
            )
        self.procs.append(proc)
        self.groups[url] = proc.pid  # start_new_session=True: the watchdog leads the group
        deadline = t0 + START_TIMEOUT_S
        while True:
            code = proc.poll()
            if code is not None:
                raise StartError(
                    f"vLLM server exited with code {code} before it was healthy; "
                    f"log {log_path}, last lines:\n{_tail(log_path)}"
                )
            try:
                status, _ = http_get(f"{url}/health", timeout=2.0)
                if status == 200:
                    break
            except OSError:
                pass
            if time.monotonic() > deadline:
                kill_group(proc)
                raise StartError(
                    f"vLLM server not healthy after {START_TIMEOUT_S:.0f} s; "
                    f"log {log_path}, last lines:\n{_tail(log_path)}"
                )
            time.sleep(0.5)
        startup_s = time.monotonic() - t0
        try:
            _, body = http_get(f"{url}/v1/models", api_key=api_key)
            max_model_len = int(json.loads(body)["data"][0]["max_model_len"])
            _, metrics = http_get(f"{url}/metrics", api_key=api_key)
            match = _KV_RE.search(metrics)
            if match is None:
                raise ValueError("no kv_cache_size_tokens in vllm:cache_config_info of /metrics")
            kv_tokens = int(match.group(1))
        except (OSError, ValueError, KeyError, IndexError) as exc:
            kill_group(proc)
            raise StartError(
                f"vLLM server at {url} is healthy but could not be probed: {exc}; log {log_path}"
            ) from exc
        return VllmServer(
            url=url,
            model=SERVED_MODEL,
            max_model_len=max_model_len,
            kv_capacity_tokens=kv_tokens,
            log_path=log_path,
            stream_interval=stream_interval,
            api_key=api_key,
            model_dir=model_dir,
            startup_s=startup_s,
        )

    def stop_all(self) -> None:
        while self.procs:
            kill_group(self.procs.pop())
        self.running.clear()
        self.groups.clear()


class StartError(Exception):
    """A server did not start: vLLM is not set up, exited, or was not healthy in time."""


@pytest.fixture(scope="session")
def vllm_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[..., VllmServer]]:
    """Factory: ``vllm_server(stream_interval=1, *, api_key=None) -> VllmServer``.

    One server per distinct argument set, started on first use and kept for the session.
    """
    servers = Servers(tmp_path_factory.mktemp("vllm"))
    try:
        yield servers
    finally:
        servers.stop_all()
