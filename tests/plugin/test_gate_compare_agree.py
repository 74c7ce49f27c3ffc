"""One judge, end to end on the simulator: a run saved as a baseline, a second run (its decode
twice as slow, its prefill the same) gated on it, and ``python -m pytest_llmspeed compare`` of
the two results files give the same verdict on every cell, and the same exit status."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from pytest_llmspeed.report.compare import compare
from pytest_llmspeed.results import load

pytestmark = pytest.mark.slow

ARGS = (
    "--llm-contexts=1K,2K",
    "--llm-concurrency=1,4",
    "--llm-duration=2",
    "--llm-max-output=256",
    "--llm-prefill-repeats=6",
    "-p",
    "no:randomly",
)
WORDS = ("regressed", "unknown", "improved", "same")


def verdicts(path: Path) -> dict[str, str]:
    doc = json.loads(path.read_text())
    return {c["id"]: c["baseline"] for c in doc["cells"] if "baseline" in c}


def test_the_gate_and_compare_judge_two_runs_alike(pytester: pytest.Pytester) -> None:
    old = pytester.runpytest(
        "--llm-endpoint=sim:tiny?speed=0.5&seed=5",
        *ARGS,
        "--llm-save-baseline=base.toml",
        "--llm-results=old.json",
    )
    old.assert_outcomes(passed=6)
    new = pytester.runpytest(
        "--llm-endpoint=sim:tiny?speed=0.5&seed=6&slower=decode:1.0",
        *ARGS,
        "--llm-baseline=base.toml",
        "--llm-results=new.json",
    )
    by_gate = verdicts(pytester.path / "new.json")
    assert set(by_gate) == {
        "prefill[1K]",
        "prefill[2K]",
        "decode[1K-c1]",
        "decode[1K-c4]",
        "decode[2K-c1]",
        "decode[2K-c4]",
    }, by_gate
    # Chance: a decode twice as slow is regressed in every decode cell, far beyond any noise
    # (a 20 % slower one at 1× was not regressed at c4 beside a loaded CI run: both versions'
    # c4 were capped by the machine's CPU, so the simulator runs at 0.5×, below what a loaded
    # machine serves, and the new version at half of that). The prefill's verdict is not
    # asserted: it is unchanged, but a one-run baseline knows no spread between starts, and on
    # a busy machine a 2K prefill read −6.8 % beyond both intervals (a CI run): the gate and
    # compare must agree on it, whatever it is
    assert all(by_gate[c] == "regressed" for c in by_gate if c.startswith("decode")), by_gate
    assert new.ret == pytest.ExitCode.TESTS_FAILED
    done = subprocess.run(
        [sys.executable, "-m", "pytest_llmspeed", "compare", "old.json", "new.json"],
        cwd=pytester.path,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 1, done.stdout + done.stderr  # the regressions: exit 1
    cmp = compare(load(pytester.path / "old.json"), load(pytester.path / "new.json"))
    assert {c.cid: c.verdict.value for c in cmp.cells} == by_gate, done.stdout
    counts = {w: sum(1 for o in by_gate.values() if o == w) for w in WORDS}
    assert (
        f"6 cell(s): {counts['regressed']} regressed, {counts['unknown']} unknown, "
        f"{counts['improved']} improved, {counts['same']} same"
    ) in done.stdout, done.stdout
