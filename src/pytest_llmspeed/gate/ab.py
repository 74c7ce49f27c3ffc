"""The A/B of two versions measured now, alternately (issue 31), as pure bookkeeping and
arithmetic: the ABBA order of rounds, each round's figures by cell, the paired change of each
figure with its spread pooled over the A/B's cells, a cell's verdict and whether it is worth
measuring again. The plugin's runner (``plugin/ab.py``) drives it; the judge is
:mod:`.judge`'s.

A round is the selected cells measured on one start of one version. Rounds come in blocks of
four, old new new old (A B B A) or new old old new (B A A B), each block's order drawn at
random from the A/B's seed (as Pinpoint and asv order their repeats: a load that rises and falls
with the rounds' own rhythm becomes noise that the spread sees, not a change); a block's change
of a figure is ``d = (ln B1 + ln B2 − ln A1 − ln A2) / 2``, in which a drift linear over the
block cancels exactly. The blocks' d of one figure are its samples. Their variance has two
parts: what moves between starts (a start's factor, the drift's curvature), mostly the whole
server's, and each measurement's own noise, which each round's interval gives (a decode
window's batch means, a prefill cell's cold requests):
``var d = σ² + (w²(A1) + w²(B1) + w²(B2) + w²(A2)) / 4``. σ² is pooled over every figure of
every cell of the same kind (its spread of d less the windows' part), so a cell's few blocks
borrow its kind's spread and keep their own noise. Not over every kind: counted per block,
the pool gains no degrees of freedom from more cells, and a prefill whose cold requests a
loaded machine moved ×5 between rounds made a −21 % decode cell unknown after 8 starts. Where
a round has no interval, the spread of d pooled over the cells of that kind stands instead.

The pooled spread's degrees of freedom are counted honestly: a round's cells share its start
and the minutes it ran in, so their blocks' d move together and ten figures of one block are
not ten independent samples. They count as one sample a block's d and one a block's noise
contrast (2 n − 1 in n blocks), as a sample of few clusters is counted (t with G − 1 degrees of
freedom: Cameron & Miller 2015). Counted as independent, the 95 % intervals of unchanged A/Bs
under a start noise shared by the whole server missed 13.6 % of the time
(tests/unit/test_ab_ledger.py's model, two blocks: 9 figures a block); counted so, 5.2 %. Tried
and left: Kish's design effect with the figures' correlation estimated from their cross-
products (few blocks know it too roughly: 10 % missed), and Satterthwaite's degrees of freedom
of σ² + a figure's own part (a quiet figure beside noisy ones got one, and a 30 % slower c1
cell stayed unknown after 16 starts).

No numpy, no pytest.
"""

from __future__ import annotations

import math
import random
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..quantiles import f_quantile
from .judge import Change, Judgement, Verdict, judge

#: the arms in the order of one block: old, new, new, old (its mirror, new old old new, is the
#: other order a block may be drawn in)
BLOCK = ("old", "new", "new", "old")
MIRROR = ("new", "old", "old", "new")
#: blocks a cell is measured in before it may be called regressed, improved or hopelessly
#: unknown; "same" may stop it after the first. One block's spread comes from its noise
#: contrasts alone, which a drift's curvature does not move but the block's change does: a
#: regression called on one block would be called on too little (a false alarm fails a build),
#: a "same" called on one block lets an unchanged cell stop at 4 starts
MIN_BLOCKS = 2
#: the figures an A/B judges, by the kind of cell, and whether higher is better: the ones the
#: stored gate floors by default (latency ceilings are opt-in there; here they are shown)
FIGURES: Mapping[str, tuple[tuple[str, bool], ...]] = {
    "decode": (("total_tok_s", True), ("per_request_tok_s", True)),
    "prefill": (("prompt_tok_s", True),),
}
#: a round whose figure is this many times off its version's median is a stalled window, left
#: out with its block (a start 40–50 % slow, as real vLLM's have been, is a factor of 2)
STALL_FACTOR = 3.0
#: the least spread between starts (relative standard deviation of a start's effect) an A/B
#: assumes: the blocks' spread less their windows' noise is an estimate on a few degrees of
#: freedom, and often 0 when the blocks happen to agree; an interval from the windows' noise
#: alone then claims what a handful of starts cannot show (an unchanged version read −2.7 % …
#: −1.6 % after four blocks, "regressed" at a 1 % tolerance). 1 % is below the spread of every
#: server measured for this project (the simulator's default start noise 2 %; real vLLM's
#: CPU build tens of %), so it widens only the intervals that were too narrow (docs/judge.md)
BETWEEN_FLOOR = 0.01
#: a cell's verdict from its figures': the first of these that any figure has
_PRECEDENCE = (Verdict.REGRESSED, Verdict.UNKNOWN, Verdict.IMPROVED, Verdict.SAME)


def block_order(block: int, seed: int | None = None) -> tuple[str, ...]:
    """The arms of block ``block`` (from 0) in order: without a seed always old new new old;
    with one, that or its mirror, drawn for each block (the same seed, the same orders)."""
    if seed is None:
        return BLOCK
    return MIRROR if random.Random(seed * 1_000_003 + block).random() < 0.5 else BLOCK


def arm_of(index: int, seed: int | None = None) -> str:
    """The arm of round ``index`` (from 0): old, new, new, old, old, new, ... without a seed;
    with one, each block's order as :func:`block_order` draws it."""
    return block_order(index // len(BLOCK), seed)[index % len(BLOCK)]


def kind_of(cell: str) -> str:
    """``decode[32K-c8]`` → decode; ``prefill[8K]`` → prefill."""
    return cell.partition("[")[0]


def clustered_df(sizes: Iterable[int]) -> float:
    """The degrees of freedom of a spread whose samples come in groups that move together (a
    block's figures share its starts), from the groups' sizes: the samples over the groups'
    size weighed by size (``Σ m_g / (Σ m_g² / Σ m_g)``), i.e. about one a group, as for a
    sample of few clusters (Cameron & Miller 2015, "A practitioner's guide to cluster-robust
    inference": t with G − 1 degrees of freedom). 0 without samples."""
    sizes = [m for m in sizes if m > 0]
    if not sizes:
        return 0.0
    return sum(sizes) ** 2 / sum(m * m for m in sizes)


@dataclass(frozen=True)
class Block:
    """One complete block of one figure: ``d``, its ln(new / old); ``noise``, the contrast
    ``(−A1 + 3 B1 − 3 B2 + A2) / √20`` of its logs, which neither the versions' difference nor
    a drift up to quadratic over the block moves and whose variance is d's (a measurement's
    noise), so each block gives the spread one more degree of freedom; each with the variance
    the measurements' own intervals give it (None: a round had none)."""

    d: float
    noise: float
    d_own: float | None = None
    noise_own: float | None = None
    start: int = 0  # the index of its first round

    @classmethod
    def of(
        cls,
        logs: Sequence[float],
        ses: Sequence[float] | None,
        arms: Sequence[str] = BLOCK,
        start: int = 0,
    ) -> Block:
        """From the logs of a block's four rounds in the order measured, their arms (old new
        new old, or its mirror: d's sign follows the arms; the noise contrast is the same for
        both orders, orthogonal to either's versions contrast, a constant and a drift up to
        quadratic)."""
        x0, x1, x2, x3 = logs
        sign = 1.0 if tuple(arms) == BLOCK else -1.0
        d = sign * (x1 + x2 - x0 - x3) / 2
        noise = (-x0 + 3 * x1 - 3 * x2 + x3) / math.sqrt(20)
        if ses is None:
            return cls(d, noise, start=start)
        w = [x * x for x in ses]
        return cls(d, noise, sum(w) / 4, (w[0] + 9 * w[1] + 9 * w[2] + w[3]) / 20, start)


@dataclass(frozen=True)
class Spread:
    """The blocks' spread over some figures: ``ss``, the sum of squares of the blocks' d about
    each figure's mean and of their noise contrasts; ``own``, what the measurements' own
    noise accounts for of it; ``samples``, its divisor (2 n − 1 a figure of n blocks); the
    sizes of the groups that move together (a block's d, a block's noise contrast: how many
    figures each holds)."""

    ss: float
    own: float
    samples: int
    groups: tuple[int, ...]
    least: int = 1  # the most samples one figure gives (2 n − 1)

    def df(self) -> float:
        """The degrees of freedom of the pooled variance: about one a group of a block's
        figures (:func:`clustered_df`), at least one figure's own (2 n − 1), to a tenth."""
        if not self.samples:
            return 0.0
        return round(max(self.least, clustered_df(self.groups) - 1), 1)


#: the one-sided level at which an A/B's own spread of a kind is shown wider than an earlier
#: A/B's (an F test of the two variances of one block's d): the prior is then not pooled
PRIOR_LEVEL = 0.95


@dataclass(frozen=True)
class KindSpread:
    """One kind's spread in one A/B (or several pooled): σ², what moves between starts, with
    its degrees of freedom (None: no round had intervals), and the variance of one block's d
    in all (σ² and the measurements' own noise) with its degrees of freedom."""

    between: float | None
    between_df: float
    total: float
    total_df: float

    def to_dict(self) -> dict[str, Any]:
        return {
            "between": None if self.between is None else round(self.between, 9),
            "between_df": self.between_df,
            "total": round(self.total, 9),
            "total_df": self.total_df,
        }


def pool_spreads(spreads: Iterable[KindSpread]) -> KindSpread | None:
    """Several A/Bs' spreads of one kind as one, each weighed by its degrees of freedom."""
    got = [s for s in spreads if s.total_df > 0 and math.isfinite(s.total)]
    if not got:
        return None
    between = [s for s in got if s.between is not None and s.between_df > 0]
    b_df = sum(s.between_df for s in between)
    t_df = sum(s.total_df for s in got)
    return KindSpread(
        sum((s.between or 0.0) * s.between_df for s in between) / b_df if b_df else None,
        round(b_df, 1),
        sum(s.total * s.total_df for s in got) / t_df,
        round(t_df, 1),
    )


@dataclass(frozen=True)
class PriorUse:
    """What one kind's verdicts took from the prior: ``pooled`` (the A/B's own spread and the
    prior's, by degrees of freedom) or ``refused`` (the A/B's own spread is wider than the
    prior's beyond chance, so its own alone), with the variances and degrees of freedom the
    verdicts then use: σ² (``between``, ``df``) and one block's d in all (``total``,
    ``total_df``, for rounds without intervals)."""

    how: str
    between: float | None
    df: float
    total: float
    total_df: float
    own_df: float
    prior_df: float
    ratio: float  # the A/B's own spread of d over the prior's (the F test's statistic)

    def to_dict(self) -> dict[str, Any]:
        return {
            "how": self.how,
            "between": None if self.between is None else round(self.between, 9),
            "df": self.df,
            "total": round(self.total, 9),
            "total_df": self.total_df,
            "own_df": self.own_df,
            "prior_df": self.prior_df,
            "ratio": round(self.ratio, 4) if math.isfinite(self.ratio) else None,
        }


@dataclass
class Round:
    """One round: one start of one version, the selected cells' figures on it."""

    index: int  # from 0
    arm: str
    #: cell id → figure → value, for the cells measured validly in this round
    cells: dict[str, dict[str, float]] = field(default_factory=dict)
    #: cell id → why it has no figures in this round (failed, error, skipped)
    missing: dict[str, str] = field(default_factory=dict)
    #: cell id → figure → its relative standard error within the round (from its interval;
    #: absent: none known)
    se: dict[str, dict[str, float]] = field(default_factory=dict)
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
            "se": self.se,
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
    #: the rounds left out as stalled windows, in words (``round 6 (new): total tok/s ×1/35``)
    left_out: tuple[str, ...] = ()

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
            "left_out": list(self.left_out),
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
    #: the seed each block's order is drawn from (:func:`block_order`; None: always ABBA)
    seed: int | None = None
    #: earlier A/Bs' spreads by kind (``--llm-ab-prior``), pooled with this A/B's own unless
    #: its own is wider beyond chance (:meth:`prior_use`)
    prior: dict[str, KindSpread] = field(default_factory=dict)

    def arm(self, index: int) -> str:
        """The arm of round ``index`` in this A/B's order."""
        return arm_of(index, self.seed)

    # -- the figures ------------------------------------------------------------------------

    def block_changes(self, cell: str, figure: str) -> list[float]:
        """The complete blocks' ln(new / old) of one figure of one cell, in order."""
        return [b.d for b in self.blocks(cell, figure)]

    def blocks(self, cell: str, figure: str) -> list[Block]:
        """The complete blocks of one figure of one cell, in order (a block holding a stalled
        round of the figure, :meth:`stalled`, is left out: not complete)."""
        out: list[Block] = []
        stalled = {r for r, _ in self.stalled(cell, figure)}
        for start in range(0, len(self.rounds) - len(BLOCK) + 1, len(BLOCK)):
            rounds = self.rounds[start : start + len(BLOCK)]
            if any(r.index in stalled for r in rounds):
                continue
            values = [r.cells.get(cell, {}).get(figure) for r in rounds]
            if any(v is None or not v > 0 or not math.isfinite(v) for v in values):
                continue
            arms = tuple(r.arm for r in rounds)
            if arms not in (BLOCK, MIRROR):
                continue  # not a block of two of each (a ledger built by hand)
            logs = [math.log(v) for v in values if v is not None]
            ses = [r.se.get(cell, {}).get(figure) for r in rounds]
            known = [w for w in ses if w is not None and math.isfinite(w)]
            out.append(Block.of(logs, known if len(known) == len(BLOCK) else None, arms, start))
        return out

    def stalled(self, cell: str, figure: str) -> list[tuple[int, float]]:
        """The rounds whose figure is off its version's median (over the rounds of that version
        that measured it, three or more) by a factor of :data:`STALL_FACTOR` or more, each with
        that factor: a window the machine stalled (another process took the cores: 86 tok/s
        where the version's median was 3,000), not the version's speed, which no start or
        drift moves that far. Pooled with the rest, one such round would widen every cell's
        interval and decide its own cell's verdict either way."""
        out: list[tuple[int, float]] = []
        for arm in ("old", "new"):
            got = [
                (r.index, v)
                for r in self.rounds
                if r.arm == arm
                for v in [r.cells.get(cell, {}).get(figure)]
                if v is not None and v > 0 and math.isfinite(v)
            ]
            if len(got) < 3:
                continue
            values = sorted(v for _, v in got)
            mid = len(values) // 2
            median = values[mid] if len(values) % 2 else math.sqrt(values[mid - 1] * values[mid])
            for index, v in got:
                factor = max(v / median, median / v)
                if factor >= STALL_FACTOR:
                    out.append((index, factor))
        return sorted(out)

    def _spread(self, cells: Iterable[str]) -> Spread:
        """Over every figure of ``cells`` with a complete block: the blocks' d about their
        mean and their noise contrasts (see :class:`Spread`)."""
        ss = own = 0.0
        samples = least = 0
        groups: Counter[tuple[int, str]] = Counter()
        for cell in cells:
            for figure, _ in FIGURES.get(kind_of(cell), ()):
                got = self.blocks(cell, figure)
                if not got:
                    continue
                n = len(got)
                mean = sum(b.d for b in got) / n
                ss += sum((b.d - mean) ** 2 + b.noise**2 for b in got)
                samples += 2 * n - 1  # one block: its noise contrast alone
                least = max(least, 2 * n - 1)
                groups.update((b.start, "noise") for b in got)
                if n > 1:  # one block's d about its own mean is no sample
                    groups.update((b.start, "d") for b in got)
                if all(b.d_own is not None for b in got):
                    own += sum((b.d_own or 0.0) * (n - 1) / n + (b.noise_own or 0.0) for b in got)
        return Spread(ss, own, samples, tuple(groups.values()), max(1, least))

    def pooled(self, kind: str) -> tuple[float, float]:
        """The variance of one block's d pooled over every figure of every cell of ``kind``
        with a complete block (the blocks' spread about their mean, and each block's noise
        contrast), and its degrees of freedom (:meth:`Spread.df`)."""
        spread = self._spread(self.cells(kind))
        if not spread.samples:
            return math.inf, 0
        return spread.ss / spread.samples, spread.df()

    def between(self, kind: str) -> tuple[float, float] | None:
        """σ², what moves between starts, pooled over every figure of every cell of ``kind``
        whose rounds all have intervals: the blocks' spread less the measurements' own part
        (at least :data:`BETWEEN_FLOOR` squared);
        its degrees of freedom (about one a block's d and one a block's noise contrast, less
        one: a block's figures share its starts, :meth:`Spread.df`). None when no figure has a
        complete block."""
        spread = self._spread(
            c
            for c in self.cells(kind)
            if all(
                b.d_own is not None
                for f, _ in FIGURES.get(kind_of(c), ())
                for b in self.blocks(c, f)
            )
        )
        if not spread.samples:
            return None
        return max(BETWEEN_FLOOR**2, (spread.ss - spread.own) / spread.samples), spread.df()

    def kind_spread(self, kind: str) -> KindSpread | None:
        """This A/B's own spread of ``kind`` (what an A/B after it takes as its prior); None
        without a complete block."""
        total, total_df = self.pooled(kind)
        if not total_df:
            return None
        between = self.between(kind)
        if between is None:
            return KindSpread(None, 0.0, total, total_df)
        return KindSpread(between[0], between[1], total, total_df)

    def prior_use(self, kind: str) -> PriorUse | None:
        """How the prior of ``kind`` joins this A/B's own spread (None: no prior, or no block
        of its own yet). Pooled by degrees of freedom, unless a one-sided F test of one block's
        variance of d finds this A/B's wider than the prior's (a noisier day than the prior's:
        its intervals must widen, not borrow a narrower spread)."""
        prior = self.prior.get(kind)
        own = self.kind_spread(kind)
        if prior is None or own is None:
            return None
        ratio = own.total / prior.total if prior.total > 0 else math.inf
        if ratio > f_quantile(PRIOR_LEVEL, own.total_df, prior.total_df):
            return PriorUse(
                "refused", own.between, own.between_df, own.total, own.total_df,
                own.between_df, prior.between_df, ratio,
            )  # fmt: skip
        between: float | None = None
        df = own.between_df
        if own.between is not None and prior.between is not None:
            df = own.between_df + prior.between_df
            between = (own.between * own.between_df + prior.between * prior.between_df) / df
        total_df = own.total_df + prior.total_df
        total = (own.total * own.total_df + prior.total * prior.total_df) / total_df
        return PriorUse(
            "pooled", between, round(df, 1), total, round(total_df, 1), own.between_df,
            prior.between_df, ratio,
        )  # fmt: skip

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
        """The cell's verdict from its complete blocks: each figure's variance of d is the
        A/B's σ² plus its own measurements' noise (or, without intervals, the kind's pooled
        spread)."""
        kind = kind_of(cell)
        between = self.between(kind)
        kind_var, kind_df = self.pooled(kind)
        use = self.prior_use(kind)
        if use is not None:  # an earlier A/B's spread, pooled (or refused: this one's alone)
            if between is not None and use.between is not None:
                between = (use.between, use.df)
            kind_var, kind_df = use.total, use.total_df
        figures: dict[str, Judgement] = {}
        blocks = 0
        for figure, higher in FIGURES.get(kind, ()):
            got = self.blocks(cell, figure)
            if not got:
                continue
            n = len(got)
            blocks = max(blocks, n)
            mean = sum(b.d for b in got) / n
            if between is not None and all(b.d_own is not None for b in got):
                own = sum(b.d_own or 0.0 for b in got) / n
                variance, df = between[0] + own, between[1]
            else:
                variance, df = kind_var, kind_df
            se = math.sqrt(variance / n) if df else math.inf
            change = Change(mean if higher else -mean, se, df or None, n)
            figures[figure] = judge(change, self.tolerance)
        starts = self.starts(cell)
        if not figures:
            why = self._why_missing(cell)
            return CellVerdict(cell, Verdict.UNKNOWN, {}, 0, starts, None, why)
        left_out = tuple(
            f"round {i + 1} ({self.rounds[i].arm}): {figure} off its version's median ×{f:.1f}"
            for figure, _ in FIGURES.get(kind, ())
            for i, f in self.stalled(cell, figure)
        )
        verdict = cell_verdict(j.verdict for j in figures.values())
        more = None
        if verdict is Verdict.UNKNOWN:
            needed = [j.more for j in figures.values() if j.verdict is Verdict.UNKNOWN]
            more = None if any(m is None for m in needed) else max(m for m in needed if m)
        return CellVerdict(cell, verdict, figures, blocks, starts, more, left_out=left_out)

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
        left = min(max_blocks - done, room)
        now: list[str] = []
        for cell in self.cells():
            if cell in self.decided:
                continue
            got = self.judge(cell)
            if done < MIN_BLOCKS and not (got.verdict is Verdict.SAME and left > 0):
                continue  # before the second block only "same" stops a cell (see MIN_BLOCKS)
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
        spreads = {k: got.to_dict() for k in FIGURES if (got := self.kind_spread(k))}
        uses = {k: use.to_dict() for k in FIGURES if (use := self.prior_use(k))}
        return {
            "tolerance": self.tolerance,
            "seed": self.seed,
            "order": [r.arm for r in self.rounds],
            #: this A/B's own spread by kind: what a later A/B's --llm-ab-prior reads
            "spread": spreads,
            "prior": {"spread": {k: p.to_dict() for k, p in self.prior.items()}, "used": uses}
            if self.prior
            else None,
            "rounds": [r.to_dict() for r in self.rounds],
            "cells": {c: v.to_dict() for c, v in verdicts.items()},
            "counts": counts,
        }


def spreads_of(ab: Mapping[str, Any]) -> dict[str, KindSpread]:
    """An earlier A/B's spread by kind, from the rounds its results file holds (its "ab"):
    recomputed, so files written before the spread was stored serve too. Raises ValueError
    when the rounds are not an A/B's."""
    rounds = ab.get("rounds")
    if not isinstance(rounds, list):
        raise ValueError("it holds no rounds")
    ledger = Ledger(0.05)
    for i, r in enumerate(rounds):
        if not isinstance(r, Mapping) or r.get("arm") not in ("old", "new"):
            raise ValueError(f"round {i + 1} is not an A/B round")
        cells, se = r.get("cells") or {}, r.get("se") or {}
        if not isinstance(cells, Mapping) or not isinstance(se, Mapping):
            raise ValueError(f"round {i + 1} is not an A/B round")
        ledger.rounds.append(
            Round(
                i,
                str(r["arm"]),
                cells={str(c): _figures(f) for c, f in cells.items()},
                se={str(c): _figures(f) for c, f in se.items()},
            )
        )
    return {k: got for k in FIGURES if (got := ledger.kind_spread(k)) is not None}


def _figures(values: object) -> dict[str, float]:
    if not isinstance(values, Mapping):
        raise ValueError("a round's figures are not an object")
    out = {}
    for name, v in values.items():
        if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
            raise ValueError(f"a round's {name} is {v!r}, not a number")
        out[str(name)] = float(v)
    return out


__all__ = [
    "BLOCK",
    "FIGURES",
    "MIN_BLOCKS",
    "MIRROR",
    "PRIOR_LEVEL",
    "STALL_FACTOR",
    "Block",
    "CellVerdict",
    "KindSpread",
    "Ledger",
    "PriorUse",
    "Round",
    "Spread",
    "arm_of",
    "block_order",
    "cell_verdict",
    "clustered_df",
    "kind_of",
    "pool_spreads",
    "spreads_of",
]
