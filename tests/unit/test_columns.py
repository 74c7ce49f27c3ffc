""" "All measurements" in the terminal and on the page come from one list of columns
(report/columns.py): the terminal's are the page's without the widest, with the same text for
the same cell's figures."""

from html import escape
from pathlib import Path

from pytest_llmspeed.report import columns
from pytest_llmspeed.report.page import render_page
from pytest_llmspeed.report.terminal import details_table
from pytest_llmspeed.results import load

DATA = Path(__file__).resolve().parents[1] / "data" / "v1"


def test_the_terminal_shows_the_pages_columns_without_the_widest():
    page, terminal = columns.columns(page=True), columns.columns(page=False)
    assert [c for c in page if not c.page_only] == list(terminal)
    assert len(columns.headers(page=True)) == len(page)


def test_a_cells_figures_read_the_same_in_both():
    results = load(DATA / "results.json")
    cells = list(results.cells)
    html = render_page(results).html
    table = details_table(cells)
    for cell in cells:
        on_page = columns.row(cell, page=True)
        in_terminal = columns.row(cell, page=False)
        shown = [c for c in columns.FIGURES if not c.page_only]
        k = len(columns.HEAD)
        figures_page = dict(zip(columns.FIGURES, on_page[k:], strict=True))
        assert [figures_page[c] for c in shown] == in_terminal[k:]
        for text in in_terminal[k:]:
            assert text in table  # what the terminal prints
        for text in on_page[k:]:
            assert f"<td>{escape(text)}</td>" in html  # what the page shows
