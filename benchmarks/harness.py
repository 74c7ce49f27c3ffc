"""The suite's harness: runs the kept benchmarks and writes each one's figures as JSON beside
its page.

A benchmark of the suite is a module of ``benchmarks`` with a function ``measure(argv)``: it
parses its own arguments (the same as its ``python -m benchmarks.NAME`` command line), measures,
and returns an ``Outcome``: its figures (``Figure``: a value, its unit, the target where one
exists, and the text a document quotes), its results page as Markdown lines, and its settings.
It does no I/O of its own into ``benchmarks/results/``: ``record`` runs it, notes what the
figures depend on (the commit and whether the tree had changes, the machine, its load before
and after and the CPU that other processes used meanwhile, the versions of the key packages)
and writes ``results/NAME.json`` and ``results/NAME.md``. ``SUITE`` lists the benchmarks with
the arguments the suite runs them with (modest, so that the whole suite takes about 15 minutes
on two cores) and shorter ones for ``--quick``.

A benchmark that cannot run here (real vLLM not set up, say) returns an ``Outcome`` with
``skipped`` set: its JSON says why and has no figures, and the rest of the suite goes on.
"""

from __future__ import annotations

import datetime as dt
import importlib
import importlib.metadata
import json
import os
import platform
import subprocess
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.common import RESULTS, ROOT, OtherCores, other_cores, write_page

#: the version of the JSON files' layout
FORMAT = 1

#: the packages whose versions a result records
PACKAGES = ("pytest-llmspeed", "aiohttp", "numpy", "pytest", "prometheus-client")


@dataclass(frozen=True)
class Figure:
    """One figure of a benchmark: ``text`` is how a document quotes it (a value, its unit)."""

    value: float | int | str | bool | None
    unit: str = ""
    target: str | None = None  # e.g. "≥ 50,000", "≤ 5 s"; None where none exists
    met: bool | None = None  # whether the target was met; None without a target
    digits: int = 1
    signed: bool = False  # a difference: "+" before a positive value

    @property
    def text(self) -> str:
        """The value as a document quotes it: thousands separators, ``digits`` decimals, a
        minus sign (U+2212) or with ``signed`` a plus, and its unit after a space (none
        before ``×``)."""
        v = self.value
        if isinstance(v, bool) or v is None or isinstance(v, str):
            s = "–" if v is None else str(v)
        else:
            s = f"{abs(v):,}" if isinstance(v, int) else f"{abs(v):,.{self.digits}f}"
            negative = v < 0 and s.strip("0.,") != ""
            s = ("−" if negative else "+" if self.signed and v > 0 else "") + s
        if not self.unit:
            return s
        return s + ("" if self.unit == "×" else " ") + self.unit

    def to_json(self) -> dict[str, Any]:
        """Its entry in a result file."""
        return {
            "value": self.value,
            "unit": self.unit,
            "target": self.target,
            "met": self.met,
            "text": self.text,
        }


@dataclass
class Outcome:
    """What ``measure`` returns: the figures by name, the page's lines, the settings."""

    figures: dict[str, Figure] = field(default_factory=dict)
    page: list[str] = field(default_factory=list)
    settings: dict[str, Any] = field(default_factory=dict)
    skipped: str | None = None  # why it did not run here
    name: str | None = None  # a variant's own file name (``intervals_vllm``), else the module's


Measure = Callable[[list[str]], Outcome]


@dataclass(frozen=True)
class Entry:
    """One benchmark of the suite: the arguments of its suite run and of a quick one."""

    name: str
    argv: str = ""  # its arguments in the suite, split at spaces
    quick: str = ""  # and in a quick run
    about: str = ""


SUITE: dict[str, Entry] = {
    e.name: e
    for e in (
        Entry(
            "sim_throughput",
            "--seconds 10",
            "--seconds 3",
            "the simulator streams to 128 streams on one core (target ≥ 50,000 tok/s)",
        ),
        Entry(
            "client_throughput",
            "--duration 10",
            "--duration 3",
            "the client's throughput and TBT against the simulator's own record",
        ),
        Entry(
            "client_at_scale",
            "--duration 6",
            "--duration 2 --clients plugin --modes unpaced",
            "memory per event, close → figures, events/s against the lean server",
        ),
        Entry(
            "unused_plugin_cost",
            "--rounds 8",
            "--rounds 2",
            "what the installed plugin costs a unit-test run that needs no server (≤ 20 ms)",
        ),
        Entry(
            "request_encoding",
            "",
            "",
            "assembling one request body at 256K tokens",
        ),
        Entry(
            "metrics_parse_cost",
            "",
            "",
            "one /metrics sample of real vLLM parsed whole and filtered (needs real vLLM)",
        ),
        Entry(
            "server_figures_cost",
            "--rounds 4 --duration 6",
            "--rounds 1 --duration 3",
            "what reading the server's figures costs a decode cell (paired, alternating)",
        ),
        Entry(
            "intervals",
            "--runs 3 --slow-runs 2 --contexts 8192 --concurrency 1,8 --fixed 6 --window 3"
            " --min 2 --max-output 1024 --skip-wall",
            "--runs 2 --slow-runs 1 --contexts 8192 --concurrency 8 --fixed 3 --window 2"
            " --min 1 --max-output 512 --skip-wall",
            "coverage of the 95 % intervals and the gate with intervals (simulator)",
        ),
        Entry(
            "gate_noise",
            "--runs 6,3,3 --contexts 1K --concurrency 1,8 --duration 1 --wait-idle 0 --retries 0"
            " --keep-disturbed",
            "--runs 2,1,1 --contexts 1K --concurrency 4 --duration 1 --wait-idle 0 --retries 0"
            " --keep-disturbed",
            "the gate's false failures and detection (simulator, noise 3 %, tolerance 5 %)",
        ),
        Entry(
            "history_speed",
            "--repeat 2",
            "--runs 200 --repeat 1",
            "`history` over 1,000 results files of the demo matrix (target ≤ 5 s)",
        ),
        Entry(
            "wire_checks_cost",
            "--rounds 5",
            "--rounds 2 --reads 5000",
            "what the wire's checks cost a read, against the tally before them",
        ),
    )
}


def _git(*args: str) -> str:
    out = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=False)
    return out.stdout.rstrip("\n")


def commit() -> dict[str, Any]:
    """The commit measured, and the files that differed from it (the tree's changes)."""
    changed = [line[3:] for line in _git("status", "--porcelain").splitlines() if line]
    sha = _git("rev-parse", "HEAD").strip()
    return {"sha": sha, "short": sha[:7], "dirty": bool(changed), "changed": changed}


def machine() -> dict[str, Any]:
    """Cores, architecture, processor, Python."""
    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8").splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "cores": os.cpu_count(),
        "arch": platform.machine(),
        "processor": model,
        "python": platform.python_version(),
        "system": platform.platform(),
    }


def versions() -> dict[str, str | None]:
    """The versions of the packages the figures depend on (None: not installed)."""
    out: dict[str, str | None] = {}
    for name in PACKAGES:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = None
    return out


def load() -> list[float]:
    """The load average over 1, 5 and 15 minutes."""
    return [round(x, 2) for x in os.getloadavg()]


def result_path(name: str) -> tuple[Path, Path]:
    """Where a benchmark's JSON and page go."""
    return RESULTS / f"{name}.json", RESULTS / f"{name}.md"


def record(name: str, measure: Measure, argv: Sequence[str], command: str) -> dict[str, Any]:
    """Run one benchmark, write its JSON (and its page when it made one); the JSON's
    content."""
    started = dt.datetime.now(dt.UTC)
    measured = commit()  # before it runs: another's commit meanwhile is not what it measured
    before, busy_before = load(), round(other_cores(1.0), 2)
    t0 = time.perf_counter()
    others = OtherCores()
    error = None
    with others:
        try:
            outcome = measure(list(argv))
        except SystemExit as exc:  # a benchmark that cannot run exits with its reason
            if exc.code in (0, None):
                raise
            outcome = Outcome(skipped=str(exc.code))
        except Exception as exc:  # a broken benchmark: said in its JSON, the suite goes on
            traceback.print_exc()
            error = f"{type(exc).__name__}: {exc}"
            outcome = Outcome()
    seconds = time.perf_counter() - t0
    doc: dict[str, Any] = {
        "format": FORMAT,
        "benchmark": name,
        "command": command,
        "argv": list(argv),
        "started": started.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "seconds": round(seconds, 1),
        "commit": measured,
        "machine": machine(),
        "load": {
            "before": before,
            "after": load(),
            "other_cores_before": busy_before,
            "other_cores": None if others.cores is None else round(others.cores, 2),
            "other_cores_after": round(other_cores(1.0), 2),
        },
        "versions": versions(),
        "settings": {k: _plain(v) for k, v in outcome.settings.items()},
        "skipped": outcome.skipped,
        "error": error,
        "figures": {k: f.to_json() for k, f in outcome.figures.items()},
    }
    name = outcome.name or name
    doc["benchmark"] = name
    json_path, page_path = result_path(name)
    json_path.write_text(json.dumps(doc, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    print(f"[{name}] wrote {json_path}", flush=True)
    if outcome.page and error is None:
        write_page(page_path, [*outcome.page, "", *footer(doc)], name)
    return doc


def footer(doc: dict[str, Any]) -> list[str]:
    """The lines a page ends with: how it was made, where its figures are."""
    c, m, ld = doc["commit"], doc["machine"], doc["load"]
    dirty = f" (with changes in {len(c['changed'])} files)" if c["dirty"] else ""
    return [
        "---",
        "",
        f"Made by `{doc['command']}` at commit {c['short']}{dirty}, {doc['started']}, in "
        f"{doc['seconds']:g} s; {m['cores']} cores ({m['arch']}), Python {m['python']}; load "
        f"average {ld['before'][0]:g} before, {ld['after'][0]:g} after, other processes "
        f"{ld['other_cores'] if ld['other_cores'] is not None else '–'} cores meanwhile. "
        f"Figures: [{doc['benchmark']}.json]({doc['benchmark']}.json).",
    ]


def _plain(v: Any) -> Any:
    """A setting as JSON can hold it."""
    if isinstance(v, str | int | float | bool) or v is None:
        return v
    if isinstance(v, list | tuple):
        return [_plain(x) for x in v]
    return str(v)


def cli(name: str, measure: Measure, argv: Sequence[str] | None = None) -> int:
    """``python -m benchmarks.NAME ARGS``: the benchmark through the harness (its JSON and its
    page written); 1 when a figure missed its target."""
    args = list(sys.argv[1:] if argv is None else argv)
    doc = record(name, measure, args, " ".join(["python -m benchmarks." + name, *args]))
    summary(doc)
    return 1 if any(f["met"] is False for f in doc["figures"].values()) else 0


def summary(doc: dict[str, Any]) -> None:
    """The figures of one result, one a line."""
    if doc["skipped"] or doc["error"]:
        why = f"skipped: {doc['skipped']}" if doc["skipped"] else f"FAILED: {doc['error']}"
        print(f"{doc['benchmark']}: {why}")
        return
    print(f"{doc['benchmark']} ({doc['seconds']:g} s):")
    for key, f in doc["figures"].items():
        met = "" if f["met"] is None else ": met" if f["met"] else ": NOT met"
        target = f" (target {f['target']}{met})" if f["target"] else ""
        print(f"  {key}: {f['text']}{target}")


def run(names: Sequence[str], quick: bool = False) -> list[dict[str, Any]]:
    """Run the named benchmarks of the suite (all of them when none is named)."""
    unknown = [n for n in names if n not in SUITE]
    if unknown:
        raise SystemExit(f"not in the suite: {', '.join(unknown)} (known: {', '.join(SUITE)})")
    docs = []
    for name in names or list(SUITE):
        entry = SUITE[name]
        module = importlib.import_module(f"benchmarks.{name}")
        argv = (entry.quick if quick else entry.argv).split()
        command = " ".join(["python -m benchmarks run", *(["--quick"] if quick else []), name])
        print(f"[suite] {name} {' '.join(argv)}", flush=True)
        doc = record(name, module.measure, argv, command)
        summary(doc)
        docs.append(doc)
    return docs


def target(value: float | None, low: float | None = None, high: float | None = None) -> bool | None:
    """Whether ``value`` lies within [low, high] (None when there is no value)."""
    if value is None:
        return None
    return (low is None or value >= low) and (high is None or value <= high)
