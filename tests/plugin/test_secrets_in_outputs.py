"""No key in any output (docs/trust.md, issue 29): a run with an API key, a crash shown with
its locals (``--tb=long -l``) and a key refused in the middle of the run, then every output
searched: the terminal, the JUnit XML, the results file, the page, the Markdown summary. And
a ``--llm-serve`` command whose server echoes its own ``--api-key`` value and exits: the log
tail printed holds no key."""

import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow

KEY = "sk-test-0123456789abcdef"
SERVE_KEY = "sk-serve-fedcba9876543210"
SMALL = ("--llm-concurrency=1,2", "--llm-duration=1", "--llm-max-output=64", "-p", "no:randomly")


@pytest.fixture
def sim_process():
    """A simulator in its own process, with a key (so a test can change it)."""
    args = ["--profile", "tiny", "--port", "0", "--speed", "4", "--api-key", KEY]
    proc = subprocess.Popen(
        [sys.executable, "-m", "pytest_llmspeed.sim", *args],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    url = "http://" + line.split("http://", 1)[1].split()[0]
    yield url
    proc.kill()
    proc.wait(10)


# a test of the user's own that crashes with the run's objects in its locals
CRASH = """
from pytest_llmspeed.plugin.stash import RUN_KEY

def test_crash_with_locals(request, llm_bench, llm_server):
    run = request.config.stash[RUN_KEY]
    settings = run.settings
    config = llm_bench.config
    conn = llm_bench.conn
    factory = llm_bench.factory
    key = config.api_key
    text = f"{key} {key!r} {key!s}"
    raise RuntimeError(f"crash: {text} {config!r} {conn!r}")
"""

# a plugin (-p): after the first decode cell, the server's key changes
ROTATE = """
import urllib.request

done = []

def pytest_runtest_logreport(report):
    if report.when == "call" and "test_decode" in report.nodeid and not done:
        done.append(report.nodeid)
        urllib.request.urlopen(urllib.request.Request(
            {url!r}, data=b'{{"api_key": "rotated"}}', method="PUT"))
"""


def test_no_output_holds_the_key(pytester, sim_process, monkeypatch):
    url = sim_process
    summary = pytester.path / "summary.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    pytester.syspathinsert()
    pytester.makepyfile(test_crash=CRASH, rotate=ROTATE.format(url=url + "/sim/api-key"))
    result = pytester.runpytest(
        "-p",
        "rotate",
        f"--llm-endpoint={url}",
        f"--llm-api-key={KEY}",
        "--llm-contexts=1K",
        "--llm-builtin-suite=always",
        *SMALL,
        "--tb=long",
        "-l",
        "-rA",
        "--llm-results=out.json",
        "--llm-html=out.html",
        "--junitxml=out.xml",
    )
    text = result.stdout.str() + result.stderr.str()
    # the paths were taken: the crash shown with its locals, the key refused
    assert "RuntimeError: crash: <redacted> <redacted> <redacted>" in text
    assert "config     = BenchConfig(" in text or "config = BenchConfig(" in text
    assert "api_key=<redacted>" in text
    assert "API key rejected" in text
    outputs = {
        "terminal": text,
        **{
            name: (pytester.path / name).read_text()
            for name in ("out.json", "out.xml", "out.html", "summary.md")
        },
    }
    assert "RuntimeError: crash" in outputs["out.xml"]
    assert "API key rejected" in outputs["out.json"]
    for name, content in outputs.items():
        assert KEY not in content, name
        assert KEY[3:15] not in content, name  # nor a part of it


def test_a_serve_log_that_echoes_the_commands_key_shows_none(pytester):
    """The key only in --llm-serve's command; the server prints its arguments (the bare
    value, no option before it) and exits: the log tail printed is redacted."""
    script = pytester.makepyfile(
        echo_server="import sys\nprint('starting with', ' '.join(sys.argv[2:]))\n"
        "print('key is', sys.argv[-1])\nsys.exit(3)\n"
    )
    command = f"{sys.executable} {script} --port {{port}} --api-key {SERVE_KEY}"
    result = pytester.runpytest(
        f"--llm-serve={command}", "--llm-contexts=1K", *SMALL, "--llm-serve-timeout=30"
    )
    text = result.stdout.str() + result.stderr.str()
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert "exited with code 3" in text and "key is <redacted>" in text
    assert SERVE_KEY not in text
    log = (pytester.path / "llmspeed-serve.log").read_text()
    assert log.splitlines()[0].endswith("--api-key '<redacted>'") or "<redacted>" in log
