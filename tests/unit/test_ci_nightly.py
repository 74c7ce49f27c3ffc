"""The nightly history workflow of docs/ci-example.md runs: its own shell steps, taken from
docs/github-actions-llmspeed-nightly.yml and run as GitHub Actions runs them (``bash
--noprofile --norc -eo pipefail``), keep each night's results file on the ``llmspeed-history``
branch of a local "origin" (made on the first night, with no file of the main branch; one file
added each later night, each night a fresh clone) and read the history from it into the job
summary. The results files are the stored real run of tests/data/v1, a day apart."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.studies.workflow_ab import step_script
from tests.history_runs import derive

ROOT = Path(__file__).resolve().parents[2]
WORKFLOW = ROOT / "docs" / "github-actions-llmspeed-nightly.yml"
STORED = ROOT / "tests" / "data" / "v1" / "results.json"

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="no git")


def step(name: str) -> str:
    """The ``run: |`` script of the workflow's step whose name starts with ``name``."""
    return step_script(name, WORKFLOW)


def git(*args: str, cwd: Path) -> str:
    return subprocess.run(
        ["git", *args], cwd=cwd, check=True, capture_output=True, text=True
    ).stdout


def bash(script: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c", script],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
    )


def test_each_night_adds_its_results_file_to_the_history_branch_and_the_history_reads_them(
    tmp_path,
):
    nights = derive(STORED, tmp_path / "nights", 3, lambda i, cell, key: 1.0)
    origin = tmp_path / "origin.git"
    git("init", "-q", "--bare", "-b", "main", str(origin), cwd=tmp_path)
    seed = tmp_path / "seed"
    git("clone", "-q", str(origin), str(seed), cwd=tmp_path)
    (seed / "README.md").write_text("the project\n")
    git("add", "README.md", cwd=seed)
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "start", cwd=seed)
    git("push", "-q", "origin", "HEAD:main", cwd=seed)
    keep, history = step("Keep the results file"), step("History")
    summary = tmp_path / "summary.md"
    for n, night in enumerate(nights):
        work = tmp_path / f"checkout-{n}"  # each night a fresh checkout, as actions/checkout
        git("clone", "-q", str(origin), str(work), cwd=tmp_path)
        (work / "out").mkdir()
        shutil.copy(night, work / "out" / "results.json")
        env = {
            **os.environ,
            "GITHUB_SHA": f"{n + 1:x}" * 40,
            "GITHUB_STEP_SUMMARY": str(summary),
            "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        }
        kept = bash(keep, work, env)
        assert kept.returncode == 0, kept.stdout + kept.stderr
        read = bash(history, work, env)
        assert read.returncode == 0, read.stdout + read.stderr
        assert f"history: {n + 1} results file(s)" in read.stdout
    files = git("ls-tree", "-r", "--name-only", "llmspeed-history", cwd=origin).split()
    assert len(files) == 3 and all(f.startswith("runs/") and f.endswith(".json") for f in files)
    assert "README.md" not in files  # the branch holds the results files only
    assert len(git("log", "--oneline", "llmspeed-history", cwd=origin).splitlines()) == 3
    text = summary.read_text()
    assert text.count("## LLM speed: the history of every night") == 3
    assert "history: 3 results file(s), 1 series" in text
