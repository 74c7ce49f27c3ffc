"""Fixtures of the simulator's tests: simulators started in-process, one per module."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

try:
    import pytest_llmspeed.sim  # noqa: F401
except ImportError:  # not installed: use the source tree
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))

from pytest_llmspeed.sim import SimOptions, running_simulator


@pytest.fixture(scope="module")
def tiny_url() -> Iterator[str]:
    """A fast ``tiny`` simulator shared by a module's tests."""
    with running_simulator(SimOptions(profile="tiny", speed=20.0)) as url:
        yield url
