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

from ..results import Flag, FlagKind

#: the heartbeat's period
TICK_S = 0.01
#: a wake-up this late means reads stamped this late: above it, the loop is behind
LATE_S = 0.05
#: the share of a window the loop may spend behind before the cell says so
LATE_SHARE = 0.1


@dataclass(frozen=True)
class LoopLag:
    """How late the event loop ran over a window."""

    max_ms: float  # the latest wake-up
    late_s: float  # seconds of the window spent more than LATE_S behind
    window_s: float
    cpu_share: float | None = None  # the process's CPU time over the window / its length

    @property
    def behind(self) -> bool:
        """The loop was behind for more than LATE_SHARE of the window."""
        return self.window_s > 0 and self.late_s > LATE_SHARE * self.window_s

    def flag(self) -> Flag | None:
        """The cell's flag when the client could not keep up (``FlagKind.CLIENT_BEHIND``; the
        report says what it means, ``report.notes.CLIENT_BEHIND``); None when it could."""
        if not self.behind:
            return None
        return Flag(
            FlagKind.CLIENT_BEHIND,
            f"up to {self.max_ms:,.0f} ms late, {self.late_s:.1f} s of {self.window_s:.1f} s "
            f"more than {LATE_S * 1e3:.0f} ms behind",
        )

    def note(self) -> str | None:
        """The flag in words (``client: event loop up to …``); None when the client kept up."""
        flag = self.flag()
        return None if flag is None else flag.text()


class Heartbeat:
    """Wakes every TICK_S while it runs and keeps how late each wake-up was (16 bytes each:
    100 a second)."""

    def __init__(self) -> None:
        self.times = array("d")
        self.lates = array("d")
        self.cpu = array("d")  # the process's CPU seconds at each wake-up

    async def run(self) -> None:
        clock, cpu = time.perf_counter, time.process_time
        while True:
            t = clock()
            await asyncio.sleep(TICK_S)
            now = clock()
            self.times.append(now)
            self.lates.append(max(now - t - TICK_S, 0.0))
            self.cpu.append(cpu())

    def lag(self, w0: float, w1: float) -> LoopLag | None:
        """The loop's lateness over [w0, w1] (None: no wake-up in it). A wake-up ``late``
        seconds late stands for that much time behind."""
        at = [i for i, t in enumerate(self.times) if w0 <= t <= w1]
        if not at or w1 <= w0:
            return None
        inside = [self.lates[i] for i in at]
        late = sum(x for x in inside if x > LATE_S)
        share = None
        span = self.times[at[-1]] - self.times[at[0]]
        if len(self.cpu) == len(self.times) and span > 0:
            share = (self.cpu[at[-1]] - self.cpu[at[0]]) / span
        return LoopLag(max(inside) * 1e3, late, w1 - w0, share)
