"""JUnit XML ``user_properties`` of a cell: its scalar figures, in a fixed order."""

from __future__ import annotations

from typing import Any

from ..results import CellRecord


def properties(record: CellRecord) -> list[tuple[str, Any]]:
    """The record's scalar figures as ``(name, value)`` pairs for JUnit."""
    return record.properties()
