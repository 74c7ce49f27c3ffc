"""An A/B in the results file, on the page and in `compare` of one file (issue 31): the "ab"
object is read and written back unchanged, the page shows old against new with the verdicts,
and `python -m pytest_llmspeed compare AB.json` prints the A/B and exits by its verdicts."""

import dataclasses
import json
from pathlib import Path

import pytest

from pytest_llmspeed.__main__ import main
from pytest_llmspeed.report.page import render_page
from pytest_llmspeed.results import ResultsError, load, loads
from tests.unit.test_ab_ledger import _ledger

DATA = Path(__file__).resolve().parents[1] / "data" / "v1"


def _ab_file(tmp_path: Path, factor: float) -> Path:
    results = dataclasses.replace(load(DATA / "results.json"), ab=_ledger(factor).to_dict())
    path = tmp_path / "ab.json"
    results.dump(path)
    return path


def test_the_ab_is_read_and_written_back(tmp_path):
    path = _ab_file(tmp_path, 0.8)
    doc = json.loads(path.read_text())
    assert doc["ab"]["counts"]["regressed"] == 4
    assert load(path).to_document() == doc
    assert load(DATA / "results.json").ab is None  # a run that was not an A/B


def test_a_malformed_ab_is_one_line():
    text = (DATA / "results.json").read_text()
    doc = json.loads(text)
    doc["ab"] = [1, 2]
    with pytest.raises(ResultsError, match="'ab' is not an A/B's record"):
        loads(json.dumps(doc), "x.json")


def test_the_page_shows_old_against_new(tmp_path):
    html = render_page(load(_ab_file(tmp_path, 0.8))).html
    assert '<section id="ab">' in html and "A/B: old against new" in html
    assert "verdicts: 4 regressed · 0 improved · 0 same · 0 unknown" in html
    assert 'class="delta-bad">regressed</td>' in html


@pytest.mark.parametrize(("factor", "status"), [(0.8, 1), (1.0, 0)])
def test_compare_of_one_ab_file_exits_by_its_verdicts(tmp_path, capsys, factor, status):
    path = _ab_file(tmp_path, factor)
    assert main(["compare", str(path), "--markdown", str(tmp_path / "ab.md")]) == status
    out = capsys.readouterr().out
    assert "A/B: old against new, 8 rounds" in out
    assert "| Cell | Verdict | Starts |" in (tmp_path / "ab.md").read_text()


def test_compare_of_one_file_that_is_not_an_ab(capsys):
    assert main(["compare", str(DATA / "results.json")]) == 2
    assert "not an A/B's results file" in capsys.readouterr().err
