"""What the wire's checks (docs/trust.md) cost the client's hot path: CPU per read of the
checked ``StreamTally`` against the tally of the commit before the checks, alternating.

Every read of a stream goes through ``StreamTally.feed``; the checks add, per read, one regex
search for a count that is not a whole number and a count of events against usage values
(the fast path), or a type check per field (the exact parse). This feeds the same recorded
reads to both tallies, ``--rounds`` rounds in alternating order, and reports the median CPU
per read of each and their paired difference, for three shapes of stream:

- **vLLM, one event a read**: continuous usage on every chunk, compact JSON (the fast path);
- **vLLM, 8 events a read**: the same, read 8 events at a time (a client behind, or a fast
  server);
- **chat, no usage**: chat deltas without usage (the exact parse of every event).

At 128 streams × 2,000 tok/s (benchmarks/results/client_at_scale.md's paced row, 256 K reads/s),
a difference of d ns a read is 256,000 × d ns of CPU a second: 0.026 % of a core per ns.

A decode cell too (``--cell-rounds N``): ``benchmarks.client_at_scale``'s plugin cell (128
streams, 8 s windows) against its lean loopback server, paced (128 × 2,000 tok/s) and unpaced
(the client's ceiling), N rounds of the tree before the checks (a ``git worktree`` of
``--before``) and this tree in alternating order, each in a fresh process: events/s and the
client's CPU share.

    python -m benchmarks.wire_checks_cost [--rounds 9] [--reads 20000] [--before 17de14a]
        [--cell-rounds 4]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

from benchmarks.common import ROOT, fmt, table
from benchmarks.harness import Figure, Outcome, cli
from pytest_llmspeed.core import wire

WIRE = "src/pytest_llmspeed/core/wire.py"
#: the figures' names of the three shapes of stream, in the order of ``streams``
KEYS = ("one_event", "eight_events", "chat")


def old_wire(commit: str) -> ModuleType:
    """``core/wire.py`` as it was at ``commit``, as a module of ``pytest_llmspeed.core`` (its
    relative imports, ``from .errors import …`` since 97d0ab5, read today's package)."""
    text = subprocess.run(
        ["git", "show", f"{commit}:{WIRE}"], cwd=ROOT, check=True, capture_output=True, text=True
    ).stdout
    path = Path(tempfile.mkdtemp()) / "wire_before.py"
    path.write_text(text)
    name = "pytest_llmspeed.core._wire_before"
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def vllm_event(n: int) -> bytes:
    event = {
        "id": "cmpl-0123456789abcdef",
        "object": "text_completion",
        "created": 1764633600,
        "model": "Qwen/Qwen3.5-27B-INT4",
        "choices": [{"index": 0, "text": " word", "logprobs": None, "finish_reason": None}],
        "usage": {"prompt_tokens": 8192, "total_tokens": 8192 + n, "completion_tokens": n},
    }
    return b"data: " + json.dumps(event, separators=(",", ":")).encode() + b"\n\n"


def chat_event() -> bytes:
    event = {
        "id": "chatcmpl-0123456789abcdef",
        "object": "chat.completion.chunk",
        "choices": [{"index": 0, "delta": {"content": " word"}, "finish_reason": None}],
    }
    return b"data: " + json.dumps(event, separators=(",", ":")).encode() + b"\n\n"


def streams(reads: int) -> dict[str, list[bytes]]:
    one = [vllm_event(i + 1) for i in range(reads)]
    eight = [b"".join(vllm_event(8 * i + k + 1) for k in range(8)) for i in range(reads)]
    chat = [chat_event() for _ in range(reads)]
    return {
        "vLLM, one event a read": one,
        "vLLM, 8 events a read": eight,
        "chat, no usage": chat,
    }


def cpu_per_read(tally_class: Callable[[], Any], reads: list[bytes], streams_of: int) -> float:
    """CPU ns per read, ``reads`` fed to fresh tallies of ``streams_of`` reads each."""
    t0 = time.process_time_ns()
    for start in range(0, len(reads), streams_of):
        tally = tally_class()
        t = 0.0
        for data in reads[start : start + streams_of]:
            t += 0.001
            tally.feed(t, data)
        tally.close()
    return (time.process_time_ns() - t0) / len(reads)


def cell_rounds(before: str, rounds: int, duration: float) -> list[list[str]]:
    """The decode cell of each tree, alternating; rows of the medians and paired differences."""
    from benchmarks.client_at_scale import LeanServer

    tree = Path(tempfile.mkdtemp()) / "before"
    subprocess.run(["git", "worktree", "add", "--detach", str(tree), before], cwd=ROOT,
                   check=True, capture_output=True)  # fmt: skip
    rows = []
    try:
        for mode, rate in (("paced 128 × 2,000 tok/s", 2000.0), ("unpaced", 0.0)):
            got: dict[str, list[dict[str, Any]]] = {"before": [], "checked": []}
            for r in range(rounds):
                order = [("before", tree), ("checked", ROOT)]
                for name, root in order if r % 2 == 0 else reversed(order):
                    with LeanServer(rate) as server:
                        env = {**os.environ, "PYTHONPATH": f"{root / 'src'}{os.pathsep}{root}"}
                        out = subprocess.run(
                            [sys.executable, "-m", "benchmarks.client_at_scale", "--one",
                             "plugin", "--url", server.url, "--streams", "128",
                             "--duration", str(duration)],
                            cwd=root, env=env, capture_output=True, text=True, check=True,
                        )  # fmt: skip
                    got[name].append(json.loads(out.stdout.strip().splitlines()[-1]))
            for key, label in (("events_s", "events/s"), ("cpu_share", "client CPU")):
                old = [x[key] for x in got["before"]]
                new = [x[key] for x in got["checked"]]
                diff = [n / o - 1 for n, o in zip(new, old, strict=True) if o]
                show = (lambda v: f"{v:.0%}") if key == "cpu_share" else (lambda v: f"{v:,.0f}")
                rows.append([
                    mode, label, show(statistics.median(old)), show(statistics.median(new)),
                    f"{statistics.median(diff):+.1%} (range {min(diff):+.1%} … {max(diff):+.1%})",
                ])  # fmt: skip
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=ROOT,
                       check=False, capture_output=True)  # fmt: skip
    return rows


def measure(argv: list[str]) -> Outcome:
    """CPU per read of both tallies over the same reads (and a decode cell of each tree with
    ``--cell-rounds``): the figures and the page."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--reads", type=int, default=20000)
    parser.add_argument("--before", default="17de14a", help="the commit before the checks")
    parser.add_argument("--cell-rounds", type=int, default=0)
    parser.add_argument("--duration", type=float, default=8.0)
    args = parser.parse_args(argv)
    before = old_wire(args.before)
    rows = []
    figures: dict[str, Figure] = {}
    for (name, reads), key in zip(streams(args.reads).items(), KEYS, strict=True):
        old: list[float] = []
        new: list[float] = []
        for r in range(args.rounds):
            pair = [(before.StreamTally, old), (wire.StreamTally, new)]
            for cls, out in pair if r % 2 == 0 else reversed(pair):
                out.append(cpu_per_read(cls, reads, 4096))
        diffs = [n - o for n, o in zip(new, old, strict=True)]
        # the checked tally must count the same
        a, b = before.StreamTally(), wire.StreamTally()
        for i, data in enumerate(reads[:4096]):
            a.feed(i * 1e-3, data)
            b.feed(i * 1e-3, data)
        a.close()
        b.close()
        same = list(a.usage_counts) == list(b.usage_counts) and list(a.text_times) == list(
            b.text_times
        )
        figures[f"{key}_before_ns"] = Figure(round(statistics.median(old)), "ns")
        figures[f"{key}_checked_ns"] = Figure(round(statistics.median(new)), "ns")
        figures[f"{key}_diff_ns"] = Figure(round(statistics.median(diffs)), "ns", signed=True)
        figures[f"{key}_same_counts"] = Figure(same, target="True", met=same)
        rows.append(
            [
                name,
                fmt(statistics.median(old), 0),
                fmt(statistics.median(new), 0),
                f"{statistics.median(diffs):+.0f}",
                f"{statistics.median(diffs) * 256_000 / 1e9:+.2%}",
                "yes" if same else "NO",
            ]
        )
    lines = [
        "# The wire's checks: what they cost a read",
        "",
        f"Tallies of {args.before} (before the checks) and of"
        f" this tree, fed the same {args.reads:,} recorded reads, {args.rounds} rounds in"
        " alternating order; CPU per read (process time), median over the rounds.",
        "",
        *table(
            [
                "stream",
                "before, ns/read",
                "checked, ns/read",
                "difference, ns/read",
                "of a core at 256 K reads/s",
                "same counts",
            ],
            rows,
            "lrrrrl",
        ),
        "",
        "256 K reads/s is 128 streams × 2,000 tok/s, one token a read "
        "(benchmarks/results/client_at_scale.md's paced row).",
    ]
    if args.cell_rounds:
        lines += [
            "",
            "## A decode cell",
            "",
            f"benchmarks.client_at_scale's plugin cell (128 streams, {args.duration:g} s windows, "
            f"one token an event) against its lean server, {args.cell_rounds} rounds of each "
            "tree in alternating order, each cell in a fresh process; the paired difference is "
            "checked / before − 1, its median and range over the rounds.",
            "",
            *table(
                ["server", "figure", "before (median)", "checked (median)", "difference"],
                cell_rounds(args.before, args.cell_rounds, args.duration),
                "llrrl",
            ),
        ]
    return Outcome(figures, lines, vars(args))


def main() -> None:
    sys.exit(cli("wire_checks_cost", measure))


if __name__ == "__main__":
    main()
