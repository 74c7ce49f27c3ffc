"""What a cell is (``core.status.cell_status``): one pure rule for prefill and decode cells, their
result or the error that stopped them; and the pytest layer's words for it
(``plugin.messages.cell_words``)."""

import dataclasses

import pytest

from pytest_llmspeed.core.errors import (
    KeyRejected,
    LLMSpeedError,
    RequestRejected,
    ServerUnreachable,
    WrongPromptLength,
)
from pytest_llmspeed.core.protocol import DecodeResult, PrefillResult, counter_disagreement
from pytest_llmspeed.core.records import decode_record
from pytest_llmspeed.core.stats import DecodeStats
from pytest_llmspeed.core.status import MAX_ERROR_RATE, VALID, CellStatus, cell_status
from pytest_llmspeed.plugin.messages import cell_words
from pytest_llmspeed.results import Status


def decode(requests: int = 20, errors: dict[str, int] | None = None, **kw) -> DecodeResult:
    errors = errors or {}
    stats = DecodeStats(
        output_tokens=1000, total_tok_s=100.0, per_request_tok_s=50.0, ttft_ms=20.0,
        ttft_p90_ms=25.0, ttft_p99_ms=30.0, tbt_ms=10.0, tbt_p90_ms=11.0, tbt_p99_ms=12.0,
        avg_active=2.0, completed=requests - sum(errors.values()), measured_s=10.0,
        requests=requests, errors=sum(errors.values()),
    )  # fmt: skip
    fields = dict(
        context=1024, concurrency=2, duration_s=10.0, max_output=64, stats=stats,
        token_accounting="usage", early_stops=0, errors=errors, received_tokens=1000,
        generation_tokens_delta=None, max_waiting=None, mean_running=None, queued=False,
    )  # fmt: skip
    return DecodeResult(**{**fields, **kw})


def test_a_clean_cell_is_valid():
    assert cell_status(decode()) == VALID
    assert VALID.valid and VALID.reason is None and VALID.message is None


def test_the_error_rate_may_reach_the_limit_but_not_pass_it():
    one = decode(errors={"HTTP 500: boom": 1})  # 1 of 20: 5 %, the default limit
    assert one.error_rate == MAX_ERROR_RATE
    assert cell_status(one) == VALID
    two = decode(errors={"HTTP 500: boom": 2})
    assert cell_status(two) == CellStatus(
        Status.FAILED,
        "2 of 20 requests failed (10% > max_error_rate 0.05)",
        "max_error_rate",
        "2× HTTP 500: boom",
    )
    assert cell_status(two).message == (
        "2 of 20 requests failed (10% > max_error_rate 0.05): 2× HTTP 500: boom"
    )
    assert cell_status(two, max_error_rate=0.1) == VALID


def test_failed_requests_name_the_setting_that_may_fix_them():
    stalled = decode(
        errors={"no data for 1 s (stalled stream)": 3, "HTTP 503: busy": 1},
        error_settings=frozenset({"timeout"}),
    )
    status = cell_status(stalled)
    assert status.errors == "3× no data for 1 s (stalled stream); 1× HTTP 503: busy"
    assert status.errors_setting == "timeout"
    assert cell_words(status) == (
        "4 of 20 requests failed (20% > --llm-max-error-rate 0.05): "
        "3× no data for 1 s (stalled stream); 1× HTTP 503: busy (--llm-timeout)"
    )


def test_a_window_that_ended_early_is_an_error_before_anything_else():
    result = decode(
        errors={"HTTP 500: boom": 12},
        wrong_lengths={1030: 3},
        aborted="the window never opened: 1 of 2 streams had a first token within 1 s",
        aborted_setting="timeout",
    )
    status = cell_status(result)
    assert (status.status, status.setting) == (Status.ERROR, "timeout")
    assert status.reason == result.aborted
    assert cell_words(status) == (
        "the window never opened: 1 of 2 streams had a first token within 1 s (--llm-timeout)"
        ": 12× HTTP 500: boom"
    )


def test_other_prompt_lengths_fail_the_cell_before_the_error_rate():
    result = decode(errors={"HTTP 500: boom": 12}, wrong_lengths={1030: 3, 1025: 1})
    status = cell_status(result)
    assert (status.status, status.setting) == (Status.FAILED, "prompt_form")
    assert status.reason == (
        "the server counted other prompt lengths than 1024 tokens: 1,025 (1×), 1,030 (3×); "
        "the figures would be for other prompts"
    )
    assert cell_words(status).startswith(
        "the server counted other prompt lengths than 1024 tokens: 1,025 (1×), 1,030 (3×); "
        "the figures would be for other prompts (--llm-prompt-form=ids): 12× HTTP 500"
    )


def test_the_servers_counter_referees_last():
    # the counter rose by 2,000 tokens while 990-1,000 were received over the same span, and
    # the server ran 4 requests at the median, 2 of them ours: another client
    result = decode(generation_tokens_delta=2000.0, received_span=(990, 1000), median_in_server=4.0)
    expected = counter_disagreement(result)
    assert expected == (
        "the server's generation counter rose by 2,000 tokens over the window while 990–1,000 "
        "were received (+100.0%), and the server ran 4 requests at the median, 2 of them ours: "
        "likely another client sharing the server"
    )
    assert cell_status(result) == CellStatus(Status.FAILED, expected)
    agreeing = dataclasses.replace(result, generation_tokens_delta=1000.0)
    assert cell_status(agreeing) == VALID


def test_a_counter_ahead_of_exact_tokens_with_only_our_requests_is_the_servers_lag():
    # tokens counted exactly (usage) and only our 2 requests on the server: the counter ran
    # ahead of what was streamed (vLLM's CPU build beside other work: +5 to +15 %); the cell
    # is valid and its notes say so (tests/unit/test_notes.py)
    ours = decode(generation_tokens_delta=1150.0, received_span=(990, 1000), median_in_server=2.0)
    assert counter_disagreement(ours) is None and cell_status(ours) == VALID
    no_gauges = dataclasses.replace(ours, median_in_server=None)
    assert cell_status(no_gauges) == VALID
    behind = dataclasses.replace(ours, generation_tokens_delta=800.0)  # the lag shrank
    assert cell_status(behind) == VALID


@pytest.mark.parametrize(
    ("delta", "cause"),
    [
        (3000.0, "chunks that carry several tokens, counted without usage"),
        (500.0, "tokens counted that the server did not generate (check the token accounting)"),
    ],
)
def test_the_counter_refutes_estimated_tokens_either_way(delta, cause):
    result = decode(
        generation_tokens_delta=delta, received_span=(990, 1000), token_accounting="ratio"
    )
    reason = counter_disagreement(result)
    assert reason is not None and reason.endswith(f"likely {cause}")
    assert cell_status(result) == CellStatus(Status.FAILED, reason)


def test_a_prefill_result_is_valid():
    result = PrefillResult(context=1024, prompt_tokens=1024, ttft_ms=50.0, prompt_tok_s=2e4,
                           max_tokens=16)  # fmt: skip
    assert cell_status(result) == VALID


@pytest.mark.parametrize(
    ("error", "status", "reason", "setting", "words"),
    [
        (
            RequestRejected(400, "prompt too long", "http://x/v1/completions"),
            Status.FAILED,
            "the server refused a prompt that fits (HTTP 400: prompt too long)",
            None,
            "the server refused a prompt that fits (HTTP 400: prompt too long)",
        ),
        (
            WrongPromptLength(
                "the server counted 1030 prompt tokens for a prompt built to be 1024"
            ),
            Status.FAILED,
            "the server counted 1030 prompt tokens for a prompt built to be 1024",
            "prompt_form",
            "the server counted 1030 prompt tokens for a prompt built to be 1024 "
            "(--llm-prompt-form=ids)",
        ),
        (
            ServerUnreachable("cannot reach the LLM server at http://x: refused"),
            Status.ERROR,
            "cannot reach the LLM server at http://x: refused",
            "endpoint",
            "cannot reach the LLM server at http://x: refused. Check --llm-endpoint and that "
            "the server is running.",
        ),
        (
            KeyRejected("API key rejected by http://x (HTTP 401: no)"),
            Status.ERROR,
            "API key rejected by http://x (HTTP 401: no)",
            "api_key",
            "API key rejected by http://x (HTTP 401: no). Set --llm-api-key or "
            "LLMSPEED_API_KEY to the server's key.",
        ),
        (
            LLMSpeedError("prefill request at 1024 tokens produced no output token"),
            Status.ERROR,
            "prefill request at 1024 tokens produced no output token",
            None,
            "prefill request at 1024 tokens produced no output token",
        ),
    ],
)
def test_an_error_that_stopped_the_cell(error, status, reason, setting, words):
    got = cell_status(error)
    assert (got.status, got.reason, got.setting, got.errors) == (status, reason, setting, None)
    assert got.error is error
    assert got.message == reason
    assert cell_words(got) == words


def test_decode_record_carries_the_status_in_the_cores_words():
    failing = decode(errors={"HTTP 500: boom": 2})
    record = decode_record(1024, failing)
    assert record.status is Status.FAILED
    assert record.reason == "2 of 20 requests failed (10% > max_error_rate 0.05): 2× HTTP 500: boom"
    assert record.errors == 2 and record.requests == 20  # the figures are kept
    valid = decode_record(1024, failing, max_error_rate=0.1)
    assert valid.status is Status.VALID and valid.reason is None
