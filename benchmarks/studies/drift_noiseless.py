"""Which decode cells of the demo get a drift note, on a machine that adds no noise at all.

The demo (``tox -e demo``: the H200 profile at 10x, 3 s windows) runs on a shared machine,
where another process's CPU is noise in every figure. Here the simulator's ``EngineCore``
runs each decode cell of the reference matrix on a virtual clock (``benchmarks.reference_fit``:
no HTTP, no sleeping), so its token series is the one a perfectly quiet machine would stream,
and 30 virtual seconds at speed 1 are the demo's 3 s at speed 10 (the same tokens, the time
scaled by 10: every relative figure the same). Each cell's requests go through
``core.stats.decode_stats``, as the plugin's would, and the table shows the trend the drift test
fits, whether it is flagged (significant at 1 %, at least 1 %), the figure's 95 % interval,
the trend against the interval's width, and whether the cell gets a note
(``core.intervals.drift_noted``, docs/metrics.md "Drift") with fixed windows, and with
``--llm-precision`` (as if its window had run to the end).

A second table does the same for a server that throttles: every engine step of the window
``--throttle`` (a fraction) slower at the window's end than at its start, growing linearly.

Usage: ``python -m benchmarks.studies.drift_noiseless [--throttle 0.05] [--write]``.
"""

from __future__ import annotations

import argparse

from benchmarks.common import RESULTS, command, table, utc_now, write_page
from benchmarks.reference_fit import CONCURRENCY, CONTEXTS, REF_DECODE, SUFFIX, M, VirtualRun
from pytest_llmspeed.core.intervals import drift_noted
from pytest_llmspeed.core.stats import DecodeStats, RequestTrace, decode_stats
from pytest_llmspeed.sim.engine import SimRequest
from pytest_llmspeed.sim.profiles import get_profile

WINDOW = 30.0


class _Log:
    def __init__(self) -> None:
        self.times: list[float] = []
        self.counts: list[int] = []

    def emit(self, req: SimRequest, n_new: int, finish: str | None, now: float) -> None:
        if n_new > 0:
            self.times.append(now)
            self.counts.append(n_new)


class ThrottledRun(VirtualRun):
    """A virtual run whose steps grow slower over the window: ``throttle`` slower at its end."""

    throttle = 0.0
    window_start: float | None = None

    def step(self) -> list[tuple[SimRequest, int, str | None]]:
        core = self.core
        t = core.next_event(self.now)
        assert t is not None, "engine idle while requests are expected"
        self.now = max(self.now, t)
        plan = core.plan(self.now)
        assert plan is not None, "nothing schedulable"
        into = 0.0 if self.window_start is None else (self.now - self.window_start) / WINDOW
        self.now += plan.duration * (1 + self.throttle * min(max(into, 0.0), 1.0))
        return core.complete(plan, self.now)

    def decode_stats(self, prefix: list[int], n: int) -> DecodeStats:
        """One decode cell of METRICS.md on the virtual clock, as the plugin's statistics see
        it: every request's send, end and token arrivals."""
        core = self.core
        logs: dict[SimRequest, _Log] = {}
        ended: dict[SimRequest, float] = {}
        first_wave: list[SimRequest] = []

        def start() -> SimRequest:
            log = _Log()
            req = SimRequest(prefix + self.ids(SUFFIX), M, ignore_eos=True, sink=log)
            logs[req] = log
            core.add(req, self.now)
            return req

        first_wave = [start() for _ in range(n)]
        self.window_start = None
        while True:
            for req, n_new, finish in self.step():
                req.sink.emit(req, n_new, finish, self.now)  # type: ignore[union-attr]
                if finish is not None:
                    ended[req] = self.now
                    start()
            opened = all(r.first_token_time is not None for r in first_wave)
            if self.window_start is None and opened:
                self.window_start = self.now
            if self.window_start is not None and self.now >= self.window_start + WINDOW:
                break
        w0 = self.window_start
        w1 = w0 + WINDOW
        traces = [
            RequestTrace(
                t_send=req.arrival,
                t_end=ended.get(req, w1),
                token_times=[t for t in log.times if t < w1],
                token_counts=[k for t, k in zip(log.times, log.counts, strict=True) if t < w1],
                finished=req in ended and ended[req] < w1,
            )
            for req, log in logs.items()
        ]
        for req in list(logs):
            core.abort(req)
        self.now = max(self.now, w1)
        return decode_stats(traces, w0, w1, n)


def cells(throttle: float, seed: int) -> list[list[str]]:
    profile = get_profile("h200-qwen3.5-27b-int4")
    rows = []
    for label, c in CONTEXTS.items():
        run = ThrottledRun(profile, seed)
        run.throttle = throttle
        prefix = run.ids(c - SUFFIX)
        run.prefill_cell(prefix + run.ids(SUFFIX), 1)
        for n, ref in zip(CONCURRENCY, REF_DECODE[label], strict=True):
            if ref is None:
                continue
            s = run.decode_stats(prefix, n)
            ci = s.total_ci
            d = s.drift
            change = d.change if d is not None and d.flagged else None
            pair = (ci.low, ci.high) if ci else None
            width = (ci.high - ci.low) / s.total_tok_s if ci else None
            fixed = drift_noted(change, s.total_tok_s, pair, WINDOW, WINDOW, early_end=False)
            early = drift_noted(change, s.total_tok_s, pair, WINDOW, WINDOW, early_end=True)
            rows.append(
                [
                    label,
                    str(n),
                    f"{s.total_tok_s:,.1f}",
                    "—" if d is None else f"{d.change:+.2%}",
                    "—" if d is None else ("yes" if d.flagged else "no"),
                    "—" if width is None else f"±{width / 2:.2%}",
                    "—" if d is None or not width else f"{abs(d.change) / width:.1f}",
                    "note" if fixed else "",
                    "note" if early else "",
                ]
            )
    return rows


HEADER = [
    "context",
    "N",
    "total tok/s",
    "trend over the window",
    "flagged",
    "95 % interval",
    "trend / interval width",
    "note (fixed window)",
    "note (--llm-precision)",
]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--throttle", type=float, default=0.05)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--write", action="store_true", help="write benchmarks/results/")
    args = parser.parse_args(argv)
    quiet = cells(0.0, args.seed)
    throttled = cells(args.throttle, args.seed)
    count = sum(1 for r in quiet if r[7])
    lines = [
        "# Drift notes on a machine that adds no noise",
        "",
        f"{utc_now()} · `{command('benchmarks.studies.drift_noiseless', argv)}`",
        "",
        __doc__.split("\n\n")[1].replace("\n", " "),
        "",
        f"## The demo's decode cells, noiseless: {count} of {len(quiet)} with a drift note",
        "",
        *table(HEADER, quiet, "lrrrcrrcc"),
        "",
        f"## A server {args.throttle:.0%} slower at the window's end: "
        f"{sum(1 for r in throttled if r[7])} of {len(throttled)} with a drift note "
        f"({sum(1 for r in throttled if r[4] == 'yes')} flagged)",
        "",
        *table(HEADER, throttled, "lrrrcrrcc"),
    ]
    print("\n".join(lines))
    if args.write:
        write_page(RESULTS / "drift_noiseless.md", lines)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
