"""One factor at a time: each option moves its own vLLM counters and leaves the others alone.

The engine on a virtual clock gives the exact statements (every step of two runs compared);
the HTTP server shows the same through its own ``/metrics``, ``/sim/trace`` and model clock
(``llmspeed_sim_step_seconds_total``), with nothing that depends on how busy the machine is.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import math
import random
from typing import Any

import aiohttp
import pytest

from pytest_llmspeed.sim import (
    SimOptions,
    cli_args,
    parse_sim_spec,
    running_simulator,
    running_simulator_process,
)
from pytest_llmspeed.sim.__main__ import build_parser
from pytest_llmspeed.sim.engine import EngineCore, SimRequest, StepPlan, conditional_acceptance
from pytest_llmspeed.sim.profiles import get_profile

from .sse_client import stream
from .test_server import metrics, value

TINY = get_profile("tiny")


def ids(n: int, seed: int) -> list[int]:
    r = random.Random(seed)
    return [r.randrange(300, 32000) for _ in range(n)]


@dataclasses.dataclass
class Step:
    """One step of a virtual-clock run, as the engine planned and completed it."""

    start: float
    duration: float
    decode: list[int]  # requests, by their place in the run's list
    prefill: list[tuple[int, int]]
    outputs: list[tuple[int, int]]  # (request, new tokens)
    running: int  # during the step (what the gauges show)
    waiting: int
    kv_usage: float  # after it


def run(core: EngineCore, reqs: list[SimRequest]) -> list[Step]:
    """Add ``reqs`` at t=0 and step the core on a virtual clock until all finish."""
    for r in reqs:
        core.add(r, 0.0)
    at = {r.seq: i for i, r in enumerate(reqs)}
    now, steps = 0.0, []
    while any(r.state != "finished" for r in reqs):
        due = core.next_event(now)
        assert due is not None
        now = max(now, due)
        plan: StepPlan | None = core.plan(now)
        assert plan is not None
        start, running, waiting = now, core.num_running, core.num_waiting
        now += plan.duration
        outs = core.complete(plan, now)
        steps.append(
            Step(
                start,
                plan.duration,
                [at[r.seq] for r in plan.decode],
                [(at[r.seq], q) for r, q in plan.prefill],
                [(at[r.seq], n) for r, n, _ in outs],
                running,
                waiting,
                core.kv_usage,
            )
        )
    return steps


def workload(n: int = 4, prompt: int = 1000, out: int = 2000) -> list[SimRequest]:
    return [SimRequest(ids(prompt, 40 + i), out, ignore_eos=True) for i in range(n)]


def decode_window(steps: list[Step], n: int) -> list[Step]:
    """The steps where ``n`` requests decode and nothing prefills (a decode cell's window)."""
    return [s for s in steps if len(s.decode) == n and not s.prefill]


def spec(core: EngineCore) -> tuple[int, int, int, list[int]]:
    st = core.stats
    return st.spec_drafts, st.spec_draft_tokens, st.spec_accepted, list(st.spec_accepted_per_pos)


# -- the counters, as vLLM counts them ----------------------------------------------------


def test_counters_agree_with_each_other_and_the_tokens() -> None:
    """iteration_tokens: one observation per step with output, tokens generated + computed
    prompt tokens; spec counters add up to the tokens streamed; by-source adds up to prompt."""
    core = EngineCore(TINY)
    shared = ids(4000, 7)
    reqs = [
        SimRequest(ids(20000, 1), 300, ignore_eos=True),  # 3 chunks: 2 steps with no output
        SimRequest(shared, 200, ignore_eos=True),
    ]
    steps = run(core, reqs[:1]) + run(core, reqs[1:])
    warm = SimRequest(shared[:3984] + ids(16, 8), 100, ignore_eos=True)  # prefix hit
    steps += run(core, [warm])
    st = core.stats
    with_output = [s for s in steps if s.outputs]
    assert len(with_output) < len(steps)  # prefill chunks that end no prompt are not observed
    assert st.iteration_tokens.count == len(with_output)
    assert st.prompt_cached == warm.cached_tokens == 3984  # all 249 blocks it shares
    assert st.prompt_computed == 20000 + 4000 + 4000 - 3984
    assert st.prompt_computed + st.prompt_cached == st.prompt_tokens
    assert st.iteration_tokens.sum == st.generation_tokens + st.prompt_computed
    drafts, draft_tokens, accepted, per_pos = spec(core)
    assert draft_tokens == 2 * drafts and sum(per_pos) == accepted
    assert per_pos[0] >= per_pos[1] > 0
    first_tokens = st.ttft.count
    assert st.generation_tokens == first_tokens + drafts + accepted == 600
    assert st.queue_time.count == st.prefill_time.count == st.decode_time.count == 3
    expected_decode = sum(r.last_token_time - (r.first_token_time or 0.0) for r in [*reqs, warm])
    assert math.isclose(st.decode_time.sum, expected_decode, rel_tol=1e-12)
    assert math.isclose(st.step_seconds, sum(s.duration for s in steps), rel_tol=1e-12)


def test_conditional_acceptance_gives_the_asked_rate() -> None:
    for drafts in (1, 2, 3, 5):
        for rate in (0.0, 0.1, 0.25, 0.5, 0.9, 1.0):
            a = conditional_acceptance(rate, drafts)
            assert math.isclose(sum(a**i for i in range(1, drafts + 1)) / drafts, rate)
    with pytest.raises(ValueError, match="in \\[0, 1\\]"):
        conditional_acceptance(1.2, 2)


# -- one factor each, on a virtual clock --------------------------------------------------


def test_accept_moves_acceptance_length_not_steps_per_second_or_running() -> None:
    base, low = EngineCore(TINY), EngineCore(TINY, acceptance=0.25)
    steps_base, steps_low = run(base, workload()), run(low, workload())
    drafts, draft_tokens, accepted, _ = spec(low)
    assert abs(accepted / draft_tokens - 0.25) < 0.005  # the golden-ratio walk: low discrepancy
    length_base = 1 + base.stats.spec_accepted / base.stats.spec_drafts
    length_low = 1 + accepted / drafts
    assert abs(length_low - 1.5) < 0.01 and abs(length_base - TINY.mean_tokens_per_step) < 0.01
    # a decode window: 4 running in both, and steps/s the same but for the one channel through
    # which acceptance reaches the step time, contexts that grow faster (5e-9 s per token)
    win_base, win_low = decode_window(steps_base, 4), decode_window(steps_low, 4)
    assert len(win_base) > 500 and len(win_low) > 500
    assert {s.running for s in win_base} == {s.running for s in win_low} == {4}
    rate_base = len(win_base) / sum(s.duration for s in win_base)
    rate_low = len(win_low) / sum(s.duration for s in win_low)
    ctx_max = 4 * (1000 + 2000)
    context_share = TINY.decode_per_context_token_s * ctx_max / TINY.step_base_s
    # bound: the context term's whole range, 1.5 % (measured: 2e-6, both windows span the same
    # contexts, 1,000 to 3,000 tokens, only at different paces)
    assert abs(rate_low / rate_base - 1) <= context_share


def test_speed_moves_step_time_only() -> None:
    base, fast = EngineCore(TINY), EngineCore(TINY, speed=2.0)
    steps_base, steps_fast = run(base, workload()), run(fast, workload())
    assert len(steps_base) == len(steps_fast)
    for a, b in zip(steps_base, steps_fast, strict=True):
        assert (a.decode, a.prefill, a.outputs, a.running) == (
            b.decode,
            b.prefill,
            b.outputs,
            b.running,
        )
        assert math.isclose(b.duration * 2, a.duration, rel_tol=1e-12)
    assert spec(base) == spec(fast)
    assert base.stats.iteration_tokens.counts == fast.stats.iteration_tokens.counts
    assert math.isclose(fast.stats.step_seconds * 2, base.stats.step_seconds, rel_tol=1e-12)
    assert math.isclose(fast.stats.decode_time.sum * 2, base.stats.decode_time.sum, rel_tol=1e-9)


def test_max_num_seqs_queues_the_rest_and_leaves_acceptance_alone() -> None:
    base, capped = EngineCore(TINY), EngineCore(TINY, max_num_seqs=2)
    run(base, workload())
    reqs = workload()
    steps = run(capped, reqs)
    assert max(s.running for s in steps) == 2
    assert (steps[0].running, steps[0].waiting) == (2, 2)
    first, second = reqs[:2], reqs[2:]
    ends = [r.last_token_time for r in first]
    for r in second:  # admitted only when a running request finished
        assert r.scheduled_at is not None and r.scheduled_at >= min(ends)
    queue = [(r.scheduled_at or 0.0) - r.ready_at for r in reqs]
    assert queue[0] == queue[1] == 0 and min(queue[2:]) > 1.0
    assert math.isclose(capped.stats.queue_time.sum, sum(queue), rel_tol=1e-12)
    assert base.stats.queue_time.sum == 0
    # each request's drafts are its own: the same acceptance, token for token
    assert spec(capped) == spec(base)
    assert capped.stats.generation_tokens == base.stats.generation_tokens == 8000


def test_kv_preempt_preempts_recomputes_and_completes_every_request() -> None:
    core = EngineCore(TINY, kv_capacity=8192, preempt=True)
    reqs = workload()  # 4 x (1000 + 2000) tokens: 12,000 > 8,192
    steps = run(core, reqs)
    st = core.stats
    assert st.preemptions > 0 and st.preemptions == sum(r.preemptions for r in reqs)
    assert all(r.output == 2000 and r.finish_reason == "length" for r in reqs)
    assert st.generation_tokens == 8000 and st.prompt_tokens == 4000
    assert st.prefix_queries == 4000  # a readmitted request's lookup is not counted again
    # a recomputed request computes its prompt and the tokens it had generated: that work is
    # in the prefill chunks, beyond the prompts
    recomputed = sum(q for s in steps for _, q in s.prefill) - 4000
    assert recomputed >= 1000 * st.preemptions
    # the next token after a recompute is a token like any other: streamed tokens still add up
    drafts, _, accepted, _ = spec(core)
    resumed = sum(1 for s in steps for seq, q in s.prefill if any(o[0] == seq for o in s.outputs))
    assert st.generation_tokens == resumed + drafts + accepted
    assert st.iteration_tokens.sum == st.generation_tokens + st.prompt_computed
    # usage follows the running contexts: it grows step by step while requests decode
    usage = [s.kv_usage for s in steps]
    assert max(usage) > 0.95
    growing = [b >= a for a, b in itertools.pairwise(usage)]
    assert sum(growing) > 0.9 * len(growing)
    assert core.pool.used == 0


def test_kv_preempt_with_room_for_everyone_runs_as_the_default() -> None:
    """Allocated as vLLM does but never short: the same steps, times and counters."""
    base = EngineCore(TINY)
    roomy = EngineCore(TINY, kv_capacity=TINY.kv_capacity_tokens, preempt=True)
    steps_base, steps_roomy = run(base, workload()), run(roomy, workload())
    assert [(s.decode, s.prefill, s.outputs, s.duration) for s in steps_base] == [
        (s.decode, s.prefill, s.outputs, s.duration) for s in steps_roomy
    ]
    assert spec(base) == spec(roomy) and roomy.stats.preemptions == 0
    # the reservation holds every request's whole footprint; vLLM's allocation, what it used
    assert steps_roomy[0].kv_usage < steps_base[0].kv_usage


# -- the options --------------------------------------------------------------------------


def test_options_parse_and_round_trip_through_the_command_line() -> None:
    opts = parse_sim_spec("sim:tiny?accept=0.5&max-num-seqs=2&kv_preempt=65536&speed=3")
    assert (opts.accept, opts.max_num_seqs, opts.kv_preempt) == (0.5, 2, 65536)
    assert opts.effective_kv_capacity == 65536
    args = build_parser().parse_args(cli_args(opts))
    assert (args.accept, args.max_num_seqs, args.kv_preempt) == (0.5, 2, 65536)
    assert parse_sim_spec("sim:tiny") == SimOptions()  # none given: as before
    text = parse_sim_spec("sim:tiny?accept=text")
    assert text.accept == "text" and build_parser().parse_args(cli_args(text)).accept == "text"


def test_accept_text_follows_the_prompt_and_leaves_the_default_alone() -> None:
    """``accept=text``: a prompt that repeats itself accepts its drafts more than one that never
    does (docs/simulator.md, "Acceptance that follows the text"); without it the profile's."""
    from pytest_llmspeed.sim.engine import TEXT_ACCEPT_MAX, TEXT_ACCEPT_MIN, predictability

    repeated, never = list(range(50)) * 100, list(range(5000))
    assert predictability(repeated) == 1.0 and predictability(never) == 0.0
    core = EngineCore(TINY, acceptance="text")
    a, b = SimRequest(repeated, 8), SimRequest(never, 8)
    core.add(a, 0.0)
    core.add(b, 0.0)
    assert a.survival == pytest.approx((TEXT_ACCEPT_MAX, TEXT_ACCEPT_MAX**2))
    assert b.survival == pytest.approx((TEXT_ACCEPT_MIN, TEXT_ACCEPT_MIN**2))
    plain = EngineCore(TINY)
    c = SimRequest(repeated, 8)
    plain.add(c, 0.0)
    assert c.survival is None  # the profile's acceptance, as before


@pytest.mark.parametrize(
    ("spec", "needle"),
    [
        ("sim:tiny?accept=1.5", "accept must be an acceptance rate in [0, 1]"),
        ("sim:tiny?accept=high", "bad value 'high' for simulator option 'accept'"),
        ("sim:tiny?max_num_seqs=0", "max_num_seqs must be at least 1"),
        ("sim:tiny?kv_preempt=8192&kv_capacity=8192", "give one"),
        ("sim:tiny?kv_preempt=8192", "kv_preempt 8192 is smaller than max_model_len 32768"),
    ],
)
def test_bad_factor_options_name_the_problem(spec: str, needle: str) -> None:
    with pytest.raises(ValueError) as info:
        parse_sim_spec(spec)
    assert needle in str(info.value)


# -- the same through HTTP: /metrics, /sim/trace ------------------------------------------


async def get_json(session: aiohttp.ClientSession, url: str) -> Any:
    async with session.get(url) as resp:
        assert resp.status == 200
        return await resp.json()


def labelled(samples: dict[str, Any], name: str, label: str) -> dict[str, float]:
    return {s.labels[label]: s.value for s in samples[name]}


async def one_run(options: SimOptions, bodies: list[dict[str, Any]]) -> tuple[dict, list]:
    """Send ``bodies`` at once to a fresh simulator; its /metrics and trace at the end."""
    with running_simulator(options) as url:
        async with aiohttp.ClientSession() as s:
            results = await asyncio.gather(*(stream(s, url + "/v1/completions", b) for b in bodies))
            for body, res in zip(bodies, results, strict=True):
                assert res.status == 200 and res.final_usage is not None
                assert res.final_usage["completion_tokens"] == body["max_tokens"]
            return await metrics(s, url), (await get_json(s, url + "/sim/trace"))["requests"]


def check_identities(m: dict[str, Any]) -> None:
    """What holds in every run: the counters agree with each other."""
    source = labelled(m, "vllm:prompt_tokens_by_source_total", "source")
    assert set(source) == {"local_compute", "local_cache_hit", "external_kv_transfer"}
    assert source["local_compute"] + source["local_cache_hit"] == value(
        m, "vllm:prompt_tokens_total"
    )
    generated = value(m, "vllm:generation_tokens_total")
    assert value(m, "vllm:iteration_tokens_total_sum") == generated + source["local_compute"]
    assert value(m, "vllm:iteration_tokens_total_count") <= value(m, "llmspeed_sim_steps_total")
    per_pos = labelled(m, "vllm:spec_decode_num_accepted_tokens_per_pos_total", "position")
    assert set(per_pos) == {"0", "1"}
    assert sum(per_pos.values()) == value(m, "vllm:spec_decode_num_accepted_tokens_total")
    assert value(m, "vllm:spec_decode_num_draft_tokens_total") == 2 * value(
        m, "vllm:spec_decode_num_drafts_total"
    )
    reasons = labelled(m, "vllm:num_requests_waiting_by_reason", "reason")
    assert set(reasons) == {"capacity", "deferred"}
    assert sum(reasons.values()) == value(m, "vllm:num_requests_waiting")


def rate_and_length(m: dict[str, Any]) -> tuple[float, float]:
    accepted = value(m, "vllm:spec_decode_num_accepted_tokens_total")
    return (
        accepted / value(m, "vllm:spec_decode_num_draft_tokens_total"),
        1 + accepted / value(m, "vllm:spec_decode_num_drafts_total"),
    )


DECODE = [{"prompt": ids(400, 60 + i), "max_tokens": 1500, "ignore_eos": True} for i in range(4)]


@pytest.mark.asyncio
async def test_metrics_have_vllm_names_types_and_labels() -> None:
    with running_simulator(SimOptions(speed=20)) as url:
        async with aiohttp.ClientSession() as s:
            await stream(s, url + "/v1/completions", DECODE[0])
            async with s.get(url + "/metrics") as resp:
                text = await resp.text()
            m = await metrics(s, url)
    for name, kind in (
        ("vllm:iteration_tokens_total", "histogram"),
        ("vllm:request_queue_time_seconds", "histogram"),
        ("vllm:request_prefill_time_seconds", "histogram"),
        ("vllm:request_decode_time_seconds", "histogram"),
        ("vllm:num_preemptions_total", "counter"),
        ("vllm:num_requests_waiting_by_reason", "gauge"),
        ("vllm:prompt_tokens_by_source_total", "counter"),
        ("vllm:spec_decode_num_accepted_tokens_per_pos_total", "counter"),
        ("vllm:kv_cache_usage_perc", "gauge"),
        ("llmspeed_sim_step_seconds_total", "counter"),
    ):
        assert f"# TYPE {name} {kind}\n" in text, name
    assert 'vllm:iteration_tokens_total_bucket{engine="0",model_name="tiny",le="1.0"}' in text
    assert 'vllm:request_queue_time_seconds_bucket{engine="0",model_name="tiny",le="0.3"}' in text
    check_identities(m)
    assert value(m, "vllm:request_decode_time_seconds_count") == 1
    assert value(m, "vllm:request_prefill_time_seconds_sum") > 0
    assert value(m, "vllm:num_preemptions_total") == 0


@pytest.mark.asyncio
async def test_accept_over_http_moves_acceptance_only() -> None:
    base, _ = await one_run(SimOptions(speed=20), DECODE)
    low, _ = await one_run(parse_sim_spec("sim:tiny?speed=20&accept=0.25"), DECODE)
    for m in (base, low):
        check_identities(m)
    rate, length = rate_and_length(low)
    assert abs(rate - 0.25) < 0.005 and abs(length - 1.5) < 0.01
    assert abs(rate_and_length(base)[1] - TINY.mean_tokens_per_step) < 0.01
    # the same work otherwise: tokens, prompts, no queue, no preemption
    for name in ("vllm:generation_tokens_total", "vllm:prompt_tokens_total"):
        assert value(low, name) == value(base, name)
    for m in (base, low):
        assert value(m, "vllm:num_preemptions_total") == 0


@pytest.mark.asyncio
async def test_speed_over_http_moves_the_model_clock_only() -> None:
    """One request: the same steps at either speed, each taking half the time at twice it."""
    body = [{"prompt": ids(20000, 70), "max_tokens": 800, "ignore_eos": True}]
    slow, _ = await one_run(SimOptions(speed=10), body)
    fast, _ = await one_run(SimOptions(speed=20), body)
    for name in (
        "llmspeed_sim_steps_total",
        "vllm:iteration_tokens_total_count",
        "vllm:iteration_tokens_total_sum",
        "vllm:spec_decode_num_drafts_total",
        "vllm:spec_decode_num_accepted_tokens_total",
        "vllm:generation_tokens_total",
    ):
        assert value(slow, name) == value(fast, name), name
    assert (
        value(slow, "vllm:iteration_tokens_total_count")
        == value(slow, "llmspeed_sim_steps_total") - 2
    )  # two of the three prefill chunks end no prompt: no output, no observation
    ratio = value(slow, "llmspeed_sim_step_seconds_total") / value(
        fast, "llmspeed_sim_step_seconds_total"
    )
    assert math.isclose(ratio, 2.0, rel_tol=1e-9)


@pytest.mark.asyncio
async def test_max_num_seqs_over_http_queues_with_reason_capacity() -> None:
    long = {"max_tokens": 20000, "ignore_eos": True}  # would run ~20 s: cancelled below
    short = {"max_tokens": 50, "ignore_eos": True}
    with running_simulator(parse_sim_spec("sim:tiny?speed=2&max_num_seqs=2")) as url:
        async with aiohttp.ClientSession() as s:
            first = [
                asyncio.create_task(
                    stream(s, url + "/v1/completions", {**long, "prompt": ids(300, 80 + i)})
                )
                for i in range(2)
            ]
            async with asyncio.timeout(120):  # a broken server fails, not hangs
                while value(await metrics(s, url), "vllm:num_requests_running") < 2:
                    await asyncio.sleep(0.01)
            second = [
                asyncio.create_task(
                    stream(s, url + "/v1/completions", {**short, "prompt": ids(300, 90 + i)})
                )
                for i in range(2)
            ]
            async with asyncio.timeout(120):
                while value(m := await metrics(s, url), "vllm:num_requests_waiting") < 2:
                    await asyncio.sleep(0.01)
            assert value(m, "vllm:num_requests_running") == 2
            assert labelled(m, "vllm:num_requests_waiting_by_reason", "reason") == {
                "capacity": 2.0,
                "deferred": 0.0,
            }
            for task in first:  # the client leaves: the queued two run
                task.cancel()
            results = await asyncio.gather(*second)
            after = await metrics(s, url)
            trace = (await get_json(s, url + "/sim/trace"))["requests"]
    assert all(r.final_usage["completion_tokens"] == 50 for r in results)
    check_identities(after)
    finished = [r for r in trace if r["finish_reason"] == "length"]
    assert len(finished) == 2
    queued = [r["scheduled"] - r["queued"] for r in finished]
    assert min(queued) > 0
    # observed when a request finishes, as vLLM does: the two that ran to the end
    assert value(after, "vllm:request_queue_time_seconds_count") == 2
    assert math.isclose(value(after, "vllm:request_queue_time_seconds_sum"), sum(queued))
    assert value(after, "vllm:num_requests_running") == 0
    assert value(after, "vllm:num_preemptions_total") == 0


@pytest.mark.asyncio
async def test_kv_preempt_over_http_counts_preemptions_and_completes_all() -> None:
    options = parse_sim_spec("sim:tiny?speed=5&kv_preempt=8192&max_model_len=4096")
    bodies = [
        {"prompt": ids(1000, 100 + i), "max_tokens": 2000, "ignore_eos": True} for i in range(4)
    ]
    m, trace = await one_run(options, bodies)
    check_identities(m)
    assert value(m, "vllm:num_preemptions_total") > 0
    assert value(m, "vllm:num_preemptions_total") == sum(r["preemptions"] for r in trace)
    assert all(r["completion_tokens"] == 2000 and r["finish_reason"] == "length" for r in trace)
    assert value(m, "vllm:generation_tokens_total") == 8000
    assert value(m, "vllm:prefix_cache_queries_total") == 4000
    assert m["vllm:cache_config_info"][0].labels["kv_cache_size_tokens"] == "8192"
    assert value(m, "vllm:kv_cache_usage_perc") == 0


@pytest.mark.asyncio
async def test_options_reach_a_simulator_started_as_a_process() -> None:
    """The plugin's path (``running_simulator_process``: the command line): accept=0 accepts
    no draft, max_num_seqs=1 runs one request at a time, kv_preempt sizes the cache."""
    options = parse_sim_spec("sim:tiny?speed=20&accept=0&max_num_seqs=1&kv_preempt=40960")
    bodies = [
        {"prompt": ids(200, 110 + i), "max_tokens": 100, "ignore_eos": True} for i in range(3)
    ]
    with running_simulator_process(options) as url:
        async with aiohttp.ClientSession() as s:
            await asyncio.gather(*(stream(s, url + "/v1/completions", b) for b in bodies))
            m = await metrics(s, url)
    assert m["vllm:cache_config_info"][0].labels["kv_cache_size_tokens"] == "40960"
    assert value(m, "vllm:spec_decode_num_drafts_total") == 3 * 99
    assert value(m, "vllm:spec_decode_num_accepted_tokens_total") == 0
    assert value(m, "vllm:generation_tokens_total") == 300
    # one request per step, one token per step: a prefill step and 99 decode steps each (two
    # requests sharing a step would make fewer)
    assert value(m, "llmspeed_sim_steps_total") == 300
    assert value(m, "vllm:iteration_tokens_total_count") == 300
