"""What the plugin costs a repository's unit tests when no selected test needs the server.

``pytest`` on one unit test with the plugin installed and no endpoint, with ``llm_endpoint =
sim`` in the ini file, and with an endpoint that is down in the ini file, each against ``pytest
-p no:llmspeed`` (the plugin not loaded at all) run right before or after it (the order drawn
each time), in two environments:

- **bytecode**: Python writes and reads its bytecode caches, and pytest its rewritten copies
  (``__pycache__``; here a fresh ``PYTHONPYCACHEPREFIX``, filled by a warm-up);
- **no bytecode**: ``PYTHONDONTWRITEBYTECODE=1``, as in many containers, over a package
  installed by pip, which compiles every module when it installs it: the regular caches are
  there (here compiled into a second prefix, with ``compileall`` for the plugin's modules), but
  pytest can never cache what it rewrites: a module pytest's assertion-rewriting hook imports
  is parsed and compiled again on every run.

Goal: within 20 ms of CPU (user + system of the pytest process) of ``-p no:llmspeed`` in every
case. The figure of a case is the median over rounds of its difference from the paired
``-p no:llmspeed`` run, with the 10th and 90th percentiles and its standard error (bootstrap).
On a shared machine those pairs spread by ±100 ms, so the instructions each run executes are
counted too, once each (``valgrind --tool=cachegrind``, deterministic with
``PYTHONHASHSEED=0``: the same run gives the same count to 0.01 %), and turned into ms at the
rate of the reference's least disturbed runs (its 10th percentile of CPU time over its count):
where valgrind is installed the verdict reads those, the CPU time's medians beside them.

    python -m benchmarks.unused_plugin_cost [--rounds 40] [--src OTHER_CHECKOUT/src]

``--src`` measures the package of another checkout (a worktree of an earlier commit, say),
put first on ``PYTHONPATH`` ahead of the installed one.

Also listed: what a run imports that ``-p no:llmspeed`` does not (``-X importtime``), and
which of the plugin's modules pytest's hook loaded (parsed on every run without bytecode).
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.common import loadavg, machine, table
from benchmarks.harness import Figure, Outcome, cli

UNIT_TEST = "def test_arithmetic():\n    assert 1 + 1 == 2\n"
GOAL_MS = 20.0
PYTEST = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"]
SRC = Path(__file__).resolve().parents[1] / "src"
REFERENCE = "`-p no:llmspeed`"
MODES = ("bytecode", "no bytecode")

# which of the package's modules pytest's assertion-rewriting hook loaded, after a run
HOOKED = """
import sys, pytest
rc = pytest.main(sys.argv[1:])
hooked = sorted(
    name for name, mod in list(sys.modules.items())
    if name.split(".")[0] == "pytest_llmspeed"
    and type(getattr(mod, "__loader__", None)).__name__ == "AssertionRewritingHook"
)
print("HOOKED", " ".join(hooked) or "-")
sys.exit(rc)
"""


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(int(q * len(ordered)), len(ordered) - 1)]


def folder(root: Path, name: str, ini: str) -> Path:
    where = root / name
    where.mkdir()
    (where / "pytest.ini").write_text(f"[pytest]\n{ini}")
    (where / "test_unit.py").write_text(UNIT_TEST)
    return where


def environment(mode: str, prefix: Path, src: Path) -> dict[str, str]:
    env = dict(os.environ, PYTHONPYCACHEPREFIX=str(prefix))
    if src != SRC:
        env["PYTHONPATH"] = os.pathsep.join([str(src), *filter(None, [env.get("PYTHONPATH")])])
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    if mode == "no bytecode":
        env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


def timed(args: list[str], cwd: Path, env: dict[str, str]) -> tuple[float, float, int]:
    """Wall seconds and CPU seconds (user + system) of one pytest run, and its exit status."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        args, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)  # reaped here: Popen must not wait
    return wall, usage.ru_utime + usage.ru_stime, proc.returncode


def prepare(prefix: Path, mode: str, runs: list[tuple[list[str], Path]], src: Path) -> None:
    """Fill ``prefix`` with the caches the environment has: every case run once writing
    them; without bytecode, also the plugin's regular caches (pip's compile at install) and
    none of pytest's rewritten copies (it cannot write them there)."""
    writing = environment("bytecode", prefix, src)
    for args, cwd in runs:
        timed(args, cwd, writing)
    if mode == "no bytecode":
        subprocess.run(
            [sys.executable, "-m", "compileall", "-q", str(src / "pytest_llmspeed")],
            env=writing,
            check=True,
        )
        for pyc in prefix.rglob("*-pytest-*.pyc"):
            pyc.unlink()


def imported(args: list[str], cwd: Path, env: dict[str, str], runs: int) -> dict[str, int]:
    """Module → its own import µs (without the modules it imports), the least of ``runs``
    runs (``-X importtime``)."""
    cmd = [sys.executable, "-X", "importtime", *args[1:]]
    out: dict[str, int] = {}
    for _ in range(runs):
        err = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, env=env).stderr
        for line in err.splitlines():
            if line.startswith("import time:") and "|" in line and "cumulative" not in line:
                own, _, name = line.split("|", 2)
                us = int(own.removeprefix("import time:"))
                out[name.strip()] = min(us, out.get(name.strip(), us))
    return out


def hooked(args: list[str], cwd: Path, env: dict[str, str]) -> str:
    done = subprocess.run(
        [sys.executable, "-c", HOOKED, *args[3:]], cwd=cwd, capture_output=True, text=True, env=env
    )
    line = next((x for x in done.stdout.splitlines() if x.startswith("HOOKED ")), "HOOKED ?")
    return line.removeprefix("HOOKED ")


def instructions(args: list[str], cwd: Path, env: dict[str, str]) -> int | None:
    """Instructions one run executes, its processes together (valgrind's cachegrind without
    the cache simulation); None without valgrind."""
    valgrind = shutil.which("valgrind")
    if valgrind is None:
        return None
    cmd = [valgrind, "--tool=cachegrind", "--cache-sim=no", "--cachegrind-out-file=/dev/null"]
    done = subprocess.run(
        [*cmd, *args],
        cwd=cwd,
        env=dict(env, PYTHONHASHSEED="0"),
        capture_output=True,
        text=True,
    )
    counts = [
        int(line.rsplit(":", 1)[1].replace(",", ""))
        for line in done.stderr.splitlines()
        if "I   refs:" in line or "I refs:" in line
    ]
    return sum(counts) or None


def standard_error(diffs: list[float], resamples: int = 2000) -> float:
    """The bootstrap standard error of the median of ``diffs``."""
    draw = random.Random(0)
    medians = [statistics.median(draw.choices(diffs, k=len(diffs))) for _ in range(resamples)]
    return statistics.stdev(medians)


def measure(argv: list[str]) -> Outcome:
    """Each case's CPU time over the paired ``-p no:llmspeed`` runs (and its instructions
    where valgrind is installed): the figures and the page."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--src", type=Path, default=SRC, help="the package's folder (src/)")
    args = parser.parse_args(argv)
    load_before = loadavg()
    with tempfile.TemporaryDirectory() as tmp, socket.socket() as refusing:
        refusing.bind(("127.0.0.1", 0))  # bound, not listening: connections refused
        down = f"http://127.0.0.1:{refusing.getsockname()[1]}"
        root = Path(tmp)
        sim = folder(root, "sim", "llm_endpoint = sim\n")
        reference = ([*PYTEST, "-p", "no:llmspeed"], sim)
        cases = {
            "plugin, no endpoint": (PYTEST, folder(root, "none", "")),
            "plugin, ini `llm_endpoint = sim`": (PYTEST, sim),
            "plugin, ini endpoint down": (PYTEST, folder(root, "down", f"llm_endpoint = {down}\n")),
        }
        envs = {}
        for mode in MODES:
            prefix = root / f"pycache {mode}"
            prepare(prefix, mode, [reference, *cases.values()], args.src.resolve())
            envs[mode] = environment(mode, prefix, args.src.resolve())
        cpu: dict[tuple[str, str], list[float]] = {}  # (mode, case) → CPU s of each run
        ref_cpu: dict[tuple[str, str], list[float]] = {}  # ... of the paired reference run
        wall: dict[tuple[str, str], list[float]] = {}
        ref_wall: dict[tuple[str, str], list[float]] = {}
        status: dict[tuple[str, str], set[int]] = {}
        keys = [(mode, name) for mode in MODES for name in cases]
        for key in keys:
            cpu[key], ref_cpu[key], wall[key], ref_wall[key], status[key] = [], [], [], [], set()
        for _ in range(args.rounds):
            random.shuffle(keys)
            for key in keys:
                env = envs[key[0]]
                first_ref = random.random() < 0.5
                if first_ref:
                    r_wall, r_cpu, _ = timed(*reference, env)
                took, used, rc = timed(*cases[key[1]], env)
                if not first_ref:
                    r_wall, r_cpu, _ = timed(*reference, env)
                cpu[key].append(used)
                wall[key].append(took)
                ref_cpu[key].append(r_cpu)
                ref_wall[key].append(r_wall)
                status[key].add(rc)
        lists = {
            (mode, name): imported(*cases[name], envs[mode], runs=3)
            for mode in MODES
            for name in ("plugin, no endpoint", "plugin, ini `llm_endpoint = sim`")
        }
        base = {mode: imported(*reference, envs[mode], runs=1) for mode in MODES}
        through_hook = hooked(*cases["plugin, ini `llm_endpoint = sim`"], envs["no bytecode"])
        counted = {
            (mode, name): instructions(*run, envs[mode])
            for mode in MODES
            for name, run in [(REFERENCE, reference), *cases.items()]
        }
    load_after = loadavg()

    def ms(values: list[float]) -> str:
        low, high = quantile(values, 0.1) * 1000, quantile(values, 0.9) * 1000
        return f"{statistics.median(values) * 1000:.0f} ({low:.0f}–{high:.0f})"

    def paired(values: list[float], ref: list[float]) -> tuple[float, str]:
        """The median of the per-pair differences (ms), and it in words with its standard
        error and spread."""
        diffs = [(v - r) * 1000 for v, r in zip(values, ref, strict=True)]
        diff = statistics.median(diffs)
        spread = f"{quantile(diffs, 0.1):+.0f} … {quantile(diffs, 0.9):+.0f}"
        return diff, f"{diff:+.1f} ± {standard_error(diffs):.1f} ({spread})"

    rows = []
    verdicts = []  # (mode, case, CPU extra ms, passed)
    count_rows = []
    estimates: dict[tuple[str, str], float] = {}  # (mode, case) → ms by the instructions
    for mode in MODES:
        refs = [v for name in cases for v in ref_cpu[(mode, name)]]
        rows.append((mode, REFERENCE, "0", ms(refs), "–", "–", "–"))
        ref_count = counted[(mode, REFERENCE)]
        if ref_count:
            per = quantile(refs, 0.1) * 1000 / ref_count  # ms an instruction, least disturbed
            count_rows.append((mode, REFERENCE, f"{ref_count / 1e6:,.0f}", "–", "–"))
            for name in cases:
                n = counted[(mode, name)]
                if n is None:
                    continue
                extra = n - ref_count
                estimates[(mode, name)] = extra * per
                count_rows.append(
                    (
                        mode,
                        name,
                        f"{n / 1e6:,.0f}",
                        f"{extra / 1e6:+,.1f} ({extra / ref_count:+.1%})",
                        f"{extra * per:+.1f}",
                    )
                )
        for name in cases:
            key = (mode, name)
            cpu_diff, cpu_words = paired(cpu[key], ref_cpu[key])
            _, wall_words = paired(wall[key], ref_wall[key])
            low = (quantile(cpu[key], 0.1) - quantile(ref_cpu[key], 0.1)) * 1000
            exit_ = "/".join(map(str, sorted(status[key])))
            rows.append((mode, name, exit_, ms(cpu[key]), cpu_words, f"{low:+.1f}", wall_words))
            verdicts.append((mode, name, cpu_diff, status[key] == {0}))
    passed = all(v[3] for v in verdicts)
    by_count = len(estimates) == len(verdicts)
    judged = {(m, n): estimates[(m, n)] if by_count else d for m, n, d, _ in verdicts}
    within = all(v <= GOAL_MS for v in judged.values()) and passed
    summary = "; ".join(
        f"{m}, {n.removeprefix('plugin, ')}: "
        + (f"{estimates[(m, n)]:+.1f} ms by its instructions, " if by_count else "")
        + f"CPU time {d:+.1f} ms"
        for m, n, d, _ in verdicts
    )

    def beyond(key: tuple[str, str]) -> list[tuple[str, int]]:
        return sorted(
            ((m, us) for m, us in lists[key].items() if m not in base[key[0]]),
            key=lambda mu: -mu[1],
        )

    import_rows = []
    for key in lists:
        new = beyond(key)
        ours = [(m, us) for m, us in new if m.split(".")[0] == "pytest_llmspeed"]
        others = [m for m, _ in new if m.split(".")[0] != "pytest_llmspeed"]
        import_rows.append(
            (
                key[0],
                key[1].removeprefix("plugin, "),
                f"{len(ours)}",
                f"{sum(us for _, us in ours) / 1000:.1f}",
                ", ".join(
                    f"`{m.removeprefix('pytest_llmspeed.')}` {us / 1000:.1f}" for m, us in ours[:4]
                ),
                ", ".join(f"`{m}`" for m in others) or "–",
            )
        )
    figures: dict[str, Figure] = {}
    for env_, case_, diff_, _ in verdicts:
        stem = f"{SLUG[env_]}_{SLUG[case_]}"
        figures[f"{stem}_cpu_ms"] = Figure(round(diff_, 2), "ms", signed=True)
        if by_count:
            figures[f"{stem}_instructions_ms"] = Figure(
                round(estimates[(env_, case_)], 2), "ms", signed=True
            )
    worst = max(judged.values())
    figures["worst_ms"] = Figure(round(worst, 2), "ms", f"≤ {GOAL_MS:.0f} ms", within, signed=True)
    figures["judged_by"] = Figure("instructions" if by_count else "CPU time")
    lines = [
        "# What the plugin costs unit tests that need no server",
        "",
        f"Machine: {machine()}, shared with other work while it ran (load average "
        f"{load_before} before, {load_after} after): the absolute times are this busy "
        "machine's, the differences what the plugin adds on it.",
        "",
        f"**{'Within' if within else 'Not within'} the goal (≤ {GOAL_MS:.0f} ms of CPU over "
        f"`-p no:llmspeed` in every case"
        + (", by the instruction counts" if by_count else "")
        + f"; CPU time: the median of {args.rounds} pairs): {summary}"
        + ("" if passed else "; and a case did not pass")
        + ".**",
        "",
        "`pytest -q -p no:cacheprovider` on one unit test. Each round runs every case once, "
        "in a shuffled order, each paired with a `-p no:llmspeed` run right before or after "
        "it (drawn each time), in the same environment; *extra* is the median of the "
        "per-pair differences, with their 10th–90th percentiles (the verdict's figure), and "
        "the difference of the two 10th percentiles, the least disturbed runs'. *CPU*: user + "
        "system time "
        "of the pytest process, what the verdict reads: the wall time of a run on a shared "
        "machine moves with other processes by more than the plugin costs. *bytecode*: "
        "Python writes and reads its caches (pytest its rewritten copies); *no bytecode*: "
        "`PYTHONDONTWRITEBYTECODE=1` over the regular caches that pip compiles at install, so "
        "that only what pytest's assertion-rewriting hook imports is compiled on every run.",
        "",
        *table(
            [
                "environment",
                "case",
                "exit",
                "CPU ms",
                "extra CPU ms",
                "extra CPU ms, 10th percentiles",
                "extra wall ms",
            ],
            rows,
            "llrrrrr",
        ),
        "",
        *(
            [
                "Instructions of one run of each (valgrind's cachegrind, `PYTHONHASHSEED=0`; "
                "the pytest process and those it starts, pytest-benchmark's `git` calls "
                "included in both), and what the extra ones cost at the rate of the "
                "reference's least disturbed runs (its 10th percentile of CPU time):",
                "",
                *table(
                    ["environment", "case", "instructions (M)", "extra (M)", "≈ extra CPU ms"],
                    count_rows,
                    "llrrr",
                ),
                "",
            ]
            if count_rows
            else []
        ),
        "What a run imports that `-p no:llmspeed` does not (`-X importtime`, each module's "
        "own time, the least of 3 runs, inflated by the measurement; it does not see the "
        "modules pytest imports by name: `pytest_llmspeed`, `pytest_llmspeed.plugin`):",
        "",
        *table(
            ["environment", "case", "plugin modules", "their ms", "costliest", "other modules"],
            import_rows,
            "llrrll",
        ),
        "",
        "Modules of the plugin that pytest's assertion-rewriting hook loaded in a run with "
        f"`llm_endpoint = sim` in the ini file (parsed and compiled on every run without "
        f"bytecode): {through_hook}.",
    ]
    return Outcome(figures, lines, {**vars(args), "src": str(args.src)})


#: the figures' names of the environments and cases
SLUG = {
    "bytecode": "bytecode",
    "no bytecode": "no_bytecode",
    "plugin, no endpoint": "no_endpoint",
    "plugin, ini `llm_endpoint = sim`": "ini_sim",
    "plugin, ini endpoint down": "ini_down",
}


def main() -> None:
    sys.exit(cli("unused_plugin_cost", measure))


if __name__ == "__main__":
    main()
