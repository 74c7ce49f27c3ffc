"""Machine-readable results: one JSON file rewritten atomically after every cell."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

SCHEMA = "pytest-llmspeed/results/v1"


class ResultsFile:
    """Keeps the run's metadata and cells; ``write()`` replaces the file in one step."""

    def __init__(self, path: str | os.PathLike[str] | None, metadata: dict[str, Any]):
        self.path = Path(path) if path else None
        self.metadata = metadata
        self.cells: dict[str, dict[str, Any]] = {}

    def add(self, record: dict[str, Any]) -> None:
        self.cells[record["id"]] = record
        self.write()

    def document(self) -> dict[str, Any]:
        return {"schema": SCHEMA, "run": self.metadata, "cells": list(self.cells.values())}

    def write(self) -> None:
        if self.path is None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=".llmspeed-", suffix=".json")
        with os.fdopen(fd, "w") as fh:
            json.dump(self.document(), fh, indent=1)
            fh.write("\n")
        os.replace(tmp, self.path)
