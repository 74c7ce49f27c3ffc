"""Why a cell changed: the decomposition adds up, the explanation names the factor that moved,
and the findings that matter by themselves, on constructed figures and on real vLLM ones."""

from __future__ import annotations

import math
import random
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from pytest_llmspeed.core.server_figures import (
    GAUGE_FAMILIES,
    ServerFigures,
    snapshot,
    window_figures,
)
from pytest_llmspeed.gate.explain import (
    NO_FIGURES_NEW,
    NO_FIGURES_OLD,
    NOISE_FLOOR,
    RESIDUAL_DECODE,
    RESIDUAL_DECODE_GAUGE,
    Explanation,
    Side,
    Unexplained,
    change_noise,
    decompose_decode,
    decompose_prefill,
    explain,
    findings,
    relative_noise,
)

DATA = Path(__file__).parent.parent / "data" / "metrics"

#: a steady decode cell at concurrency 8 with speculative decoding
BASE = ServerFigures(
    duration_s=30.0,
    steps_per_s=41.0,
    running_mean=8.0,
    running_max=8.0,
    acceptance_length=2.41,
    preemptions=0,
    waiting_mean=0.0,
    waiting_max=0.0,
    prefix_cache_hit_rate=0.99,
    queue_time_mean_s=0.0004,
    prefill_time_mean_s=0.8,
)


def tok_s(f: ServerFigures, other: float = 1.0) -> float:
    """The cell's total tok/s the factors imply (× ``other``: what they do not carry)."""
    assert f.steps_per_s is not None and f.running_mean is not None
    return f.steps_per_s * f.running_mean * (f.acceptance_length or 1.0) * other


def decode(old: ServerFigures, new: ServerFigures, **kw) -> Explanation:
    got = explain("decode[32K-c8]", "decode", Side(tok_s(old), old), Side(tok_s(new), new), **kw)
    assert isinstance(got, Explanation)
    return got


def test_the_parts_plus_the_residual_are_the_measured_log_change_exactly():
    rng = random.Random(20)
    for _ in range(5000):

        def side() -> Side:
            spec = rng.random() < 0.7
            figures = ServerFigures(
                duration_s=30.0,
                steps_per_s=rng.uniform(0.5, 5000.0),
                running_mean=rng.uniform(0.05, 512.0),
                acceptance_length=rng.uniform(1.0, 8.0) if spec else None,
            )
            return Side(rng.uniform(0.1, 1e6), figures)

        old, new = side(), side()
        split = decompose_decode(old, new)
        assert not isinstance(split, str)
        measured = math.log(new.figure / old.figure)
        assert split.total == measured
        assert [p.key for p in split.parts] == [
            "steps_per_s",
            "running",
            "acceptance_length",
            "residual",
        ]
        assert math.fsum(p.change for p in split.parts) == pytest.approx(measured, abs=1e-12)
        # each factor's part is its own log-change
        assert old.server is not None and new.server is not None
        assert split.part("steps_per_s").change == math.log(
            new.server.steps_per_s / old.server.steps_per_s  # type: ignore[operator]
        )


def test_a_cell_whose_factors_carry_everything_has_no_residual():
    slower = replace(BASE, steps_per_s=36.0, acceptance_length=2.0, running_mean=7.0)
    split = decompose_decode(Side(tok_s(BASE), BASE), Side(tok_s(slower), slower))
    assert not isinstance(split, str)
    assert split.residual == pytest.approx(0.0, abs=1e-12)
    assert not split.part("residual").moved


def test_the_residual_is_shown_when_the_factors_do_not_carry_the_change():
    # the server's steps and batch held, the client counted 8 % less (prefill in the window)
    got = explain("decode[8K-c8]", "decode", Side(tok_s(BASE), BASE), Side(tok_s(BASE, 0.92), BASE))
    assert isinstance(got, Explanation)
    assert got.decomposition is not None
    assert got.decomposition.residual == pytest.approx(math.log(0.92))
    assert [p.key for p in got.moved] == ["residual"]
    assert got.line() == (
        "decode[8K-c8] −8.0%: other (prefill in the window, the client) −8.0%, "
        "steps/s 41 → 41, running 8 → 8, acceptance length 2.41 → 2.41"
    )


def test_running_comes_from_the_exact_counters_where_the_server_gives_them():
    # output tokens per step ÷ acceptance length: the step-weighted running requests, exact;
    # the gauge's poll mean (one poll between a request's end and the next one's start read
    # 3.75 of 4) is shown in the server figures but not used
    old = replace(BASE, running_mean=8.0, output_tokens_per_step=8.0 * 2.41)
    new = replace(BASE, running_mean=7.5, output_tokens_per_step=8.0 * 2.41)
    got = decode(old, new)
    running = got.decomposition.part("running")  # type: ignore[union-attr]
    assert (running.old, running.new) == (pytest.approx(8.0), pytest.approx(8.0))
    assert running.change == pytest.approx(0.0, abs=1e-12)
    # the client's figure (from the gauge-free counters here: 8 × 2.41 × 41 both runs) held,
    # so nothing moved, and the residual is the client's count against the server's
    assert got.decomposition.part("residual").label == RESIDUAL_DECODE  # type: ignore[union-attr]
    # one side without step counters: the gauge for both, and the residual says what it holds
    gauge = replace(new, output_tokens_per_step=None)
    split = decompose_decode(Side(tok_s(old), old), Side(tok_s(gauge), gauge))
    assert not isinstance(split, str)
    assert (split.part("running").old, split.part("running").new) == (8.0, 7.5)
    assert split.part("residual").label == RESIDUAL_DECODE_GAUGE


def test_lower_acceptance_names_acceptance_length_first():
    worse = replace(BASE, acceptance_length=1.93, steps_per_s=45.92)
    got = decode(BASE, worse)
    assert got.moved[0].key == "acceptance_length"
    assert [p.key for p in got.moved] == ["acceptance_length", "steps_per_s"]
    assert got.line() == (
        "decode[32K-c8] −10.3%: acceptance length 2.41 → 1.93 (−19.9%), "
        "steps/s 41.0 → 45.9 (+12.0%), running 8 → 8"
    )


def test_slower_steps_name_steps_per_s():
    got = decode(BASE, replace(BASE, steps_per_s=41.0 * 0.8))
    assert [p.key for p in got.moved] == ["steps_per_s"]
    assert got.moved[0].share == pytest.approx(1.0)
    assert got.findings == ()
    assert got.line().startswith("decode[32K-c8] −20.0%: steps/s 41.0 → 32.8 (−20.0%)")


def test_running_capped_below_the_concurrency_names_running_and_the_queue():
    capped = replace(
        BASE,
        running_mean=4.0,
        running_max=4.0,
        waiting_mean=4.0,
        waiting_max=4.0,
        waiting_by_reason=(("capacity", 4.0, 4.0), ("deferred", 0.0, 0.0)),
        steps_per_s=47.0,
    )
    got = decode(BASE, capped, concurrency=8)
    assert got.moved[0].key == "running"
    assert {f.key for f in got.findings} == {"queued", "running_capped"}
    assert got.line() == (
        "decode[32K-c8] −42.7%: running 8 → 4 (−50.0%), steps/s 41 → 47 (+14.6%), "
        "acceptance length 2.41 → 2.41; requests waiting 0 → 4, at most 4 (capacity); "
        "at most 4 of 8 requests running (was 8)"
    )


def test_requests_that_queued_are_a_finding_from_the_histograms_when_the_polls_saw_none():
    # real vLLM on 2 busy cores, --max-num-seqs 1 at c2: the polls read no waiting request (a
    # starved API server updates its gauges late) while each request queued 0.74 s
    old = replace(BASE, queue_time_mean_s=0.00003, prefill_time_mean_s=0.02, decode_time_mean_s=0.8)
    new = replace(old, queue_time_mean_s=0.74)
    got = findings("decode", old, new)
    assert [(f.key, f.text) for f in got] == [
        ("queue_time", "requests queued 0 → 740 ms each before running (47% of their time in "
         "the server)"),
    ]  # fmt: skip
    # below the share, or already queued before, or said by the gauges: no such finding
    assert findings("decode", old, replace(old, queue_time_mean_s=0.05)) == ()
    assert findings("decode", new, replace(new, queue_time_mean_s=1.0)) == ()
    waited = replace(new, waiting_mean=1.0, waiting_max=1.0)
    assert [f.key for f in findings("decode", old, waited)] == ["queued"]
    # a server without the histograms: nothing read from them
    assert findings("decode", replace(old, decode_time_mean_s=None), new) == ()


def test_preemptions_from_none_are_a_finding_even_when_throughput_held():
    got = decode(BASE, replace(BASE, preemptions=41, steps_per_s=41.2))
    assert got.moved == ()
    assert [f.text for f in got.findings] == ["preemptions 0 → 41"]
    assert got.line() == (
        "decode[32K-c8] +0.5%: no factor moved beyond its noise (steps/s 41.0 → 41.2, "
        "running 8 → 8, acceptance length 2.41 → 2.41); preemptions 0 → 41"
    )


def test_a_warm_prefix_that_stopped_hitting_the_cache_is_a_finding():
    got = decode(BASE, replace(BASE, prefix_cache_hit_rate=0.02))
    assert [f.text for f in got.findings] == [
        "warm prefix stopped hitting the cache (hit rate 99% → 2%)"
    ]
    # a small move of the hit rate is none
    assert decode(BASE, replace(BASE, prefix_cache_hit_rate=0.9)).findings == ()


def test_preemptions_that_did_not_double_are_no_finding():
    assert findings("decode", replace(BASE, preemptions=10), replace(BASE, preemptions=15)) == ()
    assert [
        f.key
        for f in findings("decode", replace(BASE, preemptions=10), replace(BASE, preemptions=20))
    ] == ["preemptions"]


def test_a_factor_within_its_given_noise_is_held():
    moved = replace(BASE, steps_per_s=41.0 * 1.05)
    assert [p.key for p in decode(BASE, moved).moved] == ["steps_per_s"]
    assert decode(BASE, moved, noise={"steps_per_s": 0.06}).moved == ()
    assert decode(BASE, replace(BASE, steps_per_s=41.0 * (1 + NOISE_FLOOR / 2))).moved == ()


def test_relative_noise_is_the_wider_side_of_the_interval():
    assert relative_noise(100.0, (97.0, 101.0)) == pytest.approx(0.03)
    assert relative_noise(100.0, None) is None
    # a change between two runs carries both runs' noise
    assert change_noise(100.0, (97.0, 103.0), 50.0, (48.0, 52.0)) == pytest.approx(0.05)
    assert change_noise(100.0, (97.0, 103.0), 50.0, None) is None


def test_without_speculative_decoding_acceptance_length_is_1_and_not_shown():
    plain = replace(BASE, acceptance_length=None)
    got = decode(plain, replace(plain, steps_per_s=30.0))
    assert got.decomposition is not None
    part = got.decomposition.part("acceptance_length")
    assert (part.old, part.new, part.change, part.assumed) == (1.0, 1.0, 0.0, True)
    assert "acceptance" not in got.line()


def test_one_side_without_server_figures_gives_one_reason_and_no_explanation():
    old = explain("decode[1K-c1]", "decode", Side(100.0, None), Side(90.0, BASE))
    new = explain("decode[1K-c1]", "decode", Side(100.0, BASE), Side(90.0, None))
    assert old == Unexplained("decode[1K-c1]", NO_FIGURES_OLD)
    assert new == Unexplained("decode[1K-c1]", NO_FIGURES_NEW)
    assert old.line() == (
        "decode[1K-c1]: no explanation: the earlier run has no server figures "
        "(an older results file)"
    )


def test_a_server_without_a_step_count_explains_with_findings_only():
    no_steps = replace(BASE, steps_per_s=None)
    got = explain(
        "decode[1K-c8]",
        "decode",
        Side(100.0, no_steps),
        Side(80.0, replace(no_steps, preemptions=3)),
    )
    assert isinstance(got, Explanation)
    assert got.decomposition is None
    assert got.line() == (
        "decode[1K-c8] −20.0%: no decomposition: the server gives no steps/s in the earlier "
        "run; preemptions 0 → 3"
    )


def test_prefill_ttft_splits_into_queue_prefill_and_the_rest_exactly():
    rng = random.Random(7)
    for _ in range(2000):

        def side() -> Side:
            q, p = rng.uniform(0, 2), rng.uniform(0.001, 5)
            return Side(
                (q + p) * 1000 + rng.uniform(0, 50),
                ServerFigures(duration_s=1.0, queue_time_mean_s=q, prefill_time_mean_s=p),
            )

        old, new = side(), side()
        split = decompose_prefill(old, new)
        assert not isinstance(split, str)
        assert math.fsum(p.change for p in split.parts) == pytest.approx(
            new.figure - old.figure, abs=1e-9
        )


def test_a_prefill_that_queued_names_queue_time():
    old = ServerFigures(duration_s=1.0, queue_time_mean_s=0.0001, prefill_time_mean_s=1.17)
    new = replace(old, queue_time_mean_s=0.41, prefill_time_mean_s=1.18)
    got = explain("prefill[32K]", "prefill", Side(1200.0, old), Side(1622.0, new))
    assert isinstance(got, Explanation)
    assert [p.key for p in got.moved] == ["queue_ms"]
    assert got.line() == (
        "prefill[32K] TTFT +35.2%: queue time 0 → 410 ms (+409.9 ms), prefill time 1,170 → 1,180 ms"
    )


def test_a_prefill_that_hit_the_cache_names_prefill_time_and_the_cache():
    old = ServerFigures(
        duration_s=1.0, queue_time_mean_s=0.0, prefill_time_mean_s=1.2, prefix_cache_hit_rate=0.0
    )
    new = replace(old, prefill_time_mean_s=0.15, prefix_cache_hit_rate=0.9)
    got = explain("prefill[32K]", "prefill", Side(1230.0, old), Side(180.0, new))
    assert isinstance(got, Explanation)
    assert got.moved[0].key == "prefill_ms"
    assert [f.text for f in got.findings] == ["prefix cache hit rate 0% → 90%"]


def window(name: str) -> ServerFigures:
    return window_figures(
        snapshot((DATA / f"vllm-0.32-cpu-{name}-before.txt").read_text(), 0.0),
        snapshot((DATA / f"vllm-0.32-cpu-{name}-after.txt").read_text(), 2.0),
        [snapshot((DATA / f"vllm-0.32-cpu-{name}-during.txt").read_text(), 1.0, GAUGE_FAMILIES)],
    )


def test_real_vllm_windows_a_small_kv_cache_and_max_num_seqs_explain_as_such():
    # the same 8 requests at once: a roomy server, then --max-num-seqs 4 with 32 KV blocks
    def real(name: str) -> ServerFigures:
        prefix = f"{name}-" if name else ""
        return window_figures(
            snapshot((DATA / f"vllm-0.32-cpu-{prefix}before.txt").read_text(), 0.0),
            snapshot((DATA / f"vllm-0.32-cpu-{prefix}after.txt").read_text(), 2.0),
            [
                snapshot(
                    (DATA / f"vllm-0.32-cpu-{prefix}during.txt").read_text(), 1.0, GAUGE_FAMILIES
                )
            ],
        )

    roomy, tight = real(""), real("tight")
    assert roomy.generation_tokens is not None and tight.generation_tokens is not None
    got = explain(
        "decode[1K-c8]",
        "decode",
        Side(roomy.generation_tokens / roomy.duration_s, roomy),
        Side(tight.generation_tokens / tight.duration_s, tight),
        concurrency=8,
    )
    assert isinstance(got, Explanation)
    assert {f.key for f in got.findings} >= {"preemptions", "queued", "running_capped"}
    assert "preemptions 0 → 5" in got.line()
    assert got.decomposition is not None
    assert math.fsum(p.change for p in got.decomposition.parts) == pytest.approx(
        got.decomposition.total, abs=1e-12
    )


def test_server_figures_and_explain_import_no_pytest():
    code = (
        "import sys\n"
        "import pytest_llmspeed.core.server_figures, pytest_llmspeed.gate.explain\n"
        "print(sorted(m for m in sys.modules if m == 'pytest' or m.startswith('_pytest')))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == "[]"
