"""A cell's server figures in the results model: written under "server", read back equal,
valid against the schema, flattened into JUnit properties; files written before them keep
working and are written back without them (docs/design.md, "Next: the server's figures")."""

import dataclasses
import json
from pathlib import Path

import jsonschema

from pytest_llmspeed.core.server_figures import GAUGE_FAMILIES, snapshot, window_figures
from pytest_llmspeed.results import Phase, Results, ServerFigures, load, loads

ROOT = Path(__file__).resolve().parents[2]
METRICS = ROOT / "tests" / "data" / "metrics"
V1 = ROOT / "tests" / "data" / "v1" / "results.json"


def real_window() -> ServerFigures:
    """Real vLLM 0.32 (CPU build), --max-num-seqs 4 and a small KV cache: 5 preemptions."""

    def read(name: str, t: float, families=None):
        text = (METRICS / f"vllm-0.32-cpu-tight-{name}.txt").read_text()
        return snapshot(text, t) if families is None else snapshot(text, t, families)

    return window_figures(
        read("before", 0.0), read("after", 3.0), [read("during", 1.0, GAUGE_FAMILIES)]
    )


def with_server(results: Results) -> tuple[Results, str]:
    cell = next(c for c in results.cells if c.phase is Phase.DECODE and c.measured)
    figures = real_window()
    cells = tuple(dataclasses.replace(c, server=figures) if c is cell else c for c in results.cells)
    return dataclasses.replace(results, cells=cells), str(cell.id)


def test_server_figures_round_trip_through_the_results_file():
    results, cid = with_server(load(V1))
    doc = results.to_document()
    written = next(c for c in doc["cells"] if c["id"] == cid)["server"]
    assert written["preemptions"] == 5 and written["waiting_max"] == 5.0
    assert written["waiting_by_reason"] == [["capacity", 2.5, 5.0], ["deferred", 0.0, 0.0]]
    assert all(v is not None for v in written.values())  # unknown figures are absent, not null
    schema = json.loads((ROOT / "docs" / "results.schema.json").read_text())
    jsonschema.Draft202012Validator(schema).validate(doc)
    again = loads(json.dumps(doc))
    cell = next(c for c in again.cells if str(c.id) == cid)
    assert cell.server == real_window()
    assert again.to_document() == doc


def test_server_figures_are_junit_properties():
    results, cid = with_server(load(V1))
    cell = next(c for c in results.cells if str(c.id) == cid)
    props = dict(cell.properties())
    assert props["server_preemptions"] == 5
    assert props["server_kv_usage_max"] == 0.967741935483871
    assert "server_waiting_by_reason" not in props  # not a scalar: in the results file only
    before = [p for p in cell.properties() if not p[0].startswith("server_")]
    assert before == dataclasses.replace(cell, server=None).properties()  # appended, not mixed


def test_a_file_without_server_figures_loads_and_is_written_back_without_them():
    results = load(V1)
    assert all(c.server is None for c in results.cells)
    assert all("server" not in c for c in results.to_document()["cells"])


def test_figures_of_a_later_version_are_left_out_not_refused():
    doc = json.loads(V1.read_text())
    cell = next(c for c in doc["cells"] if c["phase"] == "decode" and c.get("samples"))
    cell["server"] = {"duration_s": 8.0, "steps_per_s": 41.0, "a_figure_from_the_future": 1}
    got = next(c for c in loads(json.dumps(doc)).cells if str(c.id) == cell["id"])
    assert got.server == ServerFigures(duration_s=8.0, steps_per_s=41.0)
