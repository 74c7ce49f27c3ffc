"""The open loop's pure parts (docs/workloads.md): the schedule, the trace file and its errors,
the blocks a trace shares, the figures from the scheduled send."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from pytest_llmspeed.core.client import StreamRecord
from pytest_llmspeed.core.openloop import (
    BLOCK_TOKENS,
    TRACE_MAX_BLOCKS,
    Planned,
    Sent,
    TraceError,
    expected_hit_share,
    fitting,
    open_figures,
    parse_trace,
    rate_schedule,
    read_trace,
    shared_tokens,
    trace_name,
    trace_schedule,
)
from pytest_llmspeed.results import CellId, Phase

# -- the schedule ------------------------------------------------------------------------


def test_a_rate_schedule_is_a_pure_function_of_its_arguments():
    assert rate_schedule(4, 10, seed=3) == rate_schedule(4, 10, seed=3)
    assert rate_schedule(4, 10, seed=3) != rate_schedule(4, 10, seed=4)


def test_a_rate_schedule_sends_only_inside_the_duration_in_order():
    times = rate_schedule(20, 5, seed=1)
    assert all(0 < t < 5 for t in times)
    assert list(times) == sorted(times)


def test_poisson_arrivals_have_the_rate_and_exponential_gaps():
    times = np.array(rate_schedule(50, 400, seed=7))  # about 20,000 arrivals
    n = len(times)
    assert abs(n - 20_000) < 5 * math.sqrt(20_000)  # Poisson count: sd = sqrt(mean)
    gaps = np.diff(np.concatenate(([0.0], times)))
    assert gaps.mean() == pytest.approx(1 / 50, rel=0.03)
    assert gaps.std() / gaps.mean() == pytest.approx(1.0, abs=0.03)  # exponential: cv 1


@pytest.mark.parametrize("burstiness", [0.25, 4.0])
def test_burstiness_keeps_the_mean_gap_and_sets_its_spread(burstiness):
    times = np.array(rate_schedule(50, 400, burstiness=burstiness, seed=7))
    gaps = np.diff(np.concatenate(([0.0], times)))
    assert gaps.mean() == pytest.approx(1 / 50, rel=0.05)
    # a gamma of shape b has cv 1 / sqrt(b): burstier below 1, more even above
    assert gaps.std() / gaps.mean() == pytest.approx(1 / math.sqrt(burstiness), rel=0.06)


@pytest.mark.parametrize(
    ("rate", "duration", "burstiness", "words"),
    [
        (0, 10, 1, "rate 0"),
        (math.inf, 10, 1, "rate inf"),
        (2, -1, 1, "duration -1"),
        (2, 10, 0, "burstiness 0"),
        (10_000, 100, 1, "more than 100,000"),
    ],
)
def test_a_rate_schedule_refuses_what_is_no_schedule(rate, duration, burstiness, words):
    with pytest.raises(ValueError, match=words):
        rate_schedule(rate, duration, burstiness)


# -- the trace file ------------------------------------------------------------------------


def _lines(*objs: object) -> list[str]:
    return [o if isinstance(o, str) else json.dumps(o) for o in objs]


def test_a_mooncake_trace_is_read_in_time_order_and_replayed_at_its_speed():
    trace = parse_trace(
        _lines(
            {"timestamp": 0, "input_length": 600, "output_length": 10, "hash_ids": [1, 2]},
            {"timestamp": 3000, "input_length": 700, "output_length": 5, "hash_ids": [1, 3]},
            "",
            {"timestamp": 1000, "input_length": 50, "output_length": 7},
        ),
        "t.jsonl",
    )
    assert [r.line for r in trace.requests] == [1, 4, 2]
    assert trace.requests[2].hash_ids == (1, 3)
    assert trace_schedule(trace) == (0.0, 1.0, 3.0)
    assert trace_schedule(trace, speed=2) == (0.0, 0.5, 1.5)
    assert trace.name == "t" and trace.span_s == 3.0


@pytest.mark.parametrize(
    ("line", "words"),
    [
        ("{not json", "line 2: not JSON"),
        ("[1, 2]", "line 2: not a JSON object"),
        ('{"input_length": 5, "output_length": 5}', "line 2: 'timestamp' must be a number"),
        ('{"timestamp": -1, "input_length": 5, "output_length": 5}', "'timestamp'"),
        ('{"timestamp": 1, "input_length": 0, "output_length": 5}', "'input_length' must be"),
        ('{"timestamp": 1, "input_length": 5, "output_length": "12"}', 'got "12"'),
        ('{"timestamp": 1, "input_length": true, "output_length": 5}', "got true"),
        ('{"timestamp": 1, "input_length": 5.5, "output_length": 5}', "got 5.5"),
        ('{"timestamp": 1, "input_length": 5, "output_length": 5, "hash_ids": [1, "a"]}', "list"),
    ],
)
def test_a_broken_line_is_one_line_naming_the_file_the_line_and_the_fix(line, words):
    good = '{"timestamp": 0, "input_length": 5, "output_length": 5}'
    with pytest.raises(TraceError, match=words) as info:
        parse_trace([good, line], "runs/trace.jsonl")
    message = str(info.value)
    assert message.startswith("runs/trace.jsonl: line 2: ")
    assert "\n" not in message
    assert message.endswith("fix that line or drop it")


def test_a_trace_is_bounded():
    with pytest.raises(TraceError, match="no request in it"):
        parse_trace(["", "  "], "empty.jsonl")
    many = {"timestamp": 0, "input_length": 5, "output_length": 5, "hash_ids": [0] * 4097}
    with pytest.raises(TraceError, match=f"more than {TRACE_MAX_BLOCKS:,} hash_ids"):
        parse_trace(_lines(many), "x")
    with pytest.raises(TraceError, match="a line over 64 KiB"):
        parse_trace(["x" * (65 << 10)], "x")
    # past 100,000 requests, the first 100,000 are replayed, the rest said
    trace = parse_trace(['{"timestamp": 0, "input_length": 5, "output_length": 5}'] * 100_002, "x")
    assert len(trace.requests) == 100_000
    assert "2 more lines from line 100,001 left out" in trace.notes[0]


def test_a_file_is_read_within_its_bounds(tmp_path):
    path = tmp_path / "my trace!.jsonl"
    path.write_text('{"timestamp": 5, "input_length": 9, "output_length": 2}\r\n')
    trace = read_trace(path)
    assert trace.name == "my_trace_" and len(trace.requests) == 1
    assert CellId.trace(trace.name).phase is Phase.TRACE
    with pytest.raises(TraceError, match="cannot be read"):
        read_trace(tmp_path / "missing.jsonl")


def test_requests_beyond_the_servers_context_are_left_out_and_said():
    trace = parse_trace(
        _lines(
            {"timestamp": 0, "input_length": 100, "output_length": 10},
            {"timestamp": 1, "input_length": 2000, "output_length": 100},
        ),
        "t.jsonl",
    )
    assert fitting(trace, None) == (trace, None)
    assert fitting(trace, 2100) == (trace, None)
    kept, note = fitting(trace, 2099)
    assert [r.line for r in kept.requests] == [1]
    assert note == (
        "trace t: 1 of 2 requests left out, longer than the server's context (the first: "
        "line 2: input_length 2,000 + output_length 100 = 2,100 > the server's max_model_len "
        "2,099)"
    )
    with pytest.raises(TraceError, match=r"^t.jsonl: no request fits the server \(line 1: "):
        fitting(trace, 100)


def test_trace_names_are_cell_ids():
    assert trace_name("/data/conversation_trace.jsonl") == "conversation_trace"
    assert trace_name("a b/c.d.json") == "c.d"
    assert str(CellId.parse("trace[c.d]")) == "trace[c.d]"


# -- the blocks a trace shares -----------------------------------------------------------------


def test_shared_blocks_are_the_leading_ones_an_earlier_request_named_at_the_same_places():
    B = BLOCK_TOKENS
    trace = parse_trace(
        _lines(
            {"timestamp": 0, "input_length": 3 * B, "output_length": 1, "hash_ids": [1, 2, 3]},
            # the first two blocks shared; its third holds its last token: computed, never hit
            {"timestamp": 1, "input_length": 3 * B, "output_length": 1, "hash_ids": [1, 2, 4]},
            # block 2 after another block: another prefix, nothing shared
            {"timestamp": 2, "input_length": 2 * B + 1, "output_length": 1, "hash_ids": [9, 2]},
            # all three of the first request's blocks, and a token more
            {"timestamp": 3, "input_length": 3 * B + 1, "output_length": 1, "hash_ids": [1, 2, 3]},
            {"timestamp": 4, "input_length": 10, "output_length": 1},
        ),
        "t",
    )
    assert shared_tokens(trace) == (0, 2 * B, 0, 3 * B, 0)
    total = 3 * B + 3 * B + 2 * B + 1 + 3 * B + 1 + 10
    assert expected_hit_share(trace) == pytest.approx(5 * B / total)


# -- the figures from the scheduled send -------------------------------------------------


def _sent(due: float, send: float, first: float | None, last: float, n: int, **kw) -> Sent:
    rec = StreamRecord(t_send=send, t_first=first, t_end=last)
    if first is not None:
        rec.token_times = list(np.linspace(first, last, n)) if n > 1 else [first]
        rec.token_counts = [1] * n
    rec.finished = kw.get("finished", True)
    rec.error = kw.get("error")
    rec.prompt_tokens = kw.get("prompt_tokens", 100)
    return Sent(due, Planned(due, b"{}", 100, kw.get("max_tokens", n)), rec)


def test_latencies_count_from_the_scheduled_send_and_from_the_actual_send_beside():
    # the second request was sent 2 s late (a stalled client): its TTFT from the schedule
    # keeps the 2 s, from the send it does not
    sent = [
        _sent(0.0, 0.0, 0.1, 1.0, 10),
        _sent(1.0, 3.0, 3.1, 4.0, 10),
        _sent(2.0, 3.0, 3.3, 5.0, 5, error="HTTP 500: boom", finished=False),
    ]
    f = open_figures(sent, offered_s=3.0)
    assert f.sched_ttft == pytest.approx((100, 2100, 1300))
    assert f.sent_ttft == pytest.approx((100, 100, 300))
    assert f.sched_e2e == pytest.approx((1000, 3000))  # the failed request has no end-to-end
    assert f.sent_e2e == pytest.approx((1000, 1000))
    assert f.send_lag == pytest.approx((0, 2000, 1000))
    assert f.tbt == pytest.approx((100, 100, 425))
    assert (f.requests, f.completed, f.failed) == (3, 2, 1)
    assert f.errors == {"HTTP 500: boom": 1}
    assert f.span_s == pytest.approx(5.0) and f.offered_rate == pytest.approx(1.0)
    assert f.achieved_rate == pytest.approx(2 / 5.0)
    assert f.output_tokens == 25 and f.output_tok_s == pytest.approx(5.0)
    assert f.max_in_flight == 2  # 3-4 and 3-5 overlap; 0-1 ended before
    # a server that keeps up achieves the offered rate, no more: the span is the schedule's
    # length at least
    quick = open_figures([_sent(0.5, 0.5, 0.6, 0.7, 2), _sent(1.0, 1.0, 1.1, 1.2, 2)], 4.0)
    assert quick.span_s == 4.0 and quick.achieved_rate == quick.offered_rate == 0.5


def test_an_early_stop_and_another_prompt_length_are_counted():
    sent = [
        _sent(0.0, 0.0, 0.1, 1.0, 4, max_tokens=8),
        _sent(1.0, 1.0, 1.1, 2.0, 8, max_tokens=8, prompt_tokens=101),
    ]
    f = open_figures(sent, offered_s=2.0)
    assert f.early_stops == 1
    assert f.wrong_lengths == {101: 1}


def test_an_open_loop_record_round_trips_through_the_file_junit_and_the_schema():
    import jsonschema

    from pytest_llmspeed.core.openloop import OpenLoopResult
    from pytest_llmspeed.core.records import open_record
    from pytest_llmspeed.results import Results, RunInfo, Status, loads
    from tests.conftest import SCHEMA

    sent = [_sent(i * 0.5, i * 0.5 + 0.001, i * 0.5 + 0.05, i * 0.5 + 0.4, 8) for i in range(8)]
    result = OpenLoopResult(open_figures(sent, offered_s=4.0), expected_hit_share=0.25)
    record = open_record(CellId.at_rate(8192, 2), result, context_tokens=8192)
    assert record.status is Status.VALID and record.measured
    assert record.sched_ttft_ms == pytest.approx(50) and record.sent_ttft_ms == pytest.approx(49)
    assert record.sched_ttft_ms_ci is not None and record.open_completed == 8
    run = RunInfo("pytest-llmspeed", "2026-12-01T00:00:00+00:00", "sim:tiny")
    doc = Results(run, (record,)).dumps()
    jsonschema.Draft202012Validator(SCHEMA).validate(json.loads(doc))
    back = loads(doc).cells[0]
    assert back == record and str(back.id) == "rate[8K-r2]"
    props = dict(record.properties())
    assert props["phase"] == "rate" and props["sched_ttft_ms"] == record.sched_ttft_ms
    assert props["sched_ttft_ms_ci_low"] == record.sched_ttft_ms_ci[0]
    assert props["expected_hit_share"] == 0.25 and "total_tok_s" not in props


def _open_record(cid: CellId):
    from pytest_llmspeed.core.openloop import OpenLoopResult
    from pytest_llmspeed.core.records import open_record

    sent = [_sent(i * 0.5, i * 0.5 + 0.001, i * 0.5 + 0.05, i * 0.5 + 0.4, 8) for i in range(8)]
    share = 0.25 if cid.phase is Phase.TRACE else None
    result = OpenLoopResult(open_figures(sent, offered_s=4.0), expected_hit_share=share)
    return open_record(cid, result, context_tokens=8192 if cid.phase is Phase.RATE else None)


def test_open_loop_cells_show_in_the_summary_all_measurements_and_the_page():
    from pytest_llmspeed.report.page import render_page
    from pytest_llmspeed.report.terminal import render
    from pytest_llmspeed.results import Results, RunInfo

    cells = [_open_record(CellId.at_rate(8192, 2)), _open_record(CellId.trace("day1"))]
    text = "\n".join(render(cells, 160, True, []))
    assert "Open loop (requests sent at their scheduled times" in text
    row = next(line for line in text.splitlines() if line.startswith("rate[8K-r2]"))
    assert "2.00 /" in row and "50 ms" in row and "8/8" in row  # offered, TTFT, completed
    assert "Open loop: trace" in text and "≤1" in text  # All measurements: most in flight
    assert "prefix-cache share the trace's blocks give" in text  # More figures
    html = render_page(
        Results(RunInfo("pytest-llmspeed", "2026-12-01", "sim:tiny"), tuple(cells))
    ).html
    assert "Open loop: rate" in html and "Open loop: trace" in html
    assert "TTFT from the actual send" in html  # the page's further figures


def test_open_loop_cells_are_compared_by_their_ttft_from_the_schedule():
    from pytest_llmspeed.report.compare import headline

    record = _open_record(CellId.at_rate(8192, 2))
    assert headline(record) == ("sched_ttft_ms", record.sched_ttft_ms)


@pytest.mark.parametrize(
    ("key", "value", "words"),
    [
        ("rates", "2,x", "give requests per second, comma-separated"),
        ("rates", "0", "0 is not a rate from 0.001 to 10,000/s"),
        ("rates", "2,2.0", "2.0 is given twice"),
        ("rates", ",", "give requests per second"),
        ("burstiness", "0", "must be a positive number"),
        ("trace_speed", "nan", "must be a positive number"),
        ("rate_seed", "-1", "must be a whole number"),
    ],
)
def test_open_loop_options_refuse_what_they_cannot_use(key, value, words):
    from pytest_llmspeed.plugin.settings import _convert

    with pytest.raises(ValueError, match=words):
        _convert(key, value)


def test_the_options_read_rates_and_the_trace(tmp_path):
    from pytest_llmspeed.plugin.settings import _convert

    assert _convert("rates", "0.5, 2,8") == (0.5, 2.0, 8.0)
    path = tmp_path / "t.jsonl"
    path.write_text('{"timestamp": 0, "input_length": 4, "output_length": 1}\n{"x": 1}\n')
    with pytest.raises(ValueError, match=r"^line 2: 'timestamp' must be a number"):
        _convert("trace", str(path))
    path.write_text('{"timestamp": 0, "input_length": 4, "output_length": 1}\n')
    assert _convert("trace", str(path)).name == "t"
