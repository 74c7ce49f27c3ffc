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
