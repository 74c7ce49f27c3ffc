"""The live line of a decode window on a real terminal: pytest runs in a pseudo-terminal (a
``pty``), its raw output is checked, and replayed as a terminal would show it. A run without a
terminal (a log) has no live line, no carriage return:
``test_plugin_sim.py::test_progress_lines_when_each_cell_starts_and_ends``."""

import fcntl
import os
import pty
import re
import select
import struct
import subprocess
import sys
import termios
import time

import pytest

pytestmark = pytest.mark.slow  # every test here runs cells on the simulator

LIVE = re.compile(r"\r\x1b\[(\d+)C([^\r\n]*?)\x1b\[K")  # a live update, or an erase (empty)
FIGURES = r"\d/4 s · [\d,]+ tokens · [\d,]+ tok/s now · \d+ in flight"


def on_a_terminal(pytester, *args: str, columns: int) -> str:
    """pytest's raw output when it writes to a terminal ``columns`` wide."""
    main, child = pty.openpty()
    fcntl.ioctl(child, termios.TIOCSWINSZ, struct.pack("HHHH", 24, columns, 0, 0))
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"} | {"TERM": "xterm"}
    cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--llm-endpoint=sim:tiny"]
    cmd += ["-W", "ignore::pytest.PytestDeprecationWarning", "--llm-duration=4", *args]
    proc = subprocess.Popen(
        cmd, cwd=pytester.path, env=env, stdin=subprocess.DEVNULL, stdout=child, stderr=child
    )
    os.close(child)
    out = b""
    deadline = time.monotonic() + 120
    try:
        while time.monotonic() < deadline:
            if select.select([main], [], [], 1.0)[0]:
                try:
                    data = os.read(main, 65536)
                except OSError:  # EIO: every writer closed the terminal
                    break
                if not data:
                    break
                out += data
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(30)
        os.close(main)
    assert proc.returncode == 0, out.decode(errors="replace")
    return out.decode()


def screen(raw: str) -> list[str]:
    """What a terminal shows after ``raw`` (carriage return, cursor forward, erase to the end
    of the line; colours dropped)."""
    lines: list[list[str]] = [[]]
    col = 0
    for m in re.finditer(r"\x1b\[(\d*)([A-Za-z])|.", raw, re.DOTALL):
        line = lines[-1]
        if m.group(2) == "C":
            col += int(m.group(1) or 1)
        elif m.group(2) == "K":
            del line[col:]
        elif m.group(2):
            pass  # colours
        elif m.group() == "\r":
            col = 0
        elif m.group() == "\n":
            lines.append([])
            col = 0
        else:
            line.extend(" " * (col - len(line)))
            line[col : col + 1] = [m.group()]
            col += 1
    return ["".join(line).rstrip() for line in lines]


def test_a_decode_window_is_one_live_line_erased_before_the_result(pytester):
    raw = on_a_terminal(pytester, "--llm-contexts=1K", "--llm-concurrency=1,4", columns=100)
    for n, cell in [(1, "[2/3] decode[1K-c1]"), (4, "[3/3] decode[1K-c4]")]:
        start = raw.index(f"{cell} · window 4 s")
        end = raw.index(f"{cell}: ")
        updates = LIVE.findall(raw, start, end)
        *ticks, erase = updates
        # after pytest's "llmspeed " (9 columns), rewritten in place, then erased. Chance: a 4 s
        # window ticks each second; none only if the loop were 3 s late (worst seen: 0.5 s)
        assert ticks and all(at == "9" for at, _ in updates), updates
        for _, text in ticks:
            assert re.fullmatch(re.escape(cell) + " · " + FIGURES, text), text
            # Chance: a request of 4,096 tokens (the default max output) takes about 8 s at the
            # simulator's speed 1 (two tokens a step of over 4 ms), so none ends inside a 4 s
            # window and all N stay in flight; load only makes them longer
            assert text.endswith(f" {n} in flight")
        assert erase == ("9", "")
    assert "\r\x1b[" not in raw[raw.index("[3/3] decode[1K-c4]: ") :]  # nothing after the cells
    shown = screen(raw)
    assert not [ln for ln in shown if "tok/s now" in ln]  # a person sees no leftover
    # as before there was a live line: pytest's "llmspeed ." under each start line
    assert shown.count("llmspeed .") == 3
    i = next(i for i, ln in enumerate(shown) if ln.startswith("[3/3] decode[1K-c4] · window"))
    assert shown[i + 1 : i + 3] == ["", "llmspeed ."]
    assert shown[i + 3].startswith("[3/3] decode[1K-c4]: ")


def test_a_narrow_terminal_and_verbose_ids(pytester):
    args = ["-v", "-m", "decode", "--llm-contexts=1K", "--llm-concurrency=4"]
    raw = on_a_terminal(pytester, *args, columns=60)
    prefix = "llmspeed::test_decode[1K-c4] "
    updates = LIVE.findall(raw)
    assert len(updates) >= 2
    for at, text in updates:
        assert int(at) == len(prefix)
        assert int(at) + len(text) <= 59, text  # width-limited: never wraps
    # the cell's name goes first (the start line above has it), then the end of the figures.
    # Chance: the first tick comes when the window loop wakes after its 1 s sleep and a
    # /metrics read: "1/4 s" quiet, later where a loaded machine made it late; a 4 s window
    # has ticks unless the loop is 3 s late (the worst lag measured beside busy loops: 0.5 s)
    assert re.match(r"[1-4]/4 s · ", updates[0][1]) and updates[0][1].endswith("…")
    shown = screen(raw)
    assert f"{prefix}PASSED" in [ln[: len(prefix) + 6] for ln in shown]
    assert not [ln for ln in shown if "tok/s now" in ln]


def test_quiet_has_no_live_line(pytester):
    args = ["-q", "-m", "decode", "--llm-contexts=1K", "--llm-concurrency=1"]
    raw = on_a_terminal(pytester, *args, columns=100)
    assert "tok/s now" not in raw and not LIVE.search(raw)
