"""Comparing two runs cell by cell, as pure functions (the runs themselves:
tests/plugin/test_compare.py)."""

import dataclasses
from pathlib import Path

from pytest_llmspeed.report.compare import Verdict, compare, lines, markdown, summary_line
from pytest_llmspeed.report.page import render_page
from pytest_llmspeed.results import CellId, CellRecord, Results, Status, load

DATA = Path(__file__).resolve().parents[1] / "data" / "v1" / "results.json"


def matrix(
    over: set[tuple[int, int]],
    too_long: set[tuple[int, int]],
    contexts: tuple[int, ...] = (8, 16, 32, 64),
    speed: float = 1.0,
) -> Results:
    """0.1.0's run with a decode matrix of ``contexts`` (K) × 8 concurrencies: figures (× speed)
    where a cell fits, over capacity or too long where the arithmetic skips it."""
    results = load(DATA)
    template = next(c for c in results.cells if c.id == CellId.decode(1024, 8))
    cells: list[CellRecord] = []
    for k in contexts:
        for n in (1, 2, 4, 8, 16, 32, 64, 128):
            cid = CellId.decode(k * 1024, n)
            if (k, n) in over or (k, n) in too_long:
                status = Status.OVER_CAPACITY if (k, n) in over else Status.DOES_NOT_FIT
                cells.append(CellRecord(id=cid, status=status, reason=status.label))
            else:
                cells.append(dataclasses.replace(template, id=cid, total_tok_s=100.0 * n * speed))
    return dataclasses.replace(results, cells=tuple(cells))


OVER = {(k, n) for k in (32, 64) for n in (64, 128)} | {(16, 128)}


def test_cells_over_capacity_in_both_runs_are_named_so():
    cmp = compare(matrix(OVER, set()), matrix(OVER, set()))
    over = [c for c in cmp.cells if c.verdict is Verdict.OVER_CAPACITY]
    assert sorted(c.cid for c in over) == sorted(str(CellId.decode(k * 1024, n)) for k, n in OVER)
    assert all(c.change is None and c.why == "" for c in over)
    assert cmp.count(Verdict.NOT_MEASURED) == 0
    counts = "32 cell(s): 0 regressed, 0 unknown, 0 improved, 27 same, 5 over capacity in both"
    assert summary_line(cmp) == counts
    assert f"  {counts}" in lines(cmp, "old.json")
    table = markdown(cmp, "old.json", "new.json")
    assert "| over capacity |" in table and "not measured" not in table


def test_a_cell_skipped_in_one_run_only_or_for_two_reasons_is_not_measured_in_both():
    old = matrix(OVER | {(8, 128)}, {(64, 32)})
    new = matrix(OVER - {(32, 64)}, {(8, 128), (64, 32)})
    by = {c.cid: c for c in compare(old, new).cells}
    assert by["decode[8K-c128]"].verdict is Verdict.NOT_MEASURED
    assert by["decode[8K-c128]"].why == "over capacity (old), exceeds max_model_len (new)"
    assert by["decode[32K-c64]"].verdict is Verdict.NOT_MEASURED  # measured in the new run
    assert by["decode[64K-c32]"].verdict is Verdict.TOO_LONG
    assert by["decode[64K-c64]"].verdict is Verdict.OVER_CAPACITY


def test_the_page_names_them_in_short_and_says_why_on_hover():
    cmp = compare(matrix(OVER, set()), matrix(OVER, set()))
    html = render_page(matrix(OVER, set()), cmp).html
    section = html[html.index('id="comparison"') : html.index('id="prefill"')]
    assert section.count(">over capacity</td>") == 5
    assert 'title="over capacity in both"' in section and "not measured" not in section


# -- why a cell changed: both runs' server figures (gate/explain.py) ----------------------

METRICS = Path(__file__).resolve().parents[1] / "data" / "metrics"


def real_window(prefix: str):
    """A window of real vLLM 0.32 (CPU build) from the captures in tests/data/metrics/:
    '' the test server, 'tight-' --max-num-seqs 4 with a small KV cache (5 preemptions)."""
    from pytest_llmspeed.core.server_figures import GAUGE_FAMILIES, snapshot, window_figures

    def read(name, t, *families):
        return snapshot((METRICS / f"vllm-0.32-cpu-{prefix}{name}.txt").read_text(), t, *families)

    return window_figures(
        read("before", 0.0), read("after", 3.0), [read("during", 1.0, GAUGE_FAMILIES)]
    )


def one_cell(server, factor):
    results = load(DATA)
    cell = next(c for c in results.cells if c.id == CellId.decode(1024, 8))
    changed = dataclasses.replace(
        cell, server=server, total_tok_s=2000.0 * factor, total_tok_s_ci=None
    )
    return dataclasses.replace(results, cells=(changed,))


def test_a_regression_says_why_from_both_runs_server_figures():
    cmp = compare(one_cell(real_window(""), 1.0), one_cell(real_window("tight-"), 0.6))
    (cell,) = cmp.cells
    assert cell.verdict is Verdict.REGRESSION
    assert cell.explanation.startswith("decode[1K-c8] −40.0%: ")
    # from the exact counters (output tokens per step); the one poll's gauges read 4 → 1.5
    assert "running 7.94 → 2.02 (−74.5%)" in cell.explanation
    assert "preemptions 0 → 5" in cell.explanation
    shown = lines(cmp, "old.json")
    regression = next(i for i, ln in enumerate(shown) if ln.startswith("  REGRESSION "))
    assert shown[regression + 1] == f"      why: {cell.explanation}"
    assert f"— why: {cell.explanation}" in markdown(cmp, "old.json", "new.json")
    assert cmp.unexplained is None


def test_a_finding_is_said_even_when_the_figure_held():
    # the same total tok/s, but the server preempted and queued: said, not a regression
    cmp = compare(one_cell(real_window(""), 1.0), one_cell(real_window("tight-"), 1.0))
    (cell,) = cmp.cells
    assert cell.verdict is Verdict.SAME
    assert "preemptions 0 → 5" in cell.explanation
    assert f"  finding     {cell.explanation}" in lines(cmp, "old.json")
    assert "**Why cells changed, and findings**" in markdown(cmp, "old.json", "new.json")


def test_a_file_without_server_figures_compares_as_before_with_one_line():
    old, new = one_cell(None, 1.0), one_cell(real_window("tight-"), 0.6)
    cmp = compare(old, new)
    (cell,) = cmp.cells
    assert cell.verdict is Verdict.REGRESSION and cell.explanation == ""
    assert cmp.unexplained == (
        "the old run has no server figures (a results file written before them, or a server "
        "without /metrics): the changes are not explained"
    )
    assert lines(cmp, "old.json")[-1] == f"  note: {cmp.unexplained}"
    assert lines(compare(old, old), "old.json")[-1].startswith("  1 cell(s)")  # nothing to say


def test_a_prefill_of_one_cold_request_has_no_interval_and_no_verdict():
    """One cold request a side gives a prefill figure no interval: +12.8 % is unknown, the
    line says why and what gives one; six cold requests (an interval each side) decide."""
    results = load(DATA)
    first = next(c for c in results.cells if c.id == CellId.prefill(1024))
    old = dataclasses.replace(first, attempts=())  # the figure itself, not re-measurements
    assert old.repeats in (None, 1) and old.prompt_tok_s_ci is None
    assert old.prompt_tok_s is not None and old.ttft_ms is not None
    v = old.prompt_tok_s
    new = dataclasses.replace(old, prompt_tok_s=v * 1.128, ttft_ms=old.ttft_ms / 1.128)
    cmp = compare(
        dataclasses.replace(results, cells=(old,)), dataclasses.replace(results, cells=(new,))
    )
    (cell,) = cmp.cells
    assert cell.verdict is Verdict.UNKNOWN and cell.no_interval == "one cold request in each run"
    shown = "\n".join(lines(cmp, "old.json"))
    assert "no interval: one cold request in each run" in shown, shown
    assert "--llm-prefill-repeats=6" in shown and "+12.8%" in shown
    assert "95 % interval" not in shown
    assert "--llm-prefill-repeats=6" in markdown(cmp, "old.json", "new.json")
    # with intervals (six cold requests a side) the judge decides
    six_old = dataclasses.replace(old, repeats=6, prompt_tok_s_ci=(v * 0.99, v * 1.01))
    w = v * 1.128
    six_new = dataclasses.replace(new, repeats=6, prompt_tok_s_ci=(w * 0.99, w * 1.01))
    decided = compare(
        dataclasses.replace(results, cells=(six_old,)),
        dataclasses.replace(results, cells=(six_new,)),
    )
    assert decided.cells[0].verdict is Verdict.IMPROVEMENT and not decided.cells[0].no_interval
