"""Notes on cells, grouped by kind in every summary; which trends and in-flight counts are notes
(docs/metrics.md, "Drift" and "Requests in flight")."""

import dataclasses
from pathlib import Path

import pytest

from pytest_llmspeed.core.intervals import drift_noted
from pytest_llmspeed.report.markdown import summary
from pytest_llmspeed.report.notes import (
    COUNTER_LAG,
    IN_FLIGHT,
    QUEUED,
    by_kind,
    cell_flags,
    note_lines,
)
from pytest_llmspeed.report.page import render_page
from pytest_llmspeed.report.terminal import render
from pytest_llmspeed.results import Phase, load

DATA = Path(__file__).resolve().parents[1] / "data" / "v1" / "results.json"


@pytest.fixture(scope="module")
def results():
    return load(DATA)


def decode_cells(results):
    """The measured decode cells of 0.1.0's run (valid and regressed), as measured: no notes."""
    return [c for c in results.cells if c.phase is Phase.DECODE and c.measured]


def test_each_kind_is_said_once_with_the_cells_it_concerns(results):
    a, b, c = decode_cells(results)[:3]
    short = [
        dataclasses.replace(a, little_residual=-0.19),
        dataclasses.replace(b, little_residual=-0.0625, queued=True, effective_concurrency=3.1),
        dataclasses.replace(c, little_residual=-0.01),  # within 5 %: no note
    ]
    held_a = a.concurrency * 0.81
    held_b = b.concurrency * 0.9375
    assert [(kind, [cid for cid, _ in cells]) for kind, cells in by_kind(short)] == [
        (QUEUED, [str(b.id)]),
        (IN_FLIGHT, [str(a.id), str(b.id)]),
    ]
    lines = note_lines(short)
    assert lines == [
        f"  {QUEUED.heading}: {b.id} (3.1 < {b.concurrency})",
        f"  {IN_FLIGHT.heading}: {a.id} ({held_a:.2f} of {a.concurrency} on average, −19.0%), "
        f"{b.id} ({held_b:.2f} of {b.concurrency} on average, −6.2%)",
    ]
    # the terminal summary has those lines and no line per cell
    shown = render(short, 200, False, [])
    assert [ln for ln in shown if ln.startswith("  ")] == lines
    # the step summary and the page: each kind once, the cells after it
    md = summary("t", short, [])
    assert md.count(IN_FLIGHT.heading) == 1 and md.count(QUEUED.heading) == 1
    assert f"`{a.id}` ({held_a:.2f} of {a.concurrency} on average, −19.0%), `{b.id}`" in md
    html = render_page(dataclasses.replace(results, cells=tuple(short))).html
    assert html.count(IN_FLIGHT.heading) == 1
    # a cell's own row says it in short
    assert cell_flags(short[1]) == [
        f"queued: 3.1 < {b.concurrency}",
        f"in flight: {held_b:.2f} of {b.concurrency} on average, −6.2%",
    ]


def test_a_run_without_notes_prints_none(results):
    cells = decode_cells(results)
    assert by_kind(cells) == []
    assert "Notes on cells" not in summary("t", cells, [])


@pytest.mark.parametrize(
    ("measured", "duration", "early_end", "noted"),
    [
        (30.0, 30.0, False, False),  # a full fixed window: the trend is part of its figure
        (30.0, 30.0, True, True),  # early ends asked: a trend decides them
        (12.0, 30.0, True, True),
        # cut short after 20 of 30 s: the line carried to 30 s moves the figure by
        # 2.3 % × 10 / 40 = 0.575 %: beyond ±0.5 %, not beyond ±0.6 %
        (20.0, 30.0, False, True),
    ],
)
def test_a_drift_is_a_note_only_where_it_moves_the_figure(measured, duration, early_end, noted):
    ci = (995.0, 1005.0)  # ±0.5 %
    assert drift_noted(-0.023, 1000.0, ci, measured, duration, early_end) is noted


def test_a_cut_short_window_within_its_interval_is_no_drift_note():
    assert drift_noted(-0.023, 1000.0, (994.0, 1006.0), 20.0, 30.0, False) is False
    assert drift_noted(-0.023, 1000.0, None, 20.0, 30.0, False) is True  # no interval to say
    assert drift_noted(None, 1000.0, None, 20.0, 30.0, True) is False  # no trend flagged


def test_the_noted_drift_in_the_summary(results):
    cell = decode_cells(results)[0]
    fixed = dataclasses.replace(cell, drift=-0.023, total_tok_s_ci=None)
    early = dataclasses.replace(fixed, precision=0.004, window_end="precision")
    assert note_lines([fixed]) == []
    assert note_lines([early]) == [
        f"  window ended early, precise enough (--llm-precision): {cell.id} (±0.4% after "
        f"{cell.measured_s:.1f} s)",
        "  drift: total tok/s moved over the window (a trend, not noise), and the figure with "
        f"it: it depends on where the window ended: {cell.id} (fell 2.3%)",
    ]


def test_unstable_cells_say_by_how_much_beyond_a_tenth(results):
    cell = decode_cells(results)[0]
    shown = [note_lines([dataclasses.replace(cell, stability_cv=cv)]) for cv in (0.1, 0.1049, 0.76)]
    head = "  unstable: per-second throughput varies by more than 10 %: "
    assert shown == [[], [f"{head}{cell.id} (10.5%)"], [f"{head}{cell.id} (76%)"]]


def test_a_counter_that_ran_ahead_of_exact_tokens_is_a_note(results):
    # a valid cell whose tokens were counted exactly (usage) while the server's counter rose
    # 15 % above them (vLLM's API server streaming behind its engine): a note, not a failure
    cell = decode_cells(results)[0]
    assert cell.tokens == "usage"
    lagging = dataclasses.replace(cell, generation_tokens_delta=1150.0, received_span=(990, 1000))
    assert note_lines([lagging]) == [f"  {COUNTER_LAG.heading}: {cell.id} (+15.0%)"]
    assert cell_flags(lagging) == ["counter lag: +15.0%"]
    inside = dataclasses.replace(lagging, generation_tokens_delta=1040.0)  # within 5 % + 8/stream
    assert note_lines([inside]) == []
    estimated = dataclasses.replace(lagging, tokens="ratio")  # such a cell failed: no note
    assert COUNTER_LAG not in [kind for kind, _ in by_kind([estimated])]
    other_client = dataclasses.replace(
        lagging, reason="the server's generation counter rose by 1,150 tokens ... another client"
    )
    assert note_lines([other_client]) == []  # failed for it: its reason says it all
