"""Fixtures of the simulator's tests: simulators started in-process, one per module."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from pytest_llmspeed.sim import SimOptions, running_simulator


@pytest.fixture(scope="module")
def tiny_url() -> Iterator[str]:
    """A fast ``tiny`` simulator shared by a module's tests."""
    with running_simulator(SimOptions(profile="tiny", speed=20.0)) as url:
        yield url
