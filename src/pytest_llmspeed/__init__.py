"""pytest-llmspeed: LLM serving benchmarks (prefill, sustained decode) as pytest tests.

The parts, one folder each: ``core`` (the measurement core: client, server probe, prompts,
the two cells' protocol, statistics, matrix arithmetic, the benchmark driver), ``gate`` (the
baseline file and the verdicts), ``results`` (the typed records every output reads), ``report``
(terminal, Markdown, JUnit), ``plugin`` (the thin pytest layer) and ``sim`` (the simulator).
Only ``plugin`` imports pytest. The names below are the public surface; they are imported
lazily, so ``import pytest_llmspeed`` stays light. A script drives cells with ``Bench`` and
``BenchConfig`` (README, "Drive the core from a script").

PYTEST_DONT_REWRITE: pytest rewrites the asserts of every module of a pytest11 plugin's
package, and where it cannot cache the result (``PYTHONDONTWRITEBYTECODE``, a read-only
site-packages) it parses and compiles each of them on every run, tests that need no server
included. The package relies on no rewritten assert: this module is left as it is, and the
others are imported by Python's own path finder (:class:`_PlainImport`), from their bytecode.
"""

from __future__ import annotations

import sys
from importlib.machinery import ModuleSpec, PathFinder
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
    from collections.abc import Sequence
    from types import ModuleType

    from .core.bench import Bench, BenchConfig
    from .core.probe import ServerInfo
    from .plugin.fixtures import CellRunner, WarmPrefix
    from .results import CellId, CellRecord, Results, RunInfo, Status, load


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        import importlib

        return getattr(importlib.import_module(f".{_WHERE[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class _PlainImport:
    """A finder, ahead of pytest's assertion-rewriting import hook, for this package's
    modules only: Python's path finder imports them, as outside pytest (their asserts plain,
    their bytecode caches read). Installed only where that hook is, once per process."""

    llmspeed_plain_import = True

    @staticmethod
    def find_spec(
        name: str, path: Sequence[str] | None = None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        if not name.startswith(__name__ + "."):
            return None
        return PathFinder.find_spec(name, path, target)


def _import_plainly() -> None:
    finders = sys.meta_path
    if any(getattr(f, "llmspeed_plain_import", False) for f in finders):
        return
    if any(type(f).__module__ == "_pytest.assertion.rewrite" for f in finders):
        finders.insert(0, _PlainImport())


_import_plainly()
