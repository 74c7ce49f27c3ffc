"""The built-in speed-test suite: one prefill test per context, one decode test per cell."""

import pytest

pytestmark = pytest.mark.llmspeed


@pytest.mark.prefill
def test_prefill(llm_prefix, llm_cell):
    """Cold-cache prefill at one context (prompt tok/s, TTFT)."""
    record = llm_cell.prefill(llm_prefix)
    assert record.prompt_tok_s is not None and record.prompt_tok_s > 0


@pytest.mark.decode
def test_decode(llm_prefix, llm_concurrency, llm_cell):
    """Sustained decode at one context with N requests in flight."""
    record = llm_cell.decode(llm_prefix, llm_concurrency)
    assert record.output_tokens, "no output token arrived inside the window"


@pytest.mark.rate
def test_rate(llm_prefix, llm_rate, llm_cell):
    """Open loop at one context: requests arriving at a rate for --llm-duration, whatever the
    server does; latencies from each request's scheduled send (docs/workloads.md)."""
    record = llm_cell.rate(llm_prefix, llm_rate)
    assert record.open_requests, "the schedule sent no request"


@pytest.mark.conversation
def test_conversation(llm_conversation, llm_cell):
    """Conversations at one context: as many users as the concurrency, in step through
    --llm-turns turns, each prompt the whole history; per turn the server's prefix-cache hit
    rate beside the share it should hit (docs/workloads.md)."""
    record = llm_cell.conversation(*llm_conversation)
    assert record.conv_turns, "no turn ran"


@pytest.mark.trace
def test_trace(llm_trace, llm_cell):
    """Open loop: --llm-trace's requests replayed at its times, its prefix blocks shared."""
    record = llm_cell.trace(llm_trace)
    assert record.open_requests, "the trace sent no request"
