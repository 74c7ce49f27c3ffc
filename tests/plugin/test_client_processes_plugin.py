"""``--llm-client-processes`` through the plugin, on the simulator: the cells say how many
processes read their streams, and a cell with fewer streams than processes uses one a stream
and says so."""

import json

import pytest

pytestmark = pytest.mark.slow


def run(pytester, concurrency: str, processes: str) -> dict:
    """A 1K matrix on the simulator with ``--llm-client-processes=processes``; its results."""
    result = pytester.runpytest(
        "--llm-endpoint=sim:tiny?speed=4",
        "--llm-contexts=1K",
        f"--llm-concurrency={concurrency}",
        "--llm-duration=2",
        "--llm-max-output=128",
        "--llm-results=out.json",
        f"--llm-client-processes={processes}",
    )
    assert result.ret == 0, result.stdout.str()
    return json.loads((pytester.path / "out.json").read_text())


def test_two_client_processes_read_the_cells(pytester):
    doc = run(pytester, "1,4", "2")
    assert doc["run"]["settings"]["client_processes"] == 2
    cells = {c["id"]: c for c in doc["cells"]}
    c4, c1 = cells["decode[1K-c4]"], cells["decode[1K-c1]"]
    assert c4["status"] == c1["status"] == "valid"
    assert c4["client_processes"] == 2 and c4["output_tokens"] > 0
    assert not any(n.startswith("client processes") for n in c4.get("notes", ()))
    assert "client_processes" not in c1  # one process: the default, not written
    assert "client processes: 2 asked, 1 used (one per stream at most)" in c1["notes"]


def test_auto_starts_with_one_process(pytester):
    # the simulator at this speed keeps the client far from a core: one process throughout
    doc = run(pytester, "4", "auto")
    assert doc["run"]["settings"]["client_processes"] == "auto"
    (cell,) = [c for c in doc["cells"] if c["id"] == "decode[1K-c4]"]
    assert cell["status"] == "valid" and "client_processes" not in cell
