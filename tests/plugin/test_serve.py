"""--llm-serve: the plugin starts the server under test, waits until it answers, records how it
was launched and on what, and stops it — no process left behind, whatever ends the session."""

import os
import signal
import subprocess
import sys

import pytest

from tests.plugin import sigint_as_at_a_terminal
from tests.processes import gone, processes_with

pytestmark = pytest.mark.slow

MATRIX = ("--llm-contexts=1K", "--llm-concurrency=1,2", "--llm-duration=1", "--llm-max-output=64")


def sim(marker, *extra):
    """The simulator as a server command; ``marker`` (a seed) finds its processes later."""
    words = [sys.executable, "-m", "pytest_llmspeed.sim", "--port", "{port}", "--speed", "4"]
    return " ".join([*words, "--seed", str(marker), *extra])


def test_serve_records_the_launch_and_the_machine_and_leaves_nothing(results_doc, pytester):
    marker = 910001
    result = pytester.runpytest(
        f"--llm-serve={sim(marker, '--api-key', 'sk-serve-secret')}",
        "--llm-api-key=sk-serve-secret",
        *MATRIX,
        "--llm-results=out.json",
        "--junitxml=out.xml",
    )
    result.assert_outcomes(passed=3)
    run = results_doc("out.json")["run"]
    assert run["endpoint"].startswith("http://127.0.0.1:")
    assert run["launch_command"].endswith(f"--seed {marker} --api-key <redacted>")
    assert run["metadata"]["type"] in ("CPU", "Discrete GPU") and run["metadata"]["os"]
    log = pytester.path / "llmspeed-serve.log"
    assert "llmspeed-sim listening" in log.read_text()
    for text in (log.read_text(), (pytester.path / "out.json").read_text(), result.stdout.str()):
        assert "sk-serve-secret" not in text
    assert gone(marker)


def test_a_failing_session_stops_the_server_too(pytester):
    marker = 910002
    (pytester.path / "b.toml").write_text('[cells."decode[1K-c1]"]\ntotal_tok_s = 1e9\n')
    result = pytester.runpytest(
        f"--llm-serve={sim(marker)}", *MATRIX, "--llm-baseline=b.toml", "--llm-confirm=0"
    )
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    assert gone(marker)


def test_ctrl_c_stops_the_server(tmp_path):
    marker = 910003
    proc = subprocess.Popen(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-W", "ignore",
         f"--llm-serve={sim(marker)}", "--llm-contexts=1K,2K,4K", "--llm-concurrency=1,2",
         "--llm-duration=2", "--llm-max-output=4096", "--llm-results=out.json"],
        cwd=tmp_path, stdout=subprocess.PIPE, text=True,
        preexec_fn=sigint_as_at_a_terminal, start_new_session=True,
    )  # fmt: skip
    assert proc.stdout is not None
    for line in proc.stdout:  # interrupt once the first decode cell is under way
        if "decode[1K-c1] · window" in line:
            break
    assert processes_with(marker)
    os.killpg(proc.pid, signal.SIGINT)  # as a terminal's Ctrl-C reaches pytest
    out = proc.communicate(timeout=60)[0]
    assert proc.returncode == pytest.ExitCode.INTERRUPTED, out[-2000:]
    assert gone(marker)


def test_a_command_that_exits_at_once_is_one_message_with_its_log(pytester):
    command = f"{sys.executable} -c \"print('no GPU found'); raise SystemExit(3)\" {{port}}"
    result = pytester.runpytest(f"--llm-serve={command}", *MATRIX)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        [
            "ERROR: pytest-llmspeed: the server command exited with code 3 before it answered; "
            "its log llmspeed-serve.log, last lines:",
            "no GPU found",
        ]
    )
    assert "Traceback" not in result.stderr.str()


TAKEN_ONCE = """
import os, sys
port = sys.argv[1]
if not os.path.exists("tried"):  # the first start: another process bound the port first
    open("tried", "w").close()
    print("OSError: [Errno 98] Address already in use", flush=True)
    raise SystemExit(1)
os.execv(sys.executable, [sys.executable, "-m", "pytest_llmspeed.sim", "--port", port])
"""


def test_a_port_taken_before_the_server_bound_it_is_tried_again_on_another(results_doc, pytester):
    """The free port --llm-serve chose was bound by another process before the server bound
    it (vLLM binds tens of seconds after it starts, while other servers start on the machine):
    the command runs again on a new free port, said in a note."""
    script = pytester.makepyfile(taken_once=TAKEN_ONCE)
    result = pytester.runpytest(
        f"--llm-serve={sys.executable} {script} {{port}}", *MATRIX, "--llm-results=out.json"
    )
    result.assert_outcomes(passed=3)
    result.stdout.fnmatch_lines(
        ["note: --llm-serve: port * was taken by another process before the server bound it; "
         "started again on port *"]
    )  # fmt: skip
    run = results_doc("out.json")["run"]
    moved = int(run["endpoint"].rsplit(":", 1)[1])
    assert f"started again on port {moved}" in result.stdout.str()


def test_a_server_that_never_answers_times_out_and_is_stopped(pytester):
    marker = 910004
    pytester.makepyfile(  # listens, and answers every request HTTP 501
        never_ready="""
        import http.server, sys
        address = ("127.0.0.1", int(sys.argv[1]))
        http.server.HTTPServer(address, http.server.BaseHTTPRequestHandler).serve_forever()
        """
    )
    command = f"{sys.executable} never_ready.py {{port}} --seed {marker}"
    result = pytester.runpytest(f"--llm-serve={command}", "--llm-serve-timeout=3", *MATRIX)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        [
            "ERROR: pytest-llmspeed: the server did not answer /health or /v1/models within 3 s; "
            "its log llmspeed-serve.log, last lines:*"
        ]
    )
    assert gone(marker)


def test_a_server_killed_in_a_cell_stops_the_run_and_keeps_what_was_measured(results_doc, pytester):
    marker = 910005
    pytester.syspathinsert()
    pytester.makepyfile(
        kill_it="""
        import os, signal
        import pytest
        from pytest_llmspeed.plugin.stash import RUN_KEY

        @pytest.hookimpl(tryfirst=True)
        def pytest_runtest_call(item):
            if item.name == "test_decode[1K-c2]":  # the second cell: kill its server now
                os.killpg(item.config.stash[RUN_KEY].server.launched.pid, signal.SIGKILL)
        """
    )
    result = pytester.runpytest(
        "-p", "kill_it", f"--llm-serve={sim(marker)}", *MATRIX, "--llm-timeout=5",
        "--llm-results=out.json", "--junitxml=out.xml", "-m", "decode",
    )  # fmt: skip
    assert result.ret == pytest.ExitCode.INTERRUPTED
    result.stdout.fnmatch_lines(
        ["*stopped: the server command exited with code * during the run; its log *"]
    )
    cells = results_doc("out.json")["by_id"]
    assert (
        cells["decode[1K-c1]"]["status"] == "valid" and cells["decode[1K-c2]"]["status"] == "error"
    )
    assert 'name="status" value="valid"' in (pytester.path / "out.xml").read_text()
    assert "Traceback" not in result.stdout.str()
    assert gone(marker)


def test_serve_on_the_command_line_wins_over_an_endpoint_in_the_ini_file(results_doc, pytester):
    """The command line wins over the ini file: --llm-serve starts the server and the ini
    file's endpoint (another machine) is not measured, said in a note; an ini endpoint that
    --llm-serve does not outrank (both in the ini file) is still refused, naming its place."""
    marker = 910004
    pytester.makeini("[pytest]\nllm_endpoint = http://gpu-box:8000\n")
    result = pytester.runpytest(f"--llm-serve={sim(marker)}", *MATRIX, "--llm-results=out.json")
    result.assert_outcomes(passed=3)
    result.stdout.fnmatch_lines(
        [
            "*--llm-serve starts the server: the endpoint of ini key llm_endpoint "
            "(http://gpu-box:8000) is not measured*"
        ]
    )
    assert results_doc("out.json")["run"]["endpoint"].startswith("http://127.0.0.1:")
    assert gone(marker)
    pytester.makeini(f"[pytest]\nllm_endpoint = http://gpu-box:8000\nllm_serve = {sim(marker)}\n")
    both = pytester.runpytest(*MATRIX)
    assert both.ret == pytest.ExitCode.USAGE_ERROR
    both.stderr.fnmatch_lines(
        ["*--llm-endpoint=http://gpu-box:8000 (from ini key llm_endpoint) is another one*"]
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--llm-serve= "], "ERROR: --llm-serve=' ': the server command is empty*"),
        (
            ["--llm-serve=no-such-server-cmd --port {port}"],
            "ERROR: --llm-serve=*: the server command 'no-such-server-cmd' is not found*",
        ),
        (["--llm-serve=python -m x"], "ERROR: --llm-serve=*: the server command has no port*"),
        (
            ["--llm-serve=python -m x --port {port}", "--llm-endpoint=http://gpu-box:8000"],
            "ERROR: --llm-serve=*: starts a server on this machine, but --llm-endpoint=http://"
            "gpu-box:8000 is another one: give one of the two",
        ),
    ],
)
def test_bad_serve_commands_are_one_line(pytester, args, message):
    result = pytester.runpytest(*args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([message])


def starts_in(log):
    """The start factors of the simulator's starts, from its listening lines in the log."""
    return [
        line.split("start factor ")[1].rstrip(")")
        for line in log.read_text().splitlines()
        if "llmspeed-sim listening" in line and "start factor " in line
    ]


def test_runs_restart_the_launched_server_between_runs(pytester):
    marker = 910003
    result = pytester.runpytest(
        f"--llm-serve={sim(marker, '--start-noise', '0.05')}",
        *MATRIX,
        "--llm-runs=2",
        "--llm-save-baseline=b.toml",
    )
    result.assert_outcomes(passed=6)
    result.stdout.fnmatch_lines(["note: baseline: run 2 added to b.toml (3 cells; 2 runs now)"])
    factors = starts_in(pytester.path / "llmspeed-serve.log")  # the log is appended to
    assert len(factors) == 2 and factors[0] != factors[1]
    assert gone(marker)


def test_a_miss_is_re_measured_on_a_restart_of_the_launched_server(pytester):
    marker = 910004
    (pytester.path / "b.toml").write_text('[cells."decode[1K-c1]"]\ntotal_tok_s = 1e9\n')
    result = pytester.runpytest(
        f"--llm-serve={sim(marker, '--start-noise', '0.05')}",
        *MATRIX,
        "--llm-baseline=b.toml",
        "--llm-confirm=1",
        "-m",
        "decode",
    )
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(["*[[]attempts on fresh starts: *, *[]]"])
    assert len(starts_in(pytester.path / "llmspeed-serve.log")) == 2
    assert gone(marker)


def test_a_port_answered_by_another_process_is_said(results_doc, pytester):
    """What answers the command's port is another process's server (here a simulator already
    there, the command itself never listening): the run says so, naming the process, where
    it measured another server without a word."""
    from pytest_llmspeed.core import launch
    from pytest_llmspeed.sim import SimOptions, running_simulator_process

    port = launch.free_port()
    high = launch._ephemeral_low()
    if high > launch.LOW_PORT + 100:  # below the kernel's own choices (ip_local_port_range)
        assert launch.LOW_PORT <= port < high
    with running_simulator_process(SimOptions(profile="tiny", speed=10, port=port)):
        serve = f"{sys.executable} -c 'import time; time.sleep(600)' --port {port}"
        result = pytester.runpytest(
            f"--llm-serve={serve}", "--llm-contexts=1K", "--llm-concurrency=1",
            "--llm-duration=1", "-m", "decode", "--llm-results=out.json",
        )  # fmt: skip
    out = result.stdout.str()
    assert f"port {port} is held by pid" in out and "another server took the port" in out, out
