"""Between-start noise (``start_noise``): each start of a simulator draws one speed factor,
``exp(F·z − F²/2)``, from ``start_seed`` when given (exact) or fresh OS entropy (two starts
differ), independent of ``seed``; the factor is reported by ``/sim/info``, the trace, the
``/metrics`` info line and the CLI's listening line, and every simulated time is divided by
the option's speed × the factor."""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
import urllib.request
from typing import Any

import numpy as np
import pytest

from pytest_llmspeed.sim import SimOptions, cli_args, parse_sim_spec, running_simulator
from pytest_llmspeed.sim import running_simulator_processes as processes
from pytest_llmspeed.sim.__main__ import build_parser
from pytest_llmspeed.sim.engine import start_factor
from pytest_llmspeed.sim.server import SimServer

from .test_cli import _env


def expected(noise: float, seed: int) -> float:
    """The factor computed here, from the generator the option names."""
    z = np.random.default_rng(seed).standard_normal()
    return math.exp(noise * z - noise**2 / 2)


def get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as resp:
        return json.load(resp)


def test_the_factor_is_exp_of_a_seeded_normal_and_one_without_noise() -> None:
    assert start_factor(0.0, 7) == 1.0 and start_factor(0.0) == 1.0
    assert start_factor(0.03, 7) == expected(0.03, 7)
    assert start_factor(0.03, 7) != start_factor(0.03, 8)


def test_the_factor_has_mean_one_and_log_spread_f() -> None:
    f = np.array([start_factor(0.1, seed) for seed in range(20_000)])
    # mean 1 by construction (−F²/2); the standard error of 20,000 draws is 0.1/√20000 = 0.0007
    assert abs(f.mean() - 1) < 5 * 0.1 / math.sqrt(20_000)
    assert np.log(f).std() == pytest.approx(0.1, rel=0.02)


def test_without_a_start_seed_two_starts_differ() -> None:
    options = SimOptions(start_noise=0.03)
    first, second = SimServer(options), SimServer(options)
    assert first.start_factor != second.start_factor
    assert 0.8 < first.start_factor < 1.25  # 7 standard deviations of a 3 % spread


def test_the_start_seed_is_exact_and_independent_of_the_run_seed() -> None:
    a = SimServer(SimOptions(start_noise=0.05, start_seed=4, seed=1))
    b = SimServer(SimOptions(start_noise=0.05, start_seed=4, seed=2))
    assert a.start_factor == b.start_factor == expected(0.05, 4)
    # the run's own draws (text, acceptance, step noise) still follow seed, not start_seed
    c = SimServer(SimOptions(start_noise=0.05, start_seed=9, seed=1))
    assert a.text.ids == c.text.ids and a.text.ids != b.text.ids


def test_every_simulated_time_is_divided_by_speed_times_the_factor() -> None:
    plain = SimServer(SimOptions(speed=2.0))
    noisy = SimServer(SimOptions(speed=2.0, start_noise=0.1, start_seed=3))
    factor = expected(0.1, 3)
    assert noisy.speed == 2.0 * factor and noisy.core.speed == noisy.speed
    # one engine step with nothing in it: the profile's base step time / speed
    assert plain.core.step_time([], []) / noisy.core.step_time([], []) == pytest.approx(factor)


def test_spec_keys_and_their_checks() -> None:
    opts = parse_sim_spec("sim:tiny?start_noise=0.03&start-seed=5")
    assert (opts.start_noise, opts.start_seed) == (0.03, 5)
    assert parse_sim_spec("sim").start_noise == 0.0 and parse_sim_spec("sim").start_seed is None
    with pytest.raises(ValueError, match=r"start_noise must be a fraction in \[0, 1\), got 1.0"):
        parse_sim_spec("sim:tiny?start_noise=1")
    with pytest.raises(ValueError, match="bad value 'x' for simulator option 'start_seed'"):
        parse_sim_spec("sim:tiny?start_seed=x")


def test_cli_args_carry_the_start_options() -> None:
    opts = SimOptions(start_noise=0.03, start_seed=5)
    args = build_parser().parse_args(cli_args(opts))
    assert (args.start_noise, args.start_seed) == (0.03, 5)
    plain = build_parser().parse_args(cli_args(SimOptions()))
    assert (plain.start_noise, plain.start_seed) == (0.0, None)


def test_the_factor_is_reported_by_the_running_server() -> None:
    opts = SimOptions(speed=20.0, start_noise=0.1, start_seed=7)
    factor = expected(0.1, 7)
    with running_simulator(opts) as url:
        info = get(url + "/sim/info")
        trace = get(url + "/sim/trace")
        with urllib.request.urlopen(url + "/metrics", timeout=10) as resp:
            metrics = resp.read().decode()
    assert info == {
        "profile": "tiny",
        "start_factor": factor,
        "start_noise": 0.1,
        "start_seed": 7,
        "speed": 20.0 * factor,
        "option_speed": 20.0,
        "drift": 0.0,  # no drift, no slower part: tests/sim/test_drift.py
        "drift_factor": 1.0,
        "slower": {},
    }
    assert trace["start_factor"] == factor
    assert f'start_factor="{factor!r}"' in metrics


def test_the_listening_line_says_the_factor() -> None:
    args = ["--port", "0", "--start-noise", "0.05", "--start-seed", "3"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "pytest_llmspeed.sim", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_env(),
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
    finally:
        proc.terminate()
        proc.communicate(timeout=10)
    match = re.search(r", start factor ([0-9.e-]+)\)$", line.strip())
    assert match, line
    assert float(match.group(1)) == expected(0.05, 3)


@pytest.mark.slow
def test_each_replica_is_a_start_of_its_own() -> None:
    opts = SimOptions(speed=20.0, start_noise=0.05, start_seed=11, replicas=2)
    with processes(opts) as urls:
        infos = [get(u + "/sim/info") for u in urls]
    assert [i["start_seed"] for i in infos] == [11, 12]
    assert [i["start_factor"] for i in infos] == [expected(0.05, 11), expected(0.05, 12)]
