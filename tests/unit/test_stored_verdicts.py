"""Verdicts are data: a results file keeps the gate's verdicts it stored, whatever rule this
version judges by, and a figure an older file lacks stays absent when written back.

``tests/data/older_rule/results.json`` is a hand-made run whose checks were written by the gate
of commit 6a337d0 (its ``Check``, run on these numbers): a figure failed when worse than its
limit beyond both intervals, measured from the limit with each interval's side towards better.
``decode[1K-c4]``'s median TTFT, 23.0 (22.9–30.0) against 20.0 (14.0–20.1) at 5 %, regressed by
that rule; today's (beyond the noise of both from the reference) finds it within the noise.
Its decode cells lack ``max_waiting`` and ``received_span``, as a file older than them would;
its prefill cell improved, said by the cell's outcome only (that version wrote no ``improved``).
"""

import dataclasses
import json
from pathlib import Path

import pytest

from pytest_llmspeed.gate.baseline import Baseline, CellBaseline
from pytest_llmspeed.gate.verdict import account, judged
from pytest_llmspeed.report.compare import Verdict, compare
from pytest_llmspeed.report.markdown import summary
from pytest_llmspeed.report.page import render_page
from pytest_llmspeed.results import Outcome, Status, load

DATA = Path(__file__).resolve().parents[1] / "data"
OLDER = DATA / "older_rule" / "results.json"
REASON = (
    "decode[1K-c4] TTFT ms 23.0 ±30.4% > ceiling 21.0 (baseline 20.0 ±30.0% + 5%): +15.0%, "
    "beyond both intervals"
)


@pytest.fixture(scope="module")
def older():
    return load(OLDER)


def test_today_s_rule_would_judge_the_stored_regression_otherwise(older):
    cell = older.cell("decode[1K-c4]")
    assert cell is not None and cell.gate is not None
    total, ttft = cell.gate.checks
    assert (total.regressed, ttft.regressed) == (False, True)  # as stored
    rejudged = judged(dataclasses.replace(ttft, stored=None))
    assert rejudged.verdict == "unknown"  # today: within the noise, too noisy to tell


def test_a_stored_regression_survives_load(older):
    cell = older.cell("decode[1K-c4]")
    assert cell.status is Status.FAILED and cell.reason == REASON
    assert cell.gate.outcome is Outcome.REGRESSION
    assert [c.metric for c in cell.gate.regressions] == ["ttft_ms"]
    assert cell.gate.message == REASON
    assert not cell.gate.noisy  # the file says noisy: false
    passed = older.cell("decode[1K-c8]")
    assert passed.gate.outcome is Outcome.PASS and not passed.gate.regressions
    improved = older.cell("prefill[1K]")
    assert improved.gate.outcome is Outcome.IMPROVEMENT


def test_a_stored_regression_survives_the_reports_and_compare(older):
    ids = [str(c.id) for c in older.cells]
    baseline = Baseline(
        Path("baseline.toml"),
        {},
        0.05,
        {cid: CellBaseline(cid, {"total_tok_s": 1.0}, 0.05, 1) for cid in ids},
    )
    acc = account(baseline, older.cells, ids)
    assert acc.regressed == ("decode[1K-c4]",)
    assert [c.message() for c in acc.regressions] == [REASON]
    # an earlier version's "passed" stays passed (it did not tell same from unknown); its
    # improved cell is counted improved
    assert acc.passed == ("decode[1K-c8]",) and acc.improved == ("prefill[1K]",)
    assert not acc.same and not acc.unknown
    assert f"- `{REASON}`" in summary("run", list(older.cells), []).splitlines()
    cmp = compare(older, older)
    # compare judges the figures again, by the gate's rule (a file against itself: same),
    # but a prefill figure of one cold request has no interval on either side: no verdict
    for c in cmp.cells:
        one = c.cid.startswith("prefill[")
        assert c.verdict is (Verdict.UNKNOWN if one else Verdict.SAME), c
        assert (c.no_interval == "one cold request in each run") is one
    html = render_page(older, cmp).html
    assert html.count('<span class="badge bad">regression</span>') == 1
    assert older.cell("decode[1K-c4]").gate.outcome is Outcome.REGRESSION  # compare read it


def test_a_stored_file_is_written_back_as_it_was_read(older):
    text = OLDER.read_text()
    assert older.dumps() == text
    for cell in json.loads(older.dumps())["cells"]:
        if cell["phase"] == "decode":
            assert "max_waiting" not in cell and "received_span" not in cell


@pytest.mark.parametrize("path", [DATA / "v1" / "results.json", OLDER])
def test_stored_files_keep_their_keys_through_load_and_dump(path):
    stored = json.loads(path.read_text())
    again = json.loads(load(path).dumps())
    assert again == stored
    for old, new in zip(stored["cells"], again["cells"], strict=True):
        assert set(new) == set(old), old["id"]
        for a, b in zip(
            old.get("baseline_checks", ()), new.get("baseline_checks", ()), strict=True
        ):
            assert b == a


def test_a_cell_without_its_display_label_is_written_back_without_it(tmp_path):
    doc = json.loads(OLDER.read_text())
    for cell in doc["cells"]:
        del cell["context_display"]
    path = tmp_path / "r.json"
    path.write_text(json.dumps(doc, indent=1) + "\n")
    assert load(path).dumps() == path.read_text()
    cell = load(path).cell("prefill[1K]")
    assert cell is not None and cell.context_display == "1K"  # still known to the model
