"""Cells as pytest-benchmark entries: the cell's own timing samples (time between tokens, or
TTFT for prefill) become the entry's rounds, its figures the entry's ``extra_info``.

Only when the run asks for what an entry gives (``ASKED``: pytest-benchmark's history, JSON,
comparison, histogram, CSV, or ``--benchmark-enable`` for its table): otherwise the matrix is
already the plugin's own summary, and pytest-benchmark's table of per-token microseconds after
it would say the same in another unit (docs/design.md, "pytest-benchmark")."""

from __future__ import annotations

from typing import Any

import pytest

from ..results import CellRecord, Phase

# pytest-benchmark's options (their dests) that ask for its entries: saved history
# (--benchmark-save / --benchmark-autosave), --benchmark-json, a comparison with history
# (--benchmark-compare, --benchmark-compare-fail), --benchmark-histogram, --benchmark-csv,
# its table on purpose (--benchmark-enable, --benchmark-verbose, --benchmark-columns,
# --benchmark-time-unit)
ASKED = (
    "benchmark_save",
    "benchmark_autosave",
    "benchmark_json",
    "benchmark_compare",
    "benchmark_compare_fail",
    "benchmark_histogram",
    "benchmark_csv",
    "benchmark_enable",
    "benchmark_verbose",
    "benchmark_columns",
    "benchmark_time_unit",
)


def asked(config: pytest.Config) -> bool:
    """Whether this run asked pytest-benchmark for something a cell's entry gives."""
    if not config.pluginmanager.hasplugin("benchmark"):
        return False
    if config.getoption("benchmark_skip", False):
        return False  # its fixture would skip the cell's test
    enabled = bool(config.getoption("benchmark_enable", False))
    if config.getoption("benchmark_disable", False) and not enabled:
        return False
    return any(config.getoption(name, None) for name in ASKED)


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
    """Make the cell a pytest-benchmark entry, when the run asked for one (``asked``)."""
    samples = record.samples
    if samples is None:
        return
    samples_ms = samples.ttft_ms if record.phase is Phase.PREFILL else samples.tbt_ms
    if not samples_ms or not asked(request.config):
        return
    fixture = request.getfixturevalue("benchmark")
    fixture.group = f"llmspeed {record.phase.value}"
    fixture.extra_info.update(dict(record.properties()))
    record_samples(fixture, [ms / 1e3 for ms in samples_ms])
