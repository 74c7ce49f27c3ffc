"""The page and its charts as text: every section, escaping, secrets redacted, size."""

import dataclasses
from pathlib import Path

import pytest

from pytest_llmspeed.core.errors import redact_secrets
from pytest_llmspeed.report.charts import Series, line_chart, nice_ticks
from pytest_llmspeed.report.page import render_page
from pytest_llmspeed.results import load

DATA = Path(__file__).resolve().parents[1] / "data" / "v1" / "results.json"


def test_nice_ticks():
    assert nice_ticks(7524) == [0, 2000, 4000, 6000, 8000]
    assert nice_ticks(0.9) == pytest.approx([0, 0.2, 0.4, 0.6, 0.8, 1.0])


def test_chart_has_a_mark_and_a_hover_value_per_point_and_a_legend():
    svg = line_chart(
        "t", [Series("8K", ((1, 10.0), (2, 20.0))), Series("16K", ((1, 5.0),))], "x", "y", True
    )
    assert svg.count('class="mark"') == 3 and svg.count("<polyline") == 2
    assert "<title>8K · 2: 20</title>" in svg
    assert 'class="legend">16K<' in svg


def test_x_labels_too_close_to_the_last_keep_their_tick_only():
    # a context's max (252K) and its limit (256K) sit 1.6 % apart on a log axis
    points = tuple((x, 1.0) for x in (8192, 16384, 258048, 262143))
    svg = line_chart("t", [Series("p", points)], "x", "y", True, x_format=lambda x: f"{x:g}")
    labels = [x for x in ("8192", "16384", "258048", "262143") if f">{x}</text>" in svg]
    assert labels == ["8192", "16384", "258048"]
    assert svg.count('class="axis"/>') >= 4  # every point keeps its tick


def test_page_of_a_v1_file_has_every_section():
    html = render_page(load(DATA)).html
    for section in ("title", "metadata", "prefill", "decode", "charts", "measurements", "notes"):
        assert f'id="{section}"' in html, section
    assert 'id="launch"' not in html and 'id="comparison"' not in html  # nothing to show
    assert html.count('<svg class="chart"') == 5
    assert "src=" not in html and "href=" not in html and "url(" not in html  # loads nothing
    assert "<script" not in html and "<link" not in html
    assert len(html.encode()) < 1_000_000


def test_text_from_users_and_servers_is_escaped():
    results = load(DATA)
    run = dataclasses.replace(
        results.run,
        metadata={"hardware": "<script>alert(1)</script>"},
        launch_command="vllm serve m --api-key <redacted>",
    )
    html = render_page(dataclasses.replace(results, run=run)).html
    assert "<script>alert" not in html and "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert "--api-key &lt;redacted&gt;" in html


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("vllm serve m --api-key sk-1 --port 8", "vllm serve m --api-key <redacted> --port 8"),
        ("vllm serve m --api-key=sk-1", "vllm serve m --api-key=<redacted>"),
        (
            "HF_TOKEN=hf_x OPENAI_API_KEY='a b' vllm",
            "HF_TOKEN=<redacted> OPENAI_API_KEY=<redacted> vllm",
        ),
        ("-H 'Authorization: Bearer sk-9'", "-H 'Authorization: Bearer <redacted>'"),
        ("--hf-token t --tokenizer-mode auto", "--hf-token <redacted> --tokenizer-mode auto"),
    ],
)
def test_secrets_are_redacted_from_a_launch_command(text, expected):
    assert redact_secrets(text) == expected


def test_the_over_capacity_hint_only_where_a_cell_was_over_capacity():
    from pytest_llmspeed.results import Status

    results = load(DATA)
    hint = "Over capacity: not run because"
    assert any(c.status is Status.OVER_CAPACITY for c in results.cells)
    assert hint in render_page(results).html
    fitting = tuple(c for c in results.cells if c.status is not Status.OVER_CAPACITY)
    html = render_page(dataclasses.replace(results, cells=fitting)).html
    assert hint not in html and "TTFT is measured after the prefix is warm" in html


def test_per_replica_figures_on_the_page_and_in_the_markdown_summary():
    from pytest_llmspeed.report.markdown import summary
    from pytest_llmspeed.results import Phase, Status

    results = load(DATA)
    cell = next(c for c in results.cells if c.phase is Phase.DECODE and c.status is Status.VALID)
    total = float(cell.total_tok_s or 0)
    split = dataclasses.replace(cell, replica_tok_s=(round(total * 0.6, 2), round(total * 0.4, 2)))
    cells = tuple(split if c is cell else c for c in results.cells)
    html = render_page(dataclasses.replace(results, cells=cells)).html
    a, b = (f"{x:,.1f}" for x in split.replica_tok_s or ())
    assert f"per replica {a} tok/s · {b} tok/s" in html
    md = summary("t", list(cells), [])
    assert (
        "**Per replica**" in md and f"- {cell.id}: total " in md and f"per replica {a} · {b}" in md
    )
    assert "Per replica" not in summary("t", list(results.cells), [])


def test_a_run_without_recorded_settings_still_renders():
    # a results file whose run kept no max output (written by hand, or by another tool): the
    # header says "?" where the page raised ValueError formatting '?' with a thousands separator
    results = load(DATA)
    bare = dataclasses.replace(results, run=dataclasses.replace(results.run, settings={}))
    html = render_page(bare).html
    assert "? tokens" in html and 'id="decode"' in html
