"""What one session set out to measure: whether the built-in suite joins the user's tests (and
the rule that decided, in words), the cells of the selected tests, and whether any selected
test needs the server at all — without one, the plugin starts nothing and touches no network.

A test of yours that takes ``llm_cell`` and a context but no ``llm_concurrency`` names its cell
only when it runs (``llm_cell.decode(llm_prefix, 8)``): collection knows its context, not its
concurrency. Such a test is *open*: the header says so, and its progress lines name the cells
its runner announces (:mod:`.progress`).
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

import pytest

from .settings import OPTIONS
from .stash import CELL_KEY

if TYPE_CHECKING:
    from collections.abc import Iterable

    from ..results import CellId, Phase
    from .settings import Settings

#: the fixtures that need the server (any one of them in a test's closure)
FIXTURES = frozenset(
    {
        "llm_cell",
        "llm_prefix",
        "llm_bench",
        "llm_server",
        "llm_concurrency",
        "llm_rate",
        "llm_trace",
        "llm_conversation",
    }
)
_SUITE_MARKERS = re.compile(r"(?<!not )\b(decode|prefill|llmspeed|rate|trace|conversation)\b")
#: options that, given on the command line, ask for the speed test: a server to measure (or
#: two, an A/B), a baseline to gate against or to write, several runs, open-loop or
#: conversation cells
_ASKING = frozenset(
    (
        "endpoint",
        "serve",
        "endpoint-baseline",
        "serve-baseline",
        "baseline",
        "save-baseline",
        "runs",
        "rates",
        "trace",
        "turns",
    )
)
#: at most this many cells are named one by one in the header when they are not a grid
NAMED_CELLS = 4


def needs_server(item: pytest.Item) -> bool:
    """Does this test use the server (one of the ``llm_*`` fixtures, the built-in suite's
    tests included)?"""
    return bool(FIXTURES & set(getattr(item, "fixturenames", ())))


def is_open(item: pytest.Item) -> bool:
    """Does this test name its cell only when it runs: it runs cells (``llm_cell``) at a
    context, with no ``llm_concurrency`` and no ``prefill`` marker to say which? Its cell from
    collection is the context's prefill, which may be only the warm-up of a decode cell."""
    names = set(getattr(item, "fixturenames", ()))
    return (
        "llm_cell" in names
        and "llm_concurrency" not in names
        and "llm_rate" not in names  # a rate cell: named at collection (rate[8K-r2])
        and "llm_conversation" not in names  # so is a conversation cell
        and item.get_closest_marker("prefill") is None
    )


def _listed(contexts: Iterable[int | str]) -> str:
    """``1K,4K,max``: each context once, shortest first (``max`` and ``limit`` last)."""
    from ..results import context_label

    unique = set(contexts)
    ordered = sorted(unique, key=lambda c: (isinstance(c, str), c if isinstance(c, int) else 0))
    return ",".join(context_label(c) for c in ordered)


def selected_words(cells: list[CellId], open_contexts: list[int | str]) -> str:
    """What the selected cells are, for the header: ``contexts 8K,16K · concurrency 1,2`` when
    they are a grid (every context at every concurrency, prefill cells at those contexts),
    ``contexts 8K,16K · prefill only``, else ``cells decode[8K-c1], decode[16K-c2]`` (a few)
    or ``7 cells (not a full grid) · contexts … · concurrency …``; then the open tests: ``your
    test at 4K picks its cells (named as they run)``."""
    from ..results import Phase, rate_label

    parts = []
    rated = [c for c in cells if c.phase is Phase.RATE]
    talks = [c for c in cells if c.phase is Phase.CONVERSATION]
    traces = [c for c in cells if c.phase is Phase.TRACE]
    cells = [c for c in cells if not c.phase.open_loop and c.phase is not Phase.CONVERSATION]
    decode = [c for c in cells if c.phase is Phase.DECODE]
    contexts = _listed(c.context for c in cells)
    concurrency = ",".join(map(str, sorted({c.concurrency for c in decode if c.concurrency})))
    grid = {(c, n) for c in {c.context for c in cells} for n in {c.concurrency for c in decode}}
    if not cells:
        pass
    elif not decode:
        parts.append(f"contexts {contexts} · prefill only")
    elif len(grid) == len({(c.context, c.concurrency) for c in decode}):
        parts.append(f"contexts {contexts} · concurrency {concurrency}")
    elif len(set(cells)) <= NAMED_CELLS:
        parts.append("cells " + ", ".join(dict.fromkeys(str(c) for c in cells)))
    else:
        parts.append(
            f"{len(set(cells))} cells (not a full grid) · contexts {contexts} · "
            f"concurrency {concurrency}"
        )
    if rated:  # open-loop rate cells (docs/workloads.md)
        rates = ",".join(rate_label(r) for r in sorted({c.rate for c in rated if c.rate}))
        parts.append(f"rate cells at {_listed(c.context for c in rated)} · rates {rates}/s")
    if talks:  # conversation cells (docs/workloads.md)
        users = ",".join(map(str, sorted({c.concurrency for c in talks if c.concurrency})))
        turns = ",".join(map(str, sorted({c.turns for c in talks if c.turns})))
        parts.append(
            f"conversations at {_listed(c.context for c in talks)} · users {users} · turns {turns}"
        )
    if traces:  # a trace's cell is named after its file (docs/workloads.md)
        parts.append("trace " + ", ".join(dict.fromkeys(str(c.context) for c in traces)))
    if open_contexts:
        at = _listed(open_contexts)
        parts.append(
            f"your test at {at} picks its cells (named as they run)"
            if len(open_contexts) == 1
            else f"{len(open_contexts)} tests of yours at {at} pick their cells (named as they run)"
        )
    return " · ".join(parts) or "no cell selected"


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
        #: the tests that name their cell only when they run (:func:`is_open`), by node id
        self.open: set[str] = set()
        self.needs_server = False  # a selected test uses the server
        self.traces: list[str] = []  # the names of the selected trace cells
        self.trace_cells: dict[str, CellId] = {}  # test node id → its trace cell
        self.trace_spans: dict[CellId, float] = {}  # a trace cell → its trace's span (s)

    def mark_own(self, items: list[pytest.Item]) -> None:
        """Mark the user's tests that use the ``llm_*`` fixtures ``llmspeed``, before ``-m``
        selects, so that ``-m llmspeed`` and ``-m "not llmspeed"`` see them as speed tests."""
        for item in items:
            if needs_server(item):
                item.add_marker("llmspeed")

    def add_suite(self, config: pytest.Config, items: list[pytest.Item], collected: int) -> bool:
        """Add the built-in suite to the selected ``items`` (what is left of the ``collected``
        tests after ``-m``, ``-k`` and ``--deselect``)? Keeps the rule that decided."""
        add, self.rule = self._suite_rule(config, items, collected)
        return add

    def _suite_rule(
        self, config: pytest.Config, items: list[pytest.Item], collected: int
    ) -> tuple[bool, str]:
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
                f"built-in suite left out: {len(own)} selected test(s) of yours use the llm_* "
                "fixtures (--llm-builtin-suite=always adds it)"
            )
        if not collected:
            return True, "built-in suite added: no test of yours was collected"
        markexpr = config.getoption("markexpr", "") or ""
        if _SUITE_MARKERS.search(markexpr):
            return True, f"built-in suite added: -m {markexpr!r} names its markers"
        asked = [o.flag for o in OPTIONS if o.name in _ASKING and config.getoption(o.dest, None)]
        if asked:
            return True, f"built-in suite added: {' and '.join(asked)} given on the command line"
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
        self.open = {i.nodeid for i in measured if is_open(i)}
        self.needs_server = any(needs_server(i) for i in items)
        # a trace's cell (its name is no context: not a cell of the matrix, the gate's plan
        # or the A/B's rounds): the header's words and the progress lines
        replays = {
            i.nodeid: i.callspec.params["llm_trace"]  # type: ignore[attr-defined]
            for i in items
            if "llm_trace" in getattr(getattr(i, "callspec", None), "params", {})
        }
        if not replays:  # the results model only where a trace runs (a light unused plugin)
            self.trace_cells, self.trace_spans, self.traces = {}, {}, []
            return
        from ..results import CellId

        self.trace_cells = {n: CellId.trace(str(t.name)) for n, t in replays.items()}
        self.trace_spans = {CellId.trace(str(t.name)): float(t.span_s) for t in replays.values()}
        self.traces = [str(c.context) for c in self.trace_cells.values()]

    def phases(self) -> set[Phase]:
        """The kinds of the selected cells (a test of yours that names its cell when it runs
        counts as decode)."""
        from ..results import Phase

        return (
            {c.phase for c in self.node_cells.values()}
            | ({Phase.DECODE} if self.open else set())
            | ({Phase.TRACE} if self.traces else set())
        )

    def words(self) -> str:
        """What is selected to run, for the header (:func:`selected_words`)."""
        from ..results import CellId

        closed = [c for n, c in self.node_cells.items() if n not in self.open]
        closed += [CellId.trace(name) for name in self.traces]
        open_contexts = [c.context for n, c in self.node_cells.items() if n in self.open]
        return selected_words(closed, open_contexts)


def select_as_pytest_does(config: pytest.Config, items: list[pytest.Item]) -> list[pytest.Item]:
    """The built-in suite's ``items`` that ``--deselect``, ``-k`` and ``-m`` keep, the ones
    left out reported to ``pytest_deselected`` (so pytest counts them ``deselected``). The
    suite joins after pytest selected among your tests (a deselected test of yours must not
    decide whether it joins), so pytest's own selection is applied to it here, by pytest's own
    functions."""
    from _pytest.main import pytest_collection_modifyitems as deselect_by_prefix
    from _pytest.mark import deselect_by_keyword, deselect_by_mark

    kept = list(items)
    deselect_by_prefix(kept, config)
    deselect_by_keyword(kept, config)
    deselect_by_mark(kept, config)
    return kept
