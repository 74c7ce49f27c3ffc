"""How late the client's event loop runs while a window is open: a heartbeat.

Every stream of a cell is read by one event loop. When the loop has more to do than it can (a
server faster than the client, or a machine whose other work takes the client's core), reads
wait in the sockets and are stamped late: the figures then measure the client, not the server.
A task that asks to wake every ``TICK_S`` and notes how late it woke sees exactly that wait,
whatever its cause (docs/client-at-scale.md).
"""

from __future__ import annotations

import asyncio
import time
from array import array
from dataclasses import dataclass

#: the heartbeat's period
TICK_S = 0.01
#: a wake-up this late means reads stamped this late: above it, the loop is behind
LATE_S = 0.05
#: the share of a window the loop may spend behind before the cell says so
LATE_SHARE = 0.1
#: how a cell's note that the client could not keep up begins (``CellRecord.notes``; the
#: report says what it means, ``report.notes.CLIENT_BEHIND``)
CLIENT_PREFIX = "client: event loop "


@dataclass(frozen=True)
class LoopLag:
    """How late the event loop ran over a window."""

    max_ms: float  # the latest wake-up
    late_s: float  # seconds of the window spent more than LATE_S behind
    window_s: float

    @property
    def behind(self) -> bool:
        """The loop was behind for more than LATE_SHARE of the window."""
        return self.window_s > 0 and self.late_s > LATE_SHARE * self.window_s

    def note(self) -> str | None:
        """The cell's note when the client could not keep up; None when it could."""
        if not self.behind:
            return None
        return (
            f"{CLIENT_PREFIX}up to {self.max_ms:,.0f} ms late, {self.late_s:.1f} s of "
            f"{self.window_s:.1f} s more than {LATE_S * 1e3:.0f} ms behind"
        )


class Heartbeat:
    """Wakes every TICK_S while it runs and keeps how late each wake-up was (16 bytes each:
    100 a second)."""

    def __init__(self) -> None:
        self.times = array("d")
        self.lates = array("d")

    async def run(self) -> None:
        clock = time.perf_counter
        while True:
            t = clock()
            await asyncio.sleep(TICK_S)
            now = clock()
            self.times.append(now)
            self.lates.append(max(now - t - TICK_S, 0.0))

    def lag(self, w0: float, w1: float) -> LoopLag | None:
        """The loop's lateness over [w0, w1] (None: no wake-up in it). A wake-up ``late``
        seconds late stands for that much time behind."""
        inside = [late for t, late in zip(self.times, self.lates, strict=True) if w0 <= t <= w1]
        if not inside or w1 <= w0:
            return None
        late = sum(x for x in inside if x > LATE_S)
        return LoopLag(max(inside) * 1e3, late, w1 - w0)
