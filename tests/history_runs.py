"""Series of results files made from one real simulator run, for the history's tests and its
benchmark (docs/history.md).

:func:`simulator_run` runs the plugin once on the built-in simulator (a small matrix, 1 s
windows) and keeps its results file: a real document, with every key, interval, sample and
server figure a run writes. :func:`derive` writes a series of files from it: run i started a
day after run i − 1, each cell's gated figures (and their intervals, whose relative width is
kept, or set to ±``interval``) multiplied by ``factor(i, cell, figure)`` — a step, noise, or
both —, and ``edit(i, document)`` free to change anything else (the engine version, a cell's
status, a setting).
"""

from __future__ import annotations

import datetime as dt
import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pytest_llmspeed.history.series import gated
from pytest_llmspeed.results import CellId

SMALL_MATRIX = (
    "--llm-contexts=1K,4K",
    "--llm-concurrency=1,4,8",
    "--llm-duration=1",
    "--llm-max-output=128",
    "--llm-kv-capacity=20000",  # decode[4K-c8] is over capacity
)
START = dt.datetime(2026, 1, 1, 1, 0, tzinfo=dt.UTC)

Factor = Callable[[int, str, str], float]
Edit = Callable[[int, dict[str, Any]], None]


def simulator_run(folder: Path, *matrix: str, endpoint: str = "sim:tiny?speed=4") -> Path:
    """One run of the plugin on the simulator, its results file (``folder/template.json``)."""
    folder.mkdir(parents=True, exist_ok=True)
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "no:cacheprovider",
            "-W",
            "ignore",
            "-q",
            f"--llm-endpoint={endpoint}",
            *(matrix or SMALL_MATRIX),
            "--llm-results=template.json",
        ],
        cwd=folder,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    return folder / "template.json"


def derive(
    template: Path | dict[str, Any],
    folder: Path,
    runs: int,
    factor: Factor,
    edit: Edit | None = None,
    first: int = 0,
    interval: float | None = None,
) -> list[Path]:
    """``runs`` results files in ``folder`` (``run-0000.json``, …, numbered from ``first``),
    each the template's run with its gated figures scaled by ``factor(i, cell, figure)``.
    ``interval``: each figure's 95 % interval made ±that fraction of it (a real 1 s window's
    can be ±1 % or ±15 %, as busy as the machine was: a test that needs its series to be
    decided sets it), else the template's, scaled with the figure."""
    doc = json.loads(template.read_text()) if isinstance(template, Path) else template
    folder.mkdir(parents=True, exist_ok=True)
    keys = {
        c["id"]: [(f.key, f.ci_key) for f in gated(CellId.parse(c["id"]).phase)]
        for c in doc["cells"]
    }
    out = []
    for i in range(first, first + runs):
        cells = []
        for cell in doc["cells"]:
            new = dict(cell)
            for key, ci_key in keys[cell["id"]]:
                if isinstance(new.get(key), int | float):
                    k = factor(i, cell["id"], key)
                    new[key] = round(new[key] * k, 3)
                    if interval is not None:
                        new[ci_key] = [
                            round(new[key] * (1 - interval), 3),
                            round(new[key] * (1 + interval), 3),
                        ]
                    elif new.get(ci_key):
                        new[ci_key] = [round(v * k, 3) for v in new[ci_key]]
            cells.append(new)
        run = dict(doc["run"], started=(START + dt.timedelta(days=i)).isoformat())
        one = {**doc, "run": run, "cells": cells}
        if edit is not None:
            edit(i, one)
        path = folder / f"run-{i:04d}.json"
        path.write_text(json.dumps(one, indent=1) + "\n")
        out.append(path)
    return out
