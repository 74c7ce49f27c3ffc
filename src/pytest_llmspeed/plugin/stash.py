"""Stash keys shared by the plugin's modules (import-light)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from ..results import CellId
    from .session import LLMSpeedRun

RUN_KEY: pytest.StashKey[LLMSpeedRun] = pytest.StashKey()
#: the cell a built-in or parametrized test item measures
CELL_KEY: pytest.StashKey[CellId] = pytest.StashKey()
