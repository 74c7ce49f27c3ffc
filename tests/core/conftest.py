"""Servers the core's tests share."""

from collections.abc import Iterator

import pytest

from pytest_llmspeed.sim import SimOptions, running_simulator_process


@pytest.fixture(scope="module")
def reference_sim() -> Iterator[str]:
    """The reference (H200) profile at real speed, in its own process, for a module's tests."""
    with running_simulator_process(SimOptions(profile="h200-qwen3.5-27b-int4")) as url:
        yield url
