"""Truthful progress (issue 30): each line names the cell that runs and its figure (a test of
yours that runs a decode cell shows a decode cell, its warm-up labelled as one), the header
names what is selected (not the ini's matrix), counters stay right under pytest-rerunfailures,
and a setup error is an error everywhere: the progress line, the results file, the summary."""

import re

import pytest
from junitparser import JUnitXml

from pytest_llmspeed.plugin.selection import selected_words
from pytest_llmspeed.results import CellId

TINY = "sim:tiny?speed=4"
SHORT = ("--llm-duration=1", "--llm-max-output=64", "-p", "no:randomly")

README_EXAMPLE = """
import pytest

@pytest.mark.parametrize("llm_prefix", ["4K"], indirect=True)   # warms the 4K prefix once
def test_4k_eight_users(llm_prefix, llm_cell, llm_server):
    record = llm_cell.decode(llm_prefix, 8)          # one sustained-decode cell, 8 in flight
    assert record.per_request_tok_s > 1, f"{llm_server.model} too slow per user"

@pytest.mark.parametrize("llm_prefix", ["4K"], indirect=True)   # the prefix is warm by now
def test_4k_two_users(llm_prefix, llm_cell):
    llm_cell.decode(llm_prefix, 2)
"""

FIGURE = r"[\d,]+\.\d tok/s · [\d,]+\.\d tok/s per request · TTFT [\d,]+ ms \(took \d+ s\)"
PERCENT = r"(?: +\[ *\d+%\])?"  # pytest's, at the end of a cell's last line when it has room


def progress_lines(result):
    return [ln for ln in result.stdout.lines if re.match(r"\[\d+/\d+\] ", ln)]


@pytest.mark.slow
def test_a_decode_test_of_yours_shows_its_decode_cell_and_figure(pytester, results_doc):
    pytester.makepyfile(test_speed=README_EXAMPLE)
    result = pytester.runpytest(
        f"--llm-endpoint={TINY}", *SHORT, "--llm-results=out.json", "--junitxml=out.xml"
    )
    result.assert_outcomes(passed=2)
    lines = progress_lines(result)
    assert len(lines) == 6, "\n".join(lines)
    warm_start, warm_end, start, end, start2, end2 = lines
    # the cold prefill that warms 4K comes first, labelled as what it is
    assert re.fullmatch(
        r"\[1/2\] prefill\[4K\] warm-up · cold prefill · elapsed 0:0\d · about \d+ s left",
        warm_start,
    )
    assert re.fullmatch(
        r"\[1/2\] prefill\[4K\] warm-up: [\d,.]+ prompt tok/s · TTFT \d+ ms", warm_end
    )
    # then the cell the test runs, as the built-in suite's decode cells read
    assert re.fullmatch(
        r"\[1/2\] decode\[4K-c8\] · window 1 s · elapsed 0:0\d · about \d+ s left", start
    )
    assert re.fullmatch(rf"\[1/2\] decode\[4K-c8\]: {FIGURE}{PERCENT}", end), end
    # the second test finds 4K warm: its cell only
    assert start2.startswith("[2/2] decode[4K-c2] · window 1 s · ")
    assert re.fullmatch(rf"\[2/2\] decode\[4K-c2\]: {FIGURE}{PERCENT}", end2), end2
    assert not [ln for ln in lines if ln.startswith("[1/2] prefill[4K]: ")]
    # the header names what runs: two tests of yours at 4K, not the ini's matrix
    result.stdout.fnmatch_lines(
        [
            "llmspeed: api * · window 1 s · "
            "2 tests of yours at 4K pick their cells (named as they run)"
        ]
    )
    assert "concurrency 1,2,4" not in result.stdout.str()
    cells = results_doc()["by_id"]
    assert {cid: c["status"] for cid, c in cells.items()} == {
        "prefill[4K]": "valid",
        "decode[4K-c8]": "valid",
        "decode[4K-c2]": "valid",
    }
    found = re.search(r"decode\[4K-c8\]: ([\d,.]+) tok/s", end)
    assert found is not None, end
    shown = float(found[1].replace(",", ""))
    assert shown == pytest.approx(cells["decode[4K-c8]"]["total_tok_s"], abs=0.06)

    # -v: pytest's line for the test between the cell's start and end lines
    verbose = pytester.runpytest(f"--llm-endpoint={TINY}", *SHORT, "-v", "-k", "eight")
    lines = verbose.stdout.lines
    at = lines.index(next(ln for ln in lines if ln.startswith("[1/1] decode[4K-c8] · window")))
    assert lines[at + 1].startswith("test_speed.py::test_4k_eight_users[4K] PASSED")
    assert re.fullmatch(rf"\[1/1\] decode\[4K-c8\]: {FIGURE}", lines[at + 2]), lines[at + 2]
    verbose.stdout.fnmatch_lines(
        ["llmspeed: api * · window 1 s · your test at 4K picks its cells (named as they run)"]
    )


@pytest.mark.slow
def test_the_header_names_the_selected_cells(pytester):
    # every decode cell over capacity: nothing to wait for, the header is the point
    args: tuple[str, ...] = (
        f"--llm-endpoint={TINY}",
        "--llm-contexts=1K,4K",
        "--llm-concurrency=1,4",
    )
    args += ("--llm-kv-capacity=100", *SHORT)
    grid = pytester.runpytest(*args, "-k", "test_decode and 1K")
    grid.assert_outcomes(skipped=2, deselected=4)
    grid.stdout.fnmatch_lines(["llmspeed: api * · window 1 s · contexts 1K · concurrency 1,4"])
    few = pytester.runpytest(*args, "-k", "1K-c1 or 4K-c4")
    few.assert_outcomes(skipped=2, deselected=4)
    few.stdout.fnmatch_lines(["llmspeed: api * · cells decode[[]1K-c1[]], decode[[]4K-c4[]]"])
    assert progress_lines(few)[0].startswith("[1/2] decode[1K-c1] · window 1 s")


def test_the_header_words_for_a_selection():
    p, d = CellId.prefill, CellId.decode
    matrix = [p(8192), p(16384), d(8192, 1), d(8192, 2), d(16384, 1), d(16384, 2)]
    assert selected_words(matrix, []) == "contexts 8K,16K · concurrency 1,2"
    assert selected_words(matrix[:2], []) == "contexts 8K,16K · prefill only"
    assert selected_words([d(16384, 2), d(8192, 1)], []) == "cells decode[16K-c2], decode[8K-c1]"
    assert selected_words(matrix[:3], []) == "cells prefill[8K], prefill[16K], decode[8K-c1]"
    assert selected_words(matrix[:-1], []) == (
        "5 cells (not a full grid) · contexts 8K,16K · concurrency 1,2"
    )
    assert selected_words([], [4096]) == "your test at 4K picks its cells (named as they run)"
    assert selected_words(matrix[2:3], [4096, "max", 4096]) == (
        "contexts 8K · concurrency 1 · 3 tests of yours at 4K,max pick their cells "
        "(named as they run)"
    )
    assert selected_words([], []) == "no cell selected"


FLAKY = """
import pytest

RUNS = []

@pytest.mark.parametrize("llm_prefix", ["1K"], indirect=True)
@pytest.mark.parametrize("llm_concurrency", [1])
def test_flaky(llm_prefix, llm_concurrency, llm_cell):
    RUNS.append(llm_cell.decode(llm_prefix, llm_concurrency))
    assert len(RUNS) > 2, "flaky"

@pytest.mark.parametrize("llm_prefix", ["1K"], indirect=True)
def test_steady(llm_prefix, llm_cell):
    llm_cell.decode(llm_prefix, 2)
"""


@pytest.mark.slow
def test_counters_stay_right_under_reruns(pytester, results_doc):
    pytest.importorskip("pytest_rerunfailures")
    pytester.makepyfile(test_speed=FLAKY)
    result = pytester.runpytest(
        f"--llm-endpoint={TINY}", *SHORT, "--reruns", "2", "--llm-results=out.json"
    )
    result.assert_outcomes(passed=2)
    assert result.parseoutcomes()["rerun"] == 2
    lines = progress_lines(result)
    heads = [ln.split(" · ")[0].split(":")[0] for ln in lines]  # each line's number and cell
    runs = ["", " (rerun 1)", " (rerun 2)"]
    assert heads == [
        *(f"[1/2] decode[1K-c1]{run}" for run in runs for _ in ("start", "end")),
        "[2/2] decode[1K-c2]",
        "[2/2] decode[1K-c2]",
    ], "\n".join(lines)
    # a run that failed says so (pytest's R is not in a log); the last one passed
    assert re.fullmatch(rf"\[1/2\] decode\[1K-c1\]: {FIGURE} · test RERUN{PERCENT}", lines[1])
    assert re.search(r" \(took \d+ s\) · test RERUN", lines[3]), lines[3]
    assert re.fullmatch(rf"\[1/2\] decode\[1K-c1\] \(rerun 2\): {FIGURE}{PERCENT}", lines[5]), (
        lines[5]
    )
    assert lines[2].startswith("[1/2] decode[1K-c1] (rerun 1) · window 1 s · elapsed ")
    assert results_doc()["by_id"]["decode[1K-c1]"]["status"] == "valid"


BROKEN_FIXTURE = """
import pytest

@pytest.fixture(scope="session")  # before llm_prefix (same scope, named first)
def dataset():
    raise RuntimeError("dataset missing")

@pytest.mark.parametrize("llm_prefix", ["1K"], indirect=True)
@pytest.mark.parametrize("llm_concurrency", [1])
def test_chat(llm_prefix, llm_concurrency, llm_cell, dataset):
    llm_cell.decode(llm_prefix, llm_concurrency)
"""


@pytest.mark.slow
def test_a_setup_error_is_an_error_everywhere(pytester, results_doc):
    pytester.makepyfile(test_speed=BROKEN_FIXTURE)
    result = pytester.runpytest(
        f"--llm-endpoint={TINY}", *SHORT, "--llm-results=out.json", "--junitxml=out.xml"
    )
    result.assert_outcomes(errors=1)
    words = "in setup: RuntimeError: dataset missing"
    lines = progress_lines(result)
    assert lines[0].startswith("[1/1] decode[1K-c1] · window 1 s")
    assert re.fullmatch(rf"\[1/1\] decode\[1K-c1\] ERROR: {words}{PERCENT}", lines[1]), lines[1]
    result.stdout.fnmatch_lines(
        [
            "*= llmspeed =*",
            f"error: decode[[]1K-c1[]]: {words}",
            "ERROR test_speed.py::test_chat[[]1-1K[]] - RuntimeError: dataset missing",
        ]
    )
    assert "skipped" not in "\n".join(lines)
    cell = results_doc()["by_id"]["decode[1K-c1]"]
    assert cell["status"] == "error" and cell["reason"] == words
    case = next(c for suite in JUnitXml.fromfile(str(pytester.path / "out.xml")) for c in suite)
    props = {p.get("name"): p.get("value") for p in case._elem.iter("property")}
    assert props["status"] == "error"


SETUP_FAILS_FIRST = """
import pytest

@pytest.fixture(scope="session")  # before llm_prefix (same scope, named first)
def dataset():
    raise RuntimeError("dataset missing")

@pytest.mark.parametrize("llm_prefix", ["1K"], indirect=True)
def test_a_needs_data(dataset, llm_prefix, llm_cell):
    llm_cell.decode(llm_prefix, 1)

@pytest.mark.parametrize("llm_prefix", ["1K"], indirect=True)
def test_b_runs(llm_prefix, llm_cell):
    llm_cell.decode(llm_prefix, 2)
"""


def test_a_setup_error_before_the_warm_up_leaves_the_prefill_figure_to_it(pytester, results_doc):
    """A test of yours whose own fixture fails records its cell as an error; the warm-up of the
    same context by the next test still gives the prefill cell its figures."""
    pytester.makepyfile(test_speed=SETUP_FAILS_FIRST)
    result = pytester.runpytest(f"--llm-endpoint={TINY}", *SHORT, "--llm-results=out.json")
    result.assert_outcomes(passed=1, errors=1)
    cells = results_doc("out.json")["by_id"]
    assert cells["prefill[1K]"]["status"] == "valid", cells["prefill[1K]"]
    assert cells["prefill[1K]"]["prompt_tok_s"] > 0
    assert cells["decode[1K-c2]"]["status"] == "valid"
