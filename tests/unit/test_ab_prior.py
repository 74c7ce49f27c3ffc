"""An A/B's prior (``--llm-ab-prior``, gate/prior.py and Ledger.prior_use): earlier A/Bs'
spread between starts pooled with an A/B's own by degrees of freedom, refused from another
machine or model, and refused by an F test when today is noisier than the prior's day."""

import json
import math

import pytest

from pytest_llmspeed.gate.ab import FIGURES, KindSpread, pool_spreads, spreads_of
from pytest_llmspeed.gate.judge import Verdict
from pytest_llmspeed.gate.prior import PriorError, PriorFile, pooled, read_prior, refusal
from pytest_llmspeed.quantiles import f_cdf, f_quantile
from pytest_llmspeed.report.ab import prior_lines
from tests.unit.test_ab_ledger import DECODE, _with_noise


def test_the_f_quantile_is_the_tables():
    # F(0.95; d1, d2) from the published tables
    assert f_quantile(0.95, 3, 3) == pytest.approx(9.2766, abs=1e-3)
    assert f_quantile(0.95, 3, 10) == pytest.approx(3.7083, abs=1e-3)
    assert f_quantile(0.95, 5, 20) == pytest.approx(2.7109, abs=1e-3)
    assert f_cdf(f_quantile(0.9, 2.5, 7.5), 2.5, 7.5) == pytest.approx(0.9, abs=1e-9)


def test_an_abs_spread_is_read_back_from_its_rounds():
    ledger = _with_noise(1.0, seed=3)
    doc = json.loads(json.dumps(ledger.to_dict()))  # as the results file holds it
    back = spreads_of(doc)
    for kind in FIGURES:
        mine = ledger.kind_spread(kind)
        assert mine is not None
        assert back[kind].total == pytest.approx(mine.total)
        assert back[kind].between == pytest.approx(mine.between)
        assert back[kind].between_df == mine.between_df == 3  # two blocks: 2 n - 1
    assert doc["spread"]["decode"]["between_df"] == 3


def _prior_of(seeds, start=0.02):
    return pooled(
        [
            PriorFile(
                f"{s}.json",
                {},
                None,
                "serve",
                spreads_of(_with_noise(1.0, s, start=start).to_dict()),
            )
            for s in seeds
        ]
    )


def _checks(factor, prior, seeds=range(300), start=0.02):
    """Over unchanged (or ``factor``) A/Bs of two blocks: the share of decode checks
    regressed, same, and whose 95 % interval misses the true change; the share of A/Bs whose
    prior was refused."""
    regressed = same = missed = checks = refused = 0
    for seed in seeds:
        ledger = _with_noise(factor, seed, start=start)
        if prior is not None:
            ledger.prior = prior(seed)
            use = ledger.prior_use("decode")
            assert use is not None
            refused += use.how == "refused"
        for cell in DECODE:
            for j in ledger.judge(cell).figures.values():
                lo, hi = j.change.interval()
                checks += 1
                regressed += j.verdict is Verdict.REGRESSED
                same += j.verdict is Verdict.SAME
                missed += not lo < factor - 1 < hi
    n = len(seeds)
    return regressed / checks, same / checks, missed / checks, refused / n


def test_a_prior_from_earlier_abs_shows_an_unchanged_cell_the_same_in_two_blocks():
    """Start noise 2 % shared by the whole server, own noise 0.5 %: alone, two blocks know σ
    on 3 degrees of freedom and call 42 % of decode checks the same; with three earlier A/Bs'
    spread (about 12 degrees of freedom) 74 %, the intervals still at their level (5.9 % of
    them miss), and a 10 % slower version regressed in 98 %."""
    alone = _checks(1.0, None)
    with_prior = _checks(1.0, lambda s: _prior_of([10_000 + 3 * s + k for k in range(3)]))
    assert alone[0] == with_prior[0] == 0
    assert alone[1] < 0.5 < 0.68 < with_prior[1]
    assert with_prior[2] < 0.075
    slower = _checks(0.9, lambda s: _prior_of([20_000 + 3 * s + k for k in range(3)]))
    assert slower[0] > 0.95 and slower[1] == 0


def test_a_prior_from_a_quieter_day_is_refused():
    """The prior's starts moved 0.5 %, today's 6 %: the F test refuses the prior in nearly
    every A/B, so the intervals keep this A/B's own, wide spread (pooled, they would miss
    far more often)."""
    got = _checks(
        1.0, lambda s: _prior_of([30_000 + 3 * s + k for k in range(3)], start=0.005), start=0.06
    )
    assert got[3] > 0.9
    assert got[0] < 0.02 and got[2] < 0.09


def test_pooling_weighs_each_spread_by_its_degrees_of_freedom():
    got = pool_spreads([KindSpread(0.0004, 3, 0.0005, 3), KindSpread(0.0001, 9, 0.0002, 9)])
    assert got is not None
    assert got.between == pytest.approx((0.0012 + 0.0009) / 12) and got.between_df == 12
    assert got.total == pytest.approx((0.0015 + 0.0018) / 12) and got.total_df == 12
    assert pool_spreads([]) is None


def test_a_prior_applies_only_to_its_machine_and_model():
    prior = PriorFile("p.json", {"type": "CPU", "cpu": "EPYC 7B13", "cores": "2"}, "tiny", "serve")
    here = {"type": "CPU", "cpu": "EPYC 7B13", "cores": "2", "os": "linux (6.1)"}
    assert refusal(prior, here, "tiny") is None
    assert "another machine (cores: 2, this run's 16)" in str(
        refusal(prior, {**here, "cores": "16"}, "tiny")
    )
    assert "another model (tiny, this run's big)" in str(refusal(prior, here, "big"))
    assert "not known" in str(refusal(prior, {}, "tiny"))


def test_a_prior_file_that_cannot_serve_says_why(tmp_path):
    with pytest.raises(PriorError, match="no such file"):
        read_prior(str(tmp_path / "none.json"))
    plain = tmp_path / "plain.json"
    plain.write_text(
        json.dumps(
            {
                "schema": "pytest-llmspeed/results/v1",
                "run": {"tool": "x", "started": "", "endpoint": "sim"},
                "cells": [],
            }
        )
    )
    with pytest.raises(PriorError, match="not an A/B's results file"):
        read_prior(str(plain))
    doc = json.loads(plain.read_text())
    doc["ab"] = {
        "cells": {},
        "rounds": [{"arm": "old", "cells": {"decode[1K-c1]": {"total_tok_s": "fast"}}}],
    }
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(doc))
    with pytest.raises(PriorError, match=r"a malformed A/B .*not a number"):
        read_prior(str(bad))
    doc["ab"] = {"cells": {}, "rounds": []}
    bad.write_text(json.dumps(doc))
    with pytest.raises(PriorError, match="no complete block"):
        read_prior(str(bad))


def test_the_terminal_says_what_the_prior_gave():
    ledger = _with_noise(1.0, seed=5)
    ledger.prior = _prior_of([1, 2, 3])
    doc = ledger.to_dict()
    doc["prior"]["files"] = [
        {"path": "a.json", "refused": None},
        {"path": "b.json", "refused": "measured on another machine (cpu: x, this run's y)"},
    ]
    lines = prior_lines(doc)
    assert lines[0] == "prior: a.json"
    assert lines[1] == "prior: b.json: not used, measured on another machine (cpu: x, this run's y)"
    use = doc["prior"]["used"]["decode"]
    if use["how"] == "pooled":
        assert use["df"] == use["own_df"] + use["prior_df"] == 12
        sd = math.sqrt(use["between"])
        assert (
            f"prior decode: σ between starts {sd:.1%}, 12 degrees of freedom "
            "(3 of this A/B's + 9 of the prior's)" in lines
        )
    assert any(line.startswith("prior prefill: ") for line in lines)
