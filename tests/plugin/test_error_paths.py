"""Error paths end to end: each one clear message, its status in the results and JUnit, what
the cells after it do, and the API key redacted on every path. Servers are real, on loopback:
the simulator (faults, its test hooks) or a small HTTP server for answers no real server gives.
Kills and key changes are triggered by a cell having finished, never by a timer."""

import json
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

pytestmark = pytest.mark.slow

KEY = "sk-test-0123456789abcdef"
SMALL = ("--llm-concurrency=1,2", "--llm-duration=1", "--llm-max-output=64", "-p", "no:randomly")


@pytest.fixture
def sim_process():
    """A simulator in its own process (so a test can kill it or change its key)."""
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "pytest_llmspeed.sim",
            "--profile",
            "tiny",
            "--port",
            "0",
            "--speed",
            "4",
            "--api-key",
            KEY,
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    line = proc.stdout.readline()
    url = "http://" + line.split("http://", 1)[1].split()[0]
    yield proc, url
    proc.kill()
    proc.wait(10)


# A plugin (-p), not a conftest: a conftest's item hooks only see items below its folder, and
# the built-in suite's items live in the installed package.
AFTER_FIRST_DECODE_CELL = """
import os, signal, urllib.request

done = []

def pytest_runtest_logreport(report):
    if report.when == "call" and "test_decode" in report.nodeid and not done:
        done.append(report.nodeid)
        {action}
"""


def test_key_rejected_in_the_middle_of_the_run_stops_it_and_keeps_the_cells(
    results_doc, pytester, sim_process
):
    _, url = sim_process
    pytester.syspathinsert()
    pytester.makepyfile(
        after_first_cell=AFTER_FIRST_DECODE_CELL.format(
            action=(
                f"urllib.request.urlopen(urllib.request.Request({url + '/sim/api-key'!r}, "
                "data=b'{\"api_key\": \"rotated\"}', method='PUT'))"
            )
        )
    )
    result = pytester.runpytest(
        "-p",
        "after_first_cell",
        f"--llm-endpoint={url}",
        f"--llm-api-key={KEY}",
        "--llm-contexts=1K",
        *SMALL,
        "--llm-results=out.json",
        "--junitxml=out.xml",
        "-m",
        "decode",
    )
    text = result.stdout.str() + result.stderr.str()
    assert result.ret == pytest.ExitCode.INTERRUPTED
    result.stdout.fnmatch_lines(
        [
            "*pytest-llmspeed: stopped: API key rejected by * (HTTP 401*). "
            "Set --llm-api-key or LLMSPEED_API_KEY to the server's key.*"
        ]
    )
    assert KEY not in text and "Traceback" not in text
    assert result.duration < 30  # stopped at the rejection, not at --llm-timeout
    cells = results_doc("out.json")["by_id"]
    assert cells["decode[1K-c1]"]["status"] == "valid"  # measured before the key changed
    assert cells["decode[1K-c2]"]["status"] == "error"
    assert "API key rejected" in cells["decode[1K-c2]"]["reason"]
    for name in ("out.json", "out.xml"):
        assert KEY not in (pytester.path / name).read_text()


def test_server_killed_after_a_cell_stops_the_run_and_keeps_what_was_measured(
    results_doc, pytester, sim_process
):
    proc, url = sim_process
    pytester.syspathinsert()
    pytester.makepyfile(
        after_first_cell=AFTER_FIRST_DECODE_CELL.format(
            action=f"os.kill({proc.pid}, signal.SIGKILL)"
        )
    )
    result = pytester.runpytest(
        "-p",
        "after_first_cell",
        f"--llm-endpoint={url}",
        f"--llm-api-key={KEY}",
        "--llm-contexts=1K,2K",
        *SMALL,
        "--llm-timeout=5",
        "--llm-results=out.json",
        "-m",
        "decode",
    )
    text = result.stdout.str() + result.stderr.str()
    assert "Traceback" not in text and KEY not in text
    assert result.ret == pytest.ExitCode.INTERRUPTED
    result.stdout.fnmatch_lines(
        ["! Interrupted: pytest-llmspeed: stopped: the server at * stopped answering*"]
    )
    outcomes = result.parseoutcomes()
    assert outcomes["passed"] == 1
    assert outcomes.get("failed", 0) + outcomes.get("errors", 0) == 1
    cells = results_doc("out.json")["by_id"]
    assert cells["decode[1K-c1]"]["status"] == "valid"
    assert cells["decode[1K-c2]"]["status"] == "error"
    assert "decode[2K-c1]" not in cells  # never started: the run stopped


class Stub(BaseHTTPRequestHandler):
    """Answers GET /v1/models with what the test sets; anything else 404."""

    answer: tuple[int, str] = (200, "{}")

    def do_GET(self):
        status, body = self.answer if self.path == "/v1/models" else (404, "no")
        data = body.encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


@pytest.fixture
def stub():
    server = ThreadingHTTPServer(("127.0.0.1", 0), Stub)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize(
    ("status", "body", "message"),
    [
        (
            200,
            "<html>hello</html>",
            "ERROR: pytest-llmspeed: http://127.0.0.1:*/v1/models did not answer JSON. "
            "Check --llm-endpoint (the base URL, without /v1).",
        ),
        (
            200,
            '{"data": []}',
            "ERROR: pytest-llmspeed: http://127.0.0.1:* serves no model (/v1/models is empty). "
            "Fix --llm-model.",
        ),
        (
            401,
            json.dumps({"error": {"message": f"invalid key {KEY}"}}),
            "ERROR: pytest-llmspeed: API key rejected by * (HTTP 401: invalid key <redacted>). "
            "Set --llm-api-key or LLMSPEED_API_KEY to the server's key.",
        ),
    ],
)
def test_models_answers_that_stop_the_run_before_any_cell(pytester, stub, status, body, message):
    stub.RequestHandlerClass.answer = (status, body)
    url = f"http://127.0.0.1:{stub.server_address[1]}"
    result = pytester.runpytest(f"--llm-endpoint={url}", f"--llm-api-key={KEY}")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([message])
    text = result.stdout.str() + result.stderr.str()
    assert KEY not in text and "Traceback" not in text


def test_a_server_that_breaks_every_stream_stops_the_run_before_any_cell(pytester):
    result = pytester.runpytest(
        "--llm-endpoint=sim:tiny?speed=4&seed=1&faults=drop=1",
        "--llm-contexts=1K",
        *SMALL,
        "--llm-results=out.json",
    )
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        ["ERROR: pytest-llmspeed: a first small completions request failed: stream broken: *"]
    )
    assert "Traceback" not in result.stdout.str() + result.stderr.str()


BREAK_AFTER_WARM_UP = """
import json, urllib.request
import pytest
from pytest_llmspeed.plugin.stash import RUN_KEY

@pytest.hookimpl(tryfirst=True)
def pytest_runtest_call(item):  # after the decode cell's warm-up (its setup), before the cell
    url = item.config.stash[RUN_KEY].base_url + "/sim/faults"
    body = json.dumps({{"faults": {faults!r}}}).encode()
    urllib.request.urlopen(urllib.request.Request(url, data=body, method="PUT"))
"""


def run_broken_after_warm_up(pytester, faults, *args):
    """One decode cell (1K, c2) whose server gets ``faults`` once its prefix is warm."""
    pytester.syspathinsert()
    pytester.makepyfile(break_it=BREAK_AFTER_WARM_UP.format(faults=faults))
    return pytester.runpytest(
        "-p",
        "break_it",
        "--llm-endpoint=sim:tiny?speed=4&seed=2",
        "--llm-contexts=1K",
        "--llm-concurrency=2",
        "--llm-results=out.json",
        "--junitxml=out.xml",
        "-m",
        "decode",
        *args,
    )


def test_stalled_streams_fail_the_cell_naming_the_timeout(results_doc, pytester):
    # every decode request stalls after its first tokens for longer than --llm-timeout: the
    # cell fails with the count, the reason and the option to change
    result = run_broken_after_warm_up(
        pytester,
        "stall=1,stall_s=40",
        "--llm-duration=3",
        "--llm-max-output=4096",
        "--llm-timeout=1",
    )
    result.assert_outcomes(failed=1, deselected=1)
    result.stdout.fnmatch_lines(
        [
            "*decode[[]1K-c2[]]: * requests failed (*% > --llm-max-error-rate 0.05): "
            "*× no data for 1 s (stalled stream) (--llm-timeout)"
        ]
    )
    cell = results_doc("out.json")["cells"][-1]
    assert cell["id"] == "decode[1K-c2]" and cell["status"] == "failed"
    assert cell["errors"] >= 2 and "stalled stream" in cell["reason"]
    assert 'name="status" value="failed"' in (pytester.path / "out.xml").read_text()


def test_bursts_of_503_fail_the_cell_with_the_servers_answer(results_doc, pytester):
    result = run_broken_after_warm_up(
        pytester, "burst503=1,burst_s=30", "--llm-duration=2", "--llm-max-output=64"
    )
    result.assert_outcomes(failed=1, deselected=1)
    result.stdout.fnmatch_lines(["*decode[[]1K-c2[]]: *HTTP 503*"])
    assert "Traceback" not in result.stdout.str()
    cell = results_doc("out.json")["cells"][-1]
    assert cell["status"] in ("failed", "error") and "HTTP 503" in cell["reason"]
