"""Stash keys shared by the plugin's modules (import-light)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    pass

RUN_KEY = pytest.StashKey["LLMSpeedRun"]()
#: (phase, context param, concurrency) of a built-in or parametrized cell item
CELL_KEY = pytest.StashKey[tuple[str, "int | str", "int | None"]]()
