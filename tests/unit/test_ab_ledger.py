"""The A/B's bookkeeping (gate/ab.py): the ABBA order, blocks from rounds, the spread pooled
over a kind's cells, a cell's verdict from its figures', which cells stop."""

import math
import random

import pytest

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
    # 4 cells × 2 figures × (2 blocks − 1 + a noise contrast in each block)
    assert df == len(DECODE) * 2 * (2 * 2 - 1)
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
    assert ledger.end_block(max_blocks=4, room=10) == []  # one block: no regression yet
    quiet = _ledger(1.0, blocks=1, noise=0.002)
    assert set(quiet.end_block(max_blocks=4, room=10)) == set(DECODE)  # same after 4 starts
    assert all(quiet.decided[c].verdict is Verdict.SAME for c in DECODE)
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


def _with_noise(
    factor: float, seed: int, start: float = 0.02, decode_w: float = 0.005, prefill_w: float = 0.03
) -> Ledger:
    """Four decode cells and one prefill cell, each round with its own interval: a start
    factor shared by the whole server, then each measurement's own noise as its interval
    says."""
    rng = random.Random(seed)
    ledger = Ledger(0.05)
    for index in range(2 * len(BLOCK)):
        arm = arm_of(index)
        s = math.exp(rng.gauss(0, start)) * (factor if arm == "new" else 1.0)
        r = Round(index, arm)
        for cell in DECODE:
            r.cells[cell] = {
                f: 1000.0 * s * math.exp(rng.gauss(0, decode_w))
                for f in ("total_tok_s", "per_request_tok_s")
            }
            r.se[cell] = dict.fromkeys(r.cells[cell], decode_w)
        r.cells["prefill[1K]"] = {"prompt_tok_s": 9e4 * s * math.exp(rng.gauss(0, prefill_w))}
        r.se["prefill[1K]"] = {"prompt_tok_s": prefill_w}
        ledger.rounds.append(r)
    return ledger


def test_a_noisy_cell_keeps_its_own_noise_and_borrows_the_starts_spread():
    """One prefill context alone has one degree of freedom in two blocks; with the A/B's σ²
    (from every cell) and its own intervals it is judged, and not by the decode cells'
    narrow noise."""
    ledger = _with_noise(1.0, seed=1, prefill_w=0.0)
    got = ledger.judge("prefill[1K]").figures["prompt_tok_s"]
    between = ledger.between()
    assert between is not None and between[1] == (4 * 2 + 1) * 3  # every figure's blocks
    assert got.change.df == between[1]
    noisy = _with_noise(1.0, seed=1, prefill_w=0.05).judge("prefill[1K]")
    quiet = _with_noise(1.0, seed=1, prefill_w=0.005).judge("prefill[1K]")
    assert noisy.figures["prompt_tok_s"].change.se > 2 * quiet.figures["prompt_tok_s"].change.se


def test_unchanged_is_seldom_regressed_and_mostly_same():
    """Start noise 2 %, two blocks, the model's own conditions: over 400 A/Bs of 9 checks
    each, regressed at most 1 % of the checks (the judge's one-sided 99 %), decode same in
    about three of four (a change's standard error is 1.4 % after 8 starts: its interval fits
    inside ±5 % only when the estimate is within about ±2 %)."""
    regressed = same = checks = 0
    for seed in range(400):
        ledger = _with_noise(1.0, seed)
        for cell in (*DECODE, "prefill[1K]"):
            for j in ledger.judge(cell).figures.values():
                checks += 1
                regressed += j.verdict is Verdict.REGRESSED
                same += j.verdict is Verdict.SAME and cell.startswith("decode")
    assert regressed / checks < 0.01
    assert same / (400 * len(DECODE) * 2) > 0.7


def test_ten_percent_slower_is_regressed_in_two_blocks():
    caught = 0
    for seed in range(200):
        caught += _with_noise(0.9, seed).judge("decode[1K-c4]").verdict is Verdict.REGRESSED
    assert caught / 200 > 0.9


def test_a_stalled_round_is_left_out_with_its_block():
    """A window the machine stalled (86 tok/s where its version's median is 3,000) decides
    nothing: its block is left out and the cell says so; a start 40 % slow is kept."""
    ledger = _ledger(1.0, blocks=3, noise=0.01)
    ledger.rounds[5].cells["decode[1K-c4]"]["total_tok_s"] /= 35
    assert ledger.stalled("decode[1K-c4]", "total_tok_s") == [(5, pytest.approx(35, rel=0.1))]
    assert len(ledger.blocks("decode[1K-c4]", "total_tok_s")) == 2
    got = ledger.judge("decode[1K-c4]")
    assert got.verdict is not Verdict.REGRESSED
    assert got.left_out and "round 6 (new)" in got.left_out[0]
    slow = _ledger(1.0, blocks=3, noise=0.01)
    slow.rounds[5].cells["decode[1K-c4]"]["total_tok_s"] *= 0.6
    assert slow.stalled("decode[1K-c4]", "total_tok_s") == []
