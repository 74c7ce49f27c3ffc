"""Cell records from the protocol's results: the one place measurements become
:class:`~pytest_llmspeed.results.CellRecord` s (rounding included)."""

from __future__ import annotations

import numpy as np

from ..results import CellId, CellRecord, Samples, Status
from .bandwidth import MemoryModel, decode_bandwidth
from .conversation import ConversationResult, conversation_status
from .intervals import Interval, median_interval
from .openloop import OpenLoopResult, open_status
from .protocol import DecodeResult, PrefillResult
from .status import MAX_ERROR_RATE, cell_status


def _ci(interval: Interval | None, nd: int) -> tuple[float, float] | None:
    return None if interval is None else interval.as_pair(nd)


def _r(x: float | None, nd: int = 3) -> float | None:
    return None if x is None else round(x, nd)


def prefill_record(context: int | str, result: PrefillResult) -> CellRecord:
    """A valid prefill cell at ``context`` (as the user gave it: 8192 or "max")."""
    samples = result.samples_ms or (result.ttft_ms,)
    ttft_ci = median_interval(samples)  # from 6 repeats on
    prompt_ci = None
    if ttft_ci is not None and ttft_ci.low > 0:  # prompt tok/s falls as TTFT rises
        c = result.prompt_tokens * 1e3
        prompt_ci = (round(c / ttft_ci.high, 2), round(c / ttft_ci.low, 2))
    return CellRecord(
        id=CellId.prefill(context),
        status=Status.VALID,
        context_tokens=result.context,
        prompt_tok_s=round(result.prompt_tok_s, 2),
        ttft_ms=round(result.ttft_ms, 2),
        completed=len(samples),
        max_tokens=result.max_tokens,
        repeats=len(samples),
        samples=Samples(ttft_ms=tuple(round(x, 2) for x in samples)),
        ttft_ms_ci=_ci(ttft_ci, 2),
        prompt_tok_s_ci=prompt_ci,
        server=result.server,
    )


def decode_record(
    context: int | str,
    result: DecodeResult,
    max_error_rate: float = MAX_ERROR_RATE,
    memory: MemoryModel | None = None,
) -> CellRecord:
    """The decode cell at ``context``: its figures, and its status as
    :func:`~.status.cell_status` decides with ``max_error_rate`` (its reason in the core's
    words; the pytest layer words it with its options)."""
    status = cell_status(result, max_error_rate)
    s = result.stats
    bw = (
        decode_bandwidth(
            memory,
            result.server,
            context_tokens=result.context,
            running=s.avg_active,
            mean_output=s.mean_output_in_flight,
            per_request_tok_s=s.per_request_tok_s,
        )
        if memory is not None
        else None
    )
    return CellRecord(
        id=CellId.decode(context, result.concurrency),
        status=status.status,
        reason=status.message,
        context_tokens=result.context,
        total_tok_s=_r(s.total_tok_s, 2),
        per_request_tok_s=_r(s.per_request_tok_s, 2),
        ttft_ms=_r(s.ttft_ms, 2),
        ttft_p90_ms=_r(s.ttft_p90_ms, 2),
        ttft_p99_ms=_r(s.ttft_p99_ms, 2),
        tbt_ms=_r(s.tbt_ms, 4),
        tbt_p90_ms=_r(s.tbt_p90_ms, 4),
        tbt_p99_ms=_r(s.tbt_p99_ms, 4),
        ttft_n=s.ttft_n,
        tbt_n=s.tbt_n,
        itl_ms=_r(s.itl.median_ms, 4) if s.itl else None,
        itl_p90_ms=_r(s.itl.p90_ms, 4) if s.itl else None,
        itl_p99_ms=_r(s.itl.p99_ms, 4) if s.itl else None,
        itl_max_ms=_r(s.itl.max_ms, 4) if s.itl else None,
        itl_n=s.itl.n if s.itl else None,
        itl_stalls=s.itl.stalls if s.itl else None,
        e2e_ms=_r(s.e2e.median_ms, 2) if s.e2e else None,
        e2e_p90_ms=_r(s.e2e.p90_ms, 2) if s.e2e else None,
        e2e_p99_ms=_r(s.e2e.p99_ms, 2) if s.e2e else None,
        e2e_n=s.e2e.n if s.e2e else None,
        avg_active=_r(s.avg_active, 3),
        completed=s.completed,
        output_tokens=s.output_tokens,
        measured_s=_r(s.measured_s, 3),
        requests=s.requests,
        errors=sum(result.errors.values()),
        error_summary=dict(result.errors),
        early_stops=result.early_stops,
        wrong_prompt_lengths={str(k): v for k, v in result.wrong_lengths.items()},
        tokens=result.token_accounting,
        queued=result.queued,
        effective_concurrency=_r(result.mean_running, 2),
        max_waiting=result.max_waiting,
        stability_cv=_r(s.stability_cv, 4),
        per_second_tok=tuple(s.per_second_tok),
        received_tokens=result.received_tokens,
        received_chunks=result.received_chunks,
        # a counter that fell is no figure (the cell's reason says it fell)
        generation_tokens_delta=result.generation_tokens_delta
        if result.generation_tokens_delta is None or result.generation_tokens_delta >= 0
        else None,
        received_span=tuple(result.received_span) if result.received_span else None,  # type: ignore[arg-type]
        max_output=result.max_output,
        duration_s=result.duration_s,
        replica_tok_s=tuple(round(x, 2) for x in result.replica_tok_s)
        if result.replica_tok_s
        else None,
        flags=tuple(f for f in (result.token_flag, result.client_flag, *result.flags) if f),
        notes=result.notes,
        total_tok_s_ci=_ci(s.total_ci, 2),
        per_request_tok_s_ci=_ci(s.per_request_ci, 2),
        ttft_ms_ci=_ci(s.ttft_ci, 2),
        tbt_ms_ci=_ci(s.tbt_ci, 4),
        ci_method=s.total_ci.method if s.total_ci else None,
        drift=round(s.drift.change, 4) if s.drift and s.drift.flagged else None,
        little_residual=_r(s.little_residual, 4),
        goodput_tok_s=_r(result.goodput_tok_s, 2),
        client_processes=result.client_processes if result.client_processes > 1 else None,
        output_in_flight=_r(s.mean_output_in_flight, 1),
        read_gb_s=_r(bw.bytes_per_s / 1e9, 1) if bw else None,
        bandwidth_share=_r(bw.share, 4) if bw else None,
        bandwidth_from=bw.how if bw else None,
        answer_ttft_ms=_r(result.reasoning.answer_ttft_ms, 2) if result.reasoning else None,
        reasoning_tokens=result.reasoning.reasoning_tokens if result.reasoning else None,
        answer_tokens=result.reasoning.answer_tokens if result.reasoning else None,
        reasoning_from=result.reasoning.how if result.reasoning else None,
        tool_call_deltas=result.tool_call_deltas,
        precision=_r(s.precision, 4) if result.precision_goal is not None else None,
        window_end=(
            None
            if result.precision_goal is None
            else "precision"
            if result.ended_precise
            else "duration"
        ),
        samples=Samples(
            ttft_ms=tuple(s.ttft_samples_ms),
            tbt_ms=tuple(s.tbt_samples_ms),
            per_request_tok_s=tuple(s.per_request_samples),
        ),
        server=result.server,
    )


def open_record(
    cid: CellId,
    result: OpenLoopResult,
    max_error_rate: float = MAX_ERROR_RATE,
    context_tokens: int | None = None,
) -> CellRecord:
    """An open-loop cell (``rate[8K-r2]``, ``trace[NAME]``: docs/workloads.md): its figures,
    and its status as :func:`~.openloop.open_status` decides with ``max_error_rate``."""
    status = open_status(result, max_error_rate)
    f = result.figures

    def med(values: tuple[float, ...], nd: int = 2) -> float | None:
        return _r(float(np.median(values)), nd) if values else None

    def pct(values: tuple[float, ...], q: float) -> float | None:
        return _r(float(np.percentile(values, q)), 2) if values else None

    tok_s = f.output_tok_s
    return CellRecord(
        id=cid,
        status=status.status,
        reason=status.message,
        context_tokens=context_tokens,
        sched_ttft_ms=med(f.sched_ttft),
        sched_ttft_p90_ms=pct(f.sched_ttft, 90),
        sched_ttft_p99_ms=pct(f.sched_ttft, 99),
        sent_ttft_ms=med(f.sent_ttft),
        sched_e2e_ms=med(f.sched_e2e),
        sched_e2e_p90_ms=pct(f.sched_e2e, 90),
        sched_e2e_p99_ms=pct(f.sched_e2e, 99),
        sent_e2e_ms=med(f.sent_e2e),
        open_tbt_ms=med(f.tbt, 4),
        open_output_tok_s=_r(tok_s, 2),
        offered_rate=_r(f.offered_rate, 4),
        achieved_rate=_r(f.achieved_rate, 4),
        open_requests=f.requests,
        open_completed=f.completed,
        open_failed=f.failed,
        open_early_stops=f.early_stops,
        send_lag_p99_ms=_r(result.send_lag_p99_ms, 3),
        max_in_flight=f.max_in_flight,
        open_span_s=_r(f.span_s, 3),
        server_queue_ms=_r(result.server_queue_ms, 3),
        expected_hit_share=_r(result.expected_hit_share, 4),
        sched_ttft_ms_ci=_ci(result.sched_ttft_ci, 2),
        sched_e2e_ms_ci=_ci(result.sched_e2e_ci, 2),
        open_tbt_ms_ci=_ci(result.tbt_ci, 4),
        samples=Samples(
            ttft_ms=tuple(round(float(x), 3) for x in f.sched_ttft),
            tbt_ms=tuple(round(float(x), 4) for x in f.tbt),
        ),
        flags=result.flags,
        notes=result.notes,
        server=result.server,
    )


def conversation_record(
    cid: CellId,
    result: ConversationResult,
    max_error_rate: float = MAX_ERROR_RATE,
    context_tokens: int | None = None,
) -> CellRecord:
    """A conversation cell (``conversation[8K-u4-t3]``: docs/workloads.md, "Conversations"):
    its figures over turns 2 ... T and per turn, its status as
    :func:`~.conversation.conversation_status` decides with ``max_error_rate``."""
    status = conversation_status(result, max_error_rate)
    turns = result.turns

    def each(name: str, nd: int) -> tuple[float | None, ...]:
        return tuple(_r(t.median(name), nd) for t in turns)

    later = [v for t in turns if t.turn >= 2 for v in t.ttft_ms]
    return CellRecord(
        id=cid,
        status=status.status,
        reason=status.message,
        context_tokens=context_tokens,
        conv_ttft_ms=_r(result.conv_ttft_ms, 2),
        conv_hit_rate=_r(result.conv_hit_rate, 4),
        conv_expected_hit_share=_r(result.conv_expected_hit_share, 4),
        conv_turns=len(turns),
        conv_requests=sum(t.users for t in turns),
        conv_failed=sum(t.failed for t in turns),
        conv_early_stops=sum(t.early_stops for t in turns),
        turn_users=tuple(t.users for t in turns),
        turn_prompt_tokens=tuple(
            round(float(np.median(t.prompt_tokens))) if t.prompt_tokens else None for t in turns
        ),
        turn_ttft_ms=each("ttft_ms", 2),
        turn_new_prefill_tok_s=each("new_prefill_tok_s", 1),
        turn_output_tok_s=each("output_tok_s", 2),
        turn_hit_rate=tuple(_r(t.hit_rate, 4) for t in turns),
        turn_expected_hit_share=tuple(_r(t.expected_hit_share, 4) for t in turns),
        turn_expected_hit_share_answers=tuple(_r(t.expected_hit_share_answers, 4) for t in turns),
        conv_answers=result.answers,
        samples=Samples(ttft_ms=tuple(round(float(x), 3) for x in later)),
        notes=tuple(result.notes),
    )


def unmeasured_record(
    cid: CellId, status: Status, reason: str, tokens: int | None = None
) -> CellRecord:
    """A cell that was not measured (over capacity, too long, refused, error)."""
    return CellRecord(
        id=cid,
        status=status,
        reason=reason,
        context_tokens=tokens if tokens is not None and tokens > 0 else None,
    )
