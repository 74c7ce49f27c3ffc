"""One judge: ``compare OLD NEW`` and the stored-baseline gate on a baseline saved from OLD give
the same verdict on every cell of NEW — regressed, improved, same or unknown — with and
without intervals, with re-measurements, and for results files of earlier versions (read by
the same model, judged again by today's rule)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from pytest_llmspeed.gate.baseline import load as load_baseline
from pytest_llmspeed.gate.baseline import save
from pytest_llmspeed.gate.verdict import gated, verdict
from pytest_llmspeed.report.compare import Verdict, compare
from pytest_llmspeed.results import CellId, CellRecord, Outcome, Results, Status, load

DATA = Path(__file__).resolve().parents[1] / "data"
V1 = DATA / "v1" / "results.json"
RUN = {"model": "tiny", "api": "completions", "max_output": 128, "duration_s": 2.0}
FOUR = {
    Outcome.REGRESSION: Verdict.REGRESSION,
    Outcome.UNKNOWN: Verdict.UNKNOWN,
    Outcome.IMPROVEMENT: Verdict.IMPROVEMENT,
    Outcome.SAME: Verdict.SAME,
}


def decode(context: int, n: int, total: float, pm: float | None) -> CellRecord:
    """A decode cell of 0.1.0's run with these figures (its per-request rate moves alike);
    ``pm``: each figure's interval as a fraction, None for none."""
    template = next(c for c in load(V1).cells if c.id == CellId.decode(1024, 1))
    per = total / n

    def ci(v: float) -> tuple[float, float] | None:
        return None if pm is None else (round(v * (1 - pm), 2), round(v * (1 + pm), 2))

    return dataclasses.replace(
        template,
        id=CellId.decode(context, n),
        status=Status.VALID,
        reason=None,
        gate=None,
        attempts=(),
        total_tok_s=total,
        total_tok_s_ci=ci(total),
        per_request_tok_s=per,
        per_request_tok_s_ci=ci(per),
    )


# (old total tok/s, new / old, interval of each side): a regression, an improvement, one
# shown the same, too noisy to tell, at its limit, far from it without intervals
CASES = [
    (1000.0, 0.90, 0.005),
    (2000.0, 1.10, 0.005),
    (3000.0, 0.99, 0.005),
    (4000.0, 0.97, 0.04),
    (5000.0, 0.95, None),
    (6000.0, 0.80, None),
    (7000.0, 1.00, None),
]


def runs() -> tuple[Results, Results]:
    base = load(V1)
    old, new = [], []
    for i, (total, factor, pm) in enumerate(CASES):
        context, n = 1024 * (i + 1), 1 + i % 3
        old.append(decode(context, n, total, pm))
        new.append(decode(context, n, total * factor, pm))
    return (
        dataclasses.replace(base, cells=tuple(old)),
        dataclasses.replace(base, cells=tuple(new)),
    )


def gate(old: Results, new: Results, tmp_path: Path, attempts: int = 1) -> dict[str, Outcome]:
    """Each new cell's outcome from the gate on a baseline saved from ``old`` (the file
    written and read back), with ``attempts`` measurements alike."""
    path = tmp_path / "baseline.toml"
    save(path, RUN, list(old.cells))
    baseline = load_baseline(path)
    out = {}
    for cell in new.cells:
        entry = baseline.cells.get(str(cell.id))
        found = [cell] * attempts
        out[str(cell.id)] = gated(cell, verdict(entry, found), found).gate.outcome  # type: ignore[union-attr]
    return out


def test_the_gate_and_compare_give_the_same_verdict_on_every_cell(tmp_path: Path) -> None:
    old, new = runs()
    by_gate = gate(old, new, tmp_path)
    by_compare = {c.cid: c.verdict for c in compare(old, new).cells}
    assert {cid: FOUR[o] for cid, o in by_gate.items()} == by_compare
    # and the cases reach all four verdicts
    assert set(by_compare.values()) == set(FOUR.values())


def test_they_agree_on_a_re_measured_cell_too(tmp_path: Path) -> None:
    old, new = runs()
    path = tmp_path / "baseline.toml"
    save(path, RUN, list(old.cells))
    baseline = load_baseline(path)
    judged = []
    for cell in new.cells:  # each measured twice, the second 1 % faster
        second = dataclasses.replace(cell, total_tok_s=(cell.total_tok_s or 0) * 1.01)
        result = verdict(baseline.cells[str(cell.id)], [cell, second])
        judged.append(gated(cell, result, [cell, second]))
    gated_run = dataclasses.replace(new, cells=tuple(judged))
    by_compare = {c.cid: c.verdict for c in compare(old, gated_run).cells}
    assert by_compare == {str(c.id): FOUR[c.gate.outcome] for c in judged if c.gate}
    # the comparison judged the attempts the file keeps, not the first one alone
    (check,) = [k for k in compare(old, gated_run).cells[0].checks if k.metric == "total_tok_s"]
    assert len(check.values) == 2


def test_a_results_file_read_back_compares_as_it_gated(tmp_path: Path) -> None:
    old, new = runs()
    old.dump(tmp_path / "old.json")
    new.dump(tmp_path / "new.json")
    again = compare(load(tmp_path / "old.json"), load(tmp_path / "new.json"))
    assert [c.verdict for c in again.cells] == [c.verdict for c in compare(old, new).cells]


@pytest.mark.parametrize("stored", ["v1", "older_rule"])
def test_files_of_earlier_versions_load_and_compare(stored: str) -> None:
    """A file written by 0.1.0 or by an earlier rule: its stored verdicts stay as stored,
    and compare judges its figures again by today's rule."""
    results = load(DATA / stored / "results.json")
    cmp = compare(results, results)
    # a prefill figure of one cold request (those files' default) has no interval: unknown,
    # saying so
    one = [c for c in cmp.cells if c.no_interval]
    assert one and all(c.verdict is Verdict.UNKNOWN and c.cid.startswith("prefill[") for c in one)
    judged = [c for c in cmp.cells if c.verdict.judged and not c.no_interval]
    # against itself: the old side is each cell's figure (what a baseline saved from it holds),
    # the new one its attempts, so a cell re-measured faster may read improved; never worse
    assert judged and {c.verdict for c in judged} <= {Verdict.SAME, Verdict.IMPROVEMENT}
    assert sum(c.verdict is Verdict.SAME for c in judged) >= len(judged) - 1
    assert cmp.exit_status() == 0 and cmp.exit_status(unknown_fails=True) == 1
    stored_outcomes = {c.gate.outcome for c in results.cells if c.gate}
    assert Outcome.REGRESSION in stored_outcomes  # read as stored, never judged again
