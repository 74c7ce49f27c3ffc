"""The metric definitions of docs/metrics.md over recorded timestamps.

Every function here takes plain numbers (times from ``time.perf_counter()``, in seconds) and
returns plain numbers; units are in the names (``_s``, ``_ms``, ``tok_s``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from .intervals import (
    MIN_BATCH_S,
    MIN_BATCHES,
    BatchMeans,
    Drift,
    Interval,
    batch_counts,
    batch_means_of,
    in_flight,
    little_residual,
    median_interval,
    per_request_interval,
    start_batches,
    trend,
)


@dataclass(frozen=True)
class RequestTrace:
    """One request of a decode cell, as the statistics need it."""

    t_send: float
    t_end: float  # finished, failed or cancelled
    token_times: Sequence[float]  # arrival time of each token-carrying chunk
    token_counts: Sequence[int]  # tokens in each of those chunks
    finished: bool  # received its last token (completed normally)
    error: str | None = None


@dataclass(frozen=True)
class RequestBounds:
    """The bounds a single request is held to for goodput (docs/slo.md): its TTFT (ms) at
    most, its mean time between tokens (ms) at most, its in-window tok/s at least; None: no
    such bound."""

    ttft_ms: float | None = None
    tbt_ms: float | None = None
    tok_s: float | None = None


def goodput(traces: Sequence[RequestTrace], w0: float, w1: float, bounds: RequestBounds) -> float:
    """Output tok/s over the window [w0, w1) of the requests that met ``bounds``: a request's
    own TTFT, its own mean time between tokens (over all its tokens), its own in-window tok/s
    ((tokens − 1) / their span, as per-request tok/s; a request with fewer than two tokens in
    the window is judged on the rest). A request with no token in the window adds nothing."""
    measured = w1 - w0
    if measured <= 0:
        return 0.0
    good = 0
    for tr in traces:
        times = np.asarray(tr.token_times, dtype=np.float64)
        if not len(times):
            continue
        counts = np.asarray(tr.token_counts, dtype=np.int64)
        inside = (times >= w0) & (times < w1)
        n_in = int(counts[inside].sum())
        if n_in == 0:
            continue
        if bounds.ttft_ms is not None and (times[0] - tr.t_send) * 1e3 > bounds.ttft_ms:
            continue
        total = int(counts.sum())
        tbt = (times[-1] - times[0]) / (total - 1) * 1e3 if total >= 2 else 0.0
        if bounds.tbt_ms is not None and tbt > bounds.tbt_ms:
            continue
        if bounds.tok_s is not None and n_in >= 2:
            t_in = times[inside]
            span = t_in[-1] - t_in[0]
            if span > 0 and (n_in - 1) / span < bounds.tok_s:
                continue
        good += n_in
    return good / measured


@dataclass
class DecodeStats:
    """Figures of one sustained-decode window."""

    output_tokens: int
    total_tok_s: float
    per_request_tok_s: float | None
    ttft_ms: float | None
    ttft_p90_ms: float | None
    ttft_p99_ms: float | None
    tbt_ms: float | None
    tbt_p90_ms: float | None
    tbt_p99_ms: float | None
    avg_active: float
    completed: int
    measured_s: float
    requests: int
    errors: int
    per_second_tok: list[int] = field(default_factory=list)
    stability_cv: float | None = None  # coefficient of variation of per-second throughput
    ttft_samples_ms: list[float] = field(default_factory=list)
    tbt_samples_ms: list[float] = field(default_factory=list)
    per_request_samples: list[float] = field(default_factory=list)
    # uncertainty (docs/metrics.md, "Uncertainty")
    total_ci: Interval | None = None
    per_request_ci: Interval | None = None
    ttft_ci: Interval | None = None
    tbt_ci: Interval | None = None
    batches: BatchMeans | None = None
    drift: Drift | None = None
    little_residual: float | None = None
    #: the tokens a request in flight had received, on average over the window (time-weighted,
    #: each request over its overlap with the window): its context beyond the prompt
    mean_output_in_flight: float | None = None
    #: the samples each percentile above was taken over (requests with a first token; with a
    #: time between tokens)
    ttft_n: int = 0
    tbt_n: int = 0
    #: inter-token latency over every gap (docs/metrics.md, "Inter-token latency"): the time
    #: between a request's consecutive arrivals of output inside the window, over all requests
    itl: Latencies | None = None
    #: end-to-end latency of the requests that finished inside the window (send to last token)
    e2e: Latencies | None = None

    @property
    def precision(self) -> float | None:
        """Half-width of total tok/s's interval, as a fraction of it."""
        if self.total_ci is None or self.total_tok_s <= 0:
            return None
        return self.total_ci.half_width_rel(self.total_tok_s)


#: a percentile is given where its sample holds at least one value beyond it: p90 from 10
#: values, p99 from 100 (docs/metrics.md, "A percentile and its sample")
def least_for(q: float) -> int:
    """The fewest values a ``q``-th percentile is taken over: 100 / (100 − q)."""
    return int(np.ceil(100 / (100 - q) - 1e-9))


#: a gap of this many times the cell's median inter-token latency or more is a stall
STALL_FACTOR = 10.0


@dataclass(frozen=True)
class Latencies:
    """A latency's distribution over its samples (ms): median, p90 and p99 (None where the
    sample is too small for the rank: :func:`least_for`), the largest, the count, and how many
    reached :data:`STALL_FACTOR` × the median (for gaps)."""

    median_ms: float
    p90_ms: float | None
    p99_ms: float | None
    max_ms: float
    n: int
    stalls: int = 0

    @classmethod
    def of(cls, values_ms: np.ndarray, stalls: bool = False) -> Latencies | None:
        n = len(values_ms)
        if not n:
            return None
        p50, p90, p99 = (float(x) for x in np.percentile(values_ms, [50, 90, 99]))
        counted = int(np.count_nonzero(values_ms >= STALL_FACTOR * p50)) if stalls and p50 else 0
        return cls(
            median_ms=p50,
            p90_ms=p90 if n >= least_for(90) else None,
            p99_ms=p99 if n >= least_for(99) else None,
            max_ms=float(values_ms.max()),
            n=n,
            stalls=counted,
        )


def arrival_gaps_ms(times: np.ndarray, w0: float, w1: float) -> np.ndarray:
    """A request's gaps (ms) between consecutive arrivals of output whose later end lies in
    [w0, w1): chunks that came in one read are one arrival (their gap is no time the server
    took; the fast path keeps one time a read)."""
    if len(times) < 2:
        return np.empty(0)
    arrivals = times[np.concatenate(([True], np.diff(times) > 0))]
    later = arrivals[1:]
    gaps = np.diff(arrivals)
    keep = (later >= w0) & (later < w1)
    return gaps[keep] * 1e3


def _pct(values: Sequence[float], q: float) -> float | None:
    return float(np.percentile(values, q)) if len(values) else None


def window_tokens(tr: RequestTrace) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A request's chunks: arrival times, token counts, and when its tokens arrived before
    (the latest earlier arrival: chunks that came in one read share it; its first arrival is
    its own).

    Chunks read together are spread together, over the time since the stream's previous read:
    the live test of an early end (``protocol._LiveEvents``) sees each read as one arrival,
    and the window's interval must be the one that test computed on the same tokens."""
    t = np.asarray(tr.token_times, dtype=np.float64)
    first = np.searchsorted(t, t, side="left")  # the first chunk of each one's read
    starts = np.where(first > 0, t[np.maximum(first - 1, 0)], t)
    return t, np.asarray(tr.token_counts, dtype=np.float64), starts


def window_batches(
    traces: Sequence[RequestTrace], w0: float, w1: float, k: int, seen_before: float | None
) -> np.ndarray:
    """Tokens in each of ``k`` equal batches of [w0, w1), each chunk spread since its stream's
    previous read (:func:`~.intervals.batch_counts`), summed request by request (memory: one
    request's chunks at a time). ``seen_before``: only chunks that arrived before it."""
    tokens = np.zeros(k)
    for tr in traces:
        if not len(tr.token_times):
            continue
        times, counts, starts = window_tokens(tr)
        if seen_before is not None:
            seen = times < seen_before
            times, counts, starts = times[seen], counts[seen], starts[seen]
        tokens += batch_counts(times, counts, w0, w1, k, starts)
    return tokens


def decode_stats(
    traces: Sequence[RequestTrace],
    w0: float,
    w1: float,
    concurrency: int | None = None,
    full: float | None = None,
) -> DecodeStats:
    """Apply the sustained-decode definitions to the requests of a window [w0, w1), with the
    figures' intervals, the drift test and (given the concurrency) the Little's-law check.
    ``full``: the window's planned length when it ended early (``--llm-precision``): the
    throughput intervals are then those of the figures the full window would have measured."""
    measured = max(w1 - w0, 0.0)
    out_tokens = 0
    rates: list[float] = []
    weights: list[int] = []
    ttfts: list[float] = []
    tbts: list[float] = []
    gaps: list[np.ndarray] = []
    e2es: list[float] = []
    completed = 0
    errors = 0
    n_sec = max(int(np.ceil(measured - 1e-9)), 0)
    per_second = np.zeros(n_sec, dtype=np.int64)
    for tr in traces:
        if tr.error:
            errors += 1
        times = np.asarray(tr.token_times, dtype=np.float64)
        counts = np.asarray(tr.token_counts, dtype=np.int64)
        if len(times):
            if times[0] < w1:
                ttfts.append((times[0] - tr.t_send) * 1e3)
            total = int(counts.sum())
            if total >= 2 and times[-1] > times[0]:
                tbts.append((times[-1] - times[0]) / (total - 1) * 1e3)
            inside = (times >= w0) & (times < w1)
            if inside.any():
                t_in = times[inside]
                c_in = counts[inside]
                n_i = int(c_in.sum())
                out_tokens += n_i
                if n_sec:
                    sec = np.minimum((t_in - w0).astype(np.int64), n_sec - 1)
                    np.add.at(per_second, sec, c_in)
                if n_i >= 2 and t_in[-1] > t_in[0]:
                    rates.append((n_i - 1) / (t_in[-1] - t_in[0]))
                    weights.append(n_i)
            gaps.append(arrival_gaps_ms(times, w0, w1))
            if tr.finished and w0 <= times[-1] < w1:
                completed += 1
                e2es.append((times[-1] - tr.t_send) * 1e3)
    per_request = float(np.average(rates, weights=weights)) if rates else None
    cv = None
    n_full = int(measured + 1e-9)  # whole seconds: a last partial second is not a sample
    if n_full >= 3:
        whole = per_second[:n_full]
        mean = float(whole.mean())
        cv = float(whole.std(ddof=1) / mean) if mean > 0 else None
    total_tok_s = out_tokens / measured if measured > 0 else 0.0
    bm = None
    if measured >= MIN_BATCHES * MIN_BATCH_S:
        # ended early (``full``): the interval the early end's test computed
        # (protocol._LiveEvents), on the tokens that had arrived by then; later chunks would
        # spread some of their tokens back into the last batch
        k = start_batches(measured)
        tokens = window_batches(traces, w0, w1, k, w1 if full is not None else None)
        bm = batch_means_of(tokens, total_tok_s, measured, full)
    per_request_ci = None
    if bm is not None and per_request is not None:
        arrays = [
            (np.asarray(tr.token_times, dtype=np.float64), np.asarray(tr.token_counts))
            for tr in traces
            if len(tr.token_times)
        ]  # views of the records' arrays, not copies
        per_request_ci = per_request_interval(arrays, w0, w1, bm.batches, per_request, full)
    # requests in flight: each one's overlap of [t_send, t_end) with the window
    spans = [(tr.t_send, tr.t_end) for tr in traces]
    held = output_in_flight(traces, w0, w1)
    little = little_residual(spans, w0, w1, concurrency) if concurrency else None
    return DecodeStats(
        output_tokens=out_tokens,
        total_tok_s=total_tok_s,
        per_request_tok_s=per_request,
        ttft_ms=_median(ttfts),
        ttft_p90_ms=_pct(ttfts, 90),
        ttft_p99_ms=_pct(ttfts, 99),
        tbt_ms=_median(tbts),
        tbt_p90_ms=_pct(tbts, 90),
        tbt_p99_ms=_pct(tbts, 99),
        avg_active=in_flight(spans, w0, w1) or 0.0,
        completed=completed,
        measured_s=measured,
        requests=len(traces),
        errors=errors,
        per_second_tok=[int(x) for x in per_second],
        stability_cv=cv,
        ttft_samples_ms=[round(x, 3) for x in ttfts],
        tbt_samples_ms=[round(x, 4) for x in tbts],
        per_request_samples=[round(x, 3) for x in rates],
        total_ci=bm.interval if bm else None,
        per_request_ci=per_request_ci,
        ttft_ci=median_interval(ttfts),
        tbt_ci=median_interval(tbts),
        batches=bm,
        drift=trend(bm.fine_rates) if bm else None,
        little_residual=little,
        mean_output_in_flight=held,
        ttft_n=len(ttfts),
        tbt_n=len(tbts),
        itl=Latencies.of(np.concatenate(gaps) if gaps else np.empty(0), stalls=True),
        e2e=Latencies.of(np.asarray(e2es, dtype=np.float64)),
    )


def output_in_flight(traces: Sequence[RequestTrace], w0: float, w1: float) -> float | None:
    """The output tokens a request in flight had received, averaged over the window: the
    integral over [w0, w1) of each in-flight request's tokens so far, over the integral of
    the requests in flight (None: none in flight)."""
    tokens_time = 0.0
    flight_time = 0.0
    for tr in traces:
        a, b = max(tr.t_send, w0), min(tr.t_end, w1)
        if b <= a:
            continue
        flight_time += b - a
        if not len(tr.token_times):
            continue
        t = np.asarray(tr.token_times, dtype=np.float64)
        n = np.asarray(tr.token_counts, dtype=np.float64)
        before = t < b  # tokens that arrived while it was in flight in the window
        tokens_time += float(np.sum(n[before] * (b - np.maximum(t[before], a))))
    return tokens_time / flight_time if flight_time > 0 else None


def _median(values: Sequence[float]) -> float | None:
    return float(np.median(values)) if len(values) else None


def prompt_tok_s(prompt_tokens: int, ttft_s: float) -> float:
    """Prefill throughput: prompt tokens / TTFT."""
    return prompt_tokens / ttft_s if ttft_s > 0 else float("inf")
