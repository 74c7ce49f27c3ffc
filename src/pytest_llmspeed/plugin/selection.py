"""What one session set out to measure: whether the built-in suite joins the user's tests (and
the rule that decided, in words), the cells of the selected tests, and whether any selected
test needs the server at all — without one, the plugin starts nothing and touches no network.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

import pytest

from .settings import OPTIONS
from .stash import CELL_KEY

if TYPE_CHECKING:
    from ..results import CellId
    from .settings import Settings

#: the fixtures that need the server (any one of them in a test's closure)
FIXTURES = frozenset({"llm_cell", "llm_prefix", "llm_bench", "llm_server", "llm_concurrency"})
_SUITE_MARKERS = re.compile(r"\b(decode|prefill|llmspeed)\b")


def needs_server(item: pytest.Item) -> bool:
    """Does this test use the server (one of the ``llm_*`` fixtures, the built-in suite's
    tests included)?"""
    return bool(FIXTURES & set(getattr(item, "fixturenames", ())))


class Selection:
    """The built-in suite's rule, the selected cells, and whether the server is needed."""

    def __init__(self, settings: Settings):
        self.settings = settings
        #: which rule added or left out the built-in suite, in words
        self.rule = ""
        #: ids of the cells this session set out to measure (its items after -m / -k)
        self.selected: set[str] = set()
        self.node_cells: dict[str, CellId] = {}  # test node id → the cell it measures
        self.cells: list[CellId] = []  # the selected cells, in the order they run
        self.needs_server = False  # a selected test uses the server

    def add_suite(self, config: pytest.Config, items: list[pytest.Item]) -> bool:
        """Add the built-in suite to the collected ``items``? Keeps the rule that decided."""
        add, self.rule = self._suite_rule(config, items)
        return add

    def _suite_rule(self, config: pytest.Config, items: list[pytest.Item]) -> tuple[bool, str]:
        mode = self.settings.builtin_suite
        if mode != "auto":
            return (
                mode == "always",
                f"built-in suite {'added' if mode == 'always' else 'left out'} "
                f"(--llm-builtin-suite={mode})",
            )
        own = [i for i in items if needs_server(i)]
        if own:
            return False, (
                f"built-in suite left out: {len(own)} test(s) of yours use the llm_* fixtures "
                "(--llm-builtin-suite=always adds it)"
            )
        if not items:
            return True, "built-in suite added: no test of yours was collected"
        markexpr = config.getoption("markexpr", "") or ""
        if _SUITE_MARKERS.search(markexpr):
            return True, f"built-in suite added: -m {markexpr!r} names its markers"
        if config.getoption(OPTIONS[0].dest, None):
            return True, "built-in suite added: --llm-endpoint given on the command line"
        return False, (
            "built-in suite left out: the endpoint comes from the ini file or the environment and "
            "the command asks for no speed test (run with -m decode, -m llmspeed or "
            "--llm-builtin-suite=always)"
        )

    def choose(self, items: list[pytest.Item]) -> None:
        """The selected tests, once collection is over (after -m, -k, --deselect)."""
        measured = [i for i in items if CELL_KEY in i.stash]
        self.cells = [i.stash[CELL_KEY] for i in measured]
        self.selected = {str(c) for c in self.cells}
        self.node_cells = {i.nodeid: i.stash[CELL_KEY] for i in measured}
        self.needs_server = any(needs_server(i) for i in items)
