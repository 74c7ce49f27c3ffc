"""What goes wrong on the server side reaches the user as one clear message, never a traceback."""

import json
import re
import subprocess
import sys

import pytest

from tests.plugin import sigint_as_at_a_terminal

pytestmark = pytest.mark.slow  # every test here runs a matrix on the simulator


def test_errors_mid_stream_fail_the_cell_with_a_summary(results_doc, pytester):
    result = pytester.runpytest(
        "--llm-endpoint=sim:tiny?speed=4&faults=midstream=0.5",
        "--llm-contexts=1K",
        "--llm-concurrency=4",
        "--llm-duration=1",
        "--llm-max-output=256",
        "--llm-results=out.json",
        "-m",
        "decode",
    )
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            "*decode[[]1K-c4[]]: * of * requests failed (*% > --llm-max-error-rate 0.05): "
            "*× error event*"
        ]
    )
    text = result.stdout.str()
    assert "Traceback" not in text and "def test_decode" not in text
    cell = results_doc("out.json")["cells"][-1]
    assert cell["status"] == "failed" and cell["errors"] > 0
    assert cell["output_tokens"] > 0  # what was measured is kept


def test_error_rate_threshold_is_an_option(pytester):
    result = pytester.runpytest(
        "--llm-endpoint=sim:tiny?speed=4&faults=start500=0.1",
        "--llm-contexts=1K",
        "--llm-concurrency=4",
        "--llm-duration=1",
        "--llm-max-output=64",
        "--llm-max-error-rate=1",
        "-m",
        "decode",
    )
    result.assert_outcomes(passed=1)


# The server killed in the middle of a run: tests/plugin/test_error_paths.py (the kill is
# triggered by a cell having finished, not by a timer).


def test_prompt_the_server_refuses_fails_the_cell_with_its_reason(results_doc, pytester):
    # A server that does not report max_model_len cannot be checked up front: the plugin
    # sends the prompt, and the server's refusal (HTTP 400) of a cell the arithmetic let
    # through is a failure carrying the server's message, never a skip; the decode cells of
    # that context are not run.
    pytester.makeconftest(
        """
        import pytest
        from pytest_llmspeed.plugin.stash import RUN_KEY

        @pytest.hookimpl(trylast=True)
        def pytest_configure(config):
            server = config.stash[RUN_KEY].server
            start = server.start

            def start_without_max_model_len():
                start()
                server.info.max_model_len = None
                server.skip = lambda *a: None

            server.start = start_without_max_model_len
        """
    )
    result = pytester.runpytest(
        "--llm-endpoint=sim:tiny?speed=4",
        "--llm-contexts=40K",
        "--llm-concurrency=1",
        "--llm-duration=1",
        "--llm-max-output=64",
        "--llm-results=out.json",
        "-m",
        "decode",
    )
    result.assert_outcomes(errors=1, deselected=1)
    result.stdout.fnmatch_lines(
        ["*prefill[[]40K[]]: the server refused a prompt that fits (HTTP 400: *40960*"]
    )
    assert "Traceback" not in result.stdout.str()
    cells = results_doc("out.json")["by_id"]
    assert cells["prefill[40K]"]["status"] == "failed"
    assert "HTTP 400" in cells["prefill[40K]"]["reason"]
    assert cells["decode[40K-c1]"]["status"] == "error"  # its setup failed: pytest's ERROR
    assert "refused a prompt that fits" in cells["decode[40K-c1]"]["reason"]


def test_ctrl_c_keeps_the_finished_cells(tmp_path):
    import signal
    import time

    results = tmp_path / "out.json"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "no:cacheprovider",
            "--llm-endpoint=sim:tiny",
            "--llm-contexts=1K",
            "--llm-concurrency=1,2,4,8",
            "--llm-duration=3",
            "--llm-max-output=256",
            f"--llm-results={results}",
            "-m",
            "decode",
            str(tmp_path),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        preexec_fn=sigint_as_at_a_terminal,
        cwd=tmp_path,
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if results.exists() and '"decode[1K-c2]"' in results.read_text():
            break
        time.sleep(0.2)
    time.sleep(1.0)  # decode[1K-c4] is running (its 3 s window, after the idle wait)
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == pytest.ExitCode.INTERRUPTED, out
    assert "Traceback" not in out
    assert "KeyboardInterrupt" in out and "Sustained decode" in out
    cells = {c["id"]: c for c in json.loads(results.read_text())["cells"]}
    assert cells["decode[1K-c1]"]["status"] == "valid"
    assert cells["decode[1K-c2]"]["status"] == "valid"
    # the cell Ctrl-C cut is named, in the results and the summary, never as passed
    cut = cells["decode[1K-c4]"]
    assert cut["status"] == "error" and "by Ctrl-C" in cut["reason"], cut
    assert re.search(r"error: decode\[1K-c4\]: cut after \d+\.\d s by Ctrl-C", out), out
    assert "decode[1K-c8]" not in cells
