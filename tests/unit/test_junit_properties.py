"""The JUnit properties of a cell, pinned per status: the names and their order are a contract
with whatever reads the XML (dashboards, CI annotations)."""

from pathlib import Path

import pytest

from pytest_llmspeed.results import CellId, CellRecord, Status, load

DATA = Path(__file__).resolve().parents[1] / "data" / "v1" / "results.json"

ID_KEYS = ["phase", "context", "context_tokens", "concurrency", "status"]
DECODE = [
    "total_tok_s", "per_request_tok_s", "ttft_ms", "ttft_p90_ms", "ttft_p99_ms", "tbt_ms",
    "tbt_p90_ms", "tbt_p99_ms", "avg_active", "completed", "output_tokens", "measured_s",
    "requests", "errors", "early_stops", "tokens", "queued", "effective_concurrency",
]  # fmt: skip


@pytest.fixture(scope="module")
def cells():
    return {str(c.id): c for c in load(DATA).cells}


def names(record):
    return [k for k, _ in record.properties()]


def test_valid_decode_cell(cells):
    # a cell with no floor in the baseline: the gate's verdict says so
    assert names(cells["decode[1K-c8]"]) == [*ID_KEYS, *DECODE, "gate_verdict"]
    assert dict(cells["decode[1K-c8]"].properties())["gate_verdict"] == "no floor"


def test_failed_decode_cell_adds_the_reason(cells):
    # the gate's verdict on the cell, then on each figure it checked
    gate = ["gate_verdict", "gate_total_tok_s", "gate_per_request_tok_s"]
    assert names(cells["decode[1K-c4]"]) == [*ID_KEYS, "reason", *DECODE, *gate]
    props = dict(cells["decode[1K-c4]"].properties())
    assert props["gate_verdict"] == "regressed" and props["gate_total_tok_s"] == "regressed"


def test_failed_prefill_cell(cells):
    keys = [*ID_KEYS, "reason", "prompt_tok_s", "ttft_ms", "completed"]
    assert names(cells["prefill[1K]"]) == [*keys, "gate_verdict", "gate_prompt_tok_s"]


@pytest.mark.parametrize(
    ("cid", "status"),
    [
        ("decode[4K-c8]", "over capacity"),
        ("decode[8K-c1]", "exceeds max_model_len"),
        ("prefill[8K]", "exceeds max_model_len"),
    ],
)
def test_cells_not_run_by_the_arithmetic(cells, cid, status):
    record = cells[cid]
    assert names(record) == [*ID_KEYS, "reason"]
    assert dict(record.properties())["status"] == status


@pytest.mark.parametrize("status", [Status.ERROR, Status.NOT_RUN, Status.FAILED])
def test_cells_stopped_before_figures(status):
    record = CellRecord(CellId.parse("decode[2K-c4]"), status, 2048, reason="why")
    assert record.properties() == [
        ("phase", "decode"),
        ("context", "2K"),
        ("context_tokens", 2048),
        ("concurrency", 4),
        ("status", status.value),
        ("reason", "why"),
    ]
