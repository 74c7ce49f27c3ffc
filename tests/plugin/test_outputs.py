"""A registered output (report/outputs.py) in a run: its option writes the file before the
first cell and after every cell, and the summary names it."""

import pytest

from pytest_llmspeed.report.outputs import OUTPUTS
from pytest_llmspeed.results import load


@pytest.mark.parametrize("output", OUTPUTS, ids=lambda o: o.key)
def test_a_registered_output_is_written_and_named(pytester, output):
    path = f"out/run{output.suffix}"
    result = pytester.runpytest(
        "--llm-endpoint=sim:tiny?speed=4",
        "--llm-contexts=1K",
        "--llm-concurrency=1",
        "-m",
        "prefill",
        f"--llm-{output.key}={path}",
        "--llm-results=out/r.json",
    )
    result.assert_outcomes(passed=1, deselected=1)
    result.stdout.fnmatch_lines(["results: out/r.json", f"{output.label}: {path}"])
    # the file is the run's final results in that format
    again = pytester.path / f"again{output.suffix}"
    output.write(load(pytester.path / "out" / "r.json"), None, str(again))
    assert (pytester.path / path).read_text() == again.read_text()


@pytest.mark.parametrize("output", OUTPUTS, ids=lambda o: o.key)
def test_an_output_that_cannot_be_written_is_a_usage_error(pytester, output):
    result = pytester.runpytest("--llm-endpoint=sim", f"--llm-{output.key}=/proc/x")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        [f"ERROR: --llm-{output.key}='/proc/x': cannot write there (*): choose a writable path"]
    )


def test_a_disk_that_fills_during_the_run_loses_nothing_measured(pytester, monkeypatch):
    """The results file cannot be written once the run is under way (a full disk: ENOSPC):
    one note names the path and the cause, the page is still written, each cell keeps its
    outcome, and the terminal summary shows the figures."""
    import errno

    from pytest_llmspeed.results import Results

    def full(self, path):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(Results, "dump", full)
    result = pytester.runpytest(
        "--llm-endpoint=sim:tiny?speed=10", "--llm-contexts=1K", "--llm-concurrency=1,2",
        "--llm-duration=1", "-m", "decode", "--llm-results=out/r.json", "--llm-html=out/p.html",
    )  # fmt: skip
    result.assert_outcomes(passed=2, deselected=1)
    out = result.stdout.str()
    assert "Traceback" not in out and "INTERNALERROR" not in out
    notes = [ln for ln in result.stdout.lines if "could not be written" in ln]
    assert notes == [
        "note: out/r.json could not be written (No space left on device): what was measured is "
        "in this summary; free the space or give another path"
    ], notes
    result.stdout.fnmatch_lines(["1K   * · * ms  * · * ms"])  # the decode matrix's row
    assert (pytester.path / "out" / "p.html").exists()
    assert not list((pytester.path / "out").glob(".llmspeed-*"))  # no temporary file left


def test_a_second_run_on_one_results_file_is_refused(pytester):
    """Two runs writing one results file after every cell replace each other's: the second
    (here, a lock held as a first run holds it) is refused before any cell, naming the first;
    once the first ends, the path is free again."""
    import fcntl
    import os

    lock = pytester.path / ".r.json.lock"
    fd = os.open(lock, os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    os.write(fd, b"4242")
    try:
        result = pytester.runpytest("--llm-endpoint=sim", "--llm-results=r.json")
    finally:
        os.close(fd)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        ["ERROR: --llm-results=r.json: another run (pid 4242) is writing it: give this run *"]
    )
    result = pytester.runpytest(
        "--llm-endpoint=sim:tiny?speed=10", "--llm-contexts=1K", "--llm-concurrency=1",
        "-m", "prefill", "--llm-results=r.json",
    )  # fmt: skip
    result.assert_outcomes(passed=1, deselected=1)
    assert (pytester.path / "r.json").exists() and not lock.exists()  # released at the end
