"""What the plugin costs a repository's unit tests when no selected test needs the server.

``pytest`` on one unit test, with ``llm_endpoint`` in the ini file (the simulator; a server
that is down), and with the plugin installed but no endpoint, against ``pytest -p
no:llmspeed`` (the plugin not loaded at all). Goal: within 20 ms of ``-p no:llmspeed``.

    python -m benchmarks.unused_plugin_cost [--rounds 40]

Each round runs every case once, in a shuffled order, so a machine that gets busier slows a
round, not one case; the figure of a case is the median over rounds of its difference from
the same round's ``-p no:llmspeed`` run, with the 10th and 90th percentiles. Also measured:
the import of the plugin's entry module in a fresh interpreter that has imported pytest, and
what one run imports that ``-p no:llmspeed`` does not (``-X importtime``).

Every run reads bytecode caches, as an installed package has them: the runs write them to a
temporary ``PYTHONPYCACHEPREFIX`` even where ``PYTHONDONTWRITEBYTECODE`` is set (where it is,
every import compiles its source, which costs more than the import: ``--no-bytecode`` measures
that, into ``unused_plugin_cost_no_bytecode.md``).
"""

from __future__ import annotations

import argparse
import os
import random
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.common import RESULTS, command, loadavg, machine, table, utc_now, write_page

UNIT_TEST = "def test_arithmetic():\n    assert 1 + 1 == 2\n"
GOAL_MS = 20.0
PYTEST = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"]


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(int(q * len(ordered)), len(ordered) - 1)]


def folder(root: Path, name: str, ini: str) -> Path:
    where = root / name
    where.mkdir()
    (where / "pytest.ini").write_text(f"[pytest]\n{ini}")
    (where / "test_unit.py").write_text(UNIT_TEST)
    return where


ENV = dict(os.environ)


def timed(args: list[str], cwd: Path) -> tuple[float, float, int]:
    """Wall seconds and CPU seconds (user + system) of one pytest run, and its exit status."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        args, cwd=cwd, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)  # reaped here: Popen must not wait
    return wall, usage.ru_utime + usage.ru_stime, proc.returncode


def import_seconds(repeat: int) -> list[float]:
    """The plugin's entry module imported in a fresh interpreter that has imported pytest."""
    code = (
        "import time, pytest\n"
        "t = time.perf_counter()\n"
        "import pytest_llmspeed.plugin\n"
        "print(time.perf_counter() - t)\n"
    )
    run = [sys.executable, "-c", code]
    return [
        float(subprocess.run(run, capture_output=True, text=True, env=ENV).stdout)
        for _ in range(repeat)
    ]


def imported(args: list[str], cwd: Path, runs: int) -> dict[str, int]:
    """Module → its own import µs (without the modules it imports), the least of ``runs``
    runs (``-X importtime``)."""
    cmd = [sys.executable, "-X", "importtime", *args[1:]]
    out: dict[str, int] = {}
    for _ in range(runs):
        err = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, env=ENV).stderr
        for line in err.splitlines():
            if line.startswith("import time:") and "|" in line and "cumulative" not in line:
                own, _, name = line.split("|", 2)
                us = int(own.removeprefix("import time:"))
                out[name.strip()] = min(us, out.get(name.strip(), us))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument(
        "--no-bytecode", action="store_true", help="no bytecode caches: every import compiles"
    )
    parser.add_argument("--out", type=Path, help="the results page (default: in results/)")
    args = parser.parse_args(argv)
    pages = {False: "unused_plugin_cost.md", True: "unused_plugin_cost_no_bytecode.md"}
    out = args.out or RESULTS / pages[args.no_bytecode]
    load_before = loadavg()
    with (
        tempfile.TemporaryDirectory() as tmp,
        tempfile.TemporaryDirectory() as pycache,
        socket.socket() as refusing,
    ):
        if args.no_bytecode:
            ENV["PYTHONDONTWRITEBYTECODE"] = "1"
        else:
            ENV.pop("PYTHONDONTWRITEBYTECODE", None)
            ENV["PYTHONPYCACHEPREFIX"] = pycache
        refusing.bind(("127.0.0.1", 0))  # bound, not listening: connections refused
        down = f"http://127.0.0.1:{refusing.getsockname()[1]}"
        root = Path(tmp)
        sim = folder(root, "sim", "llm_endpoint = sim\n")
        cases = {
            "`-p no:llmspeed` (ini: sim)": ([*PYTEST, "-p", "no:llmspeed"], sim),
            "plugin, no endpoint": (PYTEST, folder(root, "none", "")),
            "plugin, ini `llm_endpoint = sim`": (PYTEST, sim),
            "plugin, ini endpoint down": (PYTEST, folder(root, "down", f"llm_endpoint = {down}\n")),
        }
        reference = next(iter(cases))
        for cmd, cwd in cases.values():  # warm-up: bytecode caches, the file system
            timed(cmd, cwd)
        imports = import_seconds(max(args.rounds // 2, 5))
        wall: dict[str, list[float]] = {name: [] for name in cases}
        cpu: dict[str, list[float]] = {name: [] for name in cases}
        status: dict[str, set[int]] = {name: set() for name in cases}
        order = list(cases)
        for _ in range(args.rounds):
            random.shuffle(order)
            for name in order:
                took, used, rc = timed(*cases[name])
                wall[name].append(took)
                cpu[name].append(used)
                status[name].add(rc)
        extra_imports = imported(*cases["plugin, ini `llm_endpoint = sim`"], runs=5)
        base_imports = imported(*cases[reference], runs=1)
    load_after = loadavg()

    def ms(values: list[float]) -> str:
        low, high = quantile(values, 0.1) * 1000, quantile(values, 0.9) * 1000
        return f"{statistics.median(values) * 1000:.0f} ({low:.0f}–{high:.0f})"

    def paired(values: list[float], ref: list[float]) -> tuple[float, str]:
        """The median of the per-round differences (ms), and it in words with its spread."""
        diffs = [(v - r) * 1000 for v, r in zip(values, ref, strict=True)]
        diff = statistics.median(diffs)
        return diff, f"{diff:+.1f} ({quantile(diffs, 0.1):+.0f} … {quantile(diffs, 0.9):+.0f})"

    rows = []
    verdicts = []  # (case, best wall extra, CPU extra, passed)
    for name in cases:
        exit_ = "/".join(map(str, sorted(status[name])))
        best = f"{min(wall[name]) * 1000:.0f}"
        if name == reference:
            rows.append((name, exit_, ms(wall[name]), best, ms(cpu[name]), "–", "–", "–"))
            continue
        _, wall_words = paired(wall[name], wall[reference])
        best_diff = (min(wall[name]) - min(wall[reference])) * 1000
        cpu_diff, cpu_words = paired(cpu[name], cpu[reference])
        rows.append(
            (
                name,
                exit_,
                ms(wall[name]),
                best,
                ms(cpu[name]),
                wall_words,
                f"{best_diff:+.1f}",
                cpu_words,
            )
        )
        verdicts.append((name, best_diff, cpu_diff, status[name] == {0}))
    worst = max(verdicts, key=lambda v: max(v[1], v[2]))
    passed = all(v[3] for v in verdicts)
    within = max(worst[1], worst[2]) <= GOAL_MS and passed
    new = sorted(
        ((m, us) for m, us in extra_imports.items() if m not in base_imports),
        key=lambda mu: -mu[1],
    )
    lines = [
        "# What the plugin costs unit tests that need no server",
        "",
        f"Command: `{command('benchmarks.unused_plugin_cost', argv)}`. Date: {utc_now()}. "
        f"Machine: {machine()}, load average {load_before} before, {load_after} after. "
        + (
            "No bytecode caches: every import compiles its source (the other page: "
            f"[{pages[False]}]({pages[False]}))."
            if args.no_bytecode
            else "With bytecode caches, as an installed package has them (without them every "
            f"import also compiles its source: [{pages[True]}]({pages[True]}))."
        ),
        "",
        f"**{'Within' if within else 'Not within'} the goal: the costliest case "
        f"({worst[0]}) costs {worst[2]:+.1f} ms of CPU (median of {args.rounds} rounds) and "
        f"{worst[1]:+.1f} ms of wall time (best runs) over `-p no:llmspeed`; goal ≤ "
        f"{GOAL_MS:.0f} ms" + ("" if passed else "; and a case did not pass") + ".**",
        "",
        "`pytest -q -p no:cacheprovider` on one unit test, each case once a round in a "
        "shuffled order. *Exit*: every exit status seen. Times are medians with their 10th–90th "
        "percentiles, and the best (least disturbed) run; *extra* compares with `-p "
        "no:llmspeed`: the median of the per-round differences (with their 10th–90th "
        "percentiles), or the best runs'. On a shared machine the wall time of a run moves with "
        "other processes by far more than the plugin costs (see the percentiles); the CPU time "
        "of the pytest process (user + system) and the best run are what show the plugin's "
        "own cost, and the verdict uses them. The wall time's best run would also show "
        "waiting, on a network say.",
        "",
        *table(
            [
                "case",
                "exit",
                "wall ms",
                "best wall ms",
                "CPU ms",
                "extra wall ms",
                "extra best wall ms",
                "extra CPU ms",
            ],
            rows,
            "lrrrrrrr",
        ),
        "",
        f"Importing `pytest_llmspeed.plugin` after pytest, in a fresh interpreter: median "
        f"{statistics.median(imports) * 1000:.1f} ms ({len(imports)} interpreters; "
        f"{quantile(imports, 0.1) * 1000:.1f}–{quantile(imports, 0.9) * 1000:.1f} ms).",
        "",
        "What a run with `llm_endpoint = sim` imports that `-p no:llmspeed` does not "
        f"(`-X importtime`: each module's own time, the least of 5 runs, inflated by the "
        f"measurement; {len(new)} modules, the 12 costliest):",
        "",
        *table(["module", "ms"], [(f"`{m}`", f"{us / 1000:.1f}") for m, us in new[:12]], "lr"),
    ]
    write_page(out, lines)
    return 0 if within else 1


if __name__ == "__main__":
    sys.exit(main())
