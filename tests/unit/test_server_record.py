"""A cell's server figures in the results model: written under "server", read back equal,
valid against the schema, flattened into JUnit properties; files written before them keep
working and are written back without them (docs/design.md, "The server's figures in every cell")."""

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


# -- the baseline keeps the server figures; the gate says why a cell changed ---------------


def decode_record(server, total):
    from pytest_llmspeed.results import CellId, CellRecord, Status

    return CellRecord(
        CellId.decode(1024, 8), Status.VALID, context_tokens=1024, total_tok_s=total,
        per_request_tok_s=total / 8, server=server,
    )  # fmt: skip


def test_the_baseline_keeps_the_mean_of_its_runs_server_figures(tmp_path):
    from pytest_llmspeed.gate.baseline import load as load_baseline
    from pytest_llmspeed.gate.baseline import render, render_added

    plain = real_window()
    text, _ = render({"model": "tiny"}, [decode_record(plain, 2000.0)], date="d1")
    assert '[cells."decode[1K-c8]".server]' in text and "preemptions = 5" in text
    path = tmp_path / "base.toml"
    path.write_text(text)
    entry = load_baseline(path).cells["decode[1K-c8]"]
    assert entry.server_runs == 1 and entry.server is not None
    assert entry.server.preemptions == 5
    assert entry.server.kv_usage_max == float(f"{plain.kv_usage_max:.5g}")
    doubled = dataclasses.replace(plain, preemptions=15)
    added, _ = render_added(load_baseline(path), {}, [decode_record(doubled, 2000.0)], "d2")
    path.write_text(added)
    entry = load_baseline(path).cells["decode[1K-c8]"]
    assert entry.server_runs == 2 and entry.server is not None
    assert entry.server.preemptions == 10  # the mean of 5 and 15


def test_a_regression_against_the_baseline_says_why(tmp_path):
    from pytest_llmspeed.core.server_figures import GAUGE_FAMILIES, snapshot, window_figures
    from pytest_llmspeed.gate.baseline import load as load_baseline
    from pytest_llmspeed.gate.baseline import render
    from pytest_llmspeed.gate.verdict import gated, verdict
    from pytest_llmspeed.results import Outcome

    def plain_window():
        def read(name, t, *families):
            text = (METRICS / f"vllm-0.32-cpu-{name}.txt").read_text()
            return snapshot(text, t, *families)

        return window_figures(
            read("before", 0.0), read("after", 3.0), [read("during", 1.0, GAUGE_FAMILIES)]
        )

    text, _ = render({"model": "tiny"}, [decode_record(plain_window(), 2000.0)], date="d1")
    (tmp_path / "base.toml").write_text(text)
    entry = load_baseline(tmp_path / "base.toml").cells["decode[1K-c8]"]
    slower = decode_record(real_window(), 1200.0)  # --max-num-seqs 4, a small KV cache
    result = verdict(entry, [slower])
    assert result.outcome is Outcome.REGRESSION
    assert result.why.startswith("decode[1K-c8] −40.0%: ")
    assert "running 7.94 → 2.02" in result.why and "preemptions 0 → 5" in result.why
    record = gated(slower, result, [slower])
    assert record.reason is not None and record.reason.endswith(f"; why: {result.why}")
    assert record.to_v1()["baseline_why"] == result.why
    passed = verdict(entry, [decode_record(real_window(), 2000.0)])
    assert passed.outcome is Outcome.SAME and passed.why == ""
    without = verdict(entry, [decode_record(None, 1200.0)])  # this run has no server figures
    assert without.outcome is Outcome.REGRESSION and without.why == ""


def test_the_terminal_shows_the_server_figures_with_v_and_says_once_what_is_not_exposed():
    from pytest_llmspeed.report.terminal import render

    results, cid = with_server(load(V1))
    cells = list(results.cells)
    quiet = render(cells, 200, False, [])
    assert "The server's own figures (its /metrics over each window)" not in quiet
    shown = render(cells, 200, True, [])
    at = shown.index("The server's own figures (its /metrics over each window)")
    table = shown[at + 1].splitlines()
    assert table[0].split()[:4] == ["Cell", "Steps/s", "Out", "tok/step"]
    row = next(line for line in table if line.startswith(cid))
    assert " 5 " in row  # 5 preemptions
    figures = real_window()
    # the CPU build runs without speculative decoding: its figures are all absent, and that
    # is no news to the user; what else is missing is said once, not per cell
    assert {"spec_drafts", "acceptance_length"} <= set(figures.missing)
    assert not [line for line in shown if line.startswith("note: the server does not expose:")]
    lacking = dataclasses.replace(figures, missing=(*figures.missing, "preemptions"))
    cells = [dataclasses.replace(c, server=lacking) if c.server else c for c in cells]
    said = [ln for ln in render(cells, 200, True, []) if ln.startswith("note: the server does")]
    assert said == ["note: the server does not expose: preemptions (absent from the cells)"]


def test_the_page_shows_the_server_figures_and_why_cells_changed():
    from pytest_llmspeed.report.compare import compare
    from pytest_llmspeed.report.page import render_page

    results, cid = with_server(load(V1))
    html = render_page(results).html
    assert 'id="server-figures"' in html and f"<td>{cid}</td>" in html
    old = load(V1)
    plain = dataclasses.replace(real_window(), preemptions=0)
    old_cells = tuple(
        dataclasses.replace(c, server=plain) if str(c.id) == cid else c for c in old.cells
    )
    cmp = compare(dataclasses.replace(old, cells=old_cells), results)
    page = render_page(results, cmp).html
    assert 'id="why"' in page
    assert "preemptions 0 → 5" in page  # a finding: the figure held, the server preempted
    # and on the comparison's cell itself, in its hover text
    (title,) = [t for t in page.split('title="')[1:] if t.startswith(f"{cid}: ")]
    assert "\nwhy: " in title.split('"')[0] and "preemptions 0 → 5" in title.split('"')[0]
    assert 'id="why"' not in render_page(results, compare(load(V1), load(V1))).html


def test_the_job_summary_says_why_a_cell_regressed():
    from pytest_llmspeed.report.markdown import summary
    from pytest_llmspeed.results import GateVerdict

    results = load(V1)
    regressed = next(c for c in results.cells if c.gate and c.gate.regressions)
    why = "decode[1K-c8] −40.0%: running 4.00 → 1.50 (−62.5%); preemptions 0 → 5"
    cells = [
        dataclasses.replace(c, gate=GateVerdict(c.gate.outcome, c.gate.checks, why))
        if c is regressed and c.gate
        else c
        for c in results.cells
    ]
    md = summary("t", cells, [])
    assert f"**Why** (the server's own figures against the baseline's)\n\n- {why}" in md
    assert "**Why**" not in summary("t", list(results.cells), [])
