"""The server's own figures of each cell, as a table the terminal (``-v``) and the page share,
and the one line that says what the server does not expose (docs/metrics.md, "Server figures
and why a cell changed")."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

from ..core.server_figures import SPECULATIVE
from ..results import CellRecord, ServerFigures


def _num(digits: int) -> Callable[[float], str]:
    return lambda v: f"{v:,.{digits}f}"


def _pct(v: float) -> str:
    return f"{v:.0%}"


def _ms(v: float) -> str:
    return f"{v * 1000:,.0f}"


#: (column heading, ServerFigures field, format), in the order shown
COLUMNS: tuple[tuple[str, str, Callable[[float], str]], ...] = (
    ("Steps/s", "steps_per_s", _num(1)),
    ("Out tok/step", "output_tokens_per_step", _num(2)),
    ("Running", "running_mean", _num(2)),
    ("Waiting", "waiting_mean", _num(2)),
    ("Accept len", "acceptance_length", _num(2)),
    ("Accept rate", "acceptance_rate", _pct),
    ("Preempted", "preemptions", _num(0)),
    ("Queue ms", "queue_time_mean_s", _ms),
    ("Prefill ms", "prefill_time_mean_s", _ms),
    ("Cache hits", "prefix_cache_hit_rate", _pct),
    ("KV max", "kv_usage_max", _pct),
)


def table(cells: Iterable[CellRecord]) -> tuple[list[str], list[list[str]]]:
    """The header (the cell, each column a cell has) and a row per cell with server figures
    (— where the server gave none); nothing when no cell has them."""
    with_server = [(c, c.server) for c in cells if c.server is not None]
    shown = [col for col in COLUMNS if any(getattr(s, col[1]) is not None for _, s in with_server)]
    if not shown:
        return [], []
    rows = [[str(c.id), *(_cell(s, col) for col in shown)] for c, s in with_server]
    return ["Cell", *(label for label, _, _ in shown)], rows


def _cell(server: ServerFigures, col: tuple[str, str, Callable[[float], str]]) -> str:
    value = getattr(server, col[1])
    return "—" if value is None else col[2](value)


def not_exposed(cells: Sequence[CellRecord]) -> str | None:
    """Once per run: the figures the server did not expose in any cell (absent from the cells,
    not zero), or None when it exposed them all or nothing at all."""
    servers = [c.server for c in cells if c.server is not None]
    if not servers:
        return None
    missing = set.intersection(*(set(s.missing) for s in servers))
    if missing.issuperset(SPECULATIVE):  # no speculative decoding on this server: no news
        missing -= set(SPECULATIVE)
    # memory traffic is opt-in (--enable-mfu-metrics): the bandwidth figure says its source
    missing.discard("read_bytes_per_s")
    if not missing:
        return None
    return "the server does not expose: " + ", ".join(sorted(missing)) + " (absent from the cells)"
