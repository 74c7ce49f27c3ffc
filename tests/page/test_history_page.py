"""The history's page (``history --html``, docs/history.md) as a person sees it: headless
Chromium opens the file the command wrote from 40 results files derived from one real
simulator run (tests/history_runs.py: 3 % noise between runs, each figure ±1 %, decode at 1K
12 % slower from run 26 with an engine upgrade there, prefill at 4K 12 % faster from run 16, a
run without decode[1K-c4], one where decode[4K-c1] failed without figures). No request may
leave the page, the console must stay quiet, every cell's chart must be drawn with its runs,
levels and change points; a screenshot goes to ``out/history.png``."""

from __future__ import annotations

import math
import random
import subprocess
import sys
from typing import Any

import pytest

from tests.history_runs import derive, simulator_run
from tests.page.test_page_in_browser import SHOTS, chromium, open_page

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def page(tmp_path_factory):
    work = tmp_path_factory.mktemp("history")
    template = simulator_run(work / "sim")
    rng = random.Random(3)

    def factor(i: int, cell: str, key: str) -> float:
        k = 0.88 if i >= 25 and cell.startswith("decode[1K") else 1.0
        k *= 1.12 if i >= 15 and cell == "prefill[4K]" else 1.0
        return k * math.exp(0.03 * rng.gauss(0, 1))

    def edit(i: int, doc: dict[str, Any]) -> None:
        doc["run"]["engine_version"] = "0.27.0" if i >= 25 else "0.26.1"
        if i == 10:
            doc["cells"] = [c for c in doc["cells"] if c["id"] != "decode[1K-c4]"]
        for c in doc["cells"]:
            if i == 30 and c["id"] == "decode[4K-c1]":
                c["status"] = "failed"
                for key in ("total_tok_s", "per_request_tok_s"):
                    c.pop(key, None)

    derive(template, work / "runs", 40, factor, edit, interval=0.01)
    out = work / "history.html"
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest_llmspeed",
            "history",
            str(work / "runs"),
            "--html",
            str(out),
        ],
        capture_output=True,
        text=True,
    )
    assert run.returncode == 1, run.stdout + run.stderr  # decode at 1K regressed
    assert "REGRESSION  decode[1K-c1] total tok/s" in run.stdout
    return out


def test_the_history_page_opens_offline_with_a_chart_per_cell_and_its_change_points(page, tmp_path):
    dom, console, asked = open_page(tmp_path, page.as_uri())
    assert console == [] and asked == set()
    # 8 cells: 2 prefill (prompt tok/s) and 6 decode (total and per-request tok/s)
    assert dom.count('<svg class="chart history"') == 14
    assert dom.count('data-verdict="regressed"') == 6  # decode at 1K × 1, 4, 8: 2 figures each
    assert dom.count('data-verdict="improved"') == 1  # prefill[4K]
    assert dom.count('class="change bad"') == 6 and dom.count('class="change good"') == 1
    assert "regressed −12" in dom and "engine_version 0.26.1 → 0.27.0" in dom
    assert dom.count('class="band"') >= 14 and 'class="mark valid"' in dom
    assert "run 11: not in this run" in dom  # decode[1K-c4] missing from run 11
    assert "run 31: failed" in dom  # decode[4K-c1] failed without figures
    assert "no figure in any run: over capacity" in dom  # decode[4K-c8]
    assert page.stat().st_size < 1_000_000


def test_history_screenshot(page, tmp_path):
    SHOTS.mkdir(exist_ok=True)
    shot = SHOTS / "history.png"
    run = chromium(tmp_path, "--window-size=1280,2400", f"--screenshot={shot}", page.as_uri())
    assert shot.is_file() and shot.stat().st_size > 20_000, run.stderr[-1000:]
