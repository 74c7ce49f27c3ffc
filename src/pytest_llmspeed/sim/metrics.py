"""``/metrics``: the engine's state in Prometheus text format, with vLLM's metric names.

Counters count tokens as vLLM does: ``prompt_tokens_total`` at each request's first token,
``generation_tokens_total`` as tokens are generated, ``prefix_cache_queries_total`` /
``hits_total`` in prompt tokens when a request is first admitted (hits = tokens found in the
cache; a preempted request's second lookup is not counted, as in vLLM 0.32). Names, types,
labels and units are vLLM 0.32's (``vllm/v1/metrics/loggers.py``,
``vllm/v1/spec_decode/metrics.py``); docs/simulator.md lists them with their meaning.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .engine import Histogram

if TYPE_CHECKING:
    from .server import SimServer


def _labels(**labels: str) -> str:
    inner = ",".join(f'{k}="{v}"' for k, v in labels.items())
    return "{" + inner + "}"


def render_metrics(server: SimServer) -> str:
    """The whole exposition text."""
    core = server.core
    stats = core.stats
    base = {"engine": "0", "model_name": server.model_name}
    lab = _labels(**base)
    out: list[str] = []

    def family(name: str, kind: str, doc: str) -> None:
        out.append(f"# HELP {name} {doc}")
        out.append(f"# TYPE {name} {kind}")

    def gauge(name: str, doc: str, value: float) -> None:
        family(name, "gauge", doc)
        out.append(f"{name}{lab} {float(value)!r}")

    def counter(name: str, doc: str, value: float) -> None:
        family(name, "counter", doc)
        out.append(f"{name}{lab} {float(value)!r}")

    def histogram(name: str, doc: str, h: Histogram) -> None:
        family(name, "histogram", doc)
        for le, count in h.cumulative():
            out.append(f"{name}_bucket{_labels(**base, le=le)} {float(count)!r}")
        out.append(f"{name}_sum{lab} {h.sum!r}")
        out.append(f"{name}_count{lab} {float(h.count)!r}")

    p = server.profile
    opts = server.options
    family("llmspeed_sim_info", "gauge", "llmspeed-sim: profile and options of this simulator")
    out.append(
        "llmspeed_sim_info"
        + _labels(
            profile=p.name,
            speed=repr(opts.speed),
            noise=repr(opts.noise),
            seed=str(opts.seed),
            start_factor=repr(server.start_factor),
            version=p.version,
        )
        + " 1.0"
    )
    family(
        "llmspeed_sim_drift_factor",
        "gauge",
        "llmspeed-sim: the drift's speed factor now (1 without drift)",
    )
    drift = server.core.drift
    out.append(f"llmspeed_sim_drift_factor {drift.factor() if drift is not None else 1.0!r}")
    family("llmspeed_sim_steps_total", "counter", "llmspeed-sim: engine steps run")
    out.append(f"llmspeed_sim_steps_total {float(server.steps)!r}")
    family(
        "llmspeed_sim_late_steps_total",
        "counter",
        "llmspeed-sim: steps that started over 50 ms late (the simulator was the bottleneck)",
    )
    out.append(f"llmspeed_sim_late_steps_total {float(server.late_steps)!r}")
    family(
        "llmspeed_sim_step_seconds_total",
        "counter",
        "llmspeed-sim: simulated seconds of the steps run, the model's own clock (after speed "
        "and noise); steps_total over it is the model's steps/s, however busy the machine",
    )
    out.append(f"llmspeed_sim_step_seconds_total {stats.step_seconds!r}")
    family("vllm:cache_config_info", "gauge", "Information of the LLMEngine CacheConfig")
    out.append(
        "vllm:cache_config_info"
        + _labels(
            block_size=str(core.block_size),
            cache_dtype="auto",
            enable_prefix_caching="True",
            engine="0",
            kv_cache_size_tokens=str(core.kv_capacity),
            num_gpu_blocks=str(core.num_blocks),
        )
        + " 1.0"
    )
    gauge(
        "vllm:num_requests_running",
        "Number of requests in model execution batches.",
        core.num_running,
    )
    gauge(
        "vllm:num_requests_waiting", "Number of requests waiting to be processed.", core.num_waiting
    )
    family(
        "vllm:num_requests_waiting_by_reason",
        "gauge",
        "Number of waiting requests by reason. Reason labels: 'capacity' = waiting for "
        "scheduling capacity; 'deferred' = deferred by transient constraints (LoRA budget, KV "
        "transfer, blocked status). Sum of all reasons equals vllm:num_requests_waiting.",
    )
    # every waiting request here waits for capacity (KV blocks, max_num_seqs, token budget)
    for reason, waiting in (("capacity", core.num_waiting), ("deferred", 0)):
        out.append(
            f"vllm:num_requests_waiting_by_reason{_labels(**base, reason=reason)} "
            f"{float(waiting)!r}"
        )
    gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", core.kv_usage)
    counter("vllm:prompt_tokens_total", "Number of prefill tokens processed.", stats.prompt_tokens)
    counter(
        "vllm:generation_tokens_total",
        "Number of generation tokens processed.",
        stats.generation_tokens,
    )
    if opts.mfu_metrics:  # vLLM's --enable-mfu-metrics
        counter(
            "vllm:estimated_read_bytes_per_gpu_total",
            "Estimated number of bytes read from memory per GPU (for Model FLOPs Utilization "
            "calculations).",
            stats.read_bytes,
        )
    counter(
        "vllm:prefix_cache_queries_total",
        "Prefix cache queries, in terms of number of queried tokens.",
        stats.prefix_queries,
    )
    counter(
        "vllm:prefix_cache_hits_total",
        "Prefix cache hits, in terms of number of cached tokens.",
        stats.prefix_hits,
    )
    family("vllm:prompt_tokens_by_source_total", "counter", "Number of prompt tokens by source.")
    for source, tokens in (
        ("local_compute", stats.prompt_computed),
        ("local_cache_hit", stats.prompt_cached),
        ("external_kv_transfer", 0),
    ):
        out.append(
            f"vllm:prompt_tokens_by_source_total{_labels(**base, source=source)} {float(tokens)!r}"
        )
    counter(
        "vllm:num_preemptions_total",
        "Cumulative number of preemption from the engine.",
        stats.preemptions,
    )
    family("vllm:request_success_total", "counter", "Count of successfully processed requests.")
    for reason in ("stop", "length", "abort"):
        value = float(stats.finished.get(reason, 0))
        out.append(f"vllm:request_success_total{_labels(**base, finished_reason=reason)} {value!r}")
    counter(
        "vllm:spec_decode_num_drafts_total", "Number of spec decoding drafts.", stats.spec_drafts
    )
    counter(
        "vllm:spec_decode_num_draft_tokens_total",
        "Number of draft tokens.",
        stats.spec_draft_tokens,
    )
    counter(
        "vllm:spec_decode_num_accepted_tokens_total",
        "Number of accepted tokens.",
        stats.spec_accepted,
    )
    family(
        "vllm:spec_decode_num_accepted_tokens_per_pos_total",
        "counter",
        "Accepted tokens per draft position.",
    )
    for pos, accepted in enumerate(stats.spec_accepted_per_pos):
        out.append(
            "vllm:spec_decode_num_accepted_tokens_per_pos_total"
            f"{_labels(**base, position=str(pos))} {float(accepted)!r}"
        )
    histogram(
        "vllm:iteration_tokens_total",
        "Histogram of number of tokens per engine_step.",
        stats.iteration_tokens,
    )
    histogram(
        "vllm:request_queue_time_seconds",
        "Histogram of time spent in WAITING phase for request.",
        stats.queue_time,
    )
    histogram(
        "vllm:request_prefill_time_seconds",
        "Histogram of time spent in PREFILL phase for request.",
        stats.prefill_time,
    )
    histogram(
        "vllm:request_decode_time_seconds",
        "Histogram of time spent in DECODE phase for request.",
        stats.decode_time,
    )
    histogram(
        "vllm:time_to_first_token_seconds",
        "Histogram of time to first token in seconds.",
        stats.ttft,
    )
    histogram(
        "vllm:inter_token_latency_seconds",
        "Histogram of inter-token latency in seconds.",
        stats.itl,
    )
    return "\n".join(out) + "\n"
