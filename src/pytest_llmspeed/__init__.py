"""pytest-llmspeed: LLM serving benchmarks (prefill, sustained decode) as pytest tests.

The parts, one folder each: ``core`` (the measurement core: client, server probe, prompts,
the two cells' protocol, statistics, matrix arithmetic, the benchmark driver), ``gate`` (the
baseline file and the verdicts), ``results`` (the typed records every output reads), ``report``
(terminal, Markdown, JUnit), ``plugin`` (the thin pytest layer) and ``sim`` (the simulator).
Only ``plugin`` imports pytest. The names below are the public surface; they are imported
lazily, so ``import pytest_llmspeed`` stays light. A script drives cells with ``Bench`` and
``BenchConfig`` (README, "Drive the core from a script").
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

__all__ = [
    "Bench",
    "BenchConfig",
    "CellId",
    "CellRecord",
    "CellRunner",
    "Results",
    "RunInfo",
    "ServerInfo",
    "Status",
    "WarmPrefix",
    "__version__",
    "load",
]

_WHERE = {
    "Bench": "core.bench",
    "BenchConfig": "core.bench",
    "CellId": "results",
    "CellRecord": "results",
    "Results": "results",
    "RunInfo": "results",
    "Status": "results",
    "load": "results",
    "ServerInfo": "core.probe",
    "CellRunner": "plugin.fixtures",
    "WarmPrefix": "plugin.fixtures",
}

if TYPE_CHECKING:
    from .core.bench import Bench, BenchConfig
    from .core.probe import ServerInfo
    from .plugin.fixtures import CellRunner, WarmPrefix
    from .results import CellId, CellRecord, Results, RunInfo, Status, load


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        import importlib

        return getattr(importlib.import_module(f".{_WHERE[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
