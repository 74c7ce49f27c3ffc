"""The core, the gate, the results model and the reports import no pytest."""

import subprocess
import sys


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
