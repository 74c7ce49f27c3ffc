"""Cells as pytest-benchmark entries: the cell's own timing samples (time between tokens, or
TTFT for prefill) become the entry's rounds, its figures the entry's ``extra_info``."""

from __future__ import annotations

from typing import Any

import pytest

from ..results import CellRecord, Phase


def record_samples(fixture: Any, samples_s: list[float]) -> None:
    """Fill a pytest-benchmark fixture with samples measured elsewhere.

    pytest-benchmark times calls it makes itself and has no public way to take samples that
    were measured by someone else; its fixture keeps the mode (which makes it report, and
    refuse a second use) and builds its statistics in private members. This is the one place
    that touches them; tests/unit/test_private_access.py fails loudly when pytest-benchmark
    changes them."""
    fixture._mode = "pytest-llmspeed"  # samples come from the cell, not from calls
    stats = fixture._make_stats(1)
    for value in samples_s:
        stats.update(value)


def report(request: pytest.FixtureRequest, record: CellRecord) -> None:
    """Make the cell a pytest-benchmark entry (when pytest-benchmark is active)."""
    samples = record.samples
    if samples is None:
        return
    samples_ms = samples.ttft_ms if record.phase is Phase.PREFILL else samples.tbt_ms
    config = request.config
    if not samples_ms or not config.pluginmanager.hasplugin("benchmark"):
        return
    if config.getoption("benchmark_skip", False) or config.getoption("benchmark_disable", False):
        return
    fixture = request.getfixturevalue("benchmark")
    fixture.group = f"llmspeed {record.phase.value}"
    fixture.extra_info.update(dict(record.properties()))
    record_samples(fixture, [ms / 1e3 for ms in samples_ms])
