"""What an A/B's cell record should count as blocks, given the rounds it left out."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

#: rounds in a block (old new new old, or its mirror)
BLOCK = 4


def blocks_kept(cell: Mapping[str, Any], rounds: int = 8) -> int:
    """The blocks of ``rounds`` rounds that the judge keeps for ``cell``: each block with a
    round left out as a stalled window (``left_out``: "round 2 (new): ... ×4.6") is dropped
    whole. A machine that another process took for a few seconds stalls a round; leaving it
    out is the A/B's rule, so a test counts on it, not on the machine being quiet."""
    dropped = {
        (int(n) - 1) // BLOCK for n in re.findall(r"round (\d+)", " ".join(cell["left_out"]))
    }
    return rounds // BLOCK - len(dropped)
