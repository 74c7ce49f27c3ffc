"""Start the server under test, wait until it answers, stop it — and nothing left behind.

The command runs under a small watchdog that leads its own process group: the server and
everything it starts (vLLM's engine core, workers) live in that group, and stopping sends
SIGINT, then SIGTERM, then SIGKILL to the whole group. The watchdog holds a pipe whose other
end only this process holds: if this process dies, even by SIGKILL, the pipe closes and the
watchdog stops the group, so no server outlives the session. No pytest import here.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from .errors import LLMSpeedError, redact_secrets, secret_values
from .text import known_secrets, printable, register

#: seconds between the signals of a stop: SIGINT, then SIGTERM, then SIGKILL
GRACE_S = (10.0, 5.0)

_WATCHDOG = """
import json, os, signal, subprocess, sys, threading, time
# the secrets to keep out of the log (the server may echo its --api-key): never the server's
forms = [f.encode() for f in json.loads(os.environ.pop("LLMSPEED_REDACT", "[]"))]
forms.sort(key=len, reverse=True)
try:
    server = subprocess.Popen(
        sys.argv[1:], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE if forms else None,
        stderr=subprocess.STDOUT if forms else None,
    )
except OSError as exc:
    print(f"[llmspeed] cannot start {sys.argv[1]!r}: {exc.strerror}", flush=True)
    os._exit(127)
def copy():
    out = sys.stdout.buffer
    for line in iter(lambda: server.stdout.readline(1 << 16), b""):
        for form in forms:
            line = line.replace(form, b"<redacted>")
        out.write(line)
        out.flush()
copier = threading.Thread(target=copy, daemon=True)
if forms:
    copier.start()
for sig in (signal.SIGINT, signal.SIGTERM):  # the group's signals are for the server
    signal.signal(sig, signal.SIG_IGN)
eof = threading.Event()
threading.Thread(target=lambda: (sys.stdin.buffer.read(), eof.set()), daemon=True).start()
while server.poll() is None and not eof.wait(0.5):
    pass
if server.poll() is None:
    print("[llmspeed] the benchmark process is gone: stopping the server", flush=True)
    os.killpg(0, signal.SIGTERM)
    deadline = time.monotonic() + 15
    while server.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    os.killpg(0, signal.SIGKILL)
code = server.returncode
if forms:
    copier.join(5)  # what the server wrote last, into the log
os._exit(code if code >= 0 else 128 - code)  # not sys.exit: the stdin thread is still reading
"""


class LaunchError(LLMSpeedError):
    """The server command could not be started, or did not become healthy."""

    setting = "serve"


#: the lowest port :func:`free_port` draws from
LOW_PORT = 20000


def _ephemeral_low() -> int:
    """Where the kernel's own port choices begin (``bind`` to port 0)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port() -> int:
    """A free loopback port for a server to bind, drawn at random below the kernel's
    ephemeral range: a port the kernel hands out to a ``bind(0)`` (every other test's and
    tool's server) could be taken in the seconds before a slow server binds it, and its
    health check would then reach the other server. Port 0's choice when none is found."""
    low, high = LOW_PORT, _ephemeral_low()
    rng = random.SystemRandom()
    for _ in range(50 if high > low + 100 else 0):
        port = rng.randrange(low, high)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def listener_pids(port: int) -> set[int] | None:
    """The processes that hold a listening TCP socket on ``port`` (Linux's /proc); None where
    that cannot be told (no /proc, or a socket no process shows)."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            rows = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            f = row.split()
            if len(f) > 9 and f[3] == "0A" and int(f[1].rsplit(":", 1)[1], 16) == port:
                inodes.add(f"socket:[{f[9]}]")
    if not inodes:
        return None
    pids = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fds = list((entry / "fd").iterdir())
        except OSError:
            continue
        for fd in fds:
            try:
                link = os.readlink(fd)
            except OSError:  # closed since listed (the listing's own among them)
                continue
            if link in inodes:
                pids.add(int(entry.name))
                break
    return pids or None


def foreign_listener(server: LaunchedServer) -> str | None:
    """The process that listens on the server's port when none of the command's own does
    (Linux): the port was taken by another process before the server bound it, so what
    answered its health check is another server; or the command hands the port to a proxy of
    its own (``docker run -p``). In words, for a note; None when the command's own process
    listens, or when it cannot be told."""
    holders = listener_pids(server.command.port)
    if holders is None or any(_in_group(pid, server.pid) for pid in holders):
        return None
    pid = min(holders)
    try:
        name = Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        name = "?"
    return f"pid {pid} ({printable(name)[:40]})"


def _stat(pid: int) -> list[str] | None:
    """``/proc/PID/stat``'s fields after the command's name (state, parent, group, ...);
    None when the process is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return fields if len(fields) > 2 else None


def _in_group(pid: int, group: int) -> bool:
    fields = _stat(pid)
    return fields is not None and int(fields[2]) == group


@dataclass(frozen=True)
class ServeCommand:
    """A server command as it will run: its words, its port, and how it is shown."""

    words: tuple[str, ...] = field(repr=False)  # as run: secrets included
    port: int
    shown: str  # secrets redacted

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


def plan(command: str) -> ServeCommand:
    """Parse a server command: ``{port}`` becomes a free loopback port, else the command's own
    ``--port N`` is used. LaunchError says what is missing."""
    text = command.strip()
    if not text:
        raise LaunchError("the server command is empty: give the command that starts it")
    port: int | None = None
    if "{port}" in text:
        port = free_port()
        text = text.replace("{port}", str(port))
    try:
        words = shlex.split(text)
    except ValueError as exc:
        raise LaunchError(f"cannot read the server command ({exc})") from None
    if port is None:
        for i, word in enumerate(words):
            value = word.split("=", 1)[1] if word.startswith("--port=") else None
            if word == "--port" and i + 1 < len(words):
                value = words[i + 1]
            if value is not None and value.isdigit():
                port = int(value)
        if port is None:
            raise LaunchError(
                "the server command has no port: put {port} where the port goes "
                "(e.g. vllm serve MODEL --port {port}), or give it --port N"
            )
    if shutil.which(words[0]) is None:
        raise LaunchError(f"the server command {words[0]!r} is not found (not on PATH)")
    joined = shlex.join(words)
    for value in secret_values(joined):  # a server may echo them bare, in its log
        register(value)
    return ServeCommand(tuple(words), port, redact_secrets(joined))


@dataclass
class LaunchedServer:
    """A running server command."""

    command: ServeCommand
    log_path: Path
    proc: subprocess.Popen[bytes]
    started: float = field(default_factory=time.monotonic)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def exit_code(self) -> int | None:
        return self.proc.poll()

    def tail(self, lines: int = 15) -> str:
        try:
            text = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return "(no log)"
        # every known secret (the key, the command's own) out, not only those a pattern
        # sees; the server's bytes without control characters
        return "\n".join(printable(redact_secrets(line)) for line in text[-lines:])

    def exited_message(self, when: str) -> str:
        code = self.exit_code()
        return (
            f"the server command exited with code {code} {when}; its log {self.log_path}, "
            f"last lines:\n{self.tail()}"
        )

    def stop(self) -> None:
        """SIGINT to the whole group, then SIGTERM, then SIGKILL; wait for the watchdog."""
        group = self.proc.pid  # process_group=0: the watchdog leads the group
        for sig, grace in ((signal.SIGINT, GRACE_S[0]), (signal.SIGTERM, GRACE_S[1])):
            if not _group_alive(group):
                break
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(group, sig)
            deadline = time.monotonic() + grace
            while _group_alive(group) and time.monotonic() < deadline:
                time.sleep(0.1)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(group, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=10)
        if self.proc.stdin is not None:
            with contextlib.suppress(OSError):
                self.proc.stdin.close()


def _group_alive(group: int) -> bool:
    try:
        os.killpg(group, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # a zombie leader still counts: look for a live member
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            fields = _stat(int(entry.name))
            if fields is not None and int(fields[2]) == group and fields[0] != "Z":
                return True
    return False


def launch(
    command: ServeCommand,
    log_path: Path,
    *,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
    append: bool = False,
) -> LaunchedServer:
    """Start the command under the watchdog, its output to ``log_path`` (after what it holds
    with ``append``: a restart); ``env`` and ``cwd`` as for ``subprocess.Popen`` (None: this
    process's)."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("ab" if append else "wb") as log:
        log.write(f"$ {command.shown}\n".encode())
        log.flush()
        child_env = dict(os.environ if env is None else env)
        # every secret the plugin knows, as the server may echo it: the watchdog keeps them
        # out of the log (and out of the server's environment)
        child_env["LLMSPEED_REDACT"] = json.dumps(sorted(known_secrets()))
        proc = subprocess.Popen(
            [sys.executable, "-c", _WATCHDOG, *command.words],
            stdin=subprocess.PIPE,  # never written: it closes when this process dies
            stdout=log,
            stderr=subprocess.STDOUT,
            env=child_env,
            cwd=cwd,
            # its own process group (stopped as one), in this session: a new session is a new
            # scheduler autogroup on Linux, and vLLM's CPU build there had its API server
            # starved by its own busy engine (c4 TTFT 10 s, responses in bursts; the same
            # server started from the benchmark's session streamed every 2-3 ms)
            process_group=0,
        )
    return LaunchedServer(command, log_path, proc)


def wait_healthy(server: LaunchedServer, timeout: float) -> float:
    """Wait until ``/health`` or ``/v1/models`` answers 200; returns the seconds it took.
    LaunchError when the command exits first or the time is up (the server is stopped)."""
    deadline = server.started + timeout
    while True:
        if server.exit_code() is not None:
            raise LaunchError(server.exited_message("before it answered"))
        for path in ("/health", "/v1/models"):
            if answers_200(
                server.command.port, path, min(HEALTH_POLL_S, deadline - time.monotonic())
            ):
                return time.monotonic() - server.started
        if time.monotonic() > deadline:
            server.stop()
            raise LaunchError(
                f"the server did not answer /health or /v1/models within {timeout:g} s; its "
                f"log {server.log_path}, last lines:\n{server.tail()}",
                setting="serve_timeout",
            )
        time.sleep(0.5)


#: the most seconds one health poll waits, its whole answer's head included
HEALTH_POLL_S = 2.0


def answers_200(port: int, path: str, within: float) -> bool:
    """Does ``GET path`` on the loopback port answer HTTP 200, its status line within
    ``within`` seconds in all? A bound on the whole poll, not on each read: a server that
    trickles its status line a byte at a time (each read well inside a socket timeout) held
    ``urlopen`` forever, and the serve timeout with it. No redirect is followed."""
    end = time.monotonic() + max(within, 0.05)
    head = b""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=max(within, 0.05)) as sock:
            sock.sendall(f"GET {path} HTTP/1.0\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode())
            while b"\r\n" not in head and len(head) < 1024:
                left = end - time.monotonic()
                if left <= 0:
                    return False
                sock.settimeout(left)
                piece = sock.recv(1024)
                if not piece:
                    break
                head += piece
    except OSError:
        return False
    parts = head.split(b"\r\n", 1)[0].split()
    return len(parts) >= 2 and parts[0].startswith(b"HTTP/") and parts[1] == b"200"


def program(words: tuple[str, ...]) -> str | None:
    """The program a command runs, past ``env``, its options and ``NAME=VALUE`` assignments."""
    i = 0
    if words and Path(words[0]).name == "env":
        i = 1
        while i < len(words):
            word = words[i]
            if word in ("-u", "--unset", "-C", "--chdir", "-S", "--split-string"):
                i += 2
            elif word.startswith("-") or re.match(r"^[A-Za-z_]\w*=", word):
                i += 1
            else:
                break
    return words[i] if i < len(words) else None


def engine_python(command: ServeCommand) -> Path | None:
    """The Python of the engine's environment, when the command names one (a venv's
    ``bin/vllm``, or its ``bin/python``)."""
    name = program(command.words)
    found = shutil.which(name) if name else None
    if found is None:
        return None
    path = Path(found)
    if re.match(r"python[\d.]*$", path.name):
        return path
    for candidate in (path.parent / "python", path.parent / "python3"):
        if candidate.exists():
            return candidate
    return None
