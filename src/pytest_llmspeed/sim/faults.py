"""``--faults SPEC``: failures injected at given rates.

Grammar: comma-separated ``name=value`` items, e.g.
``start500=0.05,midstream=0.01,drop=0.01,stall=0.01,stall_s=2,burst503=0.02,burst_s=0.5``.

Rates (per request, 0..1, drawn from a generator seeded with ``--seed``):

- ``start500``: the request is answered HTTP 500 before any output;
- ``midstream``: after a random number of output tokens (1 .. max_tokens - 1) the stream gets an
  error event ``data: {"error": {...}}`` and ``data: [DONE]`` (non-streaming: HTTP 500);
- ``drop``: after a random number of output tokens the connection is closed without the end of
  the response;
- ``stall``: after a random number of output tokens the request stops producing for ``stall_s``
  seconds (default 5), then goes on;
- ``burst503``: the request starts a burst: it and every request arriving within ``burst_s``
  seconds (default 1) is answered HTTP 503.

``midstream + drop + stall`` must not exceed 1. Durations are divided by ``--speed``. An empty
spec or ``none`` injects nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

RATE_NAMES = ("start500", "midstream", "drop", "stall", "burst503")
DURATION_NAMES = ("stall_s", "burst_s")


@dataclass(frozen=True)
class FaultSpec:
    """Parsed ``--faults``: per-request rates and the stall / burst durations in seconds."""

    start500: float = 0.0
    midstream: float = 0.0
    drop: float = 0.0
    stall: float = 0.0
    burst503: float = 0.0
    stall_s: float = 5.0
    burst_s: float = 1.0

    @property
    def any(self) -> bool:
        """True when some fault can fire."""
        return any(getattr(self, name) > 0 for name in RATE_NAMES)


def parse_faults(spec: str | None) -> FaultSpec:
    """Parse a fault spec; ``ValueError`` naming the bad item and the valid names."""
    if spec is None or spec.strip().lower() in ("", "none"):
        return FaultSpec()
    valid = ", ".join(f.name for f in fields(FaultSpec))
    values: dict[str, float] = {}
    for item in spec.split(","):
        item = item.strip()
        if not item:
            continue
        name, sep, raw = item.partition("=")
        name = name.strip().replace("-", "_")
        if not sep:
            raise ValueError(f"fault item {item!r} is not name=value; valid names: {valid}")
        if name not in RATE_NAMES and name not in DURATION_NAMES:
            raise ValueError(f"unknown fault {name!r} in {spec!r}; valid names: {valid}")
        try:
            value = float(raw.strip().removesuffix("s") if name in DURATION_NAMES else raw)
        except ValueError:
            raise ValueError(f"fault {name}={raw!r} is not a number") from None
        if name in RATE_NAMES and not 0.0 <= value <= 1.0:
            raise ValueError(f"fault rate {name}={raw} must be between 0 and 1")
        if name in DURATION_NAMES and not value > 0:
            raise ValueError(f"fault duration {name}={raw} must be positive")
        values[name] = value
    result = FaultSpec(**values)
    if result.midstream + result.drop + result.stall > 1.0:
        raise ValueError("fault rates midstream + drop + stall must not exceed 1")
    return result
