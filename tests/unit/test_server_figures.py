"""The server's figures over a window, from real vLLM 0.32 CPU /metrics (tests/data/metrics/,
its README says how each was captured) and from hand-made text where a case needs it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from pytest_llmspeed.core.probe import parse_metrics
from pytest_llmspeed.core.server_figures import (
    ALL_FAMILIES,
    FIGURE_SOURCES,
    GAUGE_FAMILIES,
    SERIES,
    SPECULATIVE,
    ServerFigures,
    combine,
    only_families,
    snapshot,
    snapshot_from_samples,
    window_figures,
)

DATA = Path(__file__).parent.parent / "data" / "metrics"
# speculative decoding's figures, written out (the module derives SPECULATIVE from its table)
SPEC = (
    "spec_drafts",
    "spec_draft_tokens",
    "spec_accepted_tokens",
    "spec_accepted_per_position",
    "acceptance_length",
    "acceptance_rate",
)


def text(name: str) -> str:
    return (DATA / f"vllm-0.32-cpu-{name}.txt").read_text()


def test_every_vllm_name_of_the_table_is_in_the_real_metrics():
    # the plain server has every series but speculative decoding's; the ngram one has those
    plain, ngram = parse_metrics(text("after")), parse_metrics(text("ngram-after"))
    for series in SERIES:
        if series.vllm is None:
            continue
        suffix = {"counter": "_total", "histogram": "_count", "gauge": ""}[series.kind]
        held = ngram if series.key.startswith("spec_") else plain
        assert f"{series.vllm}{suffix}" in held, series.vllm
        if series.by:
            assert all(series.by in labels for labels, _ in held[f"{series.vllm}{suffix}"])


def test_the_filtered_parse_reads_what_the_full_parse_reads():
    for path in sorted(DATA.glob("*.txt")):
        full = path.read_text()
        kept = only_families(full, ALL_FAMILIES)
        assert "_bucket" not in kept
        assert len(kept) < len(full) / 5
        assert snapshot(full, 1.0) == snapshot_from_samples(parse_metrics(full), 1.0)


def test_window_figures_of_real_vllm_are_the_deltas_in_the_files():
    # before → after: 8 requests of 2,837 prompt tokens (2,816 of them a cached prefix),
    # 256 tokens out each; the poll between saw the 8 running
    open_ = snapshot(text("before"), 10.0)
    poll = snapshot(text("during"), 10.5, GAUGE_FAMILIES)
    close = snapshot(text("after"), 11.0)
    got = window_figures(open_, close, [poll])

    assert got.duration_s == 1.0
    # iteration_tokens_total: count 16 → 274, sum 2,852 → 5,068
    assert got.steps == 274 - 16
    assert got.steps_per_s == 258.0
    assert got.step_tokens == 5068 - 2852
    assert got.tokens_per_step == (5068 - 2852) / 258
    # generation_tokens_total 16 → 2,064; prompt_tokens_total 2,836 → 25,532
    assert got.generation_tokens == 2048 == 8 * 256
    assert got.output_tokens_per_step == 2048 / 258
    assert got.prompt_tokens == 25532 - 2836 == 8 * 2837
    # prompt_tokens_by_source: local_compute 2,836 → 3,004, local_cache_hit 0 → 22,528
    assert got.prefix_cache_counter == "by source"
    assert got.prefix_cache_queries == (3004 - 2836) + 22528
    assert got.prefix_cache_hits == 22528 == 8 * 2816
    assert got.prefix_cache_hit_rate == 22528 / 22696
    # the histograms' sum and count: 1 → 9 requests
    assert got.requests == 8
    assert got.queue_time_mean_s == (0.00016368200522265397 - 2.7891999707208015e-05) / 8
    assert got.prefill_time_mean_s == (0.19333960499352543 - 0.057732356999622425) / 8
    assert got.decode_time_mean_s == (6.800003136999294 - 0.0476958380004362) / 8
    # gauges: 0 at both ends, 8 running half-way: the trapezoids' mean is 4
    assert got.running_mean == 4.0
    assert got.running_max == 8.0
    assert got.waiting_mean == 0.0
    assert got.waiting_max == 0.0
    assert got.waiting_by_reason == (("capacity", 0.0, 0.0), ("deferred", 0.0, 0.0))
    assert got.kv_usage_max == 0.014655593551538892
    assert got.kv_usage_mean == 0.014655593551538892 / 2
    assert got.preemptions == 0
    # no speculative decoding on this server: absent, not 0
    for name in SPEC:
        assert getattr(got, name) is None
    assert got.missing == SPEC
    assert got.reset == ()


def test_spec_decoding_figures_of_real_vllm_with_ngram_drafts():
    got = window_figures(snapshot(text("ngram-before"), 0.0), snapshot(text("ngram-after"), 2.0))
    # spec_decode_num_drafts_total 4 → 518, draft tokens 8 → 1,518, accepted 8 → 1,515,
    # per position 4/2/2 → 517/499/499
    assert got.spec_drafts == 514
    assert got.spec_draft_tokens == 1510
    assert got.spec_accepted_tokens == 1507
    assert got.spec_accepted_per_position == (513, 497, 497)
    assert sum(got.spec_accepted_per_position) == got.spec_accepted_tokens
    assert got.acceptance_length == 1 + 1507 / 514
    assert got.acceptance_rate == 1507 / 1510
    assert got.steps == 81 - 10
    assert got.steps_per_s == 71 / 2.0
    assert got.missing == ()


def test_preemptions_and_waiting_of_real_vllm_with_a_small_kv_cache():
    # --max-num-seqs 4 and 32 KV blocks: 8 requests at once, 5 preemptions
    open_ = snapshot(text("tight-before"), 0.0)
    poll = snapshot(text("tight-during"), 1.0, GAUGE_FAMILIES)
    close = snapshot(text("tight-after"), 3.0)
    got = window_figures(open_, close, [poll])
    assert got.preemptions == 5
    assert got.running_max == 3.0
    assert got.waiting_max == 5.0
    # trapezoids: (0 + 5) / 2 over 1 s, (5 + 0) / 2 over 2 s, over 3 s
    assert got.waiting_mean == (2.5 * 1 + 2.5 * 2) / 3
    assert got.waiting_by_reason == (("capacity", 2.5, 5.0), ("deferred", 0.0, 0.0))
    assert got.kv_usage_max == 0.967741935483871
    assert got.queue_time_mean_s == (3.6046389489983994 - 2.785099968605209e-05) / 8


def test_replicas_are_summed_and_kv_usage_averaged():
    one = window_figures(
        snapshot(text("before"), 0.0),
        snapshot(text("after"), 1.0),
        [snapshot(text("during"), 0.5, GAUGE_FAMILIES)],
    )
    two = window_figures(
        combine([snapshot(text("before"), 0.0), snapshot(text("tight-before"), 0.0)]),
        combine([snapshot(text("after"), 1.0), snapshot(text("tight-after"), 1.0)]),
        [combine([snapshot(text("during"), 0.5), snapshot(text("tight-during"), 0.5)])],
    )
    assert two.steps == 258 + (1029 - 16)
    assert two.preemptions == 0 + 5
    assert two.generation_tokens == 2048 + 8 * 256
    assert two.running_max == 8 + 3
    assert two.waiting_max == 0 + 5
    # KV usage: the mean of the two caches' fractions at each read
    assert two.kv_usage_max == (0.014655593551538892 + 0.967741935483871) / 2
    assert one.kv_usage_max == 0.014655593551538892
    assert two.prefix_cache_hit_rate == 22528 / (22696 + 8 * 1211)


def test_a_series_only_some_replicas_expose_is_absent_from_the_sum():
    both = combine([snapshot(text("after"), 1.0), snapshot(text("ngram-after"), 1.0)])
    assert "spec_drafts" not in both.values
    assert both.total("generation_tokens") == 2064 + 2064
    assert both.replicas == 2


def test_engines_of_one_server_are_summed_and_kv_usage_averaged():
    # data parallel: vLLM labels each engine's series engine="0", engine="1"
    def two_engines(name: str) -> str:
        lines = text(name).splitlines()
        extra = [ln.replace('engine="0"', 'engine="1"') for ln in lines if 'engine="0"' in ln]
        return "\n".join(lines + extra) + "\n"

    snap = snapshot(two_engines("tight-during"), 0.0)
    assert snap.gauge("running") == 2 * 3.0
    assert snap.gauge("kv_usage") == 0.967741935483871
    assert snap.total("step_tokens", "count") == 2 * 44


def test_a_counter_that_went_back_gives_none_not_a_negative_number():
    # the server restarted inside the window: every counter is lower at the close
    got = window_figures(snapshot(text("after"), 0.0), snapshot(text("before"), 1.0))
    assert got.steps is None
    assert got.generation_tokens is None
    assert got.queue_time_mean_s is None
    assert "steps" in got.reset
    assert "steps" not in got.missing
    # the same process wrote both (same _created): a counter at 0 at both reads stays 0
    assert got.preemptions == 0
    # gauges are no counters: still known
    assert got.running_max == 0.0


def test_another_server_process_at_the_close_resets_every_counter():
    # the tight server's 5 preemptions at the open, a fresh server (its own _created) at the
    # close: no counter's delta means anything
    got = window_figures(snapshot(text("tight-after"), 0.0), snapshot(text("before"), 1.0))
    assert got.preemptions is None
    assert got.spec_drafts is None
    assert set(got.reset) == {
        name
        for name, sources in FIGURE_SOURCES.items()
        if all(s not in ("running", "waiting", "waiting_by_reason", "kv_usage") for s in sources)
        and not name.startswith("spec_")
        and name not in ("acceptance_length", "acceptance_rate")
    }
    assert got.missing == SPEC


def test_a_restart_seen_in_created_gives_none_even_when_the_counter_rose():
    # a restarted server whose counter has already passed its old value: only _created says so
    before, after = text("before"), text("after")
    created = re.search(r"^vllm:generation_tokens_created\{[^}]*\} (\S+)$", after, re.M)
    assert created is not None
    later = after.replace(created.group(1), repr(float(created.group(1)) + 60.0))
    got = window_figures(snapshot(before, 0.0), snapshot(later, 1.0))
    assert got.generation_tokens is None
    assert got.output_tokens_per_step is None
    assert got.reset == ("generation_tokens", "output_tokens_per_step")
    assert got.steps == 258


def test_figures_the_server_does_not_expose_are_listed_once():
    # a server with nothing but a running gauge
    bare = "# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running 4\n"
    got = window_figures(snapshot(bare, 0.0), snapshot(bare, 1.0))
    assert got.running_mean == 4.0
    assert set(got.missing) == set(FIGURE_SOURCES) - {"running_mean", "running_max"}
    assert len(got.missing) == len(set(got.missing))
    assert got.steps is None and got.preemptions is None and got.prefix_cache_hit_rate is None
    # no metrics at all: everything missing, the duration still known
    empty = window_figures(snapshot("", 0.0), snapshot("", 2.0))
    assert empty.duration_s == 2.0
    assert set(empty.missing) == set(FIGURE_SOURCES)
    assert empty.to_dict() == {"duration_s": 2.0, "missing": list(empty.missing)}


def test_plain_prefix_counters_when_the_by_source_counter_is_absent():
    # older vLLM: no prompt_tokens_by_source; queries/hits read instead
    drop = re.compile(r"^.*prompt_tokens_by_source.*$\n", re.M)
    got = window_figures(
        snapshot(drop.sub("", text("before")), 0.0), snapshot(drop.sub("", text("after")), 1.0)
    )
    assert got.prefix_cache_counter == "queries/hits"
    assert got.prefix_cache_queries == 25532 - 2836
    assert got.prefix_cache_hits == 22528


def test_by_source_counter_wins_over_the_plain_hits_a_recompute_counts_twice():
    # vLLM #25780: after a preemption the plain counters count the recomputed prompt again
    inflated = re.sub(
        r"^(vllm:prefix_cache_(?:queries|hits)_total\{[^}]*\}) (\S+)$",
        lambda m: f"{m.group(1)} {float(m.group(2)) * 2}",
        text("after"),
        flags=re.M,
    )
    got = window_figures(snapshot(text("before"), 0.0), snapshot(inflated, 1.0))
    assert got.prefix_cache_counter == "by source"
    assert got.prefix_cache_hits == 22528
    assert got.prefix_cache_hit_rate == 22528 / 22696


SGLANG = """\
# Hand-written from the definitions in sglang's collector.py (SchedulerMetricsCollector,
# TokenizerMetricsCollector): not captured from a running SGLang
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{{model_name="m",tp_rank="0",dp_rank="0"}} {running}
# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{{model_name="m",tp_rank="0",dp_rank="0"}} {queue}
# TYPE sglang:token_usage gauge
sglang:token_usage{{model_name="m",tp_rank="0",dp_rank="0"}} {usage}
# TYPE sglang:spec_accept_length gauge
sglang:spec_accept_length{{model_name="m",tp_rank="0",dp_rank="0"}} {accept}
# TYPE sglang:generation_tokens_total counter
sglang:generation_tokens_total{{model_name="m"}} {gen}
# TYPE sglang:prompt_tokens_total counter
sglang:prompt_tokens_total{{model_name="m"}} {prompt}
# TYPE sglang:cached_tokens_total counter
sglang:cached_tokens_total{{model_name="m"}} {cached}
# TYPE sglang:queue_time_seconds histogram
sglang:queue_time_seconds_sum{{model_name="m"}} {qsum}
sglang:queue_time_seconds_count{{model_name="m"}} {qcount}
"""


def test_sglang_names_map_to_the_same_figures():
    a = SGLANG.format(
        running=0, queue=0, usage=0.1, accept=2.0, gen=100, prompt=1000, cached=0, qsum=0.5,
        qcount=2,
    )  # fmt: skip
    b = SGLANG.format(
        running=8, queue=2, usage=0.3, accept=3.0, gen=1100, prompt=9000, cached=6000, qsum=2.5,
        qcount=6,
    )  # fmt: skip
    open_, close = snapshot(a, 0.0), snapshot(b, 2.0)
    assert open_.engine == "sglang"
    got = window_figures(open_, close)
    assert got.running_mean == 4.0
    assert got.waiting_max == 2.0
    assert got.kv_usage_mean == pytest.approx(0.2)
    assert got.acceptance_length == 2.5  # its own gauge, averaged over the window
    assert got.generation_tokens == 1000
    assert got.prefix_cache_counter == "queries/hits"
    assert got.prefix_cache_hit_rate == 6000 / 8000
    assert got.queue_time_mean_s == 2.0 / 4
    assert got.steps is None and "steps" in got.missing
    assert "acceptance_length" not in got.missing


def test_figures_serialize_to_plain_json_values():
    got = window_figures(snapshot(text("ngram-before"), 0.0), snapshot(text("ngram-after"), 2.0))
    data = got.to_dict()
    assert data["spec_accepted_per_position"] == [513, 497, 497]
    assert data["waiting_by_reason"] == [["capacity", 0.0, 0.0], ["deferred", 0.0, 0.0]]
    assert "missing" not in data
    assert "running_mean" in data
    assert isinstance(got, ServerFigures)


def test_the_speculative_figures_are_those_read_from_its_series():
    assert SPECULATIVE == SPEC
