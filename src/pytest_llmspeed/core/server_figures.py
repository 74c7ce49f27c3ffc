"""The server's own figures over a cell's window: what its ``/metrics`` says happened.

Pure: Prometheus text in, typed figures out (docs/metrics.md, "Server figures and why a cell
changed"). The caller reads ``/metrics`` at the window's open, at its close and at the polls
between, each with the time it was read (any one clock)::

    open_ = snapshot(text_at_open, t_open)
    polls = [snapshot(text, t, families=GAUGE_FAMILIES) for t, text in poll_texts]
    close = snapshot(text_at_close, t_close)
    figures = window_figures(open_, close, polls)   # ServerFigures; None = not exposed

Several replicas: ``combine`` their snapshots of one moment first (counters and histograms
summed; gauges summed or averaged as ``SERIES`` says for each).

``SERIES`` is the one table of the names each figure comes from: vLLM 0.32's, checked in its
source (``vllm/v1/metrics/loggers.py``, ``vllm/v1/spec_decode/metrics.py``) and in the
/metrics of the CPU build (``tests/data/metrics/``); SGLang's where it has an equivalent, each
marked with where it was checked.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from prometheus_client.parser import text_string_to_metric_families

from ..results import ServerFigures

__all__ = [
    "ALL_FAMILIES",
    "FIGURE_SOURCES",
    "GAUGE_FAMILIES",
    "SERIES",
    "SPECULATIVE",
    "Series",
    "ServerFigures",
    "ServerSnapshot",
    "combine",
    "invalidated",
    "only_families",
    "refused_note",
    "snapshot",
    "snapshot_from_samples",
    "went_back",
    "window_figures",
]

Kind = Literal["counter", "gauge", "histogram"]
Samples = Mapping[str, Sequence[tuple[Mapping[str, str], float]]]

#: SGLang names as they are in sgl-project/sglang python/sglang/srt/metrics/collector.py at
#: commit 93d04878cfb9b08645fae7b11bd340ee33b34acf (the version the code search holds)
_SGLANG_CHECKED = "sglang collector.py @93d0487"
#: seen only in a third party's annotated copy of a newer collector.py, not in sgl-project's
#: own repository: unverified
_SGLANG_UNVERIFIED = "sglang: seen in a copy of a newer collector.py only, unverified"


@dataclass(frozen=True)
class Series:
    """One server series a figure is computed from."""

    key: str  # the snapshot's key
    kind: Kind  # counter and histogram: window deltas; gauge: over the polls
    vllm: str | None  # the family name (a counter's without `_total`), None: vLLM has none
    sglang: str | None
    by: str | None = None  # a label whose values are kept apart ("position", "source", ...)
    # several label sets (vLLM's engine="0","1", SGLang's dp_rank) and several replicas:
    # "sum" (counters, histograms, request counts) or "mean" (a fraction of each one's cache)
    replicas: Literal["sum", "mean"] = "sum"
    sglang_checked: str = ""  # where the SGLang name was checked ("" when there is none)


#: The one table: every server series the figures read, with vLLM's and SGLang's names.
#: Counters here are named as prometheus_client's parser names their families (vLLM writes
#: ``vllm:num_preemptions_total``; the family is ``vllm:num_preemptions``). Histograms give
#: their ``_sum`` and ``_count`` (vLLM's step histogram is *named* ``…_total``: its samples are
#: ``vllm:iteration_tokens_total_sum`` / ``_count``).
SERIES: tuple[Series, ...] = (
    # speculative decoding (vLLM: only when the server runs with a speculative config)
    Series("spec_drafts", "counter", "vllm:spec_decode_num_drafts", None),
    Series("spec_draft_tokens", "counter", "vllm:spec_decode_num_draft_tokens", None),
    Series("spec_accepted_tokens", "counter", "vllm:spec_decode_num_accepted_tokens", None),
    Series(
        "spec_accepted_per_position",
        "counter",
        "vllm:spec_decode_num_accepted_tokens_per_pos",
        None,
        by="position",
    ),
    # SGLang publishes no draft counters, only its own mean acceptance length per logged batch
    # (a gauge: "accepted drafts + bonus token per forward")
    Series(
        "spec_accept_length_gauge",
        "gauge",
        None,
        "sglang:spec_accept_length",
        replicas="mean",
        sglang_checked=_SGLANG_CHECKED,
    ),
    # engine steps: one observation per step, of the tokens it computed (prefill + generated);
    # SGLang has no step histogram
    Series("step_tokens", "histogram", "vllm:iteration_tokens_total", None),
    Series(
        "generation_tokens",
        "counter",
        "vllm:generation_tokens",
        "sglang:generation_tokens",
        sglang_checked=_SGLANG_CHECKED,  # SGLang counts a request's tokens when it finishes
    ),
    Series(
        "prompt_tokens",
        "counter",
        "vllm:prompt_tokens",
        "sglang:prompt_tokens",
        sglang_checked=_SGLANG_CHECKED,
    ),
    # prefix cache: vLLM's by-source counter (local_compute, local_cache_hit,
    # external_kv_transfer) counts each prompt once when its prefill ends; the plain
    # queries/hits counters count again when a preempted request is recomputed (vLLM #25780)
    Series("prompt_tokens_by_source", "counter", "vllm:prompt_tokens_by_source", None, by="source"),
    Series(
        "prefix_cache_queries",
        "counter",
        "vllm:prefix_cache_queries",
        "sglang:prompt_tokens",
        sglang_checked=_SGLANG_CHECKED,
    ),
    Series(
        "prefix_cache_hits",
        "counter",
        "vllm:prefix_cache_hits",
        "sglang:cached_tokens",
        sglang_checked=_SGLANG_CHECKED,
    ),
    # scheduler
    Series(
        "preemptions",
        "counter",
        "vllm:num_preemptions",
        "sglang:num_retracted_requests",  # the counter; the older gauge num_retracted_reqs
        sglang_checked=_SGLANG_UNVERIFIED,
    ),
    Series(
        "queue_time",
        "histogram",
        "vllm:request_queue_time_seconds",
        "sglang:queue_time_seconds",
        sglang_checked=_SGLANG_CHECKED,
    ),
    Series("prefill_time", "histogram", "vllm:request_prefill_time_seconds", None),
    Series("decode_time", "histogram", "vllm:request_decode_time_seconds", None),
    # SGLang: one series per dp_rank (summed); that only tensor-parallel rank 0 reports is
    # assumed, not checked
    Series(
        "running",
        "gauge",
        "vllm:num_requests_running",
        "sglang:num_running_reqs",
        sglang_checked=_SGLANG_CHECKED,
    ),
    Series(
        "waiting",
        "gauge",
        "vllm:num_requests_waiting",
        "sglang:num_queue_reqs",
        sglang_checked=_SGLANG_CHECKED,
    ),
    # reasons "capacity" (no room to schedule) and "deferred" (LoRA budget, KV transfer, ...)
    Series("waiting_by_reason", "gauge", "vllm:num_requests_waiting_by_reason", None, by="reason"),
    # memory traffic, only with --enable-mfu-metrics (vLLM and SGLang); vLLM's CPU build reads 0
    Series(
        "read_bytes",
        "counter",
        "vllm:estimated_read_bytes_per_gpu",
        "sglang:estimated_read_bytes_per_gpu",
        sglang_checked=_SGLANG_UNVERIFIED,
    ),
    Series(
        "kv_usage",
        "gauge",
        "vllm:kv_cache_usage_perc",  # a fraction: 1 = full, despite the name
        "sglang:token_usage",
        replicas="mean",
        sglang_checked=_SGLANG_CHECKED,
    ),
)

_BY_KEY = {s.key: s for s in SERIES}

#: the figures of ``ServerFigures`` and the series each needs at both ends of the window
FIGURE_SOURCES: dict[str, tuple[str, ...]] = {
    "spec_drafts": ("spec_drafts",),
    "spec_draft_tokens": ("spec_draft_tokens",),
    "spec_accepted_tokens": ("spec_accepted_tokens",),
    "spec_accepted_per_position": ("spec_accepted_per_position",),
    "acceptance_length": ("spec_drafts", "spec_accepted_tokens"),  # or SGLang's gauge
    "acceptance_rate": ("spec_draft_tokens", "spec_accepted_tokens"),
    "steps": ("step_tokens",),
    "steps_per_s": ("step_tokens",),
    "step_tokens": ("step_tokens",),
    "tokens_per_step": ("step_tokens",),
    "generation_tokens": ("generation_tokens",),
    "output_tokens_per_step": ("generation_tokens", "step_tokens"),
    "prompt_tokens": ("prompt_tokens",),
    "running_mean": ("running",),
    "running_max": ("running",),
    "waiting_mean": ("waiting",),
    "waiting_max": ("waiting",),
    "waiting_by_reason": ("waiting_by_reason",),
    "prefix_cache_queries": ("prefix_cache_queries",),  # or prompt_tokens_by_source
    "prefix_cache_hits": ("prefix_cache_hits",),
    "prefix_cache_hit_rate": ("prefix_cache_queries", "prefix_cache_hits"),
    "preemptions": ("preemptions",),
    "requests": ("queue_time",),
    "queue_time_mean_s": ("queue_time",),
    "prefill_time_mean_s": ("prefill_time",),
    "decode_time_mean_s": ("decode_time",),
    "kv_usage_mean": ("kv_usage",),
    "kv_usage_max": ("kv_usage",),
    "read_bytes_per_s": ("read_bytes",),
}

#: the figures of speculative decoding, in ``FIGURE_SOURCES`` order (those read from its series):
#: all absent means the server runs without it, which is no news
SPECULATIVE: tuple[str, ...] = tuple(
    k for k, sources in FIGURE_SOURCES.items() if sources[0].startswith("spec_")
)


def _families(series: Iterable[Series]) -> frozenset[str]:
    return frozenset(n for s in series for n in (s.vllm, s.sglang) if n is not None)


#: every family the figures read (the window's open and close)
ALL_FAMILIES = _families(SERIES)
#: the gauges only (the polls inside the window: a cheaper parse)
GAUGE_FAMILIES = _families(s for s in SERIES if s.kind == "gauge")

_SUFFIXES = ("_total", "_created", "_count", "_sum")

#: the most lines of a /metrics text parsed: the whole text (the probe's read), and the lines
#: of the families read (every other read). prometheus_client takes ~1 KB and ~25 µs a sample:
#: a 13 MB /metrics of 200,000 series in a family read (under its 16 MiB cap) took the client
#: to 358 MB and past its run's bound. vLLM's whole text is ~1,000 lines an engine.
MAX_METRICS_LINES = 50_000
MAX_FAMILY_LINES = 20_000


class MetricsTooLarge(ValueError):
    """A /metrics text of more lines than are parsed (a ValueError: "does not parse")."""


def check_lines(text: str, limit: int) -> None:
    """MetricsTooLarge when ``text`` has more than ``limit`` lines."""
    lines = text.count("\n")
    if lines > limit:
        raise MetricsTooLarge(f"{lines:,} lines, more than the {limit:,} read")


def only_families(text: str, families: frozenset[str]) -> str:
    """The lines of Prometheus text that belong to ``families``: their samples (histograms'
    ``_sum``, ``_count`` and ``_created``, never their buckets) and # HELP / # TYPE lines.
    vLLM's /metrics is ~50 KB, most of it buckets; the parse is of what is kept."""
    keep = []
    for line in text.splitlines():
        if line.startswith("#"):
            parts = line.split(None, 3)
            if len(parts) >= 3 and _belongs(parts[2], families):
                keep.append(line)
            continue
        if _belongs(line.split("{", 1)[0].split(" ", 1)[0], families):
            keep.append(line)
    return "\n".join(keep) + "\n"


def _belongs(name: str, families: frozenset[str]) -> bool:
    return name in families or any(
        name.endswith(suffix) and name[: -len(suffix)] in families for suffix in _SUFFIXES
    )


@dataclass(frozen=True)
class ServerSnapshot:
    """The series of ``SERIES`` read from one ``/metrics`` (or several replicas' at once).

    ``values[key]`` maps a label value (``by`` series), ``""`` (a plain counter or gauge) or
    ``"sum"`` / ``"count"`` (a histogram) to its value, summed over the other labels (engines);
    a ``"mean"`` gauge holds the sum, and ``parts[key]`` how many label sets it summed. A key
    absent: the server does not expose that series. ``created[key]``: the latest ``_created``
    time of a counter or histogram, which changes when the server restarts."""

    t: float  # when it was read, in seconds of the caller's clock
    engine: str | None  # "vllm", "sglang", None (neither's names)
    values: Mapping[str, Mapping[str, float]]
    parts: Mapping[str, int]
    created: Mapping[str, float]
    replicas: int = 1
    #: series whose values are not figures (NaN, infinite, negative): key → the sample and
    #: its value in words; absent from ``values`` (not exposed for the cell)
    refused: Mapping[str, str] = field(default_factory=dict)

    def total(self, key: str, part: str = "") -> float | None:
        got = self.values.get(key)
        if got is None or part not in got:
            return None
        return got[part]

    def gauge(self, key: str) -> float | None:
        """A gauge's value as ``SERIES`` combines it (a sum, or the mean of its parts)."""
        value = self.total(key)
        if value is None or _BY_KEY[key].replicas == "sum":
            return value
        return value / max(self.parts.get(key, 1), 1)


def snapshot(text: str, t: float, families: frozenset[str] = ALL_FAMILIES) -> ServerSnapshot:
    """One ``/metrics`` text read at ``t``, parsed with prometheus_client (only ``families``:
    ``GAUGE_FAMILIES`` for a poll inside the window)."""
    samples: dict[str, list[tuple[Mapping[str, str], float]]] = {}
    kept = only_families(text, families)
    check_lines(kept, MAX_FAMILY_LINES)
    for family in text_string_to_metric_families(kept):
        for sample in family.samples:
            samples.setdefault(sample.name, []).append((dict(sample.labels), float(sample.value)))
    return snapshot_from_samples(samples, t)


def _sample_names(series: Series, family: str) -> tuple[tuple[str, str], ...]:
    """(part, sample name) pairs of one family."""
    if series.kind == "counter":
        return (("", f"{family}_total"),)
    if series.kind == "histogram":
        return (("sum", f"{family}_sum"), ("count", f"{family}_count"))
    return (("", family),)


def snapshot_from_samples(samples: Samples, t: float) -> ServerSnapshot:
    """A snapshot from parsed samples ({sample name: [(labels, value), ...]})."""
    values: dict[str, dict[str, float]] = {}
    parts: dict[str, int] = {}
    created: dict[str, float] = {}
    refused: dict[str, str] = {}
    engines: set[str] = set()
    for series in SERIES:
        for names, family in (("vllm", series.vllm), ("sglang", series.sglang)):
            if family is None:
                continue
            got: dict[str, float] = {}
            count = 0
            bad: str | None = None
            for part, name in _sample_names(series, family):
                rows = samples.get(name)
                if not rows:
                    continue
                for labels, value in rows:
                    if not _a_count(value):
                        bad = bad or f"{name} {_words(value)}"
                    slot = labels.get(series.by, "") if series.by else part
                    got[slot] = got.get(slot, 0.0) + value
                if part in ("", "count"):
                    count = len(rows)
            if not got:
                continue
            if bad is not None:
                # NaN, infinite or negative: not a count, the series is not exposed here
                refused[series.key] = bad
                engines.add(names)
                break
            values[series.key] = got
            parts[series.key] = count
            stamps = [v for _, v in samples.get(f"{family}_created", ())]
            if stamps:
                created[series.key] = max(stamps)
            engines.add(names)
            break  # vLLM's name first; SGLang's only when vLLM's is absent
    engine = "vllm" if "vllm" in engines else ("sglang" if engines else None)
    return ServerSnapshot(
        t=t, engine=engine, values=values, parts=parts, created=created, refused=refused
    )


def _a_count(value: float) -> bool:
    """A counter's or a gauge's value that is a figure: finite and not negative."""
    return math.isfinite(value) and value >= 0


def _words(value: float) -> str:
    if math.isnan(value):
        return "is NaN"
    if math.isinf(value):
        return "is infinite" if value > 0 else "is −infinite"
    return f"is {value:g}".replace("-", "−")


def combine(snapshots: Sequence[ServerSnapshot]) -> ServerSnapshot:
    """Several replicas' snapshots of one moment as one server's: every series summed (a
    ``"mean"`` gauge's parts too, so it stays the mean over all engines); a series only some
    replicas expose is absent (a sum over some replicas is not the server's); the time is
    the mean of their times, ``created`` the latest."""
    if not snapshots:
        raise ValueError("combine needs at least one snapshot")
    if len(snapshots) == 1:
        return snapshots[0]
    keys = set(snapshots[0].values)
    for snap in snapshots[1:]:
        keys &= set(snap.values)
    values: dict[str, dict[str, float]] = {}
    for key in keys:
        merged: dict[str, float] = {}
        for snap in snapshots:
            for part, value in snap.values[key].items():
                merged[part] = merged.get(part, 0.0) + value
        values[key] = merged
    parts = {k: sum(s.parts.get(k, 0) for s in snapshots) for k in keys}
    created = {
        k: max(s.created[k] for s in snapshots if k in s.created)
        for k in keys
        if any(k in s.created for s in snapshots)
    }
    engines = {s.engine for s in snapshots if s.engine is not None}
    refused: dict[str, str] = {}
    for snap in snapshots:
        for key, words in snap.refused.items():
            refused.setdefault(key, words)
    return ServerSnapshot(
        t=sum(s.t for s in snapshots) / len(snapshots),
        engine=sorted(engines)[0] if engines else None,
        values=values,
        parts=parts,
        created=created,
        replicas=sum(s.replicas for s in snapshots),
        refused=refused,
    )


def _delta(
    key: str, part: str, open_: ServerSnapshot, close: ServerSnapshot, reset: set[str]
) -> float | None:
    """A counter's rise over the window; None when absent at either end or when it went
    back (its ``_created`` changed, or it fell): ``key`` is then added to ``reset``."""
    a, b = open_.total(key, part), close.total(key, part)
    if a is None or b is None or key in reset:
        return None
    ca, cb = open_.created.get(key), close.created.get(key)
    if b < a or (ca is not None and cb is not None and ca != cb):
        reset.add(key)
        return None
    return b - a


def _gauge_path(
    key: str, reads: Sequence[ServerSnapshot], part: str | None = None
) -> tuple[float, float] | None:
    """(time-weighted mean, max) of a gauge over the reads that have it, in time order."""
    points: list[tuple[float, float]] = []
    for snap in reads:
        value = snap.gauge(key) if part is None else snap.total(key, part)
        if value is not None:
            points.append((snap.t, value))
    if not points:
        return None
    points.sort(key=lambda p: p[0])
    peak = max(v for _, v in points)
    span = points[-1][0] - points[0][0]
    if span <= 0:
        return sum(v for _, v in points) / len(points), peak
    area = sum((t1 - t0) * (v0 + v1) / 2 for (t0, v0), (t1, v1) in itertools.pairwise(points))
    return area / span, peak


def _int(x: float | None) -> int | None:
    return None if x is None or not math.isfinite(x) else round(x)


def _ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or b <= 0:
        return None
    ratio = a / b
    return ratio if math.isfinite(ratio) else None


def window_figures(
    open_: ServerSnapshot, close: ServerSnapshot, polls: Sequence[ServerSnapshot] = ()
) -> ServerFigures:
    """The server's figures over the window from its ``open_`` and ``close`` snapshots (every
    series) and the ``polls`` read between (gauges; any series they carry is ignored but
    gauges, and the counters they carry, checked for a fall). Absent series give None and are
    listed in ``missing``; so do series refused at any read (NaN, infinite, negative: not
    exposed for the cell); a counter that went back (at the close, or between two reads)
    gives None and is listed in ``reset``."""
    refused = {k for snap in (open_, *polls, close) for k in snap.refused}
    if refused:
        open_, close = _without(open_, refused), _without(close, refused)
        polls = [_without(p, refused) for p in polls]
    duration = close.t - open_.t
    reset: set[str] = set(fell_between(open_, polls, close))

    def delta(key: str, part: str = "") -> float | None:
        return _delta(key, part, open_, close, reset)

    # speculative decoding
    drafts = delta("spec_drafts")
    draft_tokens = delta("spec_draft_tokens")
    accepted = delta("spec_accepted_tokens")
    per_pos: tuple[int, ...] | None = None
    pos_open, pos_close = (
        open_.values.get("spec_accepted_per_position"),
        close.values.get("spec_accepted_per_position"),
    )
    if pos_open is not None and pos_close is not None:
        positions = sorted(set(pos_open) & set(pos_close), key=lambda p: (len(p), p))
        got = [delta("spec_accepted_per_position", p) for p in positions]
        if positions and all(g is not None for g in got):
            per_pos = tuple(round(g) for g in got if g is not None)
    acceptance_length = (
        None if drafts is None or accepted is None or drafts <= 0 else (1 + accepted / drafts)
    )
    reads = [open_, *polls, close]
    if acceptance_length is None and drafts is None:
        sg = _gauge_path("spec_accept_length_gauge", reads)
        acceptance_length = sg[0] if sg is not None and sg[0] > 0 else None
    acceptance_rate = _ratio(accepted, draft_tokens)

    # engine steps
    steps = delta("step_tokens", "count")
    step_tokens = delta("step_tokens", "sum")
    generation = delta("generation_tokens")
    prompt = delta("prompt_tokens")

    # scheduler
    running = _gauge_path("running", reads)
    waiting = _gauge_path("waiting", reads)
    by_reason: tuple[tuple[str, float, float], ...] | None = None
    reasons = open_.values.get("waiting_by_reason")
    if reasons is not None and close.values.get("waiting_by_reason") is not None:
        rows = []
        for reason in sorted(reasons):
            path = _gauge_path("waiting_by_reason", reads, part=reason)
            if path is not None:
                rows.append((reason, path[0], path[1]))
        by_reason = tuple(rows)
    queue_n, queue_s = delta("queue_time", "count"), delta("queue_time", "sum")
    prefill_n, prefill_s = delta("prefill_time", "count"), delta("prefill_time", "sum")
    decode_n, decode_s = delta("decode_time", "count"), delta("decode_time", "sum")

    # prefix cache: by source where given (vLLM #25780), else the plain counters
    queries: float | None = None
    hits: float | None = None
    counter: str | None = None
    sources = open_.values.get("prompt_tokens_by_source")
    if sources is not None and close.values.get("prompt_tokens_by_source") is not None:
        parts = {s: delta("prompt_tokens_by_source", s) for s in sorted(sources)}
        if parts and all(v is not None for v in parts.values()):
            queries = sum(v for v in parts.values() if v is not None)
            hits = sum(v for s, v in parts.items() if v is not None and s != "local_compute")
            counter = "by source"
    if counter is None:
        queries, hits = delta("prefix_cache_queries"), delta("prefix_cache_hits")
        if queries is not None and hits is not None:
            counter = "queries/hits"
    kv = _gauge_path("kv_usage", reads)
    # bytes read per GPU: the replicas' counters summed, over the replicas; a counter that
    # stays at 0 while steps ran (vLLM's CPU build) counts nothing: not known
    read = delta("read_bytes")
    if read is not None and (read <= 0 or duration <= 0):
        read = None

    figures = ServerFigures(
        duration_s=duration,
        spec_drafts=_int(drafts),
        spec_draft_tokens=_int(draft_tokens),
        spec_accepted_tokens=_int(accepted),
        spec_accepted_per_position=per_pos,
        acceptance_length=acceptance_length,
        acceptance_rate=acceptance_rate,
        steps=_int(steps),
        steps_per_s=None if steps is None or duration <= 0 else steps / duration,
        step_tokens=_int(step_tokens),
        tokens_per_step=_ratio(step_tokens, steps),
        generation_tokens=_int(generation),
        output_tokens_per_step=_ratio(generation, steps),
        prompt_tokens=_int(prompt),
        running_mean=None if running is None else running[0],
        running_max=None if running is None else running[1],
        waiting_mean=None if waiting is None else waiting[0],
        waiting_max=None if waiting is None else waiting[1],
        waiting_by_reason=by_reason,
        preemptions=_int(delta("preemptions")),
        requests=_int(queue_n),
        queue_time_mean_s=_ratio(queue_s, queue_n),
        prefill_time_mean_s=_ratio(prefill_s, prefill_n),
        decode_time_mean_s=_ratio(decode_s, decode_n),
        prefix_cache_queries=_int(queries),
        prefix_cache_hits=_int(hits),
        prefix_cache_hit_rate=_ratio(hits, queries),
        prefix_cache_counter=counter,
        kv_usage_mean=None if kv is None else kv[0],
        kv_usage_max=None if kv is None else kv[1],
        read_bytes_per_s=None if read is None else read / duration / max(close.replicas, 1),
    )
    return _with_reasons(figures, open_, close, reset)


def _exposed(key: str, open_: ServerSnapshot, close: ServerSnapshot) -> bool:
    return key in open_.values and key in close.values


def _with_reasons(
    figures: ServerFigures, open_: ServerSnapshot, close: ServerSnapshot, reset: set[str]
) -> ServerFigures:
    missing, went_back = [], []
    for name, sources in FIGURE_SOURCES.items():
        if getattr(figures, name) is not None:
            continue
        if name == "acceptance_length" and _exposed("spec_accept_length_gauge", open_, close):
            continue  # SGLang's gauge is there (it read 0: no drafts in the window)
        if name in ("prefix_cache_queries", "prefix_cache_hits", "prefix_cache_hit_rate") and (
            _exposed("prompt_tokens_by_source", open_, close)
            and "prompt_tokens_by_source" not in reset
        ):
            continue  # known from the by-source counter (a rate of 0 queries is None)
        if any(s in reset for s in sources):
            went_back.append(name)
        elif not all(_exposed(s, open_, close) for s in sources):
            missing.append(name)
    return dataclasses.replace(figures, missing=tuple(missing), reset=tuple(went_back))


def _without(snap: ServerSnapshot, keys: set[str]) -> ServerSnapshot:
    """``snap`` without the series ``keys`` (refused at some read of the cell)."""
    if not keys & set(snap.values):
        return snap
    return dataclasses.replace(
        snap,
        values={k: v for k, v in snap.values.items() if k not in keys},
        parts={k: v for k, v in snap.parts.items() if k not in keys},
        created={k: v for k, v in snap.created.items() if k not in keys},
    )


def _counters(snap: ServerSnapshot) -> Iterable[tuple[str, str, float]]:
    for key, parts in snap.values.items():
        if _BY_KEY[key].kind != "gauge":
            for part, value in parts.items():
                yield key, part, value


def fell_between(
    open_: ServerSnapshot, polls: Sequence[ServerSnapshot], close: ServerSnapshot
) -> dict[str, str]:
    """The counters (and histograms) that went back between two of the window's reads, in
    time order (a poll carries the referee's counters): key → what was seen, in words
    (``vllm:generation_tokens_total fell from 1,200 to 40``); its ``_created`` changed too."""
    reads = sorted([open_, *polls, close], key=lambda s: s.t)
    found: dict[str, str] = {}
    last: dict[tuple[str, str], float] = {}
    stamp: dict[str, float] = {}
    for snap in reads:
        for key, part, value in _counters(snap):
            before = last.get((key, part))
            if before is not None and value < before and key not in found:
                found[key] = (
                    f"{_name(key, snap.engine, part)} fell from {before:,.0f} to {value:,.0f}"
                )
            last[key, part] = value
        for key, made in snap.created.items():
            if key in stamp and made != stamp[key] and key not in found:
                found[key] = f"{_name(key, snap.engine)} was created again (a restart)"
            stamp[key] = made
    return found


def _name(key: str, engine: str | None, part: str = "") -> str:
    """A series' sample name as the server writes it."""
    series = _BY_KEY[key]
    family = (series.sglang if engine == "sglang" else series.vllm) or series.vllm or series.sglang
    if series.kind == "counter":
        return f"{family}_total"
    if series.kind == "histogram":
        return f"{family}_{part or 'count'}"
    return str(family)


def went_back(
    open_: ServerSnapshot, polls: Sequence[ServerSnapshot], close: ServerSnapshot
) -> str | None:
    """In words, the counters that went back inside the window, or None."""
    found = fell_between(open_, polls, close)
    return "; ".join(found.values()) if found else None


def refused_note(reads: Iterable[ServerSnapshot]) -> str | None:
    """In words, the series refused at any read of a cell (NaN, infinite, negative), or None."""
    seen: dict[str, str] = {}
    for snap in reads:
        for key, words in snap.refused.items():
            seen.setdefault(key, words)
    return "; ".join(seen.values()) if seen else None


def invalidated(figures: ServerFigures) -> ServerFigures:
    """A cell's server figures when a counter went back inside its window (the server
    restarted, or its counters are not to be trusted): every figure None, ``reset`` naming
    those whose counters went back, ``missing`` as it was."""
    keep = {"duration_s", "missing", "reset"}
    cleared = {f.name: None for f in dataclasses.fields(figures) if f.name not in keep}
    return dataclasses.replace(figures, **cleared)  # type: ignore[arg-type]
