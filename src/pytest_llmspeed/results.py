"""The results model: typed, frozen records that every output reads, and the versioned file.

One run is a :class:`RunInfo` and its :class:`CellRecord` s; :func:`load` reads every results
file this project has written, :meth:`Results.dump` writes one. Nothing here does I/O beyond
reading and writing that file, and nothing imports pytest or the measurement core.

History of the format (``schema`` key):

- ``pytest-llmspeed/results/v1`` (0.1.0): ``{"schema", "run": {...}, "cells": [...]}``; a cell
  is a flat object of figures keyed as in METRICS.md (``total_tok_s``, ``ttft_ms``, ...; the
  list is ``figures.FIGURES``), its ``status`` one of the words of :class:`Status`, the
  gate's outcome under ``baseline`` with ``baseline_checks`` and ``attempts``. Later 0.x
  releases add keys (``notes`` on a cell, ``metadata`` on the run, ``launch_command``,
  ``replica_tok_s`` on a decode cell measured over several replicas, ``improved`` on a check
  that improved, ``flags`` on a cell: the notes that code reads, typed as ``{"kind",
  "detail"}``, which a file before them says in its ``notes``' words, read back by
  :func:`flags_of_notes`; open-loop cells, phases ``rate`` and ``trace`` with ids
  ``rate[8K-r2]`` and ``trace[NAME]`` and their own figures, docs/workloads.md: a reader
  before them refuses their ids; conversation cells, phase ``conversation``, ids
  ``conversation[8K-u4-t3]``, likewise); a reader keeps keys it does not know (``extra``)
  and writes them back, and leaves out a known key the file lacks (``CellRecord.absent``).
  The gate's verdicts are data: a check read back keeps the verdict it stored (``Check.stored``),
  whatever rule this version judges by. A change of meaning of an existing key is a new major
  version (v2), and v1 stays readable.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import math
import os
import re
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum, StrEnum
from pathlib import Path
from typing import Any

from . import figures
from .contexts import LIMIT, MAX, K, context_label, display_label
from .figures import Gate

SCHEMA = "pytest-llmspeed/results/v1"
_SCHEMA_RE = re.compile(r"^pytest-llmspeed/results/v(\d+)$")
#: major versions this reader understands
READABLE_VERSIONS = (1,)

__all__ = [
    "LIMIT",
    "MAX",
    "SCHEMA",
    "CellId",
    "CellRecord",
    "Check",
    "Flag",
    "FlagKind",
    "GateVerdict",
    "K",
    "Outcome",
    "Phase",
    "Results",
    "ResultsError",
    "RunInfo",
    "Samples",
    "Status",
    "context_label",
    "display_label",
    "load",
]


class ResultsError(ValueError):
    """A results file that cannot be read; the message names the file and the problem."""


# -- words -------------------------------------------------------------------------------------


class Phase(StrEnum):
    PREFILL = "prefill"
    DECODE = "decode"
    RATE = "rate"  # open loop at an arrival rate (docs/workloads.md)
    TRACE = "trace"  # open loop at a replayed trace's times
    CONVERSATION = "conversation"  # users in step through conversations of several turns

    @property
    def open_loop(self) -> bool:
        return self in (Phase.RATE, Phase.TRACE)


class Status(Enum):
    """A cell's status (METRICS.md, "Status of a cell"). Values are the words the v1 file uses."""

    VALID = "valid"
    OVER_CAPACITY = "over capacity"
    DOES_NOT_FIT = "exceeds max_model_len"
    FAILED = "failed"
    ERROR = "error"
    NOT_RUN = "skipped"

    @property
    def measured(self) -> bool:
        """Figures were measured (a failed cell keeps its figures)."""
        return self in (Status.VALID, Status.FAILED)

    @property
    def label(self) -> str:
        """How the matrix shows a cell without figures."""
        return _LABELS[self]


_LABELS = {
    Status.VALID: "Valid",
    Status.OVER_CAPACITY: "Over capacity",
    Status.DOES_NOT_FIT: "Too long",
    Status.FAILED: "FAILED",
    Status.ERROR: "ERROR",
    Status.NOT_RUN: "skipped",
}


class Outcome(Enum):
    """The gate's verdict on one cell: its figures' worst (regressed, then unknown, improved,
    same). ``PASS`` is what an earlier version stored for a cell that did not regress (it did
    not tell same from too noisy to tell)."""

    REGRESSION = "regressed"
    UNKNOWN = "unknown"
    IMPROVEMENT = "improved"
    SAME = "same"
    PASS = "passed"
    NOT_MEASURED = "not measured"
    NO_FLOOR = "no floor"
    #: measured, but not comparable with the baseline's figure (``GateVerdict.not_gated``)
    NOT_GATED = "not gated"

    @property
    def judged(self) -> bool:
        """The cell was measured and held to a reference."""
        return self not in (Outcome.NOT_MEASURED, Outcome.NO_FLOOR, Outcome.NOT_GATED)


# -- contexts and cell ids ---------------------------------------------------------------------


def _parse_label(label: str) -> int | str:
    if label in (MAX, LIMIT):
        return label
    if label.endswith("K"):
        return int(label[:-1]) * K
    return int(label)


_CELL_ID_RE = re.compile(
    r"^(?:prefill\[(\d+K?|max|limit)\]|decode\[(\d+K?|max)-c([1-9]\d*)\]"
    r"|rate\[(\d+K?|max)-r(\d+(?:\.\d+)?)\]|trace\[([A-Za-z0-9_.-]{1,64})\]"
    r"|conversation\[(\d+K?|max)-u([1-9]\d*)-t([1-9]\d*)\])$"
)
_TRACE_NAME_RE = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")


def rate_label(rate: float) -> str:
    """A rate as a cell id writes it: ``2``, ``0.5``, ``12.25`` (at most 6 significant
    digits, never an exponent)."""
    text = f"{rate:.6f}".rstrip("0").rstrip(".")
    return text or "0"


@dataclass(frozen=True)
class CellId:
    """The one codec for cell ids: ``decode[32K-c8]``, ``prefill[max]``, ``rate[8K-r2]``,
    ``trace[NAME]``, ``conversation[8K-u4-t3]``.

    ``context`` is a token count, ``"max"`` or (prefill) ``"limit"``, and for a trace cell the
    trace's name; ``concurrency`` is None but for decode cells and conversation cells (its
    users), ``rate`` (requests per second) None but for rate cells, ``turns`` None but for
    conversation cells.
    """

    phase: Phase
    context: int | str
    concurrency: int | None = None
    rate: float | None = None
    turns: int | None = None

    def __post_init__(self) -> None:
        talks = self.phase is Phase.CONVERSATION
        if (self.phase in (Phase.DECODE, Phase.CONVERSATION)) != (self.concurrency is not None):
            raise ValueError(
                "a decode cell has a concurrency, a conversation cell its users, other cells "
                "have none"
            )
        if talks != (self.turns is not None) or (self.turns is not None and self.turns < 1):
            raise ValueError("a conversation cell has 1 turn or more, other cells have none")
        if (self.phase is Phase.RATE) != (self.rate is not None):
            raise ValueError("a rate cell has a rate, other cells have none")
        if self.rate is not None and not (self.rate > 0 and math.isfinite(self.rate)):
            raise ValueError(f"a rate cell's rate must be positive, got {self.rate!r}")
        if self.phase is Phase.TRACE and not (
            isinstance(self.context, str) and _TRACE_NAME_RE.match(self.context)
        ):
            raise ValueError(
                "a trace cell's name is 1-64 letters, digits, '_', '-' or '.', "
                f"got {self.context!r}"
            )

    @classmethod
    def prefill(cls, context: int | str) -> CellId:
        return cls(Phase.PREFILL, context)

    @classmethod
    def decode(cls, context: int | str, concurrency: int) -> CellId:
        return cls(Phase.DECODE, context, concurrency)

    @classmethod
    def at_rate(cls, context: int | str, rate: float) -> CellId:
        """The rate cell (context, requests per second); the rate as its id writes it."""
        return cls(Phase.RATE, context, rate=float(rate_label(rate)))

    @classmethod
    def trace(cls, name: str) -> CellId:
        return cls(Phase.TRACE, name)

    @classmethod
    def conversation(cls, context: int | str, users: int, turns: int) -> CellId:
        """The conversation cell: the first turn's prompt, the users, the turns."""
        return cls(Phase.CONVERSATION, context, users, turns=turns)

    @classmethod
    def parse(cls, text: str) -> CellId:
        """``"decode[32K-c8]"`` → CellId; ValueError naming the expected form otherwise."""
        m = _CELL_ID_RE.match(text)
        if not m:
            raise ValueError(
                f"unknown cell id {text!r}: cell ids look like prefill[8K], decode[32K-c8], "
                "rate[8K-r2], trace[NAME] or conversation[8K-u4-t3]"
            )
        if m.group(1) is not None:
            return cls.prefill(_parse_label(m.group(1)))
        if m.group(2) is not None:
            return cls.decode(_parse_label(m.group(2)), int(m.group(3)))
        if m.group(4) is not None:
            return cls.at_rate(_parse_label(m.group(4)), float(m.group(5)))
        if m.group(7) is not None:
            return cls.conversation(_parse_label(m.group(7)), int(m.group(8)), int(m.group(9)))
        return cls.trace(m.group(6))

    @property
    def label(self) -> str:
        """The context's label (``32K``)."""
        return context_label(self.context)

    @property
    def param_id(self) -> str:
        """The pytest parameter id: ``32K`` for a prefill cell, ``32K-c8`` for a decode cell,
        ``8K-r2`` for a rate cell, the name for a trace cell, ``8K-u4-t3`` for a
        conversation cell."""
        if self.turns is not None:
            return f"{self.label}-u{self.concurrency}-t{self.turns}"
        if self.rate is not None:
            return f"{self.label}-r{rate_label(self.rate)}"
        return self.label if self.concurrency is None else f"{self.label}-c{self.concurrency}"

    def __str__(self) -> str:
        return f"{self.phase.value}[{self.param_id}]"


# -- the gate's verdict ------------------------------------------------------------------------

#: floors (higher is better) and ceilings (lower is better) a baseline cell may carry, and
#: their words: read from :data:`~pytest_llmspeed.figures.FIGURES` (kept for readers of 0.x;
#: the code calls :mod:`~pytest_llmspeed.figures`' lookups, which see a figure added later)
FLOORS = tuple(f.key for f in figures.floors())
CEILINGS = tuple(f.key for f in figures.ceilings())
METRIC_NAMES = {f.key: f.label for f in figures.gated()}


def _minus(text: str) -> str:
    return text.replace("-", "−")


Pair = tuple[float, float]


def _sides(value: float, ci: Pair | None) -> tuple[float, float]:
    """How far a 95 % interval reaches below and above its value (0, 0 without one)."""
    if ci is None:
        return 0.0, 0.0
    return max(value - ci[0], 0.0), max(ci[1] - value, 0.0)


def mean_interval(mean: float, values: Sequence[float], cis: Sequence[Pair | None]) -> Pair | None:
    """The interval of ``mean``, the mean of independent measurements, from their own
    intervals: each side's half-widths added in quadrature and divided by their number. None
    when a measurement has none."""
    if not values or len(cis) != len(values) or any(ci is None for ci in cis):
        return None
    sides = [_sides(v, ci) for v, ci in zip(values, cis, strict=True)]
    low = math.sqrt(sum(a * a for a, _ in sides)) / len(values)
    high = math.sqrt(sum(b * b for _, b in sides)) / len(values)
    return (mean - low, mean + high)


#: the two-sided 95 % normal quantile of the figures' intervals, and the one-sided 99 % one
#: the gate tests at when the between-run spread is not estimated
Z95 = 1.959963984540054
Z99 = 2.326347874040841


def relative_se(value: float, ci: Pair | None) -> float:
    """A figure's relative standard error from its 95 % interval, ``(half-width / value) /
    1.96`` (0 without one): the one reading of an interval as noise (the gate's, ``compare``'s
    and the words' ±)."""
    if ci is None or value <= 0:
        return 0.0
    return (ci[1] - ci[0]) / 2 / value / Z95


#: the gate's four verdicts on a figure (gate/judge.py), and the one an earlier version
#: stored ("passed": it did not tell "same" from "too noisy to tell")
VERDICTS = ("regressed", "improved", "same", "unknown")
PASSED = "passed"


@dataclass(frozen=True)
class Check:
    """One figure of one cell against its baseline reference, over one or more attempts: the
    data the gate judged and the verdict it gave (gate/verdict.py judges, by gate/judge.py's
    rule; docs/judge.md, "The rule across restarts"). This is the stored verdict: nothing
    here judges.

    ``verdict`` is one of :data:`VERDICTS` (``""``: not judged yet, a check made by hand);
    a check read from a results file keeps the verdict the file stored (``stored``), whatever
    rule this version judges by, and is written back as it was read."""

    cell: str
    metric: str
    reference: float
    tolerance: float
    values: tuple[float, ...]  # one per attempt that measured the figure
    reference_ci: Pair | None = None
    values_ci: tuple[Pair | None, ...] = ()  # one per attempt (None: no interval), or none
    #: the reference's relative standard error; None: from ``reference_ci`` (a one-run baseline)
    reference_se: float | None = None
    #: the between-start spread (relative) the baseline's runs show; None: unknown, taken as 0
    spread: float | None = None
    spread_dof: int = 0
    reference_runs: int = 1  # runs the reference is the mean of
    quantile: float = Z99  # one-sided 99 %: Student's t with spread_dof when spread is known
    fresh_starts: bool = False  # each re-measurement ran on a fresh start of the server
    #: the judge's verdict: regressed, improved, same, unknown ("passed": an earlier version's)
    verdict: str = ""
    #: the standard error of the change ln(value / reference) as judged, and of the value
    #: (the mean of the attempts), both relative; None: not said (a file of an earlier version)
    change_se: float | None = None
    value_se: float | None = None
    #: for an unknown: about how many more measurements would decide it (None: none would)
    more: int | None = None
    #: the check as a results file wrote it; None: judged by this version
    stored: Mapping[str, Any] | None = field(default=None, compare=False, repr=False)

    @property
    def is_floor(self) -> bool:
        return figures.gate_of(self.metric) is Gate.FLOOR

    @property
    def limit(self) -> float:
        k = 1 - self.tolerance if self.is_floor else 1 + self.tolerance
        return self.reference * k

    @property
    def value(self) -> float:
        """The mean of the attempts."""
        return sum(self.values) / len(self.values)

    @property
    def uses_intervals(self) -> bool:
        """The reference and every attempt have a 95 % interval (a one-run baseline's rule
        then says "beyond both intervals")."""
        return (
            self.reference_ci is not None
            and len(self.values_ci) == len(self.values)
            and all(ci is not None for ci in self.values_ci)
        )

    @property
    def spread_known(self) -> bool:
        return self.spread is not None

    @property
    def noise_known(self) -> bool:
        """Some noise is known: the reference's, an attempt's interval, or the spread (else
        the rule is the flat one)."""
        return (
            self.spread_known
            or self.reference_u > 0
            or any(ci is not None for ci in self.values_ci)
        )

    @property
    def value_ci(self) -> Pair | None:
        """The interval of the mean of the attempts from their own (:func:`mean_interval`)."""
        if not self.uses_intervals:
            return None
        return mean_interval(self.value, self.values, self.values_ci)

    @property
    def reference_u(self) -> float:
        """u_R: the reference's relative standard error."""
        if self.reference_se is not None:
            return self.reference_se
        return relative_se(self.reference, self.reference_ci)

    @property
    def past_limit(self) -> bool:
        """The mean of the attempts is past the limit, towards worse."""
        return self.value < self.limit if self.is_floor else self.value > self.limit

    # -- the verdict, as judged
    @property
    def regressed(self) -> bool:
        return self.verdict == "regressed"

    @property
    def improved(self) -> bool:
        return self.verdict == "improved"

    @property
    def same(self) -> bool:
        return self.verdict == "same"

    @property
    def unknown(self) -> bool:
        """Too noisy to tell at this tolerance (today's name for an earlier version's
        "noisy": past the limit, within the noise)."""
        return self.verdict == "unknown"

    noisy = unknown

    @property
    def change(self) -> float:
        """Relative change of the (mean) value against the reference; + is better."""
        rel = self.value / self.reference - 1
        return rel if self.is_floor else -rel

    # -- words
    def _pm(self, rel_se: float) -> str:
        return f" ±{Z95 * rel_se:.1%}" if rel_se > 0 else ""

    def _value_pm(self) -> str:
        if self.uses_intervals and not self.spread_known:
            ci = self.value_ci
            assert ci is not None
            return f" ±{max(_sides(self.value, ci)) / self.value:.1%}"
        return self._pm(self.value_se or 0.0)

    def _reference_words(self) -> str:
        if self.reference_se is None and self.reference_ci is not None:
            pm = f" ±{max(_sides(self.reference, self.reference_ci)) / self.reference:.1%}"
        else:
            pm = self._pm(self.reference_u)
        runs = f" of {self.reference_runs} runs" if self.reference_runs > 1 else ""
        return f"baseline{runs} {self.reference:,.1f}{pm}"

    def _spread_words(self) -> str:
        """The spread a line judged by: the baseline's, or (re-measured on fresh starts) the
        baseline's pooled with this cell's starts, which the summary's spread line (the
        baseline's alone) does not show."""
        words = f"between-run spread {self.spread or 0.0:.1%}"
        if self.fresh_starts and len(self.values) > 1:
            words += f", the baseline's runs pooled with this cell's {len(self.values)} starts"
        return words

    def _beyond(self) -> str:
        if self.spread_known:
            return f", beyond the noise ({self._spread_words()})"
        return ", beyond both intervals" if self.uses_intervals else ""

    def message(self) -> str:
        name = figures.by_key(self.metric).label
        sign = "−" if self.is_floor else "+"
        cmp, word = ("<", "floor") if self.is_floor else (">", "ceiling")
        attempts = ""
        if len(self.values) > 1:
            shown = ", ".join(f"{v:,.1f}" for v in self.values)
            starts = " on fresh starts" if self.fresh_starts else ""
            attempts = f" [attempts{starts}: {shown}]"
        delta = _minus(f"{self.value / self.reference - 1:+.1%}")
        return (
            f"{self.cell} {name} {self.value:,.1f}{self._value_pm()} {cmp} {word} "
            f"{self.limit:,.1f} ({self._reference_words()} {sign} {self.tolerance:.0%}): "
            f"{delta}{self._beyond()}{attempts}"
        )

    def more_words(self) -> str:
        """What would decide an unknown: ``about 3 more measurement(s) would decide it
        (--llm-confirm=4)``: the confirmations this check had, and those."""
        if self.more is not None:
            confirm = len(self.values) - 1 + self.more
            return (
                f"about {self.more} more measurement(s) would decide it (--llm-confirm={confirm})"
            )
        return "too close to its limit for more measurements to decide it"

    def unknown_message(self) -> str:
        """An unknown figure in words: where it is, against what noise, and what would decide
        it."""
        name = figures.by_key(self.metric).label
        delta = _minus(f"{self.value / self.reference - 1:+.1%}")
        confirm = "more confirmations on fresh starts (a higher --llm-confirm)"
        if self.spread_known:
            noise = (
                f"within the noise between runs ({self._spread_words()}): too noisy to "
                f"tell (more runs in the baseline, or {confirm}, narrow it)"
            )
        elif self.cell.startswith("prefill["):
            noise = (
                "within the intervals: too noisy to tell (more cold requests, "
                f"--llm-prefill-repeats, or {confirm}, narrow them)"
            )
        else:
            noise = (
                "within the intervals: too noisy to tell (a longer window, --llm-precision, or "
                f"{confirm}, narrow them)"
            )
        against = f"({delta} against {self._reference_words()})"
        if self.past_limit:
            where = f"is past its limit {self.limit:,.1f} {against}, but"
        elif self.change > self.tolerance:
            where = f"is better by more than {self.tolerance:.0%} {against}, not beyond the noise:"
        else:
            where = f"is inside its limit {self.limit:,.1f} {against}, not shown within "
            where += f"±{self.tolerance:.0%}:"
        text = f"{self.cell} {name} {self.value:,.1f}{self._value_pm()} {where} {noise}"
        if self.stored is None or "more" in self.stored:
            text += f"; {self.more_words()}"
        return text

    noisy_message = unknown_message

    def improvement_message(self) -> str:
        delta = _minus(f"{self.value / self.reference - 1:+.1%}")
        return (
            f"{self.cell} {self.metric} {self.value:,.1f} vs baseline {self.reference:,.1f}: "
            f"{delta}"
        )

    def to_v1(self) -> dict[str, Any]:
        """The check as the v1 file writes it; a check read from a file, as it was read."""
        if self.stored is not None:
            return copy.deepcopy(dict(self.stored))
        out: dict[str, Any] = {
            "metric": self.metric,
            "reference": self.reference,
            "limit": round(self.limit, 3),
            "values": list(self.values),
            "change": round(self.change, 4),
            "verdict": self.verdict or PASSED,
        }
        if self.reference_ci is not None:
            out["reference_ci"] = list(self.reference_ci)
        if any(ci is not None for ci in self.values_ci):
            out["values_ci"] = [[] if ci is None else list(ci) for ci in self.values_ci]
        if self.noise_known:
            out["noisy"] = self.unknown
        if self.reference_se is not None:
            out["reference_se"] = self.reference_se
        if self.spread_known:
            out["spread"] = self.spread
            out["spread_dof"] = self.spread_dof
            out["quantile"] = self.quantile
        if self.reference_runs > 1:
            out["reference_runs"] = self.reference_runs
        if self.fresh_starts:
            out["fresh_starts"] = True
        if self.improved:
            out["improved"] = True
        if self.change_se is not None:
            out["change_se"] = self.change_se
        if self.value_se is not None:
            out["value_se"] = self.value_se
        if self.unknown:
            out["more"] = self.more
        return out

    @classmethod
    def from_v1(cls, cell: str, data: Mapping[str, Any]) -> Check:
        reference = float(data["reference"])
        limit = float(data["limit"])
        floor = figures.gate_of(str(data["metric"])) is Gate.FLOOR
        tolerance = round((1 - limit / reference) if floor else (limit / reference - 1), 4)
        ref_ci = data.get("reference_ci")
        spread = data.get("spread")
        return cls(
            cell,
            str(data["metric"]),
            reference,
            tolerance,
            tuple(map(float, data["values"])),
            (float(ref_ci[0]), float(ref_ci[1])) if ref_ci else None,
            tuple((float(ci[0]), float(ci[1])) if ci else None for ci in data.get("values_ci", ())),
            reference_se=float(data["reference_se"]) if "reference_se" in data else None,
            spread=None if spread is None else float(spread),
            spread_dof=int(data.get("spread_dof", 0)),
            reference_runs=int(data.get("reference_runs", 1)),
            quantile=float(data.get("quantile", Z99)),
            fresh_starts=bool(data.get("fresh_starts", False)),
            verdict=_stored_verdict(data),
            change_se=_number_or_none(data.get("change_se")),
            value_se=_number_or_none(data.get("value_se")),
            more=int(data["more"]) if isinstance(data.get("more"), int) else None,
            stored=copy.deepcopy(dict(data)),
        )


def _stored_verdict(data: Mapping[str, Any]) -> str:
    """A stored check's verdict in today's words: a file of this version says one of the
    four; an earlier one said "regressed" or "passed", with "noisy" (past the limit within the
    noise: unknown) and "improved" beside a pass."""
    word = str(data.get("verdict", PASSED))
    if word in VERDICTS:
        return word
    if data.get("noisy"):
        return "unknown"
    if data.get("improved"):
        return "improved"
    return PASSED


def _number_or_none(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) else None


@dataclass(frozen=True)
class GateVerdict:
    """What the gate decided about one cell, with its checks."""

    outcome: Outcome
    checks: tuple[Check, ...] = ()
    #: why the cell changed against the baseline, from both sides' server figures
    #: (gate/explain.py), for a regression or an improvement; written as ``baseline_why``
    why: str = ""
    #: why a measured cell was not gated (``Outcome.NOT_GATED``); ``baseline_not_gated``
    not_gated: str = ""
    #: the time budget (--llm-budget) stopped its re-measurements; ``baseline_budget_cut``
    budget_cut: bool = False

    @property
    def regressions(self) -> tuple[Check, ...]:
        return tuple(c for c in self.checks if c.regressed)

    @property
    def improvements(self) -> tuple[Check, ...]:
        return tuple(c for c in self.checks if c.improved)

    @property
    def unknowns(self) -> tuple[Check, ...]:
        """Figures too noisy to tell at their tolerance (not failures unless
        --llm-unknown=fail)."""
        return tuple(c for c in self.checks if c.unknown)

    noisy = unknowns

    @property
    def spread_unknown(self) -> bool:
        """Some check was judged without the between-run spread (a one-run baseline)."""
        return any(not c.spread_known for c in self.checks)

    @property
    def message(self) -> str:
        """One line per regressed figure (empty unless the outcome is a regression)."""
        return "\n".join(c.message() for c in self.regressions)


# -- cell records ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Samples:
    """Per-request values of a cell (ms, tok/s)."""

    ttft_ms: tuple[float, ...] = ()
    tbt_ms: tuple[float, ...] = ()
    per_request_tok_s: tuple[float, ...] = ()


class FlagKind(StrEnum):
    """What a cell's flag says (``CellRecord.flags``), each kind a word of the file; the
    report says what each means (``report.notes``) and :meth:`Flag.text` says the cell's in
    words."""

    #: how the tokens were counted, when not from continuous usage (the detail says how)
    TOKENS = "tokens"
    #: the client's event loop was behind for over a tenth of the window (the heartbeat's)
    CLIENT_BEHIND = "client_behind"
    #: requests running or waiting at the window's start, after the wait for an idle server
    SERVER_BUSY = "server_busy"
    #: a /metrics read of the window did not parse (the detail: its first failing line)
    METRICS_UNPARSED = "metrics_unparsed"
    #: server values that are not figures (NaN, infinite, negative): taken as not exposed
    SERVER_VALUES_REFUSED = "server_values_refused"
    #: a counter went back inside the window: the cell's server figures are not kept
    SERVER_WENT_BACK = "server_went_back"
    #: usage counted tokens before the chunk that carried them (a usage-only first chunk)
    USAGE_BEFORE_TOKENS = "usage_before_tokens"
    #: the server held streams open after their ``[DONE]`` (said once a run)
    HELD_AFTER_DONE = "held_after_done"
    #: the server has a generation counter, but a read at the window's edges gave none: the
    #: tokens received were not checked against it (the detail: which read)
    NOT_REFEREED = "not_refereed"
    #: the streams named more than one model (several backends behind one endpoint?)
    MODELS = "models"
    #: the server has a tokenize route, but it failed on the text received: the usage was not
    #: re-counted (core/recount.py; the detail: the error)
    NOT_RECOUNTED = "not_recounted"


_FLAG_KINDS = frozenset(k.value for k in FlagKind)
#: each kind's words around its detail, as the cell's note reads: (before, after)
_FLAG_WORDS = {
    FlagKind.TOKENS: ("tokens: ", ""),
    FlagKind.CLIENT_BEHIND: ("client: event loop ", ""),
    FlagKind.SERVER_BUSY: ("server busy at the window's start: ", ""),
    FlagKind.METRICS_UNPARSED: ("/metrics did not parse: ", ""),
    FlagKind.SERVER_VALUES_REFUSED: (
        "server values that are not figures: ",
        " (taken as not exposed in this cell)",
    ),
    FlagKind.SERVER_WENT_BACK: (
        "server figures not kept: ",
        " (the server restarted, or its counters are not to be trusted)",
    ),
    FlagKind.USAGE_BEFORE_TOKENS: (
        "usage counted tokens before the chunk that carried them: ",
        " (each request's first token is its first chunk that carries one)",
    ),
    FlagKind.HELD_AFTER_DONE: (
        "the server held streams open after their data: [DONE]: ",
        " (each request ended at its [DONE], the stream closed by the client)",
    ),
    FlagKind.MODELS: (
        "the streams named several models: ",
        " (several backends behind one endpoint: the figures mix them)",
    ),
    FlagKind.NOT_REFEREED: (
        "not refereed: ",
        " (the tokens received were not checked against the server's generation counter)",
    ),
    FlagKind.NOT_RECOUNTED: (
        "usage not re-counted: ",
        " (the usage was not checked against the text received)",
    ),
}


@dataclass(frozen=True)
class Flag:
    """A typed note on a cell: its kind, and the cell's own figure in words (``2 running, 1
    waiting after waiting 10.0 s``). Code reads the kind; a person reads :meth:`text`."""

    #: a str only for a kind this version does not know (a later version's), kept as read
    kind: FlagKind | str
    detail: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.kind, FlagKind) and self.kind in _FLAG_KINDS:  # as its word
            object.__setattr__(self, "kind", FlagKind(self.kind))

    def text(self) -> str:
        """The note in words, as the cell's notes said it before flags were typed."""
        if not isinstance(self.kind, FlagKind):
            return f"{self.kind}: {self.detail}" if self.detail else self.kind
        before, after = _FLAG_WORDS[self.kind]
        return f"{before}{self.detail}{after}"

    def to_v1(self) -> dict[str, str]:
        return {"kind": str(self.kind), "detail": self.detail}

    @classmethod
    def from_v1(cls, data: Mapping[str, Any]) -> Flag:
        """A flag as the file has it (a later version's kind: kept, shown in its own words)."""
        return cls(str(data["kind"]), str(data.get("detail", "")))


def flags_of_notes(notes: Iterable[str]) -> tuple[tuple[Flag, ...], tuple[str, ...]]:
    """A cell of a file written before flags (no ``flags`` key) said them in its notes: the
    flags those notes say, by the words they begin with (:data:`_FLAG_WORDS`), and the other
    notes, each in order. The one place in the project that reads a note's text: everything
    else reads :attr:`CellRecord.flags`. A flag's :meth:`~Flag.text` is the note it was read
    from (their words have not changed since each kind was first written)."""
    flags: list[Flag] = []
    rest: list[str] = []
    for note in notes:
        for kind, (before, after) in _FLAG_WORDS.items():
            if note.startswith(before):
                flags.append(Flag(kind, note.removeprefix(before).removesuffix(after)))
                break
        else:
            rest.append(note)
    return tuple(flags), tuple(rest)


#: the identity of a cell among its JUnit properties, before its figures
_ID_PROPERTIES = ("phase", "context", "context_tokens", "concurrency", "status", "reason")


def _written_when_known() -> list[str]:
    """Keys a cell writes only when known, in order: the intervals, then the optional
    figures."""
    return [
        *(f.ci_key for f in figures.with_interval()),
        *(f.key for f in figures.FIGURES if f.optional),
    ]


_ID_KEYS = ("id", "phase", "context", "context_tokens", "context_display", "concurrency", "status")
_GATE_KEYS = (
    "baseline", "baseline_checks", "baseline_why", "baseline_not_gated", "baseline_budget_cut",
    "attempts",
)  # fmt: skip


# -- the server's own figures of a cell (core/server_figures.py reads them) --------------------


@dataclass(frozen=True)
class ServerFigures:
    """What the server says happened in one cell's window. Every figure is ``None`` where
    the server does not expose what it needs (``missing`` names those, for one note per run)
    or where a counter went back (a restart inside the window: ``reset`` names those) — never
    0 for "not known". Counts are the window's; means are per finished request (histograms)
    or over time (gauges, trapezoids through the open, the polls and the close)."""

    duration_s: float  # the span between the open and close reads
    # speculative decoding
    spec_drafts: int | None = None
    spec_draft_tokens: int | None = None
    spec_accepted_tokens: int | None = None
    spec_accepted_per_position: tuple[int, ...] | None = None
    acceptance_length: float | None = None  # 1 + accepted / drafts (SGLang: its gauge's mean)
    acceptance_rate: float | None = None  # accepted / draft tokens
    # engine steps
    steps: int | None = None
    steps_per_s: float | None = None
    step_tokens: int | None = None  # tokens the steps computed: prefill + generated
    tokens_per_step: float | None = None
    generation_tokens: int | None = None
    output_tokens_per_step: float | None = None  # generated tokens / steps
    prompt_tokens: int | None = None
    # scheduler
    running_mean: float | None = None
    running_max: float | None = None
    waiting_mean: float | None = None
    waiting_max: float | None = None
    waiting_by_reason: tuple[tuple[str, float, float], ...] | None = None  # (reason, mean, max)
    preemptions: int | None = None
    requests: int | None = None  # requests that finished in the window
    queue_time_mean_s: float | None = None
    prefill_time_mean_s: float | None = None
    decode_time_mean_s: float | None = None
    # prefix cache, in prompt tokens
    prefix_cache_queries: int | None = None
    prefix_cache_hits: int | None = None
    prefix_cache_hit_rate: float | None = None
    prefix_cache_counter: str | None = None  # "by source" or "queries/hits": which was read
    # KV cache
    kv_usage_mean: float | None = None
    kv_usage_max: float | None = None
    # memory traffic (vLLM / SGLang --enable-mfu-metrics): bytes read per second, per GPU
    read_bytes_per_s: float | None = None
    # what is not known, and why
    missing: tuple[str, ...] = ()  # figures the server does not expose
    reset: tuple[str, ...] = ()  # figures whose counters went back inside the window

    def to_dict(self) -> dict[str, object]:
        """The known figures as plain JSON values (tuples as lists), and ``missing`` and
        ``reset`` when not empty."""
        out: dict[str, object] = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if value is None or value == ():
                continue
            if f.name == "waiting_by_reason":
                value = [list(row) for row in value]
            elif isinstance(value, tuple):
                value = list(value)
            out[f.name] = value
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ServerFigures:
        """The figures as :meth:`to_dict` wrote them (keys this version does not know are
        left out: a later version's server figures are not a reason to refuse a file)."""
        known = {f.name for f in dataclasses.fields(cls)}
        kwargs: dict[str, Any] = {}
        for key, value in data.items():
            if key not in known:
                continue
            if key == "waiting_by_reason":
                value = tuple((str(r), float(m), float(x)) for r, m, x in value)
            elif isinstance(value, list):
                value = tuple(value)
            kwargs[key] = value
        kwargs.setdefault("duration_s", 0.0)
        return cls(**kwargs)

    def scalars(self) -> list[tuple[str, float | int]]:
        """The known figures that are single numbers, in field order (JUnit properties)."""
        out: list[tuple[str, float | int]] = []
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if isinstance(value, int | float) and not isinstance(value, bool):
                out.append((f.name, value))
        return out


@dataclass(frozen=True)
class CellRecord:
    """One cell of the matrix: what it is, its status, its figures (METRICS.md units)."""

    id: CellId
    status: Status
    context_tokens: int | None = None
    reason: str | None = None
    # prefill
    prompt_tok_s: float | None = None
    max_tokens: int | None = None
    repeats: int | None = None
    # both phases
    ttft_ms: float | None = None
    completed: int | None = None
    # decode
    total_tok_s: float | None = None
    per_request_tok_s: float | None = None
    ttft_p90_ms: float | None = None
    ttft_p99_ms: float | None = None
    tbt_ms: float | None = None
    tbt_p90_ms: float | None = None
    tbt_p99_ms: float | None = None
    ttft_n: int | None = None
    tbt_n: int | None = None
    itl_ms: float | None = None
    itl_p90_ms: float | None = None
    itl_p99_ms: float | None = None
    itl_max_ms: float | None = None
    itl_n: int | None = None
    itl_stalls: int | None = None
    e2e_ms: float | None = None
    e2e_p90_ms: float | None = None
    e2e_p99_ms: float | None = None
    e2e_n: int | None = None
    avg_active: float | None = None
    output_tokens: int | None = None
    measured_s: float | None = None
    requests: int | None = None
    errors: int | None = None
    error_summary: Mapping[str, int] | None = None
    early_stops: int | None = None
    wrong_prompt_lengths: Mapping[str, int] | None = None
    tokens: str | None = None  # token accounting: "usage" or "chunk-count" (an estimate)
    queued: bool | None = None
    effective_concurrency: float | None = None
    max_waiting: float | None = None
    stability_cv: float | None = None
    per_second_tok: tuple[int, ...] | None = None
    received_tokens: int | None = None
    received_chunks: int | None = None
    generation_tokens_delta: float | None = None
    received_span: tuple[int, int] | None = None
    max_output: int | None = None
    duration_s: float | None = None
    samples: Samples | None = None
    # uncertainty (docs/metrics.md, "Uncertainty"); written only when known
    total_tok_s_ci: tuple[float, float] | None = None
    per_request_tok_s_ci: tuple[float, float] | None = None
    ttft_ms_ci: tuple[float, float] | None = None
    tbt_ms_ci: tuple[float, float] | None = None
    prompt_tok_s_ci: tuple[float, float] | None = None
    ci_method: str | None = None  # of total tok/s: "batch means (k=16)"
    drift: float | None = None  # a trend flagged in the window: fitted change (− = slowing)
    little_residual: float | None = None  # requests in flight on average / N − 1 (window)
    precision: float | None = None  # the half-width total tok/s reached, as a fraction
    window_end: str | None = None  # with --llm-precision: "precision" (early) or "duration"
    #: with --llm-slo (docs/slo.md): output tok/s of the requests that met the per-request
    #: bounds, and the cell against the objectives in words ("meets", "misses ttft_p90: ...")
    goodput_tok_s: float | None = None
    slo: str | None = None
    #: the client processes that read the cell's streams, when more than one
    #: (--llm-client-processes)
    client_processes: int | None = None
    #: the distance to the bandwidth bound (docs/metrics.md): the tokens a request in flight
    #: had generated (time-weighted), GB/s read per GPU, their share of the GPU's peak, and
    #: where they came from ("server counter", "estimate")
    output_in_flight: float | None = None
    read_gb_s: float | None = None
    bandwidth_share: float | None = None
    bandwidth_from: str | None = None
    #: reasoning and answer, chat only (docs/metrics.md, "Reasoning and answer"): the median
    #: time to the first answer token, the tokens of each over the cell's requests, how they
    #: were told apart ("server", "stream", "estimate"); the tool-call deltas received
    answer_ttft_ms: float | None = None
    reasoning_tokens: int | None = None
    answer_tokens: int | None = None
    reasoning_from: str | None = None
    tool_call_deltas: int | None = None
    #: total tok/s of each replica, when the server is several replicas (written when set)
    replica_tok_s: tuple[float, ...] | None = None
    #: open-loop cells (rate, trace: docs/workloads.md): latencies from each request's
    #: scheduled send (sched_) and from its actual send (sent_)
    sched_ttft_ms: float | None = None
    sched_ttft_p90_ms: float | None = None
    sched_ttft_p99_ms: float | None = None
    sent_ttft_ms: float | None = None
    sched_e2e_ms: float | None = None
    sched_e2e_p90_ms: float | None = None
    sched_e2e_p99_ms: float | None = None
    sent_e2e_ms: float | None = None
    open_tbt_ms: float | None = None
    open_output_tok_s: float | None = None
    offered_rate: float | None = None
    achieved_rate: float | None = None
    open_requests: int | None = None
    open_completed: int | None = None
    open_failed: int | None = None
    open_early_stops: int | None = None
    send_lag_p99_ms: float | None = None
    max_in_flight: int | None = None
    open_span_s: float | None = None
    server_queue_ms: float | None = None
    expected_hit_share: float | None = None
    sched_ttft_ms_ci: tuple[float, float] | None = None
    sched_e2e_ms_ci: tuple[float, float] | None = None
    open_tbt_ms_ci: tuple[float, float] | None = None
    #: conversation cells (docs/workloads.md, "Conversations"): over turns 2 ... T, then one
    #: value per turn index (turn 1 first)
    conv_ttft_ms: float | None = None
    conv_hit_rate: float | None = None
    conv_expected_hit_share: float | None = None
    conv_turns: int | None = None
    conv_requests: int | None = None
    conv_failed: int | None = None
    conv_early_stops: int | None = None
    turn_users: tuple[int, ...] | None = None
    turn_prompt_tokens: tuple[int | None, ...] | None = None
    turn_ttft_ms: tuple[float | None, ...] | None = None
    turn_new_prefill_tok_s: tuple[float | None, ...] | None = None
    turn_output_tok_s: tuple[float | None, ...] | None = None
    turn_hit_rate: tuple[float | None, ...] | None = None
    turn_expected_hit_share: tuple[float | None, ...] | None = None
    turn_expected_hit_share_answers: tuple[float | None, ...] | None = None
    conv_answers: str | None = None
    #: what the server's /metrics say of the cell's window (None: nothing exposed, or a file
    #: written before them); written under "server"
    server: ServerFigures | None = None
    # the gate
    gate: GateVerdict | None = None
    attempts: tuple[Mapping[str, float | None], ...] = ()
    #: what a reader must know of the cell that code reads: typed (kind, detail), in the order
    #: they were found; written under "flags"
    flags: tuple[Flag, ...] = ()
    #: more to know about the cell, in words only (no code reads them back)
    notes: tuple[str, ...] = ()
    #: keys of the file this version does not know, kept and written back
    extra: Mapping[str, Any] = field(default_factory=dict)
    #: keys the file it was read from did not have (written by a version before them): a
    #: figure of its phase, ``context_display``; not written back (``flags``: written back as
    #: the notes they were read from, :func:`flags_of_notes`)
    absent: frozenset[str] = frozenset()

    # -- what the cell is
    @property
    def phase(self) -> Phase:
        return self.id.phase

    @property
    def context(self) -> str:
        """The context's label as the user gave it (``32K``, ``max``)."""
        return self.id.label

    @property
    def concurrency(self) -> int:
        """Requests in flight (1 for a prefill cell)."""
        return self.id.concurrency or 1

    @property
    def context_display(self) -> str | None:
        """The resolved length for tables (``max`` → ``20K``)."""
        return display_label(self.context_tokens) if self.context_tokens else None

    @property
    def measured(self) -> bool:
        """The cell has figures (valid, or failed after it was measured; a cell failed by a
        refused request has none)."""
        return self.status.measured and (
            self.total_tok_s is not None
            or self.prompt_tok_s is not None
            or self.sched_ttft_ms is not None
            or self.turn_users is not None
        )

    def __getitem__(self, key: str) -> Any:
        """``record["total_tok_s"]``: the v1 file's key, as 0.1's dict records were read (tests
        written for them keep working); prefer the attributes."""
        return self.to_v1()[key]

    def get(self, key: str, default: Any = None) -> Any:
        return self.to_v1().get(key, default)

    def with_status(self, status: Status, reason: str | None) -> CellRecord:
        return dataclasses.replace(self, status=status, reason=reason)

    # -- outputs
    def properties(self) -> list[tuple[str, Any]]:
        """The record's scalar figures as JUnit ``user_properties``: its identity, then the
        figures with a JUnit name in the order of :data:`~.figures.FIGURES`, each interval as
        two scalars (``_ci_low``, ``_ci_high``), the figures written only when known, each
        replica's total tok/s, the server's figures, and the gate's verdict (``gate_verdict``:
        the cell's; ``gate_<figure>``: each figure's; ``gate_more``: about how many more
        measurements would decide an unknown)."""
        flat = self.to_v1()
        props = [(key, flat[key]) for key in _ID_PROPERTIES if flat.get(key) is not None]

        def scalars(group: Iterable[figures.Figure]) -> None:
            for f in group:
                value = flat.get(f.key)
                if f.junit and value is not None and not isinstance(value, list | dict):
                    props.append((f.junit, value))

        scalars(f for f in figures.FIGURES if not f.optional)
        for f in figures.with_interval():
            ci = flat.get(f.ci_key)
            if f.junit and ci is not None:
                props += [(f"{f.junit}_ci_low", ci[0]), (f"{f.junit}_ci_high", ci[1])]
        scalars(f for f in figures.FIGURES if f.optional)
        for i, rate in enumerate(self.replica_tok_s or (), start=1):
            props.append((f"replica{i}_total_tok_s", rate))
        if self.server is not None:
            props += [(f"server_{name}", value) for name, value in self.server.scalars()]
        if self.gate is not None:  # the gate's verdict: regressed, unknown, improved, same, ...
            props.append(("gate_verdict", self.gate.outcome.value))
            props += [(f"gate_{c.metric}", c.verdict) for c in self.gate.checks if c.verdict]
            unknown = [c.more for c in self.gate.unknowns if c.more is not None]
            if unknown:
                props.append(("gate_more", max(unknown)))
        return props

    def to_v1(self) -> dict[str, Any]:
        """The cell as the v1 file writes it."""
        out: dict[str, Any] = {
            "id": str(self.id),
            "phase": self.phase.value,
            "context": self.context,
        }
        if self.context_tokens is not None:
            out["context_tokens"] = self.context_tokens
            if "context_display" not in self.absent:
                out["context_display"] = self.context_display
        out["concurrency"] = self.concurrency
        out["status"] = self.status.value
        if self.reason is not None:
            out["reason"] = self.reason
        if self.samples is not None:  # a measured cell: its phase's figures, None included
            for f in figures.of_phase(self.phase, optional=False):
                if f.key not in self.absent:
                    out[f.key] = figures.written(getattr(self, f.key))
            samples: dict[str, list[float]] = {"ttft_ms": list(self.samples.ttft_ms)}
            if self.phase is not Phase.PREFILL:  # decode and open-loop cells: per request
                samples["tbt_ms"] = list(self.samples.tbt_ms)
                samples["per_request_tok_s"] = list(self.samples.per_request_tok_s)
            out["samples"] = samples
            if self.replica_tok_s is not None:
                out["replica_tok_s"] = list(self.replica_tok_s)
        for key in _written_when_known():
            value = getattr(self, key)
            if value is not None:
                out[key] = figures.written(value)
        if self.server is not None:
            out["server"] = self.server.to_dict()
        if self.gate is not None:
            out["baseline"] = self.gate.outcome.value
            if self.gate.checks:
                out["baseline_checks"] = [c.to_v1() for c in self.gate.checks]
            if self.gate.why:
                out["baseline_why"] = self.gate.why
            if self.gate.not_gated:
                out["baseline_not_gated"] = self.gate.not_gated
            if self.gate.budget_cut:
                out["baseline_budget_cut"] = True
        if self.attempts:
            out["attempts"] = [dict(a) for a in self.attempts]
        if "flags" in self.absent:  # as its file said them: in words, before the other notes
            notes = [*(f.text() for f in self.flags), *self.notes]
        else:
            if self.flags:
                out["flags"] = [f.to_v1() for f in self.flags]
            notes = list(self.notes)
        if notes:
            out["notes"] = notes
        out.update(self.extra)
        return out

    @classmethod
    def from_v1(cls, data: Mapping[str, Any]) -> CellRecord:
        """A cell of a v1 file. KeyError / ValueError / TypeError on a malformed cell."""
        cid = CellId.parse(str(data["id"]))
        kwargs: dict[str, Any] = {
            "id": cid,
            "status": Status(data["status"]),
            "context_tokens": data.get("context_tokens"),
            "reason": data.get("reason"),
        }
        known = set(_ID_KEYS) | set(_GATE_KEYS) | {"reason", "samples", "notes", "flags", "server"}
        if isinstance(data.get("server"), Mapping):
            kwargs["server"] = ServerFigures.from_dict(data["server"])
        for f in figures.with_interval():
            value = data.get(f.ci_key)
            if value is not None:
                kwargs[f.ci_key] = (float(value[0]), float(value[1]))
                known.add(f.ci_key)
        for f in figures.FIGURES:
            if f.optional and data.get(f.key) is not None:
                kwargs[f.key] = figures.read(f, data[f.key])
                known.add(f.key)
        absent = set()
        if "context_tokens" in data and "context_display" not in data:
            absent.add("context_display")
        if "samples" in data:
            for f in figures.of_phase(cid.phase, optional=False):
                if f.key in data:
                    kwargs[f.key] = figures.read(f, data[f.key])
                else:  # a file older than the figure: it stays absent when written back
                    absent.add(f.key)
                known.add(f.key)
            s = data["samples"]
            kwargs["samples"] = Samples(
                tuple(s.get("ttft_ms", ())),
                tuple(s.get("tbt_ms", ())),
                tuple(s.get("per_request_tok_s", ())),
            )
            if isinstance(data.get("replica_tok_s"), list):
                kwargs["replica_tok_s"] = tuple(float(x) for x in data["replica_tok_s"])
                known.add("replica_tok_s")
        if "baseline" in data:
            checks = tuple(Check.from_v1(str(cid), c) for c in data.get("baseline_checks", ()))
            why = str(data.get("baseline_why", ""))
            kwargs["gate"] = GateVerdict(
                Outcome(data["baseline"]),
                checks,
                why,
                not_gated=str(data.get("baseline_not_gated", "")),
                budget_cut=bool(data.get("baseline_budget_cut", False)),
            )
        notes = tuple(str(n) for n in data.get("notes", ()))
        if "flags" in data:
            kwargs["flags"] = tuple(Flag.from_v1(f) for f in data["flags"])
        else:  # a file before flags (or a cell with none): they are in its notes' words
            kwargs["flags"], notes = flags_of_notes(notes)
            if kwargs["flags"]:  # written back as read: in words
                absent.add("flags")
        kwargs["absent"] = frozenset(absent)
        kwargs["attempts"] = tuple(dict(a) for a in data.get("attempts", ()))
        kwargs["notes"] = notes
        kwargs["extra"] = {k: v for k, v in data.items() if k not in known}
        return cls(**kwargs)


# -- the run ----------------------------------------------------------------------------------

_RUN_KEYS = (
    "tool", "started", "endpoint", "model", "engine", "engine_version", "max_model_len",
    "kv_capacity", "kv_capacity_source", "api", "prompt_form", "notes", "settings", "salt",
    "python", "platform", "pytest",
)  # fmt: skip


@dataclass(frozen=True)
class RunInfo:
    """What was measured, how, and with what (no secrets: the endpoint in its public form)."""

    tool: str
    started: str  # ISO 8601, UTC
    endpoint: str
    model: str | None = None
    engine: str | None = None
    engine_version: str | None = None
    max_model_len: int | None = None
    kv_capacity: int | None = None
    kv_capacity_source: str | None = None
    api: str | None = None
    prompt_form: str | None = None
    notes: tuple[str, ...] = ()
    settings: Mapping[str, Any] = field(default_factory=dict)
    salt: int | None = None
    python: str | None = None
    platform: str | None = None
    pytest: str | None = None
    metadata: Mapping[str, str] = field(default_factory=dict)  # the user's, e.g. hardware
    launch_command: str | None = None  # how the server was started, secrets redacted
    #: with --llm-slo: per decode context, {"requests": N or None, "stopped_by": words or None}
    capacity: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    #: with --llm-slo and --llm-rates: per context, {"rate": req/s or None, "stopped_by": ...}
    rate_capacity: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    extra: Mapping[str, Any] = field(default_factory=dict)

    def to_v1(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key in _RUN_KEYS:
            value = getattr(self, key)
            if key == "notes":
                value = list(value)
            elif key == "settings":
                value = dict(value)
            out[key] = value
        if self.metadata:
            out["metadata"] = dict(self.metadata)
        if self.launch_command is not None:
            out["launch_command"] = self.launch_command
        if self.capacity:
            out["capacity"] = {k: dict(v) for k, v in self.capacity.items()}
        if self.rate_capacity:
            out["rate_capacity"] = {k: dict(v) for k, v in self.rate_capacity.items()}
        out.update(self.extra)
        return out

    @classmethod
    def from_v1(cls, data: Mapping[str, Any]) -> RunInfo:
        kwargs: dict[str, Any] = {k: data.get(k) for k in _RUN_KEYS if k in data}
        kwargs["tool"] = str(data.get("tool", "unknown"))
        kwargs["started"] = str(data.get("started", ""))
        kwargs["endpoint"] = str(data.get("endpoint", ""))
        kwargs["notes"] = tuple(str(n) for n in data.get("notes") or ())
        kwargs["settings"] = dict(data.get("settings") or {})
        kwargs["metadata"] = {str(k): str(v) for k, v in (data.get("metadata") or {}).items()}
        if isinstance(data.get("launch_command"), str):
            kwargs["launch_command"] = data["launch_command"]
        if isinstance(data.get("capacity"), Mapping):
            kwargs["capacity"] = {str(k): dict(v) for k, v in data["capacity"].items()}
        if isinstance(data.get("rate_capacity"), Mapping):
            kwargs["rate_capacity"] = {
                str(k): dict(v) for k, v in data["rate_capacity"].items() if isinstance(v, Mapping)
            }
        added = (*_RUN_KEYS, "metadata", "launch_command", "capacity", "rate_capacity")
        kwargs["extra"] = {k: v for k, v in data.items() if k not in added}
        return cls(**kwargs)


@dataclass(frozen=True)
class Results:
    """One run and its cells, in the order they were measured."""

    run: RunInfo
    cells: tuple[CellRecord, ...] = ()
    #: an A/B's rounds of both versions and its verdicts (plugin/ab.py, gate/ab.py), as the
    #: file holds them under "ab"; None for a run that was not an A/B
    ab: Mapping[str, Any] | None = None

    def cell(self, cid: CellId | str) -> CellRecord | None:
        key = str(cid)
        return next((c for c in self.cells if str(c.id) == key), None)

    def phase(self, phase: Phase) -> list[CellRecord]:
        return [c for c in self.cells if c.phase is phase]

    def to_document(self) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "schema": SCHEMA,
            "run": self.run.to_v1(),
            "cells": [c.to_v1() for c in self.cells],
        }
        if self.ab is not None:
            doc["ab"] = dict(self.ab)
        return doc

    def dumps(self) -> str:
        return json.dumps(self.to_document(), indent=1) + "\n"

    def dump(self, path: str | os.PathLike[str]) -> None:
        """Write the file atomically (a reader never sees half a file)."""
        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=".llmspeed-", suffix=".json")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                fh.write(self.dumps())
            os.chmod(tmp, 0o666 & ~_umask())  # as open() would make it, not mkstemp's 0600
            os.replace(tmp, target)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def loads(text: str, source: str = "<string>") -> Results:
    """Results from the text of a results file; ResultsError names ``source`` and the problem."""
    doc = parse(text, source)
    try:
        run = RunInfo.from_v1(doc.get("run") or {})
        cells = tuple(CellRecord.from_v1(c) for c in doc.get("cells") or ())
    except (KeyError, ValueError, TypeError, AttributeError) as exc:
        raise malformed(source, exc) from None
    ab = doc.get("ab")
    if ab is not None and not (isinstance(ab, dict) and isinstance(ab.get("cells"), dict)):
        raise ResultsError(f"{source}: a malformed results file ('ab' is not an A/B's record)")
    return Results(run, cells, ab)


def malformed(source: str, exc: Exception) -> ResultsError:
    """The error of a results file whose document does not read as the model (``exc``)."""
    return ResultsError(f"{source}: a malformed results file ({type(exc).__name__}: {exc})")


def parse(text: str, source: str = "<string>") -> dict[str, Any]:
    """The document of a results file, its schema checked (a version this reader reads), not
    yet read as the model: for a reader that needs a few keys of many files (the history,
    ``history/``), where building every record costs more than the JSON. ResultsError names
    ``source`` and the problem."""
    try:
        doc = json.loads(text, parse_constant=_no_constant)
    except ValueError as exc:
        raise ResultsError(
            f"{source}: not a pytest-llmspeed results file (not JSON: {exc})"
        ) from None
    if not isinstance(doc, dict) or "schema" not in doc:
        raise ResultsError(
            f"{source}: not a pytest-llmspeed results file (no 'schema' key; expected "
            f"{SCHEMA!r}, written by --llm-results)"
        )
    m = _SCHEMA_RE.match(str(doc["schema"]))
    if not m:
        raise ResultsError(
            f"{source}: not a pytest-llmspeed results file (schema {doc['schema']!r}, "
            f"expected {SCHEMA!r})"
        )
    version = int(m.group(1))
    if version not in READABLE_VERSIONS:
        raise ResultsError(
            f"{source}: results schema v{version} is newer than this pytest-llmspeed reads "
            f"(v{max(READABLE_VERSIONS)}): upgrade pytest-llmspeed to read it"
        )
    return doc


#: the constants Python's json reads that are not JSON (the writer never emits them)
_CONSTANTS = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}


def _no_constant(name: str) -> float:
    return _CONSTANTS[name]


def load(path: str | os.PathLike[str]) -> Results:
    """Read a results file written by any version of pytest-llmspeed."""
    return loads(text_of(path), str(Path(path)))


def text_of(path: str | os.PathLike[str]) -> str:
    """The text of a results file; ResultsError when it cannot be read."""
    p = Path(path)
    try:
        return p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ResultsError(f"{p}: no such results file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ResultsError(f"{p}: cannot read the results file: {exc}") from None


def order_contexts(cells: Iterable[CellRecord]) -> list[str]:
    """Context labels in the order the cells first show them."""
    out: list[str] = []
    for c in cells:
        if c.context not in out:
            out.append(c.context)
    return out
