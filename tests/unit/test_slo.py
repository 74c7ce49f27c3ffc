"""Service-level objectives (docs/slo.md): reading --llm-slo, a cell's verdict with its
figures' intervals, the capacity of each context, goodput's counting, and [slo] in a baseline."""

import math
import random
from typing import Any

import numpy as np
import pytest

from pytest_llmspeed.core.stats import RequestBounds, RequestTrace, goodput
from pytest_llmspeed.gate.baseline import BaselineError, load, save
from pytest_llmspeed.gate.slo import (
    Meets,
    SLOError,
    capacities,
    capacity_miss,
    judge,
    parse,
    quantile_interval,
    rate_capacities,
    request_bounds,
    same,
    text,
)
from pytest_llmspeed.results import CellId, CellRecord, Samples, Status

# -- reading the option


def test_bounds_are_read_in_the_figures_units():
    got = parse("ttft_p90<=2s, tbt_p90<=50ms,per_request_tok_s>=20,total_tok_s>1000tok/s")
    assert [(b.key, b.op, b.value) for b in got] == [
        ("ttft_p90_ms", "<=", 2000.0),
        ("tbt_p90_ms", "<=", 50.0),
        ("per_request_tok_s", ">=", 20.0),
        ("total_tok_s", ">", 1000.0),
    ]
    assert text(got) == "ttft_p90<=2s,tbt_p90<=50ms,per_request_tok_s>=20,total_tok_s>1000tok/s"
    assert parse("ttft_p90_ms<=2000ms")[0].key == "ttft_p90_ms"  # the file's key works too
    assert same("tbt_p90<=50ms,ttft_p90<=2s", parse("ttft_p90<=2s,tbt_p90<=50ms"))
    assert not same("ttft_p90<=3s", parse("ttft_p90<=2s"))


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ("ttft_p95<=2s", "unknown figure 'ttft_p95'"),  # ... and lists the valid ones
        ("ttft_p90<=2", "the bound has no unit: ttft_p90 is a time, give s or ms"),
        # several bounds: the one that is wrong is named
        ("ttft<=1s,tbt_p90<=50", "'tbt_p90<=50': the bound has no unit: tbt_p90 is a time"),
        ("ttft_p90>=2s", "ttft_p90 is better lower, so its bound is at most (<=)"),
        ("per_request_tok_s<=20", "per_request_tok_s is better higher, so its bound is at least"),
        ("per_request_tok_s>=20ms", "per_request_tok_s is in tok/s, give no unit or tok/s"),
        ("tbt_p90<=50us", "the bound has unit 'us': tbt_p90 is a time, give s or ms"),
        ("ttft<=0s", "the bound must be a positive number"),
        ("ttft", "cannot read it: write NAME<=VALUE or NAME>=VALUE"),
        ("ttft_p90<=1s,ttft_p90<=2s", "ttft_p90 is bounded twice"),
        (" , ", "give bounds such as"),
    ],
)
def test_a_bad_bound_is_one_line_saying_what_to_write(value, says):
    with pytest.raises(SLOError) as got:
        parse(value)
    message = str(got.value)
    assert says in message and "\n" not in message, message
    if "unknown figure" in says:
        assert "ttft_p90" in message and "per_request_tok_s" in message


def test_goodput_bounds_a_request_by_the_tightest_bound_of_each_kind():
    got = request_bounds(parse("ttft<=3s,ttft_p90<=2s,tbt_p99<=60ms,per_request_tok_s>=20"))
    assert got == RequestBounds(ttft_ms=2000.0, tbt_ms=60.0, tok_s=20.0)
    assert request_bounds(parse("total_tok_s>=100")) == RequestBounds()


# -- a quantile's interval


def test_the_quantile_interval_is_the_order_statistics_of_the_binomial():
    xs = list(range(1, 101))
    assert quantile_interval(xs, 0.5) == (40, 61)  # the textbook median interval, n = 100
    assert quantile_interval(xs[:10], 0.9) is None  # 10 samples cannot bound a p90
    assert quantile_interval([5.0], 0.5) is None


def test_the_quantile_interval_covers_the_true_quantile_95_percent_of_the_time():
    rng = np.random.default_rng(21)
    true = -math.log(0.1)  # the p90 of an exponential(1)
    trials, covered = 2000, 0
    for _ in range(trials):
        got = quantile_interval(rng.exponential(1.0, 60).tolist(), 0.9)
        assert got is not None
        covered += got[0] <= true <= got[1]
    # at least 95 % by construction (discrete ranks overshoot); 2,000 trials: ±1 %
    assert 0.94 <= covered / trials <= 0.995, covered / trials


# -- a cell's verdict


def cell(concurrency=8, context=8192, status=Status.VALID, **figures) -> CellRecord:
    base: dict[str, Any] = {
        "total_tok_s": 1000.0,
        "per_request_tok_s": 125.0,
        "ttft_ms": 100.0,
        "ttft_p90_ms": 150.0,
        "tbt_ms": 8.0,
        "tbt_p90_ms": 9.0,
    }
    base.update(figures)
    return CellRecord(CellId.decode(context, concurrency), status, context_tokens=context, **base)


def test_a_bound_is_met_missed_or_too_close_by_the_figures_interval():
    bounds = parse("ttft<=200ms")
    assert judge(cell(ttft_ms=150.0, ttft_ms_ci=(140.0, 160.0)), bounds).verdict is Meets.YES
    missed = judge(cell(ttft_ms=260.0, ttft_ms_ci=(240.0, 280.0)), bounds)
    assert missed.verdict is Meets.NO and missed.words() == "misses ttft: 260 ms > 200 ms"
    close = judge(cell(ttft_ms=190.0, ttft_ms_ci=(170.0, 230.0)), bounds)
    assert close.verdict is Meets.CLOSE
    assert close.words() == "too close to call: ttft: 170 ms–230 ms, bound 200 ms"
    # a figure without an interval: its value
    assert judge(cell(ttft_ms=199.0), bounds).verdict is Meets.YES
    # seconds stay seconds in the words
    got = judge(cell(ttft_p90_ms=4300.0), parse("ttft_p90<=2s"))
    assert got.words() == "misses ttft_p90: 4.3 s > 2 s"


def test_a_p90_is_judged_with_the_interval_of_its_samples():
    rng = random.Random(4)
    ttfts = tuple(rng.uniform(100.0, 300.0) for _ in range(200))
    p90 = float(np.percentile(ttfts, 90))
    samples = Samples(ttft_ms=ttfts)
    lo, hi = quantile_interval(ttfts, 0.9) or (0, 0)
    assert lo < p90 < hi
    inside = cell(ttft_p90_ms=p90, samples=samples)
    assert judge(inside, parse(f"ttft_p90<={(lo + p90) / 2}ms")).verdict is Meets.CLOSE
    assert judge(inside, parse(f"ttft_p90<={hi * 1.01}ms")).verdict is Meets.YES
    assert judge(inside, parse(f"ttft_p90<={lo * 0.99}ms")).verdict is Meets.NO


def test_a_rate_bound_is_a_floor():
    bounds = parse("per_request_tok_s>=100")
    assert judge(cell(per_request_tok_s=125.0), bounds).verdict is Meets.YES
    assert judge(cell(per_request_tok_s=80.0), bounds).words() == (
        "misses per_request_tok_s: 80.0 tok/s < 100 tok/s"
    )


def test_cells_that_were_not_measured_are_not_judged():
    bounds = parse("ttft<=200ms")
    assert judge(cell(status=Status.OVER_CAPACITY), bounds).verdict is None
    assert judge(cell(ttft_ms=None), bounds).why == (
        "not judged: no ttft (no request in the window)"
    )
    prefill = CellRecord(CellId.prefill(8192), Status.VALID, ttft_ms=10.0)
    assert judge(prefill, bounds).verdict is None


# -- capacity


def row(*ttfts, context=8192, over_from=None):
    out = []
    for i, t in enumerate(ttfts):
        n = 2**i
        if over_from is not None and n >= over_from:
            out.append(CellRecord(CellId.decode(context, n), Status.OVER_CAPACITY))
        else:
            out.append(cell(n, context, ttft_p90_ms=t))
    return out


def test_the_capacity_is_the_most_requests_up_to_which_every_cell_meets():
    bounds = parse("ttft_p90<=2s")
    got = capacities(
        [
            *row(100, 200, 900, 4300, 1000),  # c16 misses; c32 meets again: not counted
            *row(100, 200, 300, 400, 500, context=32768, over_from=8),
            *row(2500, context=131072),
        ],
        bounds,
    )
    assert got["8K"].line() == "8K: 4 requests (8 misses ttft_p90: 4.3 s > 2 s)"
    assert got["32K"].line() == "32K: 4 requests (8 over capacity)"
    assert got["128K"].line() == "128K: none (1 misses ttft_p90: 2.5 s > 2 s)"
    assert list(got) == ["8K", "32K", "128K"]
    every = capacities(row(100, 200), bounds)
    assert every["8K"].requests == 2 and every["8K"].stopped_by is None


def rate_cell(rate, ttft, p90=None, ttfts=(), context=8192) -> CellRecord:
    """A rate cell with its TTFT from the schedule (median, p90) and their samples."""
    return CellRecord(
        CellId.at_rate(context, rate), Status.VALID, context_tokens=context,
        sched_ttft_ms=ttft, sched_ttft_p90_ms=p90 if p90 is not None else ttft * 1.5,
        open_tbt_ms=8.0, samples=Samples(ttft_ms=tuple(ttfts)),
    )  # fmt: skip


def test_the_capacity_as_a_rate_is_the_highest_rate_up_to_which_every_rate_cell_meets():
    """Rate cells are judged on their latencies from the scheduled send (the decode cells'
    ``ttft`` is a rate cell's ``sched_ttft_ms``, its p90 the same samples' quantile); the
    rule is the decode capacity's: every cell up to it meets. Out of order on purpose."""
    got = rate_capacities(
        [rate_cell(16, 4300), rate_cell(1, 100), rate_cell(4, 900), rate_cell(32, 500)],
        parse("ttft<=2s"),
    )
    assert got["8K"].line() == "8K: 4 requests/s (16/s misses ttft: 4.3 s > 2 s)"
    assert got["8K"].to_dict() == {"rate": 4.0, "stopped_by": "16/s misses ttft: 4.3 s > 2 s"}
    one = rate_capacities([rate_cell(1, 100), rate_cell(2, 2500)], parse("ttft<=2s"))
    assert one["8K"].line() == "8K: 1 request/s (2/s misses ttft: 2.5 s > 2 s)"
    none = rate_capacities([rate_cell(0.5, 2500)], parse("ttft<=2s"))
    assert none["8K"].rate is None and none["8K"].line().startswith("8K: none (0.5/s misses")
    # a p90 from the cell's own samples: 20 of 0.1 s and 20 of 3 s put it past the bound
    mixed = rate_cell(1, 100, p90=3000, ttfts=(100.0,) * 20 + (3000.0,) * 20)
    assert judge(mixed, parse("ttft_p90<=2s")).verdict is Meets.NO
    # an objective a rate cell has no figure for: not judged, said, and it stops the capacity
    (no_tbt,) = rate_capacities([rate_cell(1, 100)], parse("tbt_p90<=50ms")).values()
    assert no_tbt.rate is None and no_tbt.stopped_by == (
        "1/s not judged: a rate cell has no tbt_p90"
    )
    # decode capacities leave rate cells out, and the other way round
    assert capacities([rate_cell(1, 100)], parse("ttft<=2s")) == {}
    assert rate_capacities(row(100, 200), parse("ttft<=2s")) == {}


def test_a_cell_at_or_below_the_baselines_capacity_that_misses_is_a_drop():
    bounds = parse("ttft_p90<=2s")
    missed = cell(4, ttft_p90_ms=2600.0)
    assert capacity_miss(8, missed, bounds) == (
        "8K: capacity at SLO 8 → below 4: decode[8K-c4] misses ttft_p90: 2.6 s > 2 s"
    )
    assert capacity_miss(2, missed, bounds) is None  # above the baseline's capacity
    assert capacity_miss(8, cell(4, ttft_p90_ms=1900.0), bounds) is None
    first = capacity_miss(8, cell(1, ttft_p90_ms=2600.0), bounds)
    assert first is not None and first.startswith("8K: capacity at SLO 8 → 0: ")


# -- goodput


def trace(t_send, first, n, gap, counts=1):
    times = [first + i * gap for i in range(n)]
    return RequestTrace(t_send, times[-1], times, [counts] * n, True)


def test_goodput_counts_the_window_tokens_of_the_requests_that_met_every_bound():
    traces = [
        trace(0.0, 0.1, 100, 0.01),  # TTFT 100 ms, 100 tok/s
        trace(0.0, 0.5, 100, 0.01),  # TTFT 500 ms
        trace(0.0, 0.1, 50, 0.03),  # 33 tok/s
        RequestTrace(0.0, 2.0, [], [], False),  # no token: nothing
    ]
    w0, w1 = 0.0, 2.0
    everyone = goodput(traces, w0, w1, RequestBounds())
    assert everyone == pytest.approx(250 / 2.0)
    assert goodput(traces, w0, w1, RequestBounds(ttft_ms=200.0)) == pytest.approx(150 / 2.0)
    assert goodput(traces, w0, w1, RequestBounds(tok_s=50.0)) == pytest.approx(200 / 2.0)
    assert goodput(traces, w0, w1, RequestBounds(tbt_ms=20.0)) == pytest.approx(200 / 2.0)
    # only the tokens inside the window count
    assert goodput(traces[:1], 0.5, 1.0, RequestBounds()) == pytest.approx(50 / 0.5)


# -- the baseline's [slo]


def valid(cid, **kw):
    return CellRecord(CellId.parse(cid), Status.VALID, total_tok_s=100.0, **kw)


def test_a_baseline_keeps_the_objectives_and_the_smallest_capacity_of_its_runs(tmp_path):
    path = tmp_path / "b.toml"
    run = {"model": "m", "api": "completions"}
    records = [valid("decode[8K-c1]")]
    save(path, run, records, slo=("ttft_p90<=2s", {"8K": 32, "32K": 8}))
    got = load(path)
    assert got.objectives == "ttft_p90<=2s" and got.capacity == {"8K": 32, "32K": 8}
    save(path, run, records, slo=("ttft_p90<=2s", {"8K": 16, "32K": 8, "128K": 1}))
    got = load(path)
    assert got.runs == 2 and got.capacity == {"8K": 16, "32K": 8, "128K": 1}
    # a run at other objectives does not change what the file holds
    save(path, run, records, slo=("ttft_p90<=1s", {"8K": 1}))
    assert load(path).capacity == {"8K": 16, "32K": 8, "128K": 1}
    assert load(path).objectives == "ttft_p90<=2s"


@pytest.mark.parametrize(
    ("table", "says"),
    [
        (
            '[slo]\nobjectives = "ttft_p95<=2s"\n',
            "line 2: [slo] objectives = 'ttft_p95<=2s': unknown figure 'ttft_p95' (figures: ",
        ),
        ('[slo]\ncapacity = { "8K" = 4 }\n', "line 1: [slo] needs objectives"),
        ('[slo]\nobjectives = "ttft<=2s"\ncapacity = { "8K" = -1 }\n', "line 3: [slo] capacity"),
        ('[slo]\nobjectives = "ttft<=2s"\nmore = 1\n', "[slo]: unknown key 'more'"),
    ],
)
def test_a_broken_slo_table_names_its_line(tmp_path, table, says):
    path = tmp_path / "b.toml"
    path.write_text(table)
    with pytest.raises(BaselineError) as got:
        load(path)
    assert says in str(got.value), got.value


# -- compare


def results(slo, capacity):
    from pytest_llmspeed.results import Results, RunInfo

    run = RunInfo(
        "t", "2026-12-02", "sim", settings={"slo": slo} if slo else {}, capacity=capacity or {}
    )
    return Results(run)


def test_compare_shows_the_capacities_side_by_side():
    from pytest_llmspeed.report.compare import capacity_changes

    def cap(**n):
        return {k.upper(): {"requests": v, "stopped_by": None} for k, v in n.items()}

    old = results("ttft_p90<=2s", cap(_8k=32, _32k=8))
    new = results("ttft_p90<=2s", cap(_8k=16, _32k=8))
    assert capacity_changes(old, new) == (
        "capacity at ttft_p90<=2s:",
        "_8K: 32 → 16 requests (fewer)",
        "_32K: 8 → 8 requests",
    )
    other = results("ttft_p90<=1s", cap(_8k=16))
    assert capacity_changes(old, other) == (
        "capacity at other objectives: ttft_p90<=2s (old), ttft_p90<=1s (new): not compared",
    )
    assert capacity_changes(results(None, None), new) == (
        "capacity at objectives: only this run had them (ttft_p90<=2s)",
    )
    assert capacity_changes(results(None, None), results(None, None)) == ()
    # the results file keeps them: written and read back
    from pytest_llmspeed.results import loads

    assert loads(new.dumps()).run.capacity == new.run.capacity
