"""The simulator can drift, and be a second version with one factor slower (issue 31): the
speed wanders over minutes, shared by every start with the same seed at the same moment; a
version with ``slower=decode:0.1`` takes 10 % longer per decode step with every draw the same."""

from __future__ import annotations

import math

import aiohttp
import pytest

from pytest_llmspeed.sim import SimOptions, parse_sim_spec, running_simulator_process
from pytest_llmspeed.sim.engine import Drift, EngineCore, SimRequest, parse_slower
from pytest_llmspeed.sim.profiles import get_profile


def test_drift_stays_within_its_amplitude_and_wanders_over_periods():
    drift = Drift(0.2, period_s=60.0, seed=7)
    t0 = 1_800_000_000.0
    factors = [drift.factor(t0 + 5.0 * i) for i in range(12 * 40)]  # 40 periods, every 5 s
    assert all(0.8 <= f <= 1.2 for f in factors)
    assert max(factors) - min(factors) > 0.2  # it does wander: more than one amplitude apart
    # smooth: a second apart, a small fraction of the range
    steps = [abs(drift.factor(t0 + i + 1.0) - drift.factor(t0 + i)) for i in range(600)]
    assert max(steps) < 0.02
    # a function of the clock and the seed only: another start at the same moment agrees
    assert Drift(0.2, 60.0, 7).factor(t0 + 123.4) == drift.factor(t0 + 123.4)
    assert Drift(0.2, 60.0, 8).factor(t0 + 123.4) != drift.factor(t0 + 123.4)
    assert Drift(0.0, 60.0, 7).factor(t0) == 1.0


def test_slower_parses_each_part_and_refuses_in_words():
    assert parse_slower("decode:0.1") == {"decode": 0.1}
    assert parse_slower("decode:0.05, prefill:0.2") == {"decode": 0.05, "prefill": 0.2}
    assert parse_slower(None) == {} and parse_slower("") == {}
    for bad, words in [
        ("gpu:0.1", "PART one of decode, prefill, frontend"),
        ("decode", "expected PART:FRACTION"),
        ("decode:fast", "'fast' is not a number"),
        ("decode:0.1,decode:0.2", "each part once"),
        ("decode:-1", "a fraction in -0.9"),
    ]:
        with pytest.raises(ValueError, match=words):
            parse_slower(bad)
    with pytest.raises(ValueError, match=r"bad simulator spec.*slower"):
        parse_sim_spec("sim:tiny?slower=gpu:0.1")
    with pytest.raises(ValueError, match="drift must be a fraction"):
        SimOptions(drift=1.5)


def _request(prompt_len: int) -> SimRequest:
    return SimRequest(prompt_ids=list(range(100, 100 + prompt_len)), max_tokens=10)


def test_a_slower_version_slows_only_its_part():
    profile = get_profile("tiny")
    base = EngineCore(profile)
    slow_decode = EngineCore(profile, slower={"decode": 0.1})
    slow_prefill = EngineCore(profile, slower={"prefill": 0.25})
    decoding = [_request(500), _request(800)]
    for r in decoding:
        r.output = 40
    chunk = [(_request(1000), 512)]
    assert math.isclose(slow_decode.step_time(decoding, []), 1.1 * base.step_time(decoding, []))
    assert math.isclose(slow_prefill.step_time(decoding, []), base.step_time(decoding, []))
    # a step with a prefill chunk: the chunk's part 25 % longer, the decode part as it was
    only_chunk = base.step_time(decoding, chunk) - base.step_time(decoding, [])
    assert math.isclose(
        slow_prefill.step_time(decoding, chunk), base.step_time(decoding, []) + 1.25 * only_chunk
    )


def test_the_engine_runs_at_the_drifts_speed():
    profile = get_profile("tiny")
    drift = Drift(0.2, period_s=60.0, seed=3)
    engine = EngineCore(profile, speed=2.0, drift=drift)
    steady = EngineCore(profile, speed=2.0)
    batch = [_request(300)]
    ratio = steady.step_time(batch, []) / engine.step_time(batch, [])
    # the factor read at the same moment (the curve moves by far less within a call)
    assert ratio == pytest.approx(drift.factor(), abs=1e-3)


@pytest.mark.asyncio
async def test_drift_and_slower_reach_a_simulator_started_as_a_process():
    spec = "sim:tiny?speed=5&drift=0.2&drift_period=30&drift_seed=11&slower=decode:0.1"
    options = parse_sim_spec(spec)
    with running_simulator_process(options) as url:
        async with aiohttp.ClientSession() as session:
            async with session.get(url + "/sim/info") as resp:
                info = await resp.json()
            async with session.get(url + "/metrics") as resp:
                text = await resp.text()
    expected = Drift(0.2, 30.0, 11).factor()
    assert info["drift"] == 0.2 and info["slower"] == {"decode": 0.1}
    assert info["drift_factor"] == pytest.approx(expected, abs=0.01)  # read a moment apart
    (line,) = [x for x in text.splitlines() if x.startswith("llmspeed_sim_drift_factor ")]
    assert float(line.split()[1]) == pytest.approx(expected, abs=0.01)
