"""The A/B of two versions measured now, alternately (issue 31), as pure bookkeeping and
arithmetic: the ABBA order of rounds, each round's figures by cell, the paired change of each
figure with its spread pooled over the A/B's cells, a cell's verdict and whether it is worth
measuring again. The plugin's runner (``plugin/ab.py``) drives it; the judge is
:mod:`.judge`'s.

A round is the selected cells measured on one start of one version. Rounds come in blocks of
four, old new new old (A B B A); a block's change of a figure is
``d = (ln B1 + ln B2 − ln A1 − ln A2) / 2``, in which a drift linear over the block cancels
exactly. The blocks' d of one figure are its samples; their spread is pooled over every figure
of the same kind of cell (decode, prefill) in the A/B, since a slow start or a drift is mostly
the whole server's: two blocks then give many degrees of freedom where one cell alone has one.

No numpy, no pytest.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .judge import Change, Judgement, Verdict, abba_blocks, judge

#: the arms in the order of one block: old, new, new, old
BLOCK = ("old", "new", "new", "old")
#: blocks every A/B runs before any cell may stop (one block's spread is not known)
MIN_BLOCKS = 2
#: the figures an A/B judges, by the kind of cell, and whether higher is better: the ones the
#: stored gate floors by default (latency ceilings are opt-in there; here they are shown)
FIGURES: Mapping[str, tuple[tuple[str, bool], ...]] = {
    "decode": (("total_tok_s", True), ("per_request_tok_s", True)),
    "prefill": (("prompt_tok_s", True),),
}
#: a cell's verdict from its figures': the first of these that any figure has
_PRECEDENCE = (Verdict.REGRESSED, Verdict.UNKNOWN, Verdict.IMPROVED, Verdict.SAME)


def arm_of(index: int) -> str:
    """The arm of round ``index`` (from 0): old, new, new, old, old, new, ..."""
    return BLOCK[index % len(BLOCK)]


def kind_of(cell: str) -> str:
    """``decode[32K-c8]`` → decode; ``prefill[8K]`` → prefill."""
    return cell.partition("[")[0]


@dataclass
class Round:
    """One round: one start of one version, the selected cells' figures on it."""

    index: int  # from 0
    arm: str
    #: cell id → figure → value, for the cells measured validly in this round
    cells: dict[str, dict[str, float]] = field(default_factory=dict)
    #: cell id → why it has no figures in this round (failed, error, skipped)
    missing: dict[str, str] = field(default_factory=dict)
    duration_s: float = 0.0
    started_at: str = ""

    @property
    def block(self) -> int:
        return self.index // len(BLOCK)

    def to_dict(self) -> dict[str, Any]:
        return {
            "round": self.index + 1,
            "arm": self.arm,
            "block": self.block + 1,
            "started_at": self.started_at,
            "duration_s": round(self.duration_s, 3),
            "cells": self.cells,
            "missing": self.missing,
        }


@dataclass(frozen=True)
class CellVerdict:
    """One cell's judgement: its verdict, each figure's, and how it was measured."""

    cell: str
    verdict: Verdict
    figures: Mapping[str, Judgement]
    blocks: int  # complete blocks judged
    starts: int  # rounds in which the cell was measured (its starts)
    #: for an unknown: about how many more blocks would decide it (None: none would)
    more_blocks: int | None = None
    #: why a cell has no verdict from its figures (too few complete blocks)
    missing: str | None = None
    explanation: str | None = None

    def words(self) -> str:
        """``regressed: total tok/s −10.2 % (95 % interval −12.0 % … −8.4 %), ...``"""
        if self.missing:
            return f"{self.verdict.value}: {self.missing}"
        from ..figures import find

        parts = []
        for name, j in self.figures.items():
            lo, hi = j.change.interval()
            label = getattr(find(name), "label", name)
            parts.append(f"{label} {j.change.relative:+.1%} (95 % {lo:+.1%} … {hi:+.1%})")
        text = f"{self.verdict.value}: " + ", ".join(parts)
        text += f" · tolerance ±{next(iter(self.figures.values())).tolerance:.0%}"
        text += f" · {self.blocks} blocks, {self.starts} starts"
        if self.verdict is Verdict.UNKNOWN:
            text += (
                f" · about {self.more_blocks} more block(s) of 4 starts would decide it"
                if self.more_blocks is not None
                else " · too close to the tolerance to decide"
            )
        return text

    def to_dict(self) -> dict[str, Any]:
        figures = {}
        for name, j in self.figures.items():
            lo, hi = j.change.interval()
            figures[name] = {
                "verdict": j.verdict.value,
                "change": round(j.change.relative, 6),
                "interval": [round(lo, 6), round(hi, 6)],
                "se": round(j.change.se, 6) if math.isfinite(j.change.se) else None,
                "df": j.change.df,
                "more": j.more,
            }
        return {
            "verdict": self.verdict.value,
            "blocks": self.blocks,
            "starts": self.starts,
            "more_blocks": self.more_blocks,
            "missing": self.missing,
            "figures": figures,
            "explanation": self.explanation,
        }


def cell_verdict(verdicts: Iterable[Verdict]) -> Verdict:
    """A cell's verdict from its figures': regressed if any is, else unknown if any is, else
    improved if any is, else same."""
    found = set(verdicts)
    return next((v for v in _PRECEDENCE if v in found), Verdict.UNKNOWN)


@dataclass
class Ledger:
    """Every round of an A/B, and the cells decided so far (not measured again)."""

    tolerance: float
    rounds: list[Round] = field(default_factory=list)
    decided: dict[str, CellVerdict] = field(default_factory=dict)

    # -- the figures ------------------------------------------------------------------------

    def block_changes(self, cell: str, figure: str) -> list[float]:
        """The complete blocks' ln(new / old) of one figure of one cell, in order."""
        out: list[float] = []
        for start in range(0, len(self.rounds) - len(BLOCK) + 1, len(BLOCK)):
            block = self.rounds[start : start + len(BLOCK)]
            values = [r.cells.get(cell, {}).get(figure) for r in block]
            if any(v is None or not v > 0 or not math.isfinite(v) for v in values):
                continue
            a1, b1, b2, a2 = values
            assert a1 and b1 and b2 and a2
            out.extend(abba_blocks([a1, a2], [b1, b2]))
        return out

    def pooled(self, kind: str) -> tuple[float, int]:
        """The spread (variance of one block's d) pooled over every figure of every cell of
        ``kind`` with two or more complete blocks, and its degrees of freedom."""
        ss, df = 0.0, 0
        for cell in self.cells(kind):
            for figure, _ in FIGURES.get(kind, ()):
                d = self.block_changes(cell, figure)
                if len(d) < 2:
                    continue
                mean = sum(d) / len(d)
                ss += sum((x - mean) ** 2 for x in d)
                df += len(d) - 1
        return (ss / df if df else math.inf), df

    def cells(self, kind: str | None = None) -> list[str]:
        """Every cell measured in some round (of ``kind``), in the order first seen."""
        seen: dict[str, None] = {}
        for r in self.rounds:
            for cell in (*r.cells, *r.missing):
                if kind is None or kind_of(cell) == kind:
                    seen.setdefault(cell)
        return list(seen)

    def starts(self, cell: str) -> int:
        return sum(1 for r in self.rounds if cell in r.cells or cell in r.missing)

    # -- the verdicts -----------------------------------------------------------------------

    def judge(self, cell: str) -> CellVerdict:
        """The cell's verdict from its complete blocks, with the kind's pooled spread."""
        kind = kind_of(cell)
        variance, df = self.pooled(kind)
        figures: dict[str, Judgement] = {}
        blocks = 0
        for figure, higher in FIGURES.get(kind, ()):
            d = self.block_changes(cell, figure)
            if not d:
                continue
            blocks = max(blocks, len(d))
            mean = sum(d) / len(d)
            se = math.sqrt(variance / len(d)) if df else math.inf
            change = Change(mean if higher else -mean, se, df or None, len(d))
            figures[figure] = judge(change, self.tolerance)
        starts = self.starts(cell)
        if not figures:
            why = self._why_missing(cell)
            return CellVerdict(cell, Verdict.UNKNOWN, {}, 0, starts, None, why)
        verdict = cell_verdict(j.verdict for j in figures.values())
        more = None
        if verdict is Verdict.UNKNOWN:
            needed = [j.more for j in figures.values() if j.verdict is Verdict.UNKNOWN]
            more = None if any(m is None for m in needed) else max(m for m in needed if m)
        return CellVerdict(cell, verdict, figures, blocks, starts, more)

    def _why_missing(self, cell: str) -> str:
        reasons = [r.missing[cell] for r in self.rounds if cell in r.missing]
        if reasons:
            return f"no complete block of valid measurements ({reasons[-1]})"
        return "no complete block of valid measurements"

    def wanted(self, cell: str) -> bool:
        """Is the cell measured in the next round (not decided yet)?"""
        return cell not in self.decided

    def end_block(self, max_blocks: int, room: int) -> list[str]:
        """After a block: decide each undecided cell that has its verdict, or that no more
        blocks could decide (within ``max_blocks`` and ``room``, the blocks the budget still
        allows); the cells decided now."""
        done = len(self.rounds) // len(BLOCK)
        if done < MIN_BLOCKS:
            return []
        left = min(max_blocks - done, room)
        now: list[str] = []
        for cell in self.cells():
            if cell in self.decided:
                continue
            got = self.judge(cell)
            hopeless = got.verdict is Verdict.UNKNOWN and (
                got.more_blocks is None or got.more_blocks > left or left <= 0
            )
            if got.verdict is not Verdict.UNKNOWN or hopeless or got.missing:
                self.decided[cell] = got
                now.append(cell)
        return now

    def finish(self) -> dict[str, CellVerdict]:
        """Every cell's verdict at the end: as decided, else judged now."""
        return {c: self.decided.get(c) or self.judge(c) for c in self.cells()}

    def to_dict(self, verdicts: Mapping[str, CellVerdict] | None = None) -> dict[str, Any]:
        verdicts = verdicts if verdicts is not None else self.finish()
        counts = {v.value: 0 for v in (Verdict.REGRESSED, Verdict.IMPROVED, Verdict.SAME)}
        counts[Verdict.UNKNOWN.value] = 0
        for v in verdicts.values():
            counts[v.verdict.value] += 1
        return {
            "tolerance": self.tolerance,
            "order": [r.arm for r in self.rounds],
            "rounds": [r.to_dict() for r in self.rounds],
            "cells": {c: v.to_dict() for c, v in verdicts.items()},
            "counts": counts,
        }


__all__ = [
    "BLOCK",
    "FIGURES",
    "MIN_BLOCKS",
    "CellVerdict",
    "Ledger",
    "Round",
    "arm_of",
    "cell_verdict",
    "kind_of",
]
