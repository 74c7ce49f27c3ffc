"""EngineCore on a virtual clock: scheduling, KV admission, prefix cache, MTP, step times."""

from __future__ import annotations

import dataclasses
import random

from pytest_llmspeed.sim.engine import BlockPool, EngineCore, SimRequest
from pytest_llmspeed.sim.profiles import get_profile

TINY = get_profile("tiny")


def ids(n: int, seed: int) -> list[int]:
    r = random.Random(seed)
    return [r.randrange(300, 32000) for _ in range(n)]


class Clock:
    """Drives a core step by step in virtual time."""

    def __init__(self, core: EngineCore) -> None:
        self.core = core
        self.now = 0.0
        self.plans: list = []

    def step(self) -> list:
        t = self.core.next_event(self.now)
        assert t is not None
        self.now = max(self.now, t)
        plan = self.core.plan(self.now)
        assert plan is not None
        self.plans.append(plan)
        self.now += plan.duration
        return self.core.complete(plan, self.now)

    def run(self, *reqs: SimRequest) -> None:
        while any(r.state != "finished" for r in reqs):
            self.step()


def test_chunked_prefill_respects_budget_and_first_token() -> None:
    core = EngineCore(TINY)
    clock = Clock(core)
    req = SimRequest(ids(20000, 1), 5, ignore_eos=True)
    core.add(req, 0.0)
    clock.run(req)
    chunks = [q for plan in clock.plans for _, q in plan.prefill]
    assert chunks == [8192, 8192, 3616]
    assert req.output == 5 and req.finish_reason == "length"
    assert core.stats.prompt_tokens == 20000 and core.stats.generation_tokens == 5


def test_mtp_steps_give_one_to_three_tokens_at_profile_mean() -> None:
    core = EngineCore(TINY)
    clock = Clock(core)
    req = SimRequest(ids(64, 2), 3000, ignore_eos=True)
    core.add(req, 0.0)
    counts = []
    while req.state != "finished":
        counts += [n for r, n, _ in clock.step() if r is req]
    assert set(counts[1:-1]) == {1, 2, 3}
    mean = (sum(counts) - 1 - counts[-1]) / (len(counts) - 2)
    assert abs(mean / TINY.mean_tokens_per_step - 1) < 0.01


def test_prefix_cache_hit_and_counters() -> None:
    core = EngineCore(TINY)
    clock = Clock(core)
    prompt = ids(1000, 3)
    a = SimRequest(prompt, 2, ignore_eos=True)
    core.add(a, 0.0)
    clock.run(a)
    b = SimRequest(prompt[:992] + ids(8, 4), 2, ignore_eos=True)
    core.add(b, clock.now)
    clock.run(b)
    assert a.cached_tokens == 0
    assert b.cached_tokens == 992  # 62 full blocks of 16
    assert core.stats.prefix_queries == 2000 and core.stats.prefix_hits == 992
    c = SimRequest(prompt[:992], 2, ignore_eos=True)  # fully cached: last block recomputed
    core.add(c, clock.now)
    clock.run(c)
    assert c.cached_tokens == 976


def test_admission_waits_for_kv_then_runs() -> None:
    core = EngineCore(TINY, kv_capacity=4096)
    clock = Clock(core)
    reqs = [SimRequest(ids(1000, 10 + i), 1000, ignore_eos=True) for i in range(3)]
    for r in reqs:
        core.add(r, 0.0)
    clock.step()
    assert core.num_running == 2 and core.num_waiting == 1
    assert core.kv_usage > 0.9
    clock.run(*reqs)
    first, end0, end1 = reqs[2].first_token_time, reqs[0].last_token_time, reqs[1].last_token_time
    assert first is not None and end0 is not None and end1 is not None
    assert first > min(end0, end1) - 1e-9
    assert core.num_running == 0 and core.pool.used == 0


def test_lru_eviction_keeps_recent_prefixes() -> None:
    pool = BlockPool(10)
    pool.allocate([], 0, 4)
    for h in (1, 2, 3, 4):
        assert pool.register(h)
    pool.release([1, 2, 3, 4], 0)  # tail (4) becomes least recently used
    assert pool.used == 0 and len(pool.lru) == 4
    pool.allocate([], 0, 8)  # 6 free, so 2 cached blocks are evicted: the tail first
    assert set(pool.cached) == {1, 2}
    assert pool.hit_blocks([1, 2, 3], 3) == 2
    assert not pool.can_allocate([], 0, 3)


def test_step_time_grows_with_batch_and_context_and_divides_by_speed() -> None:
    core = EngineCore(get_profile("h200-qwen3.5-27b-int4"))
    fast = EngineCore(get_profile("h200-qwen3.5-27b-int4"), speed=10.0)

    def seqs(n: int, ctx: int) -> list[SimRequest]:
        return [SimRequest([1] * ctx, 10) for _ in range(n)]

    t1, t8 = core.step_time(seqs(1, 8192), []), core.step_time(seqs(8, 8192), [])
    assert t8 > t1 and core.step_time(seqs(1, 131072), []) > t1
    assert abs(fast.step_time(seqs(4, 8192), []) * 10 - core.step_time(seqs(4, 8192), [])) < 1e-12


def test_noise_is_seeded_and_mean_preserving() -> None:
    profile = get_profile("tiny")
    a = EngineCore(profile, noise=0.05, seed=3)
    b = EngineCore(profile, noise=0.05, seed=3)
    seq = [SimRequest([1] * 100, 10)]
    xs = [a.step_time(seq, []) for _ in range(4000)]
    assert xs[:50] == [b.step_time(seq, []) for _ in range(50)]
    base = EngineCore(profile).step_time(seq, [])
    assert len(set(xs)) > 100 and abs(sum(xs) / len(xs) / base - 1) < 0.01


def test_eos_without_ignore_eos_respects_min_tokens() -> None:
    profile = dataclasses.replace(TINY, eos_probability=0.2)
    core = EngineCore(profile, seed=5)
    clock = Clock(core)
    reqs = [SimRequest(ids(32, 20 + i), 200, min_tokens=10) for i in range(20)]
    for r in reqs:
        core.add(r, 0.0)
    clock.run(*reqs)
    stopped = [r for r in reqs if r.finish_reason == "stop"]
    assert stopped and all(10 < r.output < 200 for r in stopped)
