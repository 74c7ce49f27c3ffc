"""The shipped upgrade workflow's A/B step (docs/github-actions-llmspeed.yml), run verbatim by
bash as GitHub Actions runs it, in a repository with unit tests and an ini file of its own,
the simulator standing for both vLLM versions (benchmarks/studies/workflow_ab.py says how):
a new version whose decode is twice as slow fails the job, its decode cell regressed. How
often the workflow catches a 10 % slowdown and passes an unchanged version is the study's
(benchmarks/results/workflow_ab.md)."""

import argparse

import pytest

from benchmarks.studies.workflow_ab import one_run, step_script

pytestmark = pytest.mark.slow  # A/B rounds on the simulator


def test_the_workflows_ab_step_fails_a_slower_new_version(tmp_path):
    """Chance: decode twice as slow (−50 % tok/s), far beyond the −5 % tolerance: the decode
    cell's interval would have to stretch over 45 points to reach it."""
    assert "--llm-unknown=warn" in step_script() and '--llm-budget="$LLM_BUDGET"' in step_script()
    args = argparse.Namespace(
        speed=2.0,  # far below what a loaded machine serves (test_ab.py, SPEED)
        matrix="--llm-contexts=1K --llm-concurrency=1 --llm-duration=1 --llm-max-output=128",
        budget="20s",
        timeout=600.0,
    )
    run = one_run(tmp_path, 0.5, args)
    assert run["exit"] == 1, run
    assert run["verdicts"]["decode[1K-c1]"] == "regressed", run
    assert run["starts"]["decode[1K-c1]"] >= 8, run
