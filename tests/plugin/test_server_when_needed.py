"""The server only when a selected test needs it: with the endpoint in the ini file (the
documented way to share it in a repository), plain ``pytest`` runs the unit tests without
touching the network or starting anything; the built-in suite, or a test of the user's that
uses an ``llm_*`` fixture, starts the server after collection."""

import json
import re
import socket
import subprocess
import sys
import textwrap
from collections.abc import Iterator

import pytest

UNIT_TEST = "def test_arithmetic():\n    assert 1 + 1 == 2\n"


@pytest.fixture
def refusing_port() -> Iterator[int]:
    """A loopback port where nothing listens (bound, not listening: connections refused)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        yield sock.getsockname()[1]


@pytest.fixture
def listener() -> Iterator[socket.socket]:
    """A loopback port that takes connections and never answers: ``accepted(listener)`` says
    whether anyone connected."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(8)
        sock.setblocking(False)
        yield sock


def accepted(sock: socket.socket) -> int:
    """Connections made to ``sock`` so far (each handshake completes in the backlog)."""
    count = 0
    while True:
        try:
            conn, _ = sock.accept()
        except BlockingIOError:
            return count
        conn.close()
        count += 1


def test_unit_tests_pass_when_the_ini_endpoint_is_down(pytester, refusing_port):
    pytester.makeini(f"[pytest]\nllm_endpoint = http://127.0.0.1:{refusing_port}\n")
    pytester.makepyfile(test_unit=UNIT_TEST)
    result = pytester.runpytest()
    assert result.ret == pytest.ExitCode.OK
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["llmspeed: built-in suite left out: the endpoint comes from *"])
    out = result.stdout.str() + result.stderr.str()
    assert "cannot reach" not in out and "llmspeed server" not in out


@pytest.mark.parametrize(
    "args",
    [(), ("-k", "arithmetic"), ("--llm-builtin-suite=never",), ("-m", "decode", "--co")],
    ids=["plain", "k", "suite-never", "collect-only"],
)
def test_an_endpoint_that_no_selected_test_needs_is_never_contacted(pytester, listener, args):
    port = listener.getsockname()[1]
    pytester.makeini(f"[pytest]\nllm_endpoint = http://127.0.0.1:{port}\nllm_timeout = 2\n")
    pytester.makepyfile(test_unit=UNIT_TEST)
    result = pytester.runpytest(*args)
    assert result.ret == pytest.ExitCode.OK, result.stdout.str() + result.stderr.str()
    assert accepted(listener) == 0


def test_a_test_of_yours_that_uses_the_server_starts_it_and_a_down_one_stops_the_run(
    pytester, refusing_port
):
    url = f"http://127.0.0.1:{refusing_port}"
    pytester.makeini(f"[pytest]\nllm_endpoint = {url}\n")
    pytester.makepyfile(
        test_unit=UNIT_TEST,
        test_speed="def test_model(llm_server):\n    assert llm_server.model\n",
    )
    result = pytester.runpytest()
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"ERROR: pytest-llmspeed: cannot reach the LLM server at {url}*"])
    out = result.stdout.str() + result.stderr.str()
    assert "Traceback" not in out and "passed" not in out  # stopped before any test
    # deselect the test that needs the server: the unit test runs, the server is not asked
    result = pytester.runpytest("-k", "not model")
    result.assert_outcomes(passed=1, deselected=1)


def test_a_test_of_yours_starts_the_simulator_it_uses(pytester):
    pytester.makeini("[pytest]\nllm_endpoint = sim:tiny\n")
    pytester.makepyfile(
        test_unit=UNIT_TEST,
        test_speed="def test_model(llm_server):\n    assert llm_server.model == 'tiny'\n",
        test_later=textwrap.dedent(
            """
            def test_asks_at_run_time(request):  # no llm_* fixture in its signature
                assert request.getfixturevalue("llm_server").model == "tiny"
            """
        ),
    )
    result = pytester.runpytest("-p", "no:randomly")
    result.assert_outcomes(passed=3)
    result.stdout.fnmatch_lines(
        [
            "llmspeed: built-in suite left out: 1 selected test(s) of yours use the llm_* *",
            "llmspeed server: http://127.0.0.1:* · engine llmspeed-sim * · model tiny *",
        ]
    )
    # a test of yours that uses the fixtures is a speed test: marked llmspeed
    marked = pytester.runpytest("-p", "no:randomly", "-m", "llmspeed", "-v")
    marked.assert_outcomes(passed=1, deselected=2)
    marked.stdout.fnmatch_lines(["*test_speed.py::test_model PASSED*"])
    unmarked = pytester.runpytest("-p", "no:randomly", "-m", "not llmspeed")
    unmarked.assert_outcomes(passed=2, deselected=1)
    assert "llmspeed server" not in unmarked.stdout.str()
    # asked for at run time only: started then, for that test
    result = pytester.runpytest("-p", "no:randomly", "test_later.py", "test_unit.py")
    result.assert_outcomes(passed=2)
    assert "llmspeed server" not in result.stdout.str()


def test_a_deselected_test_of_yours_does_not_turn_the_suite_off(pytester, refusing_port):
    """Only selected tests decide: a test of yours that uses the fixtures, left out by -k or
    -m, neither keeps the built-in suite out nor spares a dead endpoint its probe."""
    pytester.makepyfile(
        test_unit=UNIT_TEST,
        test_speed="def test_model(llm_server):\n    assert llm_server.model\n",
    )
    url = f"http://127.0.0.1:{refusing_port}"
    dead = pytester.runpytest(f"--llm-endpoint={url}", "-k", "not model")
    assert dead.ret == pytest.ExitCode.USAGE_ERROR, dead.stdout.str()
    dead.stderr.fnmatch_lines([f"ERROR: pytest-llmspeed: cannot reach the LLM server at {url}*"])
    # -m decode selects the suite's decode cells; the user's test is not one of them
    args = ("--llm-contexts=1K", "--llm-concurrency=1", "--llm-duration=1", "-p", "no:randomly")
    run = pytester.runpytest(
        "--llm-endpoint=sim:tiny?speed=8&api_key=sk-hidden", "--llm-api-key=sk-hidden", "-m",
        "decode", "--llm-results=r.json",
        *args,
    )  # fmt: skip
    outcomes = run.parseoutcomes()
    assert outcomes.get("passed") == 1, run.stdout.str()
    run.stdout.fnmatch_lines(
        [
            "collected * items / * deselected / 1 selected",
            "llmspeed: built-in suite added: -m 'decode' names its markers",
        ]
    )
    # what the simulator simulated is named with its options (not its key) in the results
    assert json.loads((pytester.path / "r.json").read_text())["run"]["endpoint"] == (
        "sim:tiny?speed=8"
    )
    assert "note: built-in simulator: sim:tiny?speed=8 at " in run.stdout.str()
    assert "sk-hidden" not in run.stdout.str()
    collected = int(re.search(r"collected (\d+) items", run.stdout.str())[1])  # type: ignore[index]
    assert outcomes["passed"] + outcomes["deselected"] == collected  # every item accounted for


SIM_IN_THE_INI = """
import subprocess, sys, pytest

started = []
popen_init = subprocess.Popen.__init__

def recording_init(self, args, *rest, **kwargs):
    started.append(" ".join(map(str, args)) if isinstance(args, (list, tuple)) else str(args))
    popen_init(self, args, *rest, **kwargs)

subprocess.Popen.__init__ = recording_init
rc = pytest.main(["-p", "no:cacheprovider", {folder!r}, *{args!r}])
heavy = [m for m in ("aiohttp", "numpy", "pytest_llmspeed.sim", "pytest_llmspeed.core.client")
         if m in sys.modules]
print("HEAVY", heavy)
print("SIMULATORS", len([a for a in started if "pytest_llmspeed.sim" in a]))
sys.exit(rc)
"""


@pytest.mark.parametrize(
    ("args", "simulators"),
    [
        ((), 0),
        # the control: the built-in suite selected, the same observation sees the simulator
        (("-m", "decode", "--llm-contexts=1K", "--llm-concurrency=1", "--llm-duration=1"), 1),
    ],
    ids=["unit-tests", "suite-selected"],
)
def test_sim_in_the_ini_starts_a_simulator_only_for_the_suite(tmp_path, args, simulators):
    (tmp_path / "pytest.ini").write_text("[pytest]\nllm_endpoint = sim:tiny?speed=4\n")
    (tmp_path / "test_unit.py").write_text(UNIT_TEST)
    out = subprocess.run(
        [sys.executable, "-c", SIM_IN_THE_INI.format(folder=str(tmp_path), args=args)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"SIMULATORS {simulators}" in out.stdout
    assert ("built-in simulator" in out.stdout) == bool(simulators)
    assert ("llmspeed server" in out.stdout) == bool(simulators)
    if not simulators:
        assert "1 passed" in out.stdout
        assert "HEAVY []" in out.stdout
