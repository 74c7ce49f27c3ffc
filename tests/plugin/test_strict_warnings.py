"""A user's strict settings: warnings as errors (``-W error``, ``filterwarnings = ["error"]``)
and Python's development mode (``-X dev``: ResourceWarning shown, asyncio's debug mode) pass a
small matrix on the built-in simulator with no warning (issue 30: the simulator child's pipes
were left open, and every simulator run exited 1 under ``-W error``)."""

import json

import pytest

pytestmark = pytest.mark.slow  # each test runs a small matrix on the simulator

ARGS = (
    "--llm-endpoint=sim:tiny?speed=4",
    "--llm-contexts=1K",
    "--llm-concurrency=1,2",
    "--llm-duration=1",
    "--llm-max-output=128",
    "--llm-results=out.json",
    "--llm-html=out.html",
    "--junitxml=out.xml",
    # pytest-asyncio (a test dependency of this project, not of the plugin) warns about its
    # own unset ini option under -W error; a user's repository without it has nothing to block
    "-p",
    "no:asyncio",
    "-W",
    "error",
)


def strict_project(pytester):
    pytester.makepyprojecttoml('[tool.pytest.ini_options]\nfilterwarnings = ["error"]\n')
    pytester.makepyfile(test_unit="def test_add():\n    assert 1 + 1 == 2\n")


def assert_clean(result, pytester):
    assert result.ret == 0, result.stdout.str()
    result.assert_outcomes(passed=4, warnings=0)
    text = result.stdout.str() + result.stderr.str()
    for word in ("warnings summary", "Warning", "unclosed", "Exception ignored"):
        assert word not in text, word
    cells = json.loads((pytester.path / "out.json").read_text())["cells"]
    assert sorted(c["id"] for c in cells) == ["decode[1K-c1]", "decode[1K-c2]", "prefill[1K]"]
    assert all(c["status"] == "valid" for c in cells)


def test_matrix_passes_with_warnings_as_errors(pytester):
    strict_project(pytester)
    result = pytester.runpytest("--llm-builtin-suite=always", *ARGS)
    assert_clean(result, pytester)


def test_matrix_passes_in_development_mode(pytester, monkeypatch):
    """``-X dev`` in a process of its own (PYTHONDEVMODE=1 is ``-X dev``; the simulator's
    child inherits it), where a ResourceWarning at the interpreter's exit is seen too."""
    strict_project(pytester)
    monkeypatch.setenv("PYTHONDEVMODE", "1")
    monkeypatch.setenv("PYTHONWARNINGS", "error")
    result = pytester.runpytest_subprocess("--llm-builtin-suite=always", *ARGS, timeout=120)
    assert_clean(result, pytester)
