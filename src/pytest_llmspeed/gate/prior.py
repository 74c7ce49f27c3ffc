"""An A/B's prior: the spread between starts that earlier A/Bs on the same machine measured
(``--llm-ab-prior=FILE,...``), read from their results files, pooled with the A/B's own by
degrees of freedom (:meth:`.ab.Ledger.prior_use`). Two blocks (8 starts) know a start's
spread on about 3 degrees of freedom: too few to call an unchanged cell the same (t = 3.18);
with earlier A/Bs' spread they are enough (docs/judge.md, "A prior from earlier A/Bs").

A prior applies only where it was measured: a file from another machine (its hardware in
the run's metadata) or another model is refused, and a prior from a quieter day than today's
is refused by the one-sided F test of :meth:`.ab.Ledger.prior_use`. No pytest here."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from .ab import FIGURES, KindSpread, pool_spreads, spreads_of

#: the metadata keys that name the machine a run was measured on (core/machine.py's, and the
#: simulator's "hardware", which holds its profile and speed); not the OS, the driver or CUDA,
#: which an upgrade under test may change
MACHINE_KEYS = ("hardware", "type", "gpu", "gpus", "vram", "cpu", "cores")


class PriorError(ValueError):
    """A prior file that cannot serve, in words that name it."""


@dataclass(frozen=True)
class PriorFile:
    """One earlier A/B: where it came from, what it ran on, its spread by kind."""

    path: str
    machine: Mapping[str, str]
    model: str | None
    kind: str | None  # "serve" or "endpoints"
    spreads: Mapping[str, KindSpread] = field(default_factory=dict)


def read_prior(path: str) -> PriorFile:
    """One results file of an earlier A/B. Raises PriorError (it is not there, not a results
    file, holds no A/B, or no complete block)."""
    from ..results import ResultsError, load

    if not os.path.isfile(path):
        raise PriorError(f"{path}: no such file (give an earlier A/B's --llm-results file)")
    try:
        results = load(path)
    except ResultsError as exc:
        raise PriorError(str(exc)) from None
    if results.ab is None:
        raise PriorError(f"{path}: not an A/B's results file (it has no 'ab')")
    try:
        spreads = spreads_of(results.ab)
    except ValueError as exc:
        raise PriorError(f"{path}: a malformed A/B ({exc})") from None
    if not spreads:
        raise PriorError(f"{path}: its A/B has no complete block of old, new, new, old")
    run = results.run
    machine = {k: str(v) for k, v in run.metadata.items() if k in MACHINE_KEYS}
    kind = results.ab.get("kind")
    return PriorFile(path, machine, run.model, kind if isinstance(kind, str) else None, spreads)


def refusal(prior: PriorFile, machine: Mapping[str, str], model: str | None) -> str | None:
    """Why ``prior`` does not apply to a run on ``machine`` with ``model`` (None: it does)."""
    mine = {k: v for k, v in machine.items() if k in MACHINE_KEYS}
    if not mine or not prior.machine:
        return "the machine of one of the two is not known"
    for key in sorted(set(mine) | set(prior.machine)):
        if mine.get(key) != prior.machine.get(key):
            return (
                f"measured on another machine ({key}: {prior.machine.get(key) or 'unknown'}, "
                f"this run's {mine.get(key) or 'unknown'})"
            )
    if model is not None and prior.model is not None and model != prior.model:
        return f"measured with another model ({prior.model}, this run's {model})"
    return None


def pooled(priors: Sequence[PriorFile]) -> dict[str, KindSpread]:
    """The priors' spreads by kind, pooled by degrees of freedom."""
    out = {}
    for kind in FIGURES:
        got = pool_spreads(p.spreads[kind] for p in priors if kind in p.spreads)
        if got is not None:
            out[kind] = got
    return out


__all__ = ["MACHINE_KEYS", "PriorError", "PriorFile", "pooled", "read_prior", "refusal"]
