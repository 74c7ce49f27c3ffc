"""SimOptions, parse_sim_spec, the --faults grammar and --quirks."""

from __future__ import annotations

import pytest

from pytest_llmspeed.sim import QUIRKS, SimOptions, parse_quirks, parse_sim_spec
from pytest_llmspeed.sim.faults import FaultSpec, parse_faults


def test_plain_sim_is_tiny_defaults() -> None:
    assert parse_sim_spec("sim") == SimOptions()
    assert SimOptions().profile == "tiny"


def test_profile_and_query() -> None:
    opts = parse_sim_spec(
        "sim:h200-qwen3.5-27b-int4?speed=10&noise=0.03&kv-capacity=1048576&max_model_len=131072"
        "&seed=7&stream_interval=4&api_key=k&faults=start500=0.1,drop=0.2"
    )
    assert opts.profile == "h200-qwen3.5-27b-int4"
    assert (opts.speed, opts.noise, opts.seed, opts.stream_interval) == (10.0, 0.03, 7, 4)
    assert (opts.kv_capacity, opts.max_model_len, opts.api_key) == (1048576, 131072, "k")
    assert parse_faults(opts.faults) == FaultSpec(start500=0.1, drop=0.2)
    assert parse_sim_spec("sim:tiny").profile == "tiny"


@pytest.mark.parametrize(
    ("spec", "needle"),
    [
        ("sim:nope", "valid profiles: h200-qwen3.5-27b-int4, tiny"),
        ("sim:tiny?sped=2", "unknown simulator option 'sped'"),
        ("sim:tiny?speed=fast", "bad value 'fast' for simulator option 'speed'"),
        ("sim:tiny?seed=1.5", "expected an integer"),
        ("sim:tiny?speed=0", "speed must be positive"),
        ("sim:tiny?faults=explode=1", "unknown fault 'explode'"),
        ("sim:tiny?quirks=no-metrics,no-json", "unknown quirk 'no-json'; valid quirks: no-vendor"),
        ("sim:tiny?kv_capacity=1024", "smaller than max_model_len"),
        ("simulator", "must be 'sim' or 'sim:PROFILE"),
    ],
)
def test_bad_specs_name_the_problem(spec: str, needle: str) -> None:
    with pytest.raises(ValueError) as info:
        parse_sim_spec(spec)
    assert needle in str(info.value)


def test_unknown_option_lists_valid_ones() -> None:
    with pytest.raises(ValueError) as info:
        parse_sim_spec("sim:tiny?bogus=1")
    for name in ("speed", "kv_capacity", "max_model_len", "noise", "seed", "faults"):
        assert name in str(info.value)


def test_fault_grammar() -> None:
    spec = parse_faults(
        "start500=0.05, midstream=0.01,drop=0.01,stall=0.01,burst503=0.02,stall_s=2s,burst-s=0.5"
    )
    assert spec == FaultSpec(0.05, 0.01, 0.01, 0.01, 0.02, 2.0, 0.5)
    assert spec.any
    assert not parse_faults(None).any
    assert not parse_faults("none").any
    for bad in ("start500", "start500=2", "drop=x", "stall_s=0", "midstream=0.6,drop=0.6"):
        with pytest.raises(ValueError):
            parse_faults(bad)


def test_quirks() -> None:
    assert parse_quirks(None) == frozenset()
    assert parse_quirks("no-metrics+text-only") == {"no-metrics", "text-only"}
    assert parse_quirks(" no-metrics , text-only ,") == {"no-metrics", "text-only"}
    opts = parse_sim_spec("sim:tiny?quirks=" + ",".join(QUIRKS))
    assert parse_quirks(opts.quirks) == set(QUIRKS)
