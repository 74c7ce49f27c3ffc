"""pytest-xdist in a user's repository (issue 30): the plugin decides only once a selected test
needs the server. Unit tests run under ``-n`` as without the plugin, an endpoint in the ini or
not; speed tests under workers are refused in one line whose hint (``-n 0``) works whatever
``addopts`` holds, and with it the cells run."""

import pytest

pytest.importorskip("xdist")

UNIT_TESTS = """
def test_add():
    assert 1 + 1 == 2

def test_sub():
    assert 2 - 1 == 1
"""


@pytest.fixture
def repo(pytester):
    pytester.makepyfile(test_unit=UNIT_TESTS)
    pytester.makeini("[pytest]\naddopts = -n 2 -p no:cacheprovider\nllm_endpoint = sim:tiny\n")
    return pytester


@pytest.mark.parametrize("extra", [(), ("-k", "add"), ("--llm-builtin-suite=never",)])
def test_unit_tests_run_under_xdist_with_an_endpoint_in_the_ini(repo, extra):
    result = repo.runpytest_subprocess(*extra)
    assert result.ret == 0, result.stdout.str() + result.stderr.str()
    result.stdout.fnmatch_lines(["*2 workers*"])
    result.assert_outcomes(passed=1 if extra[:1] == ("-k",) else 2)
    assert "llmspeed server" not in result.stdout.str()


def test_speed_tests_under_workers_are_refused_in_one_line(repo):
    result = repo.runpytest_subprocess("-m", "decode", "--llm-contexts=1K", "--llm-concurrency=1")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    out = result.stdout.str() + result.stderr.str()
    lines = [
        line for line in out.splitlines() if "cannot run speed tests under pytest-xdist" in line
    ]
    assert len(lines) == 1, out
    assert "1 selected test(s) need the LLM server" in lines[0]
    assert "Add -n 0 to the command" in lines[0]
    assert "Traceback" not in out and "INTERNALERROR" not in out
    assert "llmspeed server" not in out  # nothing was started on a worker


def test_the_hint_works_with_n_in_addopts(repo):
    result = repo.runpytest_subprocess(
        "-n", "0", "-m", "decode", "--llm-contexts=1K", "--llm-concurrency=1", "--llm-duration=1"
    )
    assert result.ret == 0, result.stdout.str() + result.stderr.str()
    result.assert_outcomes(passed=1, deselected=3)
    result.stdout.fnmatch_lines(["*decode[[]1K-c1[]]: * tok/s*"])
