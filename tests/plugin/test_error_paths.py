"""Error paths end to end: each one clear message, its status in the results and JUnit, what
the cells after it do, and the API key redacted on every path. Servers are real, on loopback:
the simulator (faults, its test hooks) or a small HTTP server for answers no real server gives.
Kills and key changes are triggered by a cell having finished, never by a timer."""

import fnmatch
import json
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from junitparser import JUnitXml

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
    assert proc.stdout is not None
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
        ["ERROR: pytest-llmspeed: a first small completions request failed: *: stream broken: *"]
    )
    assert "Traceback" not in result.stdout.str() + result.stderr.str()


def test_a_500_not_about_the_prompt_names_the_url_and_keeps_token_ids(pytester):
    """Only a refusal about the prompt switches to text prompts (llama-cpp-python answers its
    validation errors with HTTP 500); any other 500 stops the run, naming URL and purpose."""
    result = pytester.runpytest(
        "--llm-endpoint=sim:tiny?speed=4&seed=1&faults=start500=1",
        "--llm-contexts=1K",
        *SMALL,
    )
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        [
            "ERROR: pytest-llmspeed: a first small completions request failed: "
            "http://127.0.0.1:*/v1/completions (finding which request fields and prompt form "
            "the server takes): HTTP 500: llmspeed-sim injected fault*"
        ]
    )
    assert "token-id prompts" not in result.stdout.str() + result.stderr.str()


BREAK_AFTER_WARM_UP = """
import json, urllib.request
import pytest
from pytest_llmspeed.plugin.stash import RUN_KEY

@pytest.hookimpl(tryfirst=True)
def pytest_runtest_call(item):  # after the decode cell's warm-up (its setup), before the cell
    url = item.config.stash[RUN_KEY].server.base_url + "/sim/faults"
    faults = {faults!r} if {cell!r} in item.nodeid else "none"
    body = json.dumps({{"faults": faults}}).encode()
    urllib.request.urlopen(urllib.request.Request(url, data=body, method="PUT"))
"""


def run_broken_after_warm_up(pytester, faults, *args, cell="", concurrency="2"):
    """Decode cells at 1K (one, c2, unless told) whose server gets ``faults`` once their
    prefix is warm: every cell's, or only the one whose id holds ``cell`` (the others' none)."""
    pytester.syspathinsert()
    pytester.makepyfile(break_it=BREAK_AFTER_WARM_UP.format(faults=faults, cell=cell))
    return pytester.runpytest(
        "-p",
        "break_it",
        "--llm-endpoint=sim:tiny?speed=4&seed=2",
        "--llm-contexts=1K",
        f"--llm-concurrency={concurrency}",
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
            "*× no token for 1 s after the last one (a stalled stream; *) (--llm-timeout)"
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


def junit_status(pytester):
    """Each case's ``status`` property in out.xml, by the cell in its name."""
    xml = JUnitXml.fromfile(str(pytester.path / "out.xml"))
    return {
        case.name.split("[")[1].rstrip("]"): {
            p.get("name"): p.get("value") for p in case._elem.iter("property")
        }.get("status")
        for suite in xml
        for case in suite
    }


def test_a_window_that_never_opens_is_an_error_naming_the_timeout(results_doc, pytester):
    # KV for one 1K + 4096 request only (the plugin told otherwise, so the cell runs): at c2 the
    # second stream waits for the first, which takes longer than --llm-timeout to finish, so
    # it never has its first token in time; the c1 cell after it runs as usual
    result = pytester.runpytest(
        "--llm-endpoint=sim:tiny?speed=4&kv_capacity=6144&max_model_len=6144",
        "--llm-kv-capacity=1000000",
        "--llm-contexts=1K",
        "--llm-concurrency=2,1",
        "--llm-duration=1",
        "--llm-max-output=4096",
        "--llm-timeout=1",
        "--llm-results=out.json",
        "--junitxml=out.xml",
        "-m",
        "decode",
    )
    result.assert_outcomes(failed=1, passed=1, deselected=1)
    result.stdout.fnmatch_lines(
        [
            "*decode[[]1K-c2[]]: the window never opened: 1 of 2 streams had a first token "
            "within 1 s (--llm-timeout)*"
        ]
    )
    assert "Traceback" not in result.stdout.str()
    cells = results_doc("out.json")["by_id"]
    never = cells["decode[1K-c2]"]
    assert never["status"] == "error" and "the window never opened" in never["reason"]
    assert never["measured_s"] == 0 and never["output_tokens"] == 0
    assert cells["decode[1K-c1]"]["status"] == "valid"  # the run goes on
    assert junit_status(pytester) == {"1K-c2": "error", "1K-c1": "valid"}


def test_a_window_cut_short_by_failures_is_an_error_and_the_run_goes_on(results_doc, pytester):
    # once the c8 cell's window is open (every stream had its first tokens), every stream
    # breaks mid-way: the cell stops at the failures in a row (~1 s in), long before its 4 s;
    # the c1 cell after it (faults off again) is measured as usual
    result = run_broken_after_warm_up(
        pytester,
        "drop=1",
        "--llm-duration=4",
        "--llm-max-output=64",
        cell="1K-c8",
        concurrency="8,1",
    )
    result.assert_outcomes(failed=1, passed=1, deselected=1)
    message = (
        "the window was cut short after *.* of 4 s: the server failed * requests in a row: "
        "stream broken*"
    )
    result.stdout.fnmatch_lines([f"*decode[[]1K-c8[]]: {message}"])
    assert "Traceback" not in result.stdout.str()
    cells = results_doc("out.json")["by_id"]
    cut = cells["decode[1K-c8]"]
    assert cut["status"] == "error" and fnmatch.fnmatch(cut["reason"], message)
    # what the window held until then is kept, and says how long it lasted
    assert 0 < cut["measured_s"] < 4 and cut["output_tokens"] > 0
    lasted = float(cut["reason"].split("cut short after ", 1)[1].split()[0])
    assert lasted == pytest.approx(cut["measured_s"], abs=0.051)
    assert cells["decode[1K-c1]"]["status"] == "valid"
    assert cells["decode[1K-c1]"]["measured_s"] == pytest.approx(4, abs=0.01)
    assert junit_status(pytester) == {"1K-c8": "error", "1K-c1": "valid"}
