"""The core, the gate, the results model and the reports import no pytest; the project's
tooling (engines/, benchmarks/, scripts/) imports no pytest and nothing of tests/."""

import subprocess
import sys
from pathlib import Path

import pytest


def test_core_gate_results_report_import_without_pytest():
    code = (
        "import sys\n"
        "import pytest_llmspeed, pytest_llmspeed.results\n"
        "import pytest_llmspeed.core.bench, pytest_llmspeed.core.records\n"
        "import pytest_llmspeed.core.client, pytest_llmspeed.core.probe\n"
        "import pytest_llmspeed.core.prompts, pytest_llmspeed.core.protocol\n"
        "import pytest_llmspeed.core.stats, pytest_llmspeed.core.matrix\n"
        "import pytest_llmspeed.gate.baseline, pytest_llmspeed.gate.verdict\n"
        "import pytest_llmspeed.report.terminal, pytest_llmspeed.report.markdown\n"
        "from pytest_llmspeed import load, CellId, CellRecord, ServerInfo\n"
        "print(sorted(m for m in sys.modules if m == 'pytest' or m.startswith('_pytest')))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == "[]"


def test_public_names():
    import pytest_llmspeed

    for name in pytest_llmspeed.__all__:
        assert getattr(pytest_llmspeed, name) is not None, name


ROOT = Path(__file__).resolve().parents[2]


def test_engines_and_benchmarks_import_neither_pytest_nor_tests():
    """``benchmarks.common`` also runs in vLLM's own environment, which has no pytest
    (``benchmarks/studies/client_overhead.py``); the tooling never reaches into ``tests/``."""
    code = (
        "import sys\n"
        "import benchmarks.common, engines.servers, engines.home\n"
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'pytest', '_pytest', 'tests'}))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT
    ).stdout
    assert out.strip() == "[]"


@pytest.mark.parametrize(
    "script", ["setup_vllm.py", "setup_llama_cpp.py", "setup_transformers_serve.py"]
)
def test_set_up_scripts_run_on_the_standard_library_alone(script, tmp_path):
    """With no site-packages (``-S``), no PYTHONPATH (``-E``) and from another folder, as
    before the project is installed: ``engines/home.py`` is all they import of it."""
    done = subprocess.run(
        [sys.executable, "-E", "-S", str(ROOT / "scripts" / script), "--help"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage: ")
