"""The A/B's bookkeeping (gate/ab.py): the ABBA order, blocks from rounds, the spread pooled
over a kind's cells, a cell's verdict from its figures', which cells stop."""

import math
import random

from pytest_llmspeed.gate.ab import BLOCK, Ledger, Round, arm_of, cell_verdict
from pytest_llmspeed.gate.judge import Verdict

DECODE = ("decode[1K-c1]", "decode[1K-c4]", "decode[4K-c1]", "decode[4K-c4]")


def _ledger(
    factor: float,
    blocks: int = 2,
    noise: float = 0.02,
    drift: float = 0.0,
    seed: int = 0,
    cells: tuple[str, ...] = DECODE,
) -> Ledger:
    """An A/B whose new version is ``factor`` × the old one, with a start noise shared by
    every cell of a start (a slow start is the whole server's) and a linear drift."""
    rng = random.Random(seed)
    ledger = Ledger(0.05)
    for index in range(blocks * len(BLOCK)):
        arm = arm_of(index)
        start = math.exp(rng.gauss(0, noise)) * (1 + drift * index)
        r = Round(index, arm)
        for k, cell in enumerate(cells):
            base = 1000.0 * (k + 1) * start * (factor if arm == "new" else 1.0)
            r.cells[cell] = {
                "total_tok_s": base * math.exp(rng.gauss(0, 0.005)),
                "per_request_tok_s": base / 4 * math.exp(rng.gauss(0, 0.005)),
            }
        ledger.rounds.append(r)
    return ledger


def test_rounds_come_in_abba_blocks():
    assert [arm_of(i) for i in range(8)] == ["old", "new", "new", "old"] * 2
    assert Round(5, "new").block == 1


def test_a_linear_drift_cancels_in_each_block():
    ledger = _ledger(1.0, noise=0.0, drift=0.05)
    for d in ledger.block_changes("decode[1K-c1]", "total_tok_s"):
        assert abs(d) < 0.02  # the drift is 5 % a round: 15 % over a block


def test_the_spread_is_pooled_over_the_cells_and_figures_of_a_kind():
    ledger = _ledger(1.0)
    _, df = ledger.pooled("decode")
    assert df == len(DECODE) * 2 * (2 - 1)  # 4 cells × 2 figures × (2 blocks − 1)
    assert ledger.pooled("prefill") == (math.inf, 0)


def test_unchanged_is_same_and_ten_percent_slower_regressed():
    same = _ledger(1.0, noise=0.01)
    for cell in DECODE:
        assert same.judge(cell).verdict is Verdict.SAME, same.judge(cell).words()
    slower = _ledger(0.9, noise=0.01)
    for cell in DECODE:
        got = slower.judge(cell)
        assert got.verdict is Verdict.REGRESSED, got.words()
        assert got.figures["total_tok_s"].change.relative < -0.05
        assert got.starts == 8 and got.blocks == 2


def test_faster_is_improved():
    got = _ledger(1.2, noise=0.01).judge("decode[1K-c4]")
    assert got.verdict is Verdict.IMPROVED


def test_a_cell_is_its_worst_figure():
    assert cell_verdict([Verdict.SAME, Verdict.REGRESSED]) is Verdict.REGRESSED
    assert cell_verdict([Verdict.IMPROVED, Verdict.UNKNOWN]) is Verdict.UNKNOWN
    assert cell_verdict([Verdict.IMPROVED, Verdict.SAME]) is Verdict.IMPROVED
    assert cell_verdict([Verdict.SAME, Verdict.SAME]) is Verdict.SAME


def test_a_round_without_a_cell_leaves_its_block_out():
    ledger = _ledger(1.0)
    del ledger.rounds[5].cells["decode[1K-c1]"]
    ledger.rounds[5].missing["decode[1K-c1]"] = "failed: HTTP 500"
    assert len(ledger.block_changes("decode[1K-c1]", "total_tok_s")) == 1
    assert len(ledger.block_changes("decode[1K-c4]", "total_tok_s")) == 2
    assert ledger.starts("decode[1K-c1]") == 8


def test_a_cell_never_measured_is_unknown_and_says_why():
    ledger = _ledger(1.0, cells=("decode[1K-c1]",))
    for r in ledger.rounds:
        r.missing["decode[8K-c8]"] = "failed: HTTP 500"
    got = ledger.judge("decode[8K-c8]")
    assert got.verdict is Verdict.UNKNOWN and got.missing and "HTTP 500" in got.missing


def test_blocks_stop_for_decided_cells_and_for_hopeless_unknowns():
    ledger = _ledger(0.8, blocks=1)
    assert ledger.end_block(max_blocks=4, room=10) == []  # one block: nothing decided
    ledger = _ledger(0.8)
    decided = ledger.end_block(max_blocks=4, room=10)
    assert set(decided) == set(DECODE)
    assert not any(ledger.wanted(c) for c in DECODE)
    noisy = _ledger(0.95, noise=0.08, seed=3)
    noisy.end_block(max_blocks=2, room=10)  # no block left: an unknown is decided as it is
    assert not any(noisy.wanted(c) for c in DECODE)


def test_the_document_counts_every_verdict():
    doc = _ledger(0.8).to_dict()
    assert doc["counts"] == {"regressed": 4, "improved": 0, "same": 0, "unknown": 0}
    assert doc["order"] == ["old", "new", "new", "old"] * 2
    cell = doc["cells"]["decode[1K-c1]"]
    assert cell["verdict"] == "regressed" and cell["starts"] == 8
    lo, hi = cell["figures"]["total_tok_s"]["interval"]
    assert lo < cell["figures"]["total_tok_s"]["change"] < hi < -0.05
