"""Cells cut by pytest-timeout (issue 30): the cut cell's streams are cancelled and closed
before the next test starts, the cell is recorded as cut (results, summary, JUnit), never as
passed, and a timeout shorter than a decode window is said once at the start.

Ctrl-C's cut is in tests/plugin/test_plugin_failures.py (test_ctrl_c_keeps_the_finished_cells).
"""

import json
import xml.etree.ElementTree as ET

import pytest

pytest.importorskip("pytest_timeout")

USER_TESTS = """
import pytest


@pytest.mark.timeout(1.5)
@pytest.mark.parametrize("llm_prefix", ["1K"], indirect=True)
def test_cut(llm_prefix, llm_cell):
    llm_cell.decode(llm_prefix, 4)


@pytest.mark.parametrize("llm_prefix", ["1K"], indirect=True)
def test_next(llm_prefix, llm_cell):
    record = llm_cell.decode(llm_prefix, 1)
    assert record.total_tok_s
"""


@pytest.mark.parametrize("method", ["signal", "thread"])
def test_a_cut_cell_stops_and_leaves_the_next_one_alone(pytester, method):
    pytester.makepyfile(test_user=USER_TESTS)
    result = pytester.runpytest_subprocess(
        "-p",
        "no:cacheprovider",
        "--llm-endpoint=sim:tiny",
        "--llm-duration=4",
        f"--timeout-method={method}",
        "--llm-results=out.json",
        "--junitxml=out.xml",
    )
    out = result.stdout.str() + result.stderr.str()
    # Chance: pytest-timeout cuts the first cell at 1.5 s, before its 4 s window can end on any
    # machine (load only delays the window); the next cell has no timeout
    result.assert_outcomes(passed=1, failed=1)
    # one line at the start names the timeout and the window
    assert out.count("pytest-timeout's 1.5 s is shorter than a decode cell's 4 s window") == 1
    result.stdout.fnmatch_lines(
        [
            "*_ test_cut[[]1K[]] _*",
            "decode[[]1K-c4[]]: cut after 1.5 s by pytest-timeout",
            "error: decode[[]1K-c4[]]: cut after 1.5 s by pytest-timeout",
        ]
    )
    assert "Traceback" not in out and "Timeout +" not in out, out
    cells = {c["id"]: c for c in json.loads((pytester.path / "out.json").read_text())["cells"]}
    cut = cells["decode[1K-c4]"]
    assert cut["status"] == "error" and cut["reason"] == "cut after 1.5 s by pytest-timeout"
    nxt = cells["decode[1K-c1]"]
    # the next cell ran alone: valid, its referee agreeing, no other client seen on the server
    assert nxt["status"] == "valid", nxt
    assert nxt["generation_tokens_delta"] is not None
    # Chance: one request of 4,096 tokens (the default max output) runs the whole 4 s window
    # (it takes about 8 s at speed 1, longer under load): one running, unless the cut cell's
    # streams still were
    assert nxt["effective_concurrency"] == pytest.approx(1.0, abs=0.05), nxt
    # Chance: what load marks on a cell (its client behind, per-second throughput unstable, a
    # drift) are its flags and fields, not notes: a note here would be about the cut
    assert not nxt.get("notes"), nxt.get("notes")
    junit = ET.parse(pytester.path / "out.xml").getroot()
    (case,) = [c for c in junit.iter("testcase") if c.get("name") == "test_cut[1K]"]
    failure = case.find("failure")
    assert failure is not None
    assert "cut after 1.5 s by pytest-timeout" in (failure.get("message") or "")


def test_the_built_in_suite_under_a_short_timeout(pytester):
    result = pytester.runpytest_subprocess(
        "-p",
        "no:cacheprovider",
        "--llm-endpoint=sim:tiny",
        "--llm-contexts=1K",
        "--llm-concurrency=1,2",
        "--llm-duration=3",
        "--timeout=2",
        "-m",
        "decode",
        "--llm-results=out.json",
    )
    out = result.stdout.str() + result.stderr.str()
    # Chance: each cell is cut at 2 s, before its 3 s window can end on any machine
    result.assert_outcomes(failed=2, deselected=1)
    assert "Traceback" not in out and "asyncio/" not in out, out
    cells = {c["id"]: c for c in json.loads((pytester.path / "out.json").read_text())["cells"]}
    for cid in ("decode[1K-c1]", "decode[1K-c2]"):
        assert cells[cid]["status"] == "error", cells[cid]
        assert cells[cid]["reason"] == "cut after 2 s by pytest-timeout"
        assert f"error: {cid}: cut after 2 s by pytest-timeout" in out


def test_a_timeout_longer_than_the_window_says_nothing(pytester):
    result = pytester.runpytest_subprocess(
        "-p",
        "no:cacheprovider",
        "--llm-endpoint=sim:tiny",
        "--llm-contexts=1K",
        "--llm-concurrency=1",
        "--llm-duration=1",
        "--timeout=60",
        "-m",
        "decode",
    )
    # Chance: the cell (a 1 s window after its requests' first tokens) takes about 2 s quiet;
    # the 60 s timeout is thirty times that, beyond what load does
    result.assert_outcomes(passed=1, deselected=1)
    assert "shorter than a decode cell" not in result.stdout.str()
