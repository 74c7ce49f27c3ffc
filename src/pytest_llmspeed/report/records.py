"""Cell results as plain records (dicts of numbers and strings) shared by every report."""

from __future__ import annotations

from typing import Any

from ..matrix import context_label, display_label
from ..protocol import DecodeResult, PrefillResult

VALID = "valid"
OVER_CAPACITY = "over capacity"
TOO_LONG = "exceeds max_model_len"
FAILED = "failed"
ERROR = "error"
SKIPPED = "skipped"

#: figures attached to JUnit test cases (scalars only), in this order
PROPERTY_KEYS = (
    "phase", "context", "context_tokens", "concurrency", "status", "reason",
    "prompt_tok_s", "total_tok_s", "per_request_tok_s", "ttft_ms", "ttft_p90_ms", "ttft_p99_ms",
    "tbt_ms", "tbt_p90_ms", "tbt_p99_ms", "avg_active", "completed", "output_tokens",
    "measured_s", "requests", "errors", "early_stops", "tokens", "queued",
    "effective_concurrency", "stability_cv",
)  # fmt: skip


def cell_name(phase: str, context: int | str, concurrency: int | None = None) -> str:
    label = context_label(context)
    return f"prefill[{label}]" if phase == "prefill" else f"decode[{label}-c{concurrency}]"


def prefill_record(param: int | str, result: PrefillResult) -> dict[str, Any]:
    samples = result.samples_ms or (result.ttft_ms,)
    return {
        "id": cell_name("prefill", param),
        "phase": "prefill",
        "context": context_label(param),
        "context_tokens": result.context,
        "context_display": display_label(result.context),
        "concurrency": 1,
        "status": VALID,
        "prompt_tok_s": round(result.prompt_tok_s, 2),
        "ttft_ms": round(result.ttft_ms, 2),
        "completed": len(samples),
        "max_tokens": result.max_tokens,
        "repeats": len(samples),
        "samples": {"ttft_ms": [round(x, 2) for x in samples]},
    }


def _r(x: float | None, nd: int = 3) -> float | None:
    return None if x is None else round(x, nd)


def decode_record(param: int | str, result: DecodeResult) -> dict[str, Any]:
    s = result.stats
    return {
        "id": cell_name("decode", param, result.concurrency),
        "phase": "decode",
        "context": context_label(param),
        "context_tokens": result.context,
        "context_display": display_label(result.context),
        "concurrency": result.concurrency,
        "status": VALID,
        "total_tok_s": _r(s.total_tok_s, 2),
        "per_request_tok_s": _r(s.per_request_tok_s, 2),
        "ttft_ms": _r(s.ttft_ms, 2),
        "ttft_p90_ms": _r(s.ttft_p90_ms, 2),
        "ttft_p99_ms": _r(s.ttft_p99_ms, 2),
        "tbt_ms": _r(s.tbt_ms, 4),
        "tbt_p90_ms": _r(s.tbt_p90_ms, 4),
        "tbt_p99_ms": _r(s.tbt_p99_ms, 4),
        "avg_active": _r(s.avg_active, 3),
        "completed": s.completed,
        "output_tokens": s.output_tokens,
        "measured_s": _r(s.measured_s, 3),
        "requests": s.requests,
        "errors": sum(result.errors.values()),
        "error_summary": result.errors,
        "early_stops": result.early_stops,
        "wrong_prompt_lengths": {str(k): v for k, v in result.wrong_lengths.items()},
        "tokens": result.token_accounting,
        "queued": result.queued,
        "effective_concurrency": _r(result.mean_running, 2),
        "max_waiting": result.max_waiting,
        "stability_cv": _r(s.stability_cv, 4),
        "per_second_tok": s.per_second_tok,
        "received_tokens": result.received_tokens,
        "received_chunks": result.received_chunks,
        "generation_tokens_delta": result.generation_tokens_delta,
        "received_span": list(result.received_span) if result.received_span else None,
        "max_output": result.max_output,
        "duration_s": result.duration_s,
        "samples": {
            "ttft_ms": s.ttft_samples_ms,
            "tbt_ms": s.tbt_samples_ms,
            "per_request_tok_s": s.per_request_samples,
        },
    }


def skipped_record(
    phase: str,
    param: int | str,
    concurrency: int | None,
    status: str,
    reason: str,
    tokens: int | None = None,
) -> dict[str, Any]:
    record = {
        "id": cell_name(phase, param, concurrency),
        "phase": phase,
        "context": context_label(param),
        "concurrency": concurrency if concurrency is not None else 1,
        "status": status,
        "reason": reason,
    }
    if tokens is not None and tokens > 0:
        record["context_tokens"] = tokens
        record["context_display"] = display_label(tokens)
    return record


def properties(record: dict[str, Any]) -> list[tuple[str, Any]]:
    """The record's scalar figures as JUnit ``user_properties``."""
    return [
        (key, record[key])
        for key in PROPERTY_KEYS
        if key in record and record[key] is not None and not isinstance(record[key], list | dict)
    ]
