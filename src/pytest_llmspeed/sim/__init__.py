"""Built-in simulated vLLM server: ``SimOptions``, ``parse_sim_spec``, ``running_simulator``.

Importing this package is light (no aiohttp, no numpy); the server is imported when it starts.
See ``docs/simulator.md``.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl

from .faults import parse_faults
from .profiles import PROFILES, get_profile

if TYPE_CHECKING:
    import subprocess

DEFAULT_PROFILE = "tiny"
#: simulated replicas at most (each one a process)
MAX_REPLICAS = 16

#: ways the simulator can behave like a less vLLM-like OpenAI-compatible server (``quirks``)
QUIRKS = {
    "no-vendor-fields": "answer HTTP 422 to requests with ignore_eos or min_tokens",
    "no-stream-usage": "ignore stream_options: no usage in streamed chunks",
    "final-usage-only": "ignore continuous_usage_stats: usage only in the stream's last chunk",
    "models-500": "answer HTTP 500 on /v1/models (transformers serve offline does)",
    "no-tokenize": "answer HTTP 404 on /tokenize (llama-cpp-python's server has none)",
    "tokenize-extras": "tokenize as llama-cpp-python: POST /extras/tokenize {input}; no /tokenize",
    "tokenize-content": "tokenize as llama.cpp's server: POST /tokenize takes {content}",
    "no-metrics": "answer HTTP 404 on /metrics",
    "text-only": "answer HTTP 400 to prompts given as token ids",
    "text-only-500": "answer HTTP 500 to prompts given as token ids (llama-cpp-python does)",
    "no-reasoning-details": "leave usage.completion_tokens_details (reasoning_tokens) out",
}


def parse_quirks(spec: str | None) -> frozenset[str]:
    """``no-metrics,text-only`` -> the set of quirk names; ``ValueError`` names a bad one."""
    names = {q.strip() for q in (spec or "").replace("+", ",").split(",") if q.strip()}
    unknown = sorted(names - set(QUIRKS))
    if unknown:
        raise ValueError(f"unknown quirk {unknown[0]!r}; valid quirks: {', '.join(QUIRKS)}")
    return frozenset(names)


@dataclass(frozen=True)
class SimOptions:
    """Everything the simulator can be started with (the CLI options, as data)."""

    profile: str = DEFAULT_PROFILE
    host: str = "127.0.0.1"
    port: int = 0
    speed: float = 1.0
    kv_capacity: int | None = None
    max_model_len: int | None = None
    noise: float = 0.0
    seed: int = 0
    api_key: str | None = None
    stream_interval: int = 1
    faults: str | None = None
    quirks: str | None = None
    replicas: int = 1  # simulator processes, each its own engine (the plugin's sim:...?replicas=)
    #: between-start noise: each start multiplies the speed by exp(F·z − F²/2), z standard normal
    start_noise: float = 0.0
    #: seeds that draw (exact, for tests); None: fresh OS entropy at each start
    start_seed: int | None = None
    #: one factor each (docs/simulator.md, "One factor at a time"): the drafts' acceptance
    #: rate (accepted / draft tokens; None: the profile's), the most requests running at once
    #: (vLLM --max-num-seqs; None: the profile's), a KV cache of this many tokens allocated as
    #: vLLM allocates it, preempting under pressure (None: reserve, never preempt)
    #: or "text": each request's from how predictable its prompt is (docs/simulator.md)
    accept: float | str | None = None
    max_num_seqs: int | None = None
    kv_preempt: int | None = None
    #: expose vLLM's --enable-mfu-metrics counters (estimated read bytes per GPU)
    mfu_metrics: bool = False
    #: the speed wandering over minutes, shared by every start with the same drift_seed at the
    #: same moment (engine.Drift): within ±drift of the speed, about one swing per drift_period
    drift: float = 0.0
    drift_period: float = 300.0
    drift_seed: int = 0
    #: a second version with one factor slower: "decode:0.1" (engine.parse_slower)
    slower: str | None = None

    def __post_init__(self) -> None:
        profile = get_profile(self.profile)
        if not 1 <= self.replicas <= MAX_REPLICAS:
            raise ValueError(f"replicas must be in 1..{MAX_REPLICAS}, got {self.replicas}")
        if self.replicas > 1 and self.port != 0:
            raise ValueError("several replicas need free ports: leave port out (0)")
        if not self.speed > 0:
            raise ValueError(f"speed must be positive, got {self.speed}")
        if not 0 <= self.noise < 1:
            raise ValueError(f"noise must be a fraction in [0, 1), got {self.noise}")
        if not 0 <= self.start_noise < 1:
            raise ValueError(f"start_noise must be a fraction in [0, 1), got {self.start_noise}")
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port must be in 0..65535, got {self.port}")
        if self.stream_interval < 1:
            raise ValueError(f"stream_interval must be at least 1, got {self.stream_interval}")
        if self.max_model_len is not None and self.max_model_len < 2:
            raise ValueError(f"max_model_len must be at least 2, got {self.max_model_len}")
        if isinstance(self.accept, str) and self.accept != "text":
            raise ValueError(f"accept must be an acceptance rate or text, got {self.accept!r}")
        if isinstance(self.accept, float | int) and not 0 <= self.accept <= 1:
            raise ValueError(f"accept must be an acceptance rate in [0, 1], got {self.accept}")
        if self.max_num_seqs is not None and self.max_num_seqs < 1:
            raise ValueError(f"max_num_seqs must be at least 1, got {self.max_num_seqs}")
        if self.kv_capacity is not None and self.kv_preempt is not None:
            raise ValueError(
                "kv_capacity and kv_preempt are two ways to size the KV cache: give one "
                "(kv_preempt preempts under pressure, kv_capacity makes requests wait)"
            )
        for name in ("kv_capacity", "kv_preempt"):
            size = getattr(self, name)
            if size is not None and size < profile.block_size:
                raise ValueError(
                    f"{name} must be at least one block ({profile.block_size} tokens), got {size}"
                )
        kv_name = "kv_capacity" if self.kv_preempt is None else "kv_preempt"
        if self.effective_kv_capacity < self.effective_max_model_len:
            raise ValueError(
                f"{kv_name} {self.effective_kv_capacity} is smaller than max_model_len "
                f"{self.effective_max_model_len}: one full-length request would never fit; "
                f"lower max_model_len or raise {kv_name}"
            )
        parse_faults(self.faults)
        parse_quirks(self.quirks)
        if not 0 <= self.drift < 1:
            raise ValueError(f"drift must be a fraction in [0, 1), got {self.drift}")
        if not self.drift_period > 0:
            raise ValueError(f"drift_period must be positive seconds, got {self.drift_period}")
        if self.slower is not None:
            from .engine import parse_slower  # numpy: only when asked for

            parse_slower(self.slower)

    @property
    def effective_max_model_len(self) -> int:
        """max_model_len after the profile default."""
        return self.max_model_len or get_profile(self.profile).max_model_len

    @property
    def effective_kv_capacity(self) -> int:
        """KV capacity in tokens after the profile default, rounded down to whole blocks."""
        profile = get_profile(self.profile)
        capacity = self.kv_preempt or self.kv_capacity or profile.kv_capacity_tokens
        return capacity // profile.block_size * profile.block_size


def accept_value(value: str) -> float | str:
    """``accept``: an acceptance rate, or ``text`` (each request's from its prompt)."""
    return "text" if value.strip().lower() == "text" else float(value)


def _flag(value: str) -> bool:
    """A switch in a simulator spec: ``mfu_metrics`` or ``mfu_metrics=1`` / ``true`` / ``0``."""
    if value.lower() in ("1", "true", "yes", ""):
        return True
    if value.lower() in ("0", "false", "no"):
        return False
    raise ValueError(value)


_CONVERTERS: dict[str, Any] = {
    "host": str,
    "port": int,
    "speed": float,
    "kv_capacity": int,
    "max_model_len": int,
    "noise": float,
    "seed": int,
    "api_key": str,
    "stream_interval": int,
    "faults": str,
    "quirks": str,
    "replicas": int,
    "start_noise": float,
    "start_seed": int,
    "accept": accept_value,
    "max_num_seqs": int,
    "kv_preempt": int,
    "mfu_metrics": _flag,
    "drift": float,
    "drift_period": float,
    "drift_seed": int,
    "slower": str,
}


def parse_sim_spec(spec: str) -> SimOptions:
    """``sim``, ``sim:PROFILE`` or ``sim:PROFILE?speed=10&noise=0.03`` -> :class:`SimOptions`."""
    text = spec.strip()
    if text == "sim":
        return SimOptions()
    if not text.startswith("sim:"):
        raise ValueError(
            f"simulator spec {spec!r} must be 'sim' or 'sim:PROFILE?key=value&...'; "
            f"profiles: {', '.join(sorted(PROFILES))}"
        )
    profile, _, query = text[4:].partition("?")
    profile = profile or DEFAULT_PROFILE
    if profile not in PROFILES:
        raise ValueError(
            f"unknown simulator profile {profile!r} in {spec!r}; "
            f"valid profiles: {', '.join(sorted(PROFILES))}"
        )
    values: dict[str, Any] = {}
    valid = ", ".join(_CONVERTERS)
    for key, raw in parse_qsl(query, keep_blank_values=True):
        name = key.strip().replace("-", "_")
        if name not in _CONVERTERS:
            raise ValueError(
                f"unknown simulator option {key!r} in {spec!r}; valid options: {valid}"
            )
        if name in values:
            raise ValueError(f"simulator option {key!r} given twice in {spec!r}")
        try:
            values[name] = _CONVERTERS[name](raw)
        except ValueError:
            kind = {int: "an integer", _flag: "1 or 0", accept_value: "a number or text"}.get(
                _CONVERTERS[name], "a number"
            )
            raise ValueError(
                f"bad value {raw!r} for simulator option {key!r} in {spec!r}: expected {kind}"
            ) from None
    try:
        return SimOptions(profile=profile, **values)
    except ValueError as exc:
        raise ValueError(f"bad simulator spec {spec!r}: {exc}") from None


class _SimThread(threading.Thread):
    def __init__(self, options: SimOptions) -> None:
        super().__init__(name="llmspeed-sim", daemon=True)
        self.options = options
        self.ready = threading.Event()
        self.url: str | None = None
        self.error: BaseException | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self.stop_event: asyncio.Event | None = None

    def run(self) -> None:
        asyncio.run(self._main())

    async def _main(self) -> None:
        from .server import SimServer

        server = SimServer(self.options)
        try:
            url = await server.start()
        except BaseException as exc:  # reported to the caller's thread
            self.error = exc
            await server.stop()
            self.ready.set()
            return
        self.loop = asyncio.get_running_loop()
        self.stop_event = asyncio.Event()
        self.url = url
        self.ready.set()
        try:
            await self.stop_event.wait()
        finally:
            await server.stop()

    def stop(self) -> None:
        if self.loop is not None and self.stop_event is not None:
            self.loop.call_soon_threadsafe(self.stop_event.set)


SWITCH_INTERVAL_S = 0.0005


@contextmanager
def running_simulator(options: SimOptions | None = None) -> Iterator[str]:
    """Run the simulator in its own thread and event loop; yield its base URL.

    While it runs, the interpreter's thread switch interval is lowered from 5 ms to 0.5 ms:
    the simulator and an in-process client share the GIL, and a 5 ms hand-over would show up
    in every TTFT the client measures.
    """
    thread = _SimThread(options or SimOptions())
    interval = sys.getswitchinterval()
    sys.setswitchinterval(min(interval, SWITCH_INTERVAL_S))
    thread.start()
    thread.ready.wait()
    if thread.error is not None:
        thread.join()
        raise RuntimeError(f"llmspeed-sim failed to start: {thread.error}") from thread.error
    try:
        assert thread.url is not None
        yield thread.url
    finally:
        thread.stop()
        thread.join(timeout=30)
        sys.setswitchinterval(interval)


def cli_args(options: SimOptions) -> list[str]:
    """The ``python -m pytest_llmspeed.sim`` arguments that start ``options``."""
    args = [
        "--profile",
        options.profile,
        "--host",
        options.host,
        "--port",
        str(options.port),
        "--speed",
        repr(options.speed),
        "--noise",
        repr(options.noise),
        "--seed",
        str(options.seed),
        "--stream-interval",
        str(options.stream_interval),
    ]
    if options.start_noise:
        args += ["--start-noise", repr(options.start_noise)]
    if options.drift:
        args += ["--drift", repr(options.drift), "--drift-period", repr(options.drift_period)]
        args += ["--drift-seed", str(options.drift_seed)]
    if options.mfu_metrics:
        args.append("--enable-mfu-metrics")
    for flag, value in (
        ("--kv-capacity", options.kv_capacity),
        ("--max-model-len", options.max_model_len),
        ("--api-key", options.api_key),
        ("--faults", options.faults),
        ("--quirks", options.quirks),
        ("--start-seed", options.start_seed),
        ("--accept", None if options.accept is None else str(options.accept)),
        ("--max-num-seqs", options.max_num_seqs),
        ("--kv-preempt", options.kv_preempt),
        ("--slower", options.slower),
    ):
        if value is not None:
            args += [flag, str(value)]
    return args


def serve_command(spec: str) -> str:
    """The command line that starts the simulator of ``spec`` (``sim:PROFILE?options``) on the
    port ``{port}`` names, for ``--llm-serve`` and ``--llm-serve-baseline``: an A/B of two
    simulated versions (``sim:tiny`` against ``sim:tiny?slower=decode:0.1``) started, stopped
    and restarted by the plugin as it does a real server. ValueError for a bad spec, or one of
    several replicas (one command starts one server)."""
    import shlex

    options = parse_sim_spec(spec)
    if options.replicas > 1:
        raise ValueError(
            f"{spec!r}: one command starts one server; replicas are for --llm-endpoint"
        )
    args = cli_args(dataclasses.replace(options, host="127.0.0.1", port=0))
    at = args.index("--port")
    quoted = [shlex.quote(a) for a in args]
    quoted[at + 1] = "{port}"
    return " ".join([shlex.quote(sys.executable), "-m", "pytest_llmspeed.sim", *quoted])


@contextmanager
def running_simulator_process(
    options: SimOptions | None = None, start_timeout: float = 60.0
) -> Iterator[str]:
    """Run the simulator in a child process (its own interpreter, so its own GIL and core);
    yield its base URL. The plugin uses this for ``--llm-endpoint=sim``: in-process, the
    simulator and the client share one GIL, and at high token rates that shared core, not the
    simulated engine, sets the pace (measured: the reference matrix at 10x tops out near 10K
    tok/s on a busy 2-core machine in-process, against 31K in the profile)."""
    import collections
    import os
    import subprocess

    opts = options or SimOptions()
    # --exit-with-stdin: the child stops when this process's end of its stdin closes, which
    # the OS does however this process ends (a traceback in a hook, SIGKILL): no simulator
    # outlives the session
    cmd = [sys.executable, "-m", "pytest_llmspeed.sim", *cli_args(opts), "--exit-with-stdin"]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        cmd,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    stdout, stderr = proc.stdout, proc.stderr
    assert stdout is not None and stderr is not None  # stdout=PIPE, stderr=PIPE
    # both pipes read to their end in threads of their own, so that a chatty child never
    # blocks on a full pipe; stderr's last lines are kept for a start that fails
    err_tail: collections.deque[str] = collections.deque(maxlen=50)
    first: list[str] = []

    def read_out() -> None:
        first.append(stdout.readline())
        for _ in stdout:
            pass

    readers = [
        threading.Thread(target=read_out, daemon=True, name="llmspeed-sim stdout"),
        threading.Thread(
            target=err_tail.extend, args=(stderr,), daemon=True, name="llmspeed-sim stderr"
        ),
    ]
    for reader in readers:
        reader.start()
    try:
        deadline = time.monotonic() + start_timeout
        while not first and proc.poll() is None and time.monotonic() < deadline:
            readers[0].join(0.05)
        url = None
        if first and "http://" in first[0]:
            url = first[0].split("http://", 1)[1].split()[0]
        if url is None:
            _stop_child(proc)
            readers[1].join(10)
            err = "".join(err_tail).strip()[-500:]
            raise RuntimeError(f"llmspeed-sim failed to start: {err}")
        yield "http://" + url
    finally:
        _stop_child(proc)
        # every pipe closed (-W error, -X dev: no ResourceWarning): the readers first reach
        # the pipes' end, which the child's exit gives them
        for reader in readers:
            reader.join(10)
        for pipe in (proc.stdin, stdout, stderr):
            if pipe is not None:
                with contextlib.suppress(OSError):
                    pipe.close()


def _stop_child(proc: subprocess.Popen[str]) -> None:
    """Stop the simulator's process (SIGTERM, then SIGKILL) and reap it."""
    import subprocess

    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


@contextmanager
def running_simulator_processes(
    options: SimOptions | None = None, start_timeout: float = 60.0
) -> Iterator[list[str]]:
    """``options.replicas`` simulators, each in its own process with its own engine (replica
    i draws its randomness from ``seed + i``, and its start factor from ``start_seed + i`` when
    given: each replica is a start of its own); yield their base URLs."""
    import dataclasses

    opts = options or SimOptions()
    with contextlib.ExitStack() as stack:
        urls = [
            stack.enter_context(
                running_simulator_process(
                    dataclasses.replace(
                        opts,
                        seed=opts.seed + i,
                        start_seed=None if opts.start_seed is None else opts.start_seed + i,
                        replicas=1,
                    ),
                    start_timeout,
                )
            )
            for i in range(opts.replicas)
        ]
        yield urls


__all__ = [
    "PROFILES",
    "SimOptions",
    "cli_args",
    "parse_sim_spec",
    "running_simulator",
    "running_simulator_process",
    "running_simulator_processes",
]
