"""The judge's arithmetic (gate/judge.py, issue 31): four verdicts from one estimate of a change,
and the ABBA pairing that cancels a drift the unpaired estimate keeps."""

from __future__ import annotations

import math
import random

import pytest

from pytest_llmspeed.gate.judge import (
    Change,
    Verdict,
    abba_blocks,
    judge,
    more_needed,
    paired,
    unpaired,
    verdict_of,
)


def change(relative: float, se: float, df: int | None = 7, n: int = 8) -> Change:
    return Change(math.log1p(relative), se, df, n)


@pytest.mark.parametrize(
    ("relative", "se", "expected"),
    [
        (0.0, 0.005, Verdict.SAME),  # ±1.2 % at 95 %: inside ±5 %
        (-0.02, 0.005, Verdict.SAME),
        (-0.10, 0.01, Verdict.REGRESSED),
        (+0.10, 0.01, Verdict.IMPROVED),
        (-0.10, 0.06, Verdict.UNKNOWN),  # past the tolerance, not beyond the noise
        (0.0, 0.03, Verdict.UNKNOWN),  # inside it, but its interval is not
        (-0.045, 0.005, Verdict.UNKNOWN),  # on the edge: neither shown inside nor past
    ],
)
def test_four_verdicts(relative, se, expected):
    assert judge(change(relative, se), 0.05).verdict is expected


def test_an_unknown_says_what_would_decide_it():
    noisy = change(0.0, 0.03)
    result = judge(noisy, 0.05)
    assert result.verdict is Verdict.UNKNOWN and result.more is not None
    # that many more measurements with the same spread decide it; one fewer does not
    m = result.more
    decided = Change(noisy.log_ratio, noisy.se * math.sqrt(8 / (8 + m)), 7 + m, 8 + m)
    assert verdict_of(decided, 0.05) is Verdict.SAME
    if m > 1:
        short = Change(noisy.log_ratio, noisy.se * math.sqrt(8 / (7 + m)), 6 + m, 7 + m)
        assert verdict_of(short, 0.05) is Verdict.UNKNOWN
    assert "more measurement(s) would decide it" in result.words()
    # an estimate sitting on the tolerance: no number of measurements decides it
    edge = Change(math.log1p(-0.05), 0.02, 7, 8)
    assert more_needed(edge, 0.05) is None
    assert "too close to the tolerance" in judge(edge, 0.05).words()


def test_a_latency_is_better_when_it_falls():
    old, new = [100.0, 101.0, 99.0, 100.5], [90.0, 91.0, 89.5, 90.5]  # TTFT in ms, 10 % faster
    assert judge(unpaired(old, new, higher_is_better=False), 0.05).verdict is Verdict.IMPROVED
    assert judge(unpaired(old, new, higher_is_better=True), 0.05).verdict is Verdict.REGRESSED


def test_abba_cancels_a_drift_linear_within_a_block():
    rate = 0.01  # the machine slows 1 % a round, whatever runs
    ratio = 0.93  # new is 7 % slower
    order = ["A", "B", "B", "A"] * 3
    old: list[float] = []
    new: list[float] = []
    for t, arm in enumerate(order):
        speed = 1000.0 * math.exp(-rate * t)
        (old if arm == "A" else new).append(speed * (ratio if arm == "B" else 1.0))
    blocks = abba_blocks(old, new)
    assert blocks == pytest.approx([math.log(ratio)] * 3)
    est = paired(blocks)
    assert est.relative == pytest.approx(-0.07) and est.se == pytest.approx(0.0, abs=1e-12)


def test_abba_needs_whole_blocks():
    with pytest.raises(ValueError, match="two measurements of each arm per block"):
        abba_blocks([1.0, 2.0, 3.0], [1.0, 2.0, 3.0])
    with pytest.raises(ValueError, match="positive"):
        abba_blocks([1.0, 0.0], [1.0, 1.0])
    with pytest.raises(ValueError, match="tolerance"):
        judge(change(0.0, 0.01), 0.0)
    assert paired([0.01]).se == math.inf  # one block: no spread to go on


def _ab(rng: random.Random, ratio: float, blocks: int, noise: float, period: float):
    """One A/B on a server whose speed drifts within ±20 % over ``period`` rounds (a smooth
    curve through a random level each period, as the simulator's Drift) and whose starts
    differ by ``noise``: each arm's figures in ABBA order."""
    knots = [rng.uniform(-1.0, 1.0) for _ in range(int(4 * blocks / period) + 2)]
    phase = rng.uniform(0.0, 1.0)
    old: list[float] = []
    new: list[float] = []
    for t, arm in enumerate(["A", "B", "B", "A"] * blocks):
        x = t / period + phase
        k = math.floor(x)
        w = knots[k] + (knots[k + 1] - knots[k]) * (1 - math.cos(math.pi * (x - k))) / 2
        value = 1000.0 * (1 + 0.2 * w) * math.exp(rng.gauss(0.0, noise))
        (old if arm == "A" else new).append(value * (ratio if arm == "B" else 1.0))
    return old, new


def test_paired_abba_beats_unpaired_under_drift():
    """Start noise 2 %, a drift within ±20 % over 8 rounds, tolerance 5 %, 4 blocks (16
    starts): the paired judge calls an unchanged server same far more often than the unpaired
    one (whose arms both carry the drift), catches 10 % slower more often, and regresses at
    most 0.5 % of unchanged checks."""
    rng = random.Random(31)
    trials = 1000
    counts = {
        f"{how} {ratio}": dict.fromkeys(Verdict, 0)
        for how in ("paired", "unpaired")
        for ratio in (1.0, 0.9)
    }
    for _ in range(trials):
        for ratio in (1.0, 0.9):
            old, new = _ab(rng, ratio, blocks=4, noise=0.02, period=8.0)
            counts[f"paired {ratio}"][judge(paired(abba_blocks(old, new)), 0.05).verdict] += 1
            counts[f"unpaired {ratio}"][judge(unpaired(old, new), 0.05).verdict] += 1
    share = {k: {v.value: n / trials for v, n in c.items()} for k, c in counts.items()}
    assert share["paired 1.0"]["regressed"] <= 0.005, share
    assert share["paired 1.0"]["same"] > share["unpaired 1.0"]["same"] + 0.2, share
    assert share["paired 0.9"]["regressed"] > share["unpaired 0.9"]["regressed"], share
