"""The event loop's heartbeat (``core/heartbeat.py``): how late it ran and how much CPU it used
over a window, when a cell says its client could not keep up, and when ``auto`` adds a client
process (``core/bench.more_processes``)."""

from array import array

import pytest

from pytest_llmspeed.core.bench import more_processes
from pytest_llmspeed.core.heartbeat import Heartbeat, LoopLag
from pytest_llmspeed.results import Flag, FlagKind


def beats(lates: list[float], cpu_per_tick: float = 0.005) -> Heartbeat:
    """A heartbeat that woke every 10 ms (plus its lateness), using ``cpu_per_tick`` each."""
    h = Heartbeat()
    t = cpu = 0.0
    for late in lates:
        t += 0.01 + late
        cpu += cpu_per_tick
        h.times.append(t)
        h.lates.append(late)
        h.cpu.append(cpu)
    return h


def test_a_loop_on_time_is_not_behind():
    lag = beats([0.001] * 300).lag(0.0, 3.0)
    assert lag is not None and not lag.behind and lag.flag() is None and lag.note() is None
    assert lag.max_ms == pytest.approx(1.0) and lag.late_s == 0.0
    assert lag.cpu_share == pytest.approx(0.005 / 0.011, rel=1e-9)  # its CPU over its span


def test_a_loop_late_for_over_a_tenth_of_the_window_says_so():
    # 80 ms late every 5th wake-up: 0.08 s late in each 0.13 s
    lates = [0.08 if i % 5 == 0 else 0.0 for i in range(100)]
    lag = beats(lates).lag(0.0, 3.0)
    assert lag is not None and lag.behind
    assert lag.late_s == pytest.approx(20 * 0.08) and lag.max_ms == pytest.approx(80.0)
    detail = "up to 80 ms late, 1.6 s of 3.0 s more than 50 ms behind"
    assert lag.flag() == Flag(FlagKind.CLIENT_BEHIND, detail)
    assert lag.note() == f"client: event loop {detail}"  # the words a person reads


def test_late_wake_ups_outside_the_window_do_not_count():
    h = beats([0.2] * 10 + [0.0] * 100)  # late before the window opens (t < 2.1)
    lag = h.lag(2.2, 3.0)
    assert lag is not None and lag.late_s == 0.0 and not lag.behind
    assert Heartbeat().lag(0.0, 1.0) is None  # no wake-up: nothing measured


@pytest.mark.parametrize(
    ("lag", "current", "cores", "why"),
    [
        (LoopLag(5.0, 0.0, 8.0, 0.93), 1, 2, "used 93% of a core"),
        (LoopLag(90.0, 2.0, 8.0, 0.5), 1, 2, "fell behind"),
        (LoopLag(5.0, 0.0, 8.0, 0.6), 1, 2, None),  # room left on its core
        (LoopLag(5.0, 0.0, 8.0, 0.99), 2, 2, None),  # no core for one more
        (None, 1, 2, None),  # not measured
    ],
)
def test_auto_adds_a_process_only_when_one_is_the_limit(lag, current, cores, why):
    assert more_processes(current, lag, cores) == why


def test_the_arrays_stay_compact():
    h = beats([0.0] * 10)
    assert all(isinstance(a, array) for a in (h.times, h.lates, h.cpu))
