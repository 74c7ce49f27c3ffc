"""The hostile-server battery's machinery: one hostile server a run (``sim/hostile.py``, in its
own process), the plugin run against it as a user runs it (``python -m pytest`` in a fresh
folder, every output asked for), and what the run left: its terminal, its files, its exit
status, its wall time and its peak memory.

The runs are independent and mostly wait (on timeouts, trickles), so the selected ones run a
few at a time in threads, started once for the module (:func:`battery`); each test then reads
its own run's outcome.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

#: the API key every run uses; no 8 characters of it in a row may reach an output
KEY = "sk-HK9f3Qz7Lw2Xv8Rt"
#: the run's settings (short: the battery runs in CI every time)
TIMEOUT_S = 3
DURATION_S = 1
CELLS = 3  # prefill[1K], decode[1K-c1], decode[1K-c2]
SETTINGS = (
    f"--llm-timeout={TIMEOUT_S}",
    f"--llm-duration={DURATION_S}",
    "--llm-concurrency=1,2",
    "--llm-contexts=1K",
    "--llm-max-output=64",
)
#: the CPU-bound parts of a run that no timeout bounds: the interpreter's and the plugin's
#: imports, a --llm-serve server's start, the outputs written at the end
STARTS_S = 20
#: what a run may take: the probe's reads (each bounded by the timeout), then per cell its
#: window and the waits around it (the wait for an idle server, the first tokens: each bounded
#: by the timeout), plus the issue's 10 s, plus the starts.
#: Chance: a run that hangs never ends, so the bound only has to stand above a correct run's
#: time under load. Quiet, the longest case (health_trickle) takes 20 s, 17 s of it the
#: timeouts' own waits, which load does not stretch; its CPU-bound part, about 3 s, would have
#: to grow 14-fold (two busy loops and three other runs on two cores give each run at least a
#: sixth of a core: 6-fold at worst) to pass 63 s
RUN_BOUND_S = 4 * TIMEOUT_S + CELLS * (DURATION_S + 2 * TIMEOUT_S) + 10 + STARTS_S
#: the plugin's peak memory (issue 29), whatever a server sends
PEAK_RSS_MB = 200
#: runs at a time (most of them wait, not compute)
WORKERS = 4

#: the plugin run, with its peak resident memory (its own and its children's: client
#: processes) written at exit; the test also samples /proc while it runs (a run killed at its
#: bound writes nothing). Its own is /proc's VmHWM, not getrusage's ru_maxrss: Linux carries
#: the forking process's peak into ru_maxrss across exec, so a run started by a test process
#: that had grown to 270 MB read 273 MB for the well-behaved server
_PEAK_WRAPPER = """
import atexit, os, resource, sys

def _hwm():
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    return 0

def _peak():
    kb = max(_hwm(), resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
    with open(os.environ["HOSTILE_PEAK_FILE"], "w") as fh:
        fh.write(str(kb))

atexit.register(_peak)
import pytest
sys.exit(pytest.main())
"""

#: the outputs a run writes (beside its terminal), by name
OUTPUTS = {
    "junit": "out.xml",
    "results": "out.json",
    "page": "out.html",
    "summary": "summary.md",
    "serve log": "llmspeed-serve.log",  # written by the plugin: the server's output, keyless
    "requests": "requests.jsonl",
}


@dataclass(frozen=True)
class Spec:
    """One run: a case of the hostile server, its server options, the plugin's extra options."""

    case: str
    server_args: tuple[str, ...] = ()
    plugin_args: tuple[str, ...] = ()
    serve: bool = False  # the plugin starts the server (--llm-serve), no --llm-api-key


@dataclass
class Outcome:
    """What one run left."""

    spec: Spec
    folder: Path
    exit: int | None  # None: killed at its bound
    wall_s: float
    peak_kb: int
    terminal: str
    files: dict[str, str] = field(default_factory=dict)  # output name → its text
    stats: dict[str, Any] = field(default_factory=dict)  # the server's /_hostile/stats
    server_output: str = ""

    @property
    def results(self) -> dict[str, Any] | None:
        text = self.files.get("results")
        if not text:
            return None
        try:
            doc: dict[str, Any] = json.loads(text)
        except ValueError:
            return None
        return doc

    @property
    def cells(self) -> dict[str, dict[str, Any]]:
        doc = self.results
        return {c["id"]: c for c in doc["cells"]} if doc else {}

    def lines(self) -> list[str]:
        return self.terminal.splitlines()

    def line_with(self, *words: str, any_of: tuple[str, ...] = ()) -> str | None:
        """The first terminal line holding every one of ``words`` and one of ``any_of``
        (case-insensitive)."""
        for line in self.lines():
            low = line.lower()
            if all(w.lower() in low for w in words) and (
                not any_of or any(w.lower() in low for w in any_of)
            ):
                return line
        return None

    def describe(self) -> str:
        """The run's end, for a failure message."""
        tail = "\n".join(self.lines()[-25:])
        return (
            f"case {self.spec.case} {' '.join(self.spec.server_args)}: exit {self.exit}, "
            f"{self.wall_s:.1f} s, peak {self.peak_kb / 1024:.0f} MB, server {self.stats}\n"
            f"--- terminal (last 25 lines) ---\n{tail}"
        )


# -- searches of an output -------------------------------------------------------------------


def key_fragments(key: str = KEY, n: int = 8) -> list[str]:
    """Every ``n`` characters in a row of the key: a key cut short still shows."""
    return [key[i : i + n] for i in range(len(key) - n + 1)]


#: an ESC as each output would carry one: the byte itself; in JUnit as pytest writes a byte XML
#: cannot hold (``#x1B``) or as a character reference; in the page as a character reference or a
#: JSON escape (its data is JSON a script reads). The results' strings are searched decoded. In
#: a terminal or a Markdown text, the six characters ``\u001b`` are text, not an ESC.
_ESC_FORMS = {
    "junit": re.compile(r"\x1b|&#0*27;|&#x0*1b;|#x1B", re.IGNORECASE),
    "page": re.compile(r"\x1b|&#0*27;|&#x0*1b;|\\u001b|\\x1b", re.IGNORECASE),
}
_ESC = re.compile(r"\x1b")


def json_strings(value: Any) -> Iterator[str]:
    """Every string (keys too) of a JSON document."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for k, v in value.items():
            yield k
            yield from json_strings(v)
    elif isinstance(value, list):
        for v in value:
            yield from json_strings(v)


def leaks(name: str, text: str, key: str = KEY) -> list[str]:
    """What an output holds that no output may: (a part of) the key, an ESC byte (raw, or
    written as an XML/HTML character reference or a JSON escape, which become one when read),
    a line beginning ``::`` (a GitHub workflow command). A JSON output is searched in its
    decoded strings too."""
    found = []
    texts = [text]
    if name == "results":
        with contextlib.suppress(ValueError):
            texts += list(json_strings(json.loads(text)))
    for t in texts:
        frags = [f for f in key_fragments(key) if f in t]
        if frags:
            at = t.find(frags[0])
            found.append(f"{name}: the API key ({frags[0]!r}…): {t[max(at - 60, 0) : at + 30]!r}")
            break
    for t in texts:
        m = _ESC_FORMS.get(name, _ESC).search(t)
        if m:
            found.append(
                f"{name}: an ESC ({m.group()!r}): {t[max(m.start() - 60, 0) : m.end() + 30]!r}"
            )
            break
    for t in texts:
        bad = [line for line in t.splitlines() if line.lstrip().startswith("::")]
        if bad:
            found.append(f"{name}: a line beginning '::': {bad[0][:120]!r}")
            break
    for t in texts:  # a server-made line start (the error page's lines, as sent)
        bad = [ln for ln in t.splitlines() if ln.lstrip().startswith(SERVER_LINE_STARTS)]
        if bad:
            found.append(f"{name}: a line the server began: {bad[0][:120]!r}")
            break
    return found


#: how the hostile error page's lines begin (sim/hostile.py's ERROR_PAGE)
SERVER_LINE_STARTS = ("## hostile", "[hostile-link]", "<head><title>502")


# -- one run ---------------------------------------------------------------------------------


@dataclass
class Server:
    proc: subprocess.Popen[str]
    url: str

    def stats(self) -> dict[str, Any]:
        try:
            with urllib.request.urlopen(self.url + "/_hostile/stats", timeout=5) as r:
                doc: dict[str, Any] = json.loads(r.read())
                return doc
        except (OSError, ValueError) as exc:
            return {"error": str(exc)}

    def raw(self, path: str, data: bytes | None = None) -> tuple[int, dict[str, str], bytes]:
        """One request's status, headers and body, as the server sent them (no redirect
        followed): what the positive controls search."""
        headers = {"Authorization": f"Bearer {KEY}"}
        req = urllib.request.Request(self.url + path, data=data, headers=headers)
        opener = urllib.request.build_opener(_NoRedirect)
        try:
            with opener.open(req, timeout=10) as r:
                return r.status, dict(r.headers), r.read()
        except urllib.error.HTTPError as err:
            return err.code, dict(err.headers), err.read()

    def raw_head(self, path: str, limit: int = 4 << 20) -> bytes:
        """The head (status line and headers) of a GET, read off the socket: what an HTTP
        library refuses to parse."""
        host, port = self.url.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port)), timeout=10) as sock:
            sock.sendall(f"GET {path} HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
            data = b""
            while b"\r\n\r\n" not in data and len(data) < limit:
                piece = sock.recv(1 << 16)
                if not piece:
                    break
                data += piece
        return data.split(b"\r\n\r\n", 1)[0]

    def stop(self) -> str:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.close()  # the server ends with its stdin
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        out = self.proc.stdout.read()
        self.proc.stdout.close()
        return out or ""


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


def start_server(case: str, *args: str, api_key: str | None = KEY) -> Server:
    cmd = [sys.executable, "-m", "pytest_llmspeed.sim.hostile", "--case", case, "--port", "0"]
    if api_key is not None:
        cmd += ["--api-key", api_key]
    proc = subprocess.Popen(
        [*cmd, *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if "http://" not in line:
        proc.kill()
        raise RuntimeError(f"the hostile server did not start: {line!r}")
    return Server(proc, "http://" + line.split("http://", 1)[1].split()[0])


def _vm_hwm_kb(pid: int) -> int:
    """Peak resident memory of a process and its children, from /proc (0: gone)."""
    peak = 0
    pids = [pid]
    try:
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        pids += [int(c) for c in children]
    except OSError:
        pass
    for p in pids:
        try:
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmHWM:"):
                    peak = max(peak, int(line.split()[1]))
        except (OSError, ValueError):
            pass
    return peak


def run_plugin(spec: Spec, folder: Path) -> Outcome:
    """Start the case's server, run the plugin against it in ``folder``, stop the server."""
    folder.mkdir(parents=True, exist_ok=True)
    server: Server | None = None
    args = list(SETTINGS)
    if spec.serve:
        serve = (
            f"{sys.executable} -m pytest_llmspeed.sim.hostile --case {spec.case} "
            f"--api-key {KEY} --port {{port}} {' '.join(spec.server_args)}"
        )
        args += [f"--llm-serve={serve}", "--llm-serve-timeout=20"]
    else:
        server = start_server(spec.case, *spec.server_args)
        args += [f"--llm-endpoint={server.url}", f"--llm-api-key={KEY}"]
    args += [
        "-p",
        "no:asyncio",  # as the project's pytester runs: no warning of a test dependency
        "--tb=long",
        "-l",
        f"--junitxml={OUTPUTS['junit']}",
        f"--llm-results={OUTPUTS['results']}",
        f"--llm-html={OUTPUTS['page']}",
        f"--llm-requests={OUTPUTS['requests']}",
        *spec.plugin_args,
    ]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "GITHUB_"))}
    env["GITHUB_STEP_SUMMARY"] = str(folder / OUTPUTS["summary"])
    env["HOSTILE_PEAK_FILE"] = str(folder / "peak_kb")
    env["COLUMNS"] = "120"
    env.pop("LLMSPEED_API_KEY", None)
    env.pop("OPENAI_API_KEY", None)
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-c", _PEAK_WRAPPER, *args],
        cwd=folder,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    chunks: list[bytes] = []

    def read() -> None:
        assert proc.stdout is not None
        for piece in iter(lambda: proc.stdout.read(65536), b""):  # type: ignore[union-attr]
            chunks.append(piece)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    peak = 0
    exit_code: int | None = None
    while True:
        peak = max(peak, _vm_hwm_kb(proc.pid))
        code = proc.poll()
        if code is not None:
            exit_code = code
            break
        if time.perf_counter() - t0 > RUN_BOUND_S:
            proc.kill()
            proc.wait()
            break
        time.sleep(0.1)
    wall = time.perf_counter() - t0
    reader.join(10)
    with contextlib.suppress(OSError, ValueError):
        peak = max(peak, int((folder / "peak_kb").read_text()))
    terminal = b"".join(chunks).decode("utf-8", "replace")
    files = {}
    for name, path in OUTPUTS.items():
        p = folder / path
        if p.exists():
            files[name] = p.read_text("utf-8", "replace")
    stats: dict[str, Any] = {}
    server_output = ""
    if server is not None:
        stats = server.stats()
        server_output = server.stop()
    return Outcome(spec, folder, exit_code, wall, peak, terminal, files, stats, server_output)


def check_common(out: Outcome) -> list[str]:
    """What every run must do (issue 29, "Done when"): end within its bound, stay under the
    memory bound, no INTERNALERROR, and no output holding the key, an ESC or a '::' line."""
    problems = []
    if out.exit is None:
        problems.append(f"did not end within {RUN_BOUND_S} s (killed)")
    if out.peak_kb > PEAK_RSS_MB * 1024:
        problems.append(f"peak RSS {out.peak_kb / 1024:.0f} MB, over {PEAK_RSS_MB} MB")
    if "INTERNALERROR" in out.terminal:
        at = out.terminal.find("INTERNALERROR")
        problems.append(f"INTERNALERROR: {out.terminal[at : at + 300]!r}")
    problems += leaks("terminal", out.terminal)
    for name, text in out.files.items():
        problems += leaks(name, text)
    summary = out.files.get("summary", "")
    if len(summary.encode()) > 1 << 20:
        problems.append(f"the Markdown summary is {len(summary.encode()):,} bytes, over 1 MiB")
    return problems


@pytest.fixture(scope="module")
def battery(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, Future[Outcome]]]:
    """The module's selected runs, started at once (``WORKERS`` at a time): run id → outcome."""
    specs: dict[str, Spec] = request.module.RUNS
    selected = []
    for item in request.session.items:
        callspec = getattr(item, "callspec", None)
        if (
            getattr(item, "module", None) is request.module
            and callspec is not None
            and "run_id" in callspec.params
        ):
            selected.append(callspec.params["run_id"])
    pool = ThreadPoolExecutor(max_workers=WORKERS)
    futures = {
        rid: pool.submit(run_plugin, specs[rid], tmp_path_factory.mktemp(rid, numbered=True))
        for rid in dict.fromkeys(selected)
    }
    yield futures
    pool.shutdown(wait=True, cancel_futures=True)
