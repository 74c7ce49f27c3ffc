"""The four verdicts are shown and counted wherever a gated run is read: the terminal summary,
the job summary, the page, JUnit's properties, and compare's lines and exit status; an unknown
says what would decide it."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

from pytest_llmspeed.gate.baseline import Baseline, CellBaseline
from pytest_llmspeed.gate.verdict import account, counted, gated, verdict
from pytest_llmspeed.report.compare import compare, lines
from pytest_llmspeed.report.compare import markdown as compare_markdown
from pytest_llmspeed.report.markdown import summary
from pytest_llmspeed.report.page import render_page
from pytest_llmspeed.report.terminal import gate_lines
from pytest_llmspeed.results import CellId, CellRecord, Results, Status, load

V1 = Path(__file__).resolve().parents[1] / "data" / "v1" / "results.json"
# the reference 1000 tok/s ± 0.5 %, tolerance 5 %; the new figure, its ± (a fraction)
FIGURES = {1: (1000.0, 0.005), 2: (900.0, 0.005), 4: (1100.0, 0.005), 8: (970.0, 0.06)}


def cell(n: int, total: float, pm: float) -> CellRecord:
    template = next(c for c in load(V1).cells if c.id == CellId.decode(1024, 1))
    return dataclasses.replace(
        template,
        id=CellId.decode(1024, n),
        status=Status.VALID,
        reason=None,
        gate=None,
        attempts=(),
        total_tok_s=total,
        total_tok_s_ci=(total * (1 - pm), total * (1 + pm)),
        per_request_tok_s=None,
    )


def gated_run() -> tuple[Baseline, list[CellRecord], list[CellRecord]]:
    baseline = Baseline(Path("b.toml"), {}, 0.05)
    old, new = [], []
    for n, (total, pm) in FIGURES.items():
        cid = str(CellId.decode(1024, n))
        entry = CellBaseline(
            cid, {"total_tok_s": 1000.0}, 0.05, 1, {"total_tok_s": (995.0, 1005.0)}
        )
        baseline.cells[cid] = entry
        rec = cell(n, total, pm)
        new.append(gated(rec, verdict(entry, [rec]), [rec]))
        old.append(cell(n, 1000.0, 0.005))
    return baseline, old, new


def test_the_terminal_counts_the_four_and_names_each_unknown() -> None:
    baseline, _, cells = gated_run()
    shown = gate_lines("b.toml", account(baseline, cells, [str(c.id) for c in cells]))
    assert (
        shown[1] == "Baseline b.toml: 1 regression(s), 1 improvement(s) beyond tolerance, 1 unknown"
    )
    assert shown[2] == (
        "  4 baseline cell(s): 1 same, 1 improved, 1 unknown, 1 regressed, 0 not run, "
        "0 deselected, 0 not gated"
    )
    (unknown,) = [line for line in shown if line.startswith("  unknown ")]
    assert unknown.startswith("  unknown     decode[1K-c8] total tok/s 970.0 ±6.0% is inside")
    assert re.search(r"more measurement\(s\) would decide it \(--llm-confirm=\d+\)$", unknown)
    assert "  (cells too noisy to tell pass: --llm-unknown=fail fails them)" in shown
    strict = account(baseline, cells, [str(c.id) for c in cells], unknown_fails=True)
    assert strict.fails and any(line.startswith("  UNKNOWN ") for line in gate_lines("b", strict))


def test_the_job_summary_and_the_page_count_them_too() -> None:
    _, _, cells = gated_run()
    assert counted(cells) == "1 regressed, 1 unknown, 1 improved, 1 same"
    text = summary("run", cells, [])
    assert "**Against the baseline**: 1 regressed, 1 unknown, 1 improved, 1 same" in text
    assert "**Unknown** (too noisy to tell at the tolerance)" in text and " ❔" in text
    results = dataclasses.replace(load(V1), cells=tuple(cells))
    html = render_page(results).html
    assert "Against the baseline: 1 regressed, 1 unknown, 1 improved, 1 same" in html
    assert '<span class="badge warn">unknown</span>' in html
    assert '<span class="badge good">same</span>' in html


def test_junit_carries_each_cells_and_figures_verdict() -> None:
    _, _, cells = gated_run()
    verdicts = [dict(c.properties())["gate_verdict"] for c in cells]
    assert verdicts == ["same", "regressed", "improved", "unknown"]
    props = dict(cells[3].properties())
    assert props["gate_total_tok_s"] == "unknown" and int(props["gate_more"]) >= 1


def test_compare_shows_them_and_exits_by_them() -> None:
    _, old, new = gated_run()
    base = load(V1)
    cmp = compare(
        dataclasses.replace(base, cells=tuple(old)), dataclasses.replace(base, cells=tuple(new))
    )
    shown = lines(cmp, "old.json")
    assert "  4 cell(s): 1 regressed, 1 unknown, 1 improved, 1 same" in shown
    assert any(ln.startswith("  unknown     decode[1K-c8] total_tok_s ") for ln in shown)
    assert cmp.exit_status() == 1  # the regression
    only_unknown = Results(base.run, tuple(c for c in new if c.id == CellId.decode(1024, 8)))
    old8 = Results(base.run, tuple(c for c in old if c.id == CellId.decode(1024, 8)))
    cmp8 = compare(old8, only_unknown)
    assert cmp8.exit_status() == 0 and cmp8.exit_status(unknown_fails=True) == 1
    assert "**Unknown: too noisy to tell**" in compare_markdown(cmp8, "old.json", "new.json")
