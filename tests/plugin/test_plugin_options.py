"""The plugin as users meet it: inactive without an endpoint; one clear message per bad input."""

import subprocess
import sys
import textwrap

import pytest


def test_inactive_without_endpoint_imports_nothing_heavy(tmp_path):
    (tmp_path / "test_a.py").write_text("def test_a():\n    assert 1\n")
    code = textwrap.dedent(
        f"""
        import sys, pytest
        rc = pytest.main(["-q", "-p", "no:cacheprovider", {str(tmp_path)!r}])
        heavy = [m for m in ("aiohttp", "numpy", "pytest_llmspeed.sim",
                             "pytest_llmspeed.core.client") if m in sys.modules]
        print("HEAVY", heavy)
        sys.exit(rc)
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "HEAVY []" in out.stdout
    assert "1 passed" in out.stdout
    assert "llmspeed" not in out.stdout.replace("HEAVY", "")


def test_markers_registered(pytester):
    result = pytester.runpytest("--markers")
    result.stdout.fnmatch_lines(
        ["*@pytest.mark.llmspeed*", "*@pytest.mark.prefill*", "*@pytest.mark.decode*"]
    )


def test_help_lists_every_option(pytester):
    result = pytester.runpytest("--help")
    for flag in (
        "--llm-endpoint",
        "--llm-model",
        "--llm-api-key",
        "--llm-api",
        "--llm-contexts",
        "--llm-prefill-contexts",
        "--llm-concurrency",
        "--llm-duration",
        "--llm-precision",
        "--llm-min-duration",
        "--llm-prefill-repeats",
        "--llm-max-output",
        "--llm-kv-capacity",
        "--llm-results",
        "--llm-timeout",
    ):
        result.stdout.fnmatch_lines([f"*{flag}*"])


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--llm-duration=abc"], "--llm-duration='abc': must be a positive number of seconds"),
        (["--llm-duration=-3"], "--llm-duration='-3': must be a positive number of seconds"),
        (["--llm-contexts=8X"], "--llm-contexts='8X': context '8X' is not a token count*"),
        (["--llm-concurrency=1,0"], "--llm-concurrency='1,0': concurrency '0' is not a whole*"),
        (["--llm-api=grpc"], "--llm-api='grpc': choose one of completions, chat"),
        (["--llm-prompt-form=words"], "--llm-prompt-form='words': choose one of ids, text"),
        (["--llm-max-output=many"], "--llm-max-output='many': must be a whole number*"),
        (["--llm-max-error-rate=2"], "--llm-max-error-rate='2': must be a fraction*"),
        (["--llm-prefill-repeats=0"], "--llm-prefill-repeats='0': must be a whole number of*"),
        (["--llm-precision=0"], "--llm-precision='0': must be above 0: give the interval's*"),
        (["--llm-precision=150%"], "--llm-precision='150%': is wider than ±50 %*e.g. 2% or 0.02"),
        (["--llm-precision=2"], "--llm-precision='2': is 2, read as a fraction (±200%)*"),
        (["--llm-precision=abc"], "--llm-precision='abc': give the interval's half-width as a*"),
        (
            ["--llm-precision=2%", "--llm-min-duration=40"],
            "--llm-min-duration='40': is longer than --llm-duration (30 s)*",
        ),
        (["--llm-min-duration=0"], "--llm-min-duration='0': must be a positive number of*"),
        (
            ["--llm-client-processes=0"],
            "--llm-client-processes='0': must be a whole number of processes ≥ 1, or auto",
        ),
        (
            ["--llm-client-processes=abc"],
            "--llm-client-processes='abc': must be a whole number of processes ≥ 1, or auto",
        ),
        (
            ["--llm-client-processes=2", "--llm-precision=2%"],
            "--llm-client-processes='2': cannot go with --llm-precision: its early end needs*",
        ),
    ],
)
def test_bad_option_values_are_usage_errors(pytester, args, message):
    result = pytester.runpytest("--llm-endpoint=http://127.0.0.1:9", *args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"ERROR: {message}"])
    assert "Traceback" not in result.stderr.str() + result.stdout.str()


def test_bad_endpoint_scheme(pytester):
    result = pytester.runpytest("--llm-endpoint=ftp://host")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["ERROR: --llm-endpoint='ftp://host': use a URL such as*"])


@pytest.mark.parametrize(
    ("option", "url", "shown", "why"),
    [
        ("endpoint", "http://127.0.0.1:9/?api_key=sk-SECRET123", "http://127.0.0.1:9/",
         "holds a key in its query string"),
        ("endpoint", "http://me:sk-SECRET123@127.0.0.1:9", "http://127.0.0.1:9",
         "holds credentials"),
        ("endpoint", "http://127.0.0.1:9/v1?model=x", "http://127.0.0.1:9/v1",
         "has a query string or fragment"),
        ("metrics-url", "http://127.0.0.1:9/metrics?token=SECRET123", "http://127.0.0.1:9/metrics",
         "holds a key in its query string"),
    ],
)  # fmt: skip
def test_a_server_url_with_credentials_is_refused_without_printing_them(
    pytester, option, url, shown, why
):
    """A key in the URL would be printed on every line that names the server (and the API's
    paths were appended after its query string): refused in one line that hides it."""
    args = [f"--llm-{option}={url}"]
    if option != "endpoint":
        args.insert(0, "--llm-endpoint=http://127.0.0.1:9")
    result = pytester.runpytest(*args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"ERROR: --llm-{option}='{shown}': {why}*"])
    everything = result.stderr.str() + result.stdout.str()
    assert "SECRET" not in everything and "Traceback" not in everything


def test_ini_environment_and_command_line_precedence(pytester, monkeypatch):
    pytester.makeini("[pytest]\nllm_duration = nope\n")
    result = pytester.runpytest("--llm-endpoint=http://127.0.0.1:9")
    result.stderr.fnmatch_lines(["ERROR: ini key llm_duration='nope': *"])
    pytester.makeini("[pytest]\nllm_endpoint = news://z\n")
    result = pytester.runpytest()
    result.stderr.fnmatch_lines(["ERROR: ini key llm_endpoint='news://z'*"])
    monkeypatch.setenv("LLMSPEED_ENDPOINT", "gopher://x")
    result = pytester.runpytest()
    result.stderr.fnmatch_lines(["ERROR: environment variable LLMSPEED_ENDPOINT='gopher://x'*"])
    result = pytester.runpytest("--llm-endpoint=ftp://y")
    result.stderr.fnmatch_lines(["ERROR: --llm-endpoint='ftp://y'*"])


def test_unreachable_endpoint_stops_at_once(pytester):
    result = pytester.runpytest("--llm-endpoint=http://127.0.0.1:9", "--llm-timeout=5")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        ["ERROR: pytest-llmspeed: cannot reach the LLM server at http://127.0.0.1:9*"]
    )
    assert "Traceback" not in result.stderr.str()
    assert result.duration < 30


def test_collect_only_is_offline(pytester):
    result = pytester.runpytest(
        "--llm-endpoint=http://127.0.0.1:9",
        "--collect-only",
        "-q",
        "--llm-contexts=8K,max",
        "--llm-concurrency=1,4",
    )
    result.stdout.fnmatch_lines(
        [
            "llmspeed::test_prefill[[]8K[]]",
            "llmspeed::test_prefill[[]max[]]",
            "llmspeed::test_decode[[]8K-c1[]]",
            "llmspeed::test_decode[[]max-c4[]]",
        ]
    )


def test_readme_documents_every_option():
    """docs/options.md, the options' reference the README links to, has a row for each."""
    from pathlib import Path

    from pytest_llmspeed.plugin.settings import OPTIONS

    reference = (Path(__file__).parents[2] / "docs" / "options.md").read_text(encoding="utf-8")
    for opt in OPTIONS:
        assert f"| `{opt.flag}` | `{opt.ini}` |" in reference, opt.flag


def test_server_that_never_answers_times_out_with_one_message(pytester):
    import socket
    import threading

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    port = listener.getsockname()[1]
    accepted = []
    stop = threading.Event()

    def accept():  # takes connections and never answers
        listener.settimeout(0.2)
        while not stop.is_set():
            try:
                accepted.append(listener.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        result = pytester.runpytest(f"--llm-endpoint=http://127.0.0.1:{port}", "--llm-timeout=2")
    finally:
        stop.set()
        thread.join()
        for conn in accepted:
            conn.close()
        listener.close()
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        ["ERROR: pytest-llmspeed: cannot reach the LLM server at *: no answer within 2 s *"]
    )
    assert result.duration < 20


@pytest.mark.parametrize(
    ("option", "value", "message"),
    [
        ("--llm-results", "/proc/r.json", "cannot write there (*): choose a writable path"),
        ("--llm-save-baseline", "/proc/b.toml", "cannot write there (*): choose a writable path"),
        ("--llm-results", ".", "is a folder: give a file name"),
    ],
)
def test_an_output_that_cannot_be_written_is_a_usage_error(pytester, option, value, message):
    result = pytester.runpytest("--llm-endpoint=sim", f"{option}={value}")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"ERROR: {option}={value!r}: {message}"])
    assert "Traceback" not in result.stderr.str() + result.stdout.str()


def test_an_output_folder_that_does_not_exist_yet_is_created(pytester):
    result = pytester.runpytest("--llm-endpoint=sim", "--llm-results=new/dir/r.json", "--co")
    assert result.ret == pytest.ExitCode.OK
    assert (pytester.path / "new" / "dir").is_dir()
