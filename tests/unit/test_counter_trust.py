"""The generation counter as a referee, and the cell's notes on its server's values (issue 29,
docs/trust.md "Values that make sense"): a counter gap the requests in flight cannot hold, or
a counter that goes back, is not to be trusted (the cell fails), never a lagging server; a
counter that went back invalidates every server figure of the cell."""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_llmspeed.core.client import StreamRecord
from pytest_llmspeed.core.protocol import (
    DecodeResult,
    MetricsRead,
    _counter_room,
    _window_figures,
    _window_flags,
    counter_disagreement,
)
from pytest_llmspeed.core.server_figures import snapshot as server_snapshot
from pytest_llmspeed.core.stats import DecodeStats
from pytest_llmspeed.core.status import cell_status
from pytest_llmspeed.report.notes import COUNTER_EARLY, COUNTER_LAG, note_lines
from pytest_llmspeed.results import Flag, FlagKind, Status

from .test_server_values import metrics, record

DATA = Path(__file__).parent.parent / "data" / "metrics"


def read(text: str, t: float) -> MetricsRead:
    return MetricsRead(t, t + 0.01, (text,))


def test_the_cell_says_which_values_it_refused():
    reads = [read(metrics("100"), 0.0), read(metrics("NaN", running="-3"), 0.5)]
    close = read(metrics("200"), 1.0)
    families = frozenset({"vllm:generation_tokens", "vllm:num_requests_running"})
    snaps = [snap for r in (*reads, close) if (snap := r.parse(families)[1]) is not None]
    assert len(snaps) == 3
    flags = _window_flags(None, (reads[0], [reads[1]], close), (snaps[0], [snaps[1]], snaps[2]))
    (flag,) = flags
    assert flag.kind is FlagKind.SERVER_VALUES_REFUSED
    note = flag.text()
    assert note.startswith("server values that are not figures: ")
    assert note.endswith(" (taken as not exposed in this cell)")
    assert "vllm:generation_tokens_total is NaN" in note
    assert "vllm:num_requests_running is −3" in note


def test_a_counter_that_falls_between_polls_invalidates_the_cells_server_figures():
    # open 100, a poll at 50 (the server restarted, or a flapping counter), close 300
    open_, poll, close = (
        server_snapshot(metrics(v), t) for t, v in ((0, "100"), (0.5, "50"), (1, "300"))
    )
    got = _window_figures(open_, close, [poll])
    assert got is not None
    assert got.generation_tokens is None and got.running_mean is None  # nothing kept
    assert "generation_tokens" in got.reset
    (flag,) = _window_flags(None, (None, [], None), (open_, [poll], close))
    assert flag == Flag(
        FlagKind.SERVER_WENT_BACK, "vllm:generation_tokens_total fell from 100 to 50"
    )
    assert flag.text() == (
        "server figures not kept: vllm:generation_tokens_total fell from 100 to 50 (the server "
        "restarted, or its counters are not to be trusted)"
    )


def test_a_counter_that_went_back_at_the_close_is_said_too():
    before, after = (
        (DATA / "vllm-0.32-cpu-before.txt").read_text(),
        (DATA / "vllm-0.32-cpu-after.txt").read_text(),
    )
    open_, close = server_snapshot(after, 0.0), server_snapshot(before, 1.0)
    got = _window_figures(open_, close, [])
    assert got is not None and got.reset and got.steps is None and got.running_max is None
    (flag,) = _window_flags(None, (None, [], None), (open_, [], close))
    assert flag.kind is FlagKind.SERVER_WENT_BACK and " fell from " in flag.detail


def test_metrics_that_do_not_parse_in_a_cell_say_the_line_once():
    bad = read(
        '# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{a="x\ny"} 1\n', 0.5
    )
    good = read(metrics(), 0.0)
    snap = good.parse(frozenset({"vllm:num_requests_running"}))[1]
    flags = _window_flags(None, (good, [bad, bad], good), (snap, [], snap))
    assert [f.text() for f in flags] == [
        '/metrics did not parse: line 2: "vllm:num_requests_running{a=\\"x"'
    ]
    assert flags[0].kind is FlagKind.METRICS_UNPARSED


def decode(**kw: object) -> DecodeResult:
    stats = DecodeStats(
        output_tokens=1000, total_tok_s=100.0, per_request_tok_s=50.0, ttft_ms=20.0,
        ttft_p90_ms=25.0, ttft_p99_ms=30.0, tbt_ms=10.0, tbt_p90_ms=11.0, tbt_p99_ms=12.0,
        avg_active=2.0, completed=20, measured_s=10.0, requests=20, errors=0,
    )  # fmt: skip
    fields: dict[str, object] = dict(
        context=1024, concurrency=2, duration_s=10.0, max_output=64, stats=stats,
        token_accounting="usage", early_stops=0, errors={}, received_tokens=1000,
        generation_tokens_delta=None, max_waiting=None, mean_running=None, queued=False,
        received_span=(990, 1000), median_in_server=2.0,
    )  # fmt: skip
    return DecodeResult(**{**fields, **kw})  # type: ignore[arg-type]


@pytest.mark.parametrize("delta", [10_000.0, 1_500.0, 100.0])
def test_a_counter_gap_the_requests_in_flight_cannot_hold_is_not_a_lagging_server(delta):
    # 2 requests of at most 64 tokens: at most 128 tokens generated and not yet streamed
    result = decode(generation_tokens_delta=delta)
    reason = counter_disagreement(result)
    assert reason is not None
    assert "2 × 64 = 128 tokens" in reason and "not to be trusted" in reason
    assert "lagging API server" not in reason
    assert cell_status(result).status is Status.FAILED


def test_a_lag_within_what_the_requests_can_hold_stays_a_lag():
    assert counter_disagreement(decode(generation_tokens_delta=1150.0)) is None


@pytest.mark.parametrize(
    ("kw", "words"),
    [
        ({"generation_tokens_delta": -500.0}, "fell by 500 tokens"),
        ({"generation_tokens_delta": 1000.0, "server": "reset"}, "went back inside the window"),
    ],
)
def test_a_generation_counter_that_goes_back_is_not_to_be_trusted(kw, words):
    if kw.get("server") == "reset":
        open_, poll, close = (
            server_snapshot(metrics(v), t) for t, v in ((0, "100"), (0.5, "5000"), (1, "1100"))
        )
        kw = {**kw, "server": _window_figures(open_, close, [poll])}
    result = decode(**kw)
    reason = counter_disagreement(result)
    assert reason is not None and words in reason and "not to be trusted" in reason
    assert cell_status(result).status is Status.FAILED


def test_a_counter_not_to_be_trusted_is_no_counter_lag_note():
    reason = counter_disagreement(decode(generation_tokens_delta=10_000.0))
    cell = record(
        status=Status.FAILED, reason=reason, generation_tokens_delta=10_000.0,
        received_span=(990, 1000), tokens="usage",
    )  # fmt: skip
    assert not any(COUNTER_LAG.heading in line for line in note_lines([cell]))


# -- the referee's bounds (docs/trust.md, "The referee's bounds") -----------------------------
# decode(): c2, max output 64, 990-1000 tokens received over the counter's span; the bracket's
# own slack is 5 % of 1,000 + 8 tokens a stream = 66 tokens


@pytest.mark.parametrize("risen", [500.0, 900.0])
def test_a_counter_below_the_tokens_received_before_its_close_read_fails_the_cell(risen):
    # a usage that says twice what was sent: whatever the window, fewer were generated from
    # before the cell's first request than were received (a token is generated first)
    result = decode(generation_tokens_delta=995.0, counter_floor=(risen, 1200))
    reason = counter_disagreement(result)
    assert reason is not None
    assert "fewer generated than received" in reason
    assert "usage counts more tokens than it sent" in reason and "not to be trusted" in reason
    assert "lagging" not in reason
    assert cell_status(result).status is Status.FAILED


def test_the_floor_allows_the_brackets_slack():
    # 1,200 received: 5 % + 8 a stream = 76 tokens short of them is within the bound
    assert counter_disagreement(decode(counter_floor=(1125.0, 1200))) is None
    assert counter_disagreement(decode(counter_floor=(1123.0, 1200))) is not None


def test_the_floor_with_estimated_tokens_blames_the_estimate():
    result = decode(counter_floor=(500.0, 1200), token_accounting="chunk-count")
    reason = counter_disagreement(result)
    assert reason is not None and "estimate counted tokens the server did not generate" in reason


def test_a_counter_above_what_the_open_requests_could_still_send_fails_the_cell():
    # the requests open at the close could still have generated 100 tokens: a counter 1,000 +
    # 100 + 66 above is tokens the server counted and never streamed (a usage that says less)
    result = decode(generation_tokens_delta=1167.0, counter_room=(40, 100))
    reason = counter_disagreement(result)
    assert reason is not None
    assert "more than the requests open at the window's close" in reason
    assert "100 tokens" in reason and "usage counts fewer than it sent" in reason
    assert "not a lagging server" in reason and cell_status(result).status is Status.FAILED
    # within it: the server's lag
    within = decode(generation_tokens_delta=1165.0, counter_room=(40, 100))
    assert counter_disagreement(within) is None


def test_a_counter_below_what_the_window_received_past_its_room_fails_the_cell():
    # received 990-1000; the requests open at the start could have generated 40 of them
    # before it: a counter below 990 - 40 - 66 = 884 credited tokens never generated
    result = decode(generation_tokens_delta=883.0, counter_room=(40, 100))
    reason = counter_disagreement(result)
    assert reason is not None and "fewer generated than received" in reason
    assert "40 tokens" in reason and "usage counts more than it sent" in reason
    assert "lagging" not in reason
    within = decode(generation_tokens_delta=885.0, counter_room=(40, 100))
    assert counter_disagreement(within) is None


def test_a_counter_behind_within_its_room_is_not_called_a_lag():
    cell = record(generation_tokens_delta=885.0, received_span=(990, 1000), tokens="usage")
    lines = note_lines([cell])
    assert any(COUNTER_EARLY.heading in line for line in lines)
    assert not any(COUNTER_LAG.heading in line for line in lines)
    assert "lagging" not in COUNTER_EARLY.heading


def stream(
    sent: float,
    times: list[float],
    counts: list[int],
    end: float | None = None,
    error: str | None = None,
) -> StreamRecord:
    return StreamRecord(t_send=sent, t_end=end, token_times=times, token_counts=counts, error=error)


def test_the_room_is_what_the_requests_open_at_each_read_could_hold():
    # max output 64; the window's reads at 1.0-1.1 (open) and 5.0-5.1 (close)
    records = [
        # open at the open read (10 received before it, 20 after): at most 20 of those after
        # were generated before it; done before the close read: nothing left to generate
        stream(0.0, [0.5, 2.0], [10, 20], end=3.0),
        # open at both: 5 before, 10 after; 64 - 15 left at the close
        stream(0.5, [0.8, 4.0], [5, 10]),
        # sent after the open read, ended by an error inside the window: what it did not
        # send (64 - 3) may have been generated
        stream(2.0, [2.5], [3], end=4.5, error="stream broken"),
        stream(0.0, [0.2], [64], end=0.5),  # over before the window
        stream(5.2, [], []),  # sent after the close read
    ]
    assert _counter_room(records, 64, (1.0, 1.1), (5.0, 5.1)) == (20 + 10, 49 + 61)
