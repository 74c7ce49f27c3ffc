"""Cheap when unused, in any environment (issue 30): with no selected test that needs the
server, the plugin imports little, and pytest's assertion-rewriting hook, which parses and
compiles every module it imports on each run where it cannot cache them
(``PYTHONDONTWRITEBYTECODE``), imports none of its modules but the package's ``__init__``
(``PYTEST_DONT_REWRITE``). What it costs in CPU: ``benchmarks/unused_plugin_cost.py``."""

from __future__ import annotations

import os
import subprocess
import sys
from ast import literal_eval
from pathlib import Path

import pytest

import pytest_llmspeed

UNIT_TEST = "def test_arithmetic():\n    assert 1 + 1 == 2\n"

OBSERVE = """
import sys, pytest
rc = pytest.main(["-q", "-p", "no:cacheprovider"])
mine = {n: m for n, m in list(sys.modules.items()) if n.split(".")[0] == "pytest_llmspeed"}
hooked = [n for n, m in mine.items()
          if type(getattr(m, "__loader__", None)).__name__ == "AssertionRewritingHook"]
print("HOOKED", sorted(hooked))
print("MODULES", sorted(mine))
sys.exit(rc)
"""

#: never imported by a run whose tests need no server; the results model neither, endpoint or
#: not: its dataclasses alone cost some 15 ms of CPU to create, from bytecode or not
HEAVY = (
    "aiohttp",
    "numpy",
    "pytest_llmspeed.sim",
    "pytest_llmspeed.core.client",
    "pytest_llmspeed.results",
    "pytest_llmspeed.figures",
)
#: ... and with no endpoint, not the settings' validation nor the session's parts
NOT_WITHOUT_ENDPOINT = ("pytest_llmspeed.core.matrix", "pytest_llmspeed.plugin.session")


def observe(tmp_path: Path, ini: str, no_bytecode: bool) -> tuple[list[str], list[str], str]:
    (tmp_path / "pytest.ini").write_text(f"[pytest]\n{ini}")
    (tmp_path / "test_unit.py").write_text(UNIT_TEST)
    env = {k: v for k, v in os.environ.items() if not k.startswith("LLMSPEED_")}
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    if no_bytecode:
        env["PYTHONDONTWRITEBYTECODE"] = "1"
    done = subprocess.run(
        [sys.executable, "-c", OBSERVE],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
        env=env,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    lines = dict(line.split(" ", 1) for line in done.stdout.splitlines() if line[:1].isupper())
    return literal_eval(lines["HOOKED"]), literal_eval(lines["MODULES"]), done.stdout


@pytest.mark.parametrize("no_bytecode", [False, True], ids=["bytecode", "no-bytecode"])
@pytest.mark.parametrize(
    "ini",
    ["", "llm_endpoint = sim:tiny?speed=4\n", "llm_endpoint = http://127.0.0.1:9\n"],
    ids=["no-endpoint", "sim-in-the-ini", "endpoint-down-in-the-ini"],
)
def test_unused_plugin_is_imported_by_python_not_rewritten(tmp_path, ini, no_bytecode):
    hooked, modules, out = observe(tmp_path, ini, no_bytecode)
    assert "1 passed" in out
    assert hooked == ["pytest_llmspeed"]  # the one module pytest imports before the finder
    assert "pytest_llmspeed.plugin" in modules
    assert not set(HEAVY) & set(modules)
    if not ini:
        assert not set(NOT_WITHOUT_ENDPOINT) & set(modules)
        assert "llmspeed" not in out.split("HOOKED")[0]


def test_the_package_says_it_relies_on_no_rewritten_assert():
    """The marker pytest reads; it also keeps pytest from warning that the module was
    imported before it could be rewritten (a second session in the same process)."""
    assert "PYTEST_DONT_REWRITE" in (pytest_llmspeed.__doc__ or "")


def test_the_finder_handles_the_package_only():
    finder = pytest_llmspeed._PlainImport
    assert finder.find_spec("json") is None
    assert finder.find_spec("pytest_llmspeed_other") is None
    spec = finder.find_spec("pytest_llmspeed.figures", pytest_llmspeed.__path__)
    assert spec is not None and spec.origin is not None
    assert spec.origin.endswith("figures.py")
    assert type(spec.loader).__name__ == "SourceFileLoader"


def test_the_finder_is_installed_once_and_only_under_pytest():
    # this session runs under pytest: installed, once, ahead of pytest's hook
    marked = [f for f in sys.meta_path if getattr(f, "llmspeed_plain_import", False)]
    assert len(marked) == 1
    code = (
        "import sys, pytest_llmspeed\n"
        "print(sum(getattr(f, 'llmspeed_plain_import', False) for f in sys.meta_path))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.stdout.strip() == "0", done.stderr  # a script: Python's import as it is
