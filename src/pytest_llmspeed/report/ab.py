"""The A/B in words (issue 31): old against new for every cell with its verdict, for the
terminal and the Markdown job summary. Pure: the results' ``ab`` object in, lines out.

Each arm's figure is the geometric mean of its rounds (the judge works in logs); the change
and its interval are the judge's paired estimate, not the ratio of those means.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from tabulate import tabulate

from ..figures import find, text

#: the verdicts in the order they are counted
ORDER = ("regressed", "improved", "same", "unknown")


def arm_means(doc: Mapping[str, Any], cell: str, figure: str) -> dict[str, float | None]:
    """Each arm's geometric mean of a figure of a cell over the rounds that measured it."""
    out: dict[str, float | None] = {}
    for arm in ("old", "new"):
        values = [
            r["cells"][cell][figure]
            for r in doc.get("rounds", ())
            if r.get("arm") == arm and figure in r.get("cells", {}).get(cell, {})
        ]
        values = [v for v in values if isinstance(v, int | float) and v > 0]
        out[arm] = math.exp(sum(map(math.log, values)) / len(values)) if values else None
    return out


def counts_line(doc: Mapping[str, Any]) -> str:
    counts = doc.get("counts", {})
    return " · ".join(f"{counts.get(v, 0)} {v}" for v in ORDER)


def rows(doc: Mapping[str, Any]) -> list[list[str]]:
    """One row per figure of each cell: cell, its verdict and starts on its first row; the
    figure, each arm's value, the change and its interval."""
    out: list[list[str]] = []
    for cell, v in doc.get("cells", {}).items():
        head = [cell, str(v["verdict"]), str(v.get("starts", 0))]
        figures = v.get("figures") or {}
        if not figures:
            out.append([*head, "—", "—", "—", "—", "—"])
            continue
        for name, f in figures.items():
            figure = find(name)
            means = arm_means(doc, cell, name)
            shown = [
                text(figure, means[a]) if figure and means[a] is not None else "—"
                for a in ("old", "new")
            ]
            lo, hi = f["interval"]
            out.append(
                [
                    *head,
                    figure.label if figure else name,
                    *shown,
                    f"{f['change']:+.1%}",
                    f"{lo:+.1%} … {hi:+.1%}",
                ]
            )
            head = ["", "", ""]
    return out


HEAD = ["Cell", "Verdict", "Starts", "Figure", "Old", "New", "Change", "95 % interval"]


def lines(doc: Mapping[str, Any]) -> list[str]:
    """The terminal's A/B section: what was compared, the table, the counts, and what would
    decide each unknown."""
    rounds: Sequence[Mapping[str, Any]] = doc.get("rounds", ())
    blocks = len(rounds) // 4
    tol = doc.get("tolerance", 0.05)
    out = [
        f"A/B: old against new, {len(rounds)} rounds on fresh starts in ABBA order "
        f"({blocks} blocks of old, new, new, old) · tolerance ±{tol:.0%}"
        + (f" · stopped: {doc['stopped']}" if doc.get("stopped") else "")
    ]
    for arm in ("old", "new"):
        a = doc.get("arms", {}).get(arm, {})
        what = a.get("command") or a.get("endpoint") or "?"
        out.append(f"{arm}: {what}")
        if a.get("server"):
            out.append(f"     {a['server']}")
    out.extend(prior_lines(doc))
    out.extend(tabulate(rows(doc), headers=HEAD, disable_numparse=True).splitlines())
    out.append(
        "Change: the paired change of new against old over the blocks (its 95 % interval); "
        "old and new: each arm's geometric mean."
    )
    out.append(f"verdicts: {counts_line(doc)}")
    for cell, v in doc.get("cells", {}).items():
        if v["verdict"] == "unknown":
            more = v.get("more_blocks")
            why = v.get("missing") or (
                f"about {more} more block(s) of 4 starts would decide it (a longer "
                "--llm-budget, or --llm-ab-prior=FILES: earlier A/Bs' spread between starts)"
                if more is not None
                else "too close to the tolerance for more starts to decide"
            )
            out.append(f"unknown: {cell}: {why}")
        for words in v.get("left_out") or ():
            out.append(f"left out of {cell}: {words} (a stalled window, with its block)")
        if v.get("explanation") and v["verdict"] in ("regressed", "improved"):
            out.append(f"why {cell}: {v['explanation']}")
    return out


def prior_lines(doc: Mapping[str, Any]) -> list[str]:
    """What the A/B took from earlier A/Bs (``--llm-ab-prior``): each file, taken or why not,
    and each kind's spread between starts with its degrees of freedom."""
    prior = doc.get("prior") or {}
    out = []
    for f in prior.get("files") or ():
        why = f.get("refused")
        out.append(f"prior: {f.get('path')}" + (f": not used, {why}" if why else ""))
    for kind, u in (prior.get("used") or {}).items():
        if u.get("how") == "refused":
            ratio = u.get("ratio")
            times = f"{ratio:.1f}× " if isinstance(ratio, int | float) else ""
            out.append(
                f"prior {kind}: not used: this A/B's spread is {times}the prior's, wider than "
                f"chance; its own alone ({u.get('df', 0):g} degrees of freedom)"
            )
            continue
        between = u.get("between")
        sd = (
            f"σ between starts {math.sqrt(between):.1%}, "
            if isinstance(between, int | float) and between >= 0
            else ""
        )
        out.append(
            f"prior {kind}: {sd}{u.get('df', 0):g} degrees of freedom ({u.get('own_df', 0):g} "
            f"of this A/B's + {u.get('prior_df', 0):g} of the prior's)"
        )
    return out


def markdown(doc: Mapping[str, Any]) -> str:
    """The A/B for the job summary: the table and the counts, every cell string escaped."""
    head = "| " + " | ".join(HEAD) + " |\n| " + " | ".join("---" for _ in HEAD) + " |\n"
    body = "".join(
        "| " + " | ".join(c.replace("|", "\\|") for c in row) + " |\n" for row in rows(doc)
    )
    rounds = len(doc.get("rounds", ()))
    return (
        f"### A/B: old against new ({rounds} rounds, ABBA, tolerance "
        f"±{doc.get('tolerance', 0.05):.0%})\n\n{head}{body}\n{counts_line(doc)}\n"
    )


__all__ = ["HEAD", "arm_means", "counts_line", "lines", "markdown", "prior_lines", "rows"]
