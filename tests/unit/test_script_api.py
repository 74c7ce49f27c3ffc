"""The script API (issue 30): ``Bench`` and ``BenchConfig`` are public names of the package,
the README's example runs as it is against the simulator that a ``sim`` spec starts, and an
address the client cannot use is refused in one line before anything is opened."""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import pytest_llmspeed
from pytest_llmspeed import Bench, BenchConfig
from pytest_llmspeed.core import bench as core_bench

ROOT = Path(__file__).resolve().parents[2]

# after the example: every child process of the script is gone (the simulator stopped)
CHILDREN = """
import os, pathlib
children = pathlib.Path(f"/proc/{os.getpid()}/task/{os.getpid()}/children").read_text().split()
print("CHILDREN", len(children))
"""


def readme_example() -> str:
    """The README's fenced Python block that imports Bench from the package."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    blocks = re.findall(r"^```python\n(.*?)^```", text, flags=re.DOTALL | re.MULTILINE)
    found = [b for b in blocks if "from pytest_llmspeed import Bench, BenchConfig" in b]
    assert len(found) == 1, "the README's script example"
    return found[0]


def run_script(code: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """``code`` in a fresh interpreter, every warning an error (``-W error``: an unclosed
    session, pipe or loop would show on stderr)."""
    return subprocess.run(
        [sys.executable, "-W", "error", "-c", code],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=tmp_path,
    )


def test_bench_and_config_are_public_and_lazy():
    assert {"Bench", "BenchConfig"} <= set(pytest_llmspeed.__all__)
    assert Bench is core_bench.Bench and BenchConfig is core_bench.BenchConfig
    code = (
        "import sys, pytest_llmspeed\n"
        "print(sorted(m for m in ('pytest_llmspeed.core.bench', 'aiohttp', 'numpy') "
        "if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


@pytest.mark.slow
def test_the_readme_example_runs_against_the_simulator_it_starts(tmp_path):
    done = run_script(readme_example() + CHILDREN, tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stderr == ""  # no traceback, no unclosed session, no warning
    first, children = done.stdout.splitlines()
    model, status, figure = first.split()
    assert (model, status) == ("tiny", "valid")
    assert float(figure) > 0  # total tok/s
    assert children == "CHILDREN 0"


def _config(url: str, **more: object) -> BenchConfig:
    return BenchConfig(url, None, None, "completions", 64, 1.0, 5.0, None, **more)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("url", "more", "named"),
    [
        ("localhost:8000", {}, "base_url 'localhost:8000' is not an http(s) URL"),
        ("ftp://gpu-box:8000", {}, "base_url 'ftp://gpu-box:8000' is not an http(s) URL"),
        ("http://", {}, "base_url 'http://' is not an http(s) URL"),
        (
            "http://a:8000",
            {"endpoints": ("http://a:8000", "b:8000")},
            "endpoints 'b:8000' is not an http(s) URL",
        ),
        (
            "http://a:8000",
            {"metrics_urls": ("unix:///metrics",)},
            "metrics_urls 'unix:///metrics' is not an http(s) URL",
        ),
        ("sim:tiny", {"endpoints": ("http://a:8000",)}, "is the built-in simulator, one endpoint"),
        ("sim:nope", {}, "unknown simulator profile 'nope'"),
        ("sim:tiny?sped=2", {}, "unknown simulator option 'sped'"),
    ],
)
def test_an_address_the_client_cannot_use_is_refused_in_one_line(url, more, named):
    with pytest.raises(ValueError) as caught:
        _config(url, **more)
    message = str(caught.value)
    assert named in message
    assert "\n" not in message


def test_refused_before_anything_is_opened(tmp_path):
    """The failure the issue saw (aiohttp's NonHttpUrlClientError, "Unclosed client session")
    cannot happen: the config is refused, and no session exists to leave unclosed."""
    code = textwrap.dedent(
        """
        from pytest_llmspeed import BenchConfig
        try:
            BenchConfig("localhost:8000", api_key=None, model=None, api="completions",
                        max_output=64, duration=1, timeout=5, kv_capacity=None)
        except ValueError as exc:
            print("REFUSED", exc)
        """
    )
    done = run_script(code, tmp_path)
    assert done.returncode == 0 and done.stderr == "", done.stderr
    assert done.stdout.startswith("REFUSED BenchConfig: base_url 'localhost:8000' is not an ")


@pytest.mark.slow
def test_a_start_that_fails_stops_the_simulator_and_closes_the_session(tmp_path):
    code = textwrap.dedent(
        """
        from pytest_llmspeed import Bench, BenchConfig
        from pytest_llmspeed.core.errors import LLMSpeedError

        config = BenchConfig("sim:tiny?speed=10", api_key=None, model="not-served",
                             api="completions", max_output=64, duration=1, timeout=30,
                             kv_capacity=None)
        with Bench(config) as bench:
            try:
                bench.start()
            except LLMSpeedError as exc:
                print("FAILED", exc.message.splitlines()[0])
            print("STOPPED", bench.sim_urls != () and bench.conn is None)
        """
    )
    done = run_script(code + CHILDREN, tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stderr == ""
    assert "FAILED " in done.stdout and "not-served" in done.stdout
    assert "STOPPED True" in done.stdout
    assert "CHILDREN 0" in done.stdout
