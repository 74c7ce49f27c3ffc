"""The A/B's arithmetic on a model of its conditions: what share of checks the ledger and the
judge (``gate/ab.py``, ``gate/judge.py``) call regressed, improved, same and unknown, and the
starts a cell takes, for an unchanged new version and ones 5 %, 10 % and 20 % slower.

No server: each round's figures are drawn. A start multiplies every cell of the server by one
factor, ``exp(N(0, start))`` (common to every cell, as a slow start is the whole server's);
a drift ``drift · sin(phase + round · curvature)`` moves every round (ABBA cancels its linear
part in a block, not its curvature); each measurement adds its own noise, which its interval
states (decode windows ``--window``, prefill ``--prefill``). Cells: prefill[1K], decode[1K-c1],
decode[1K-c8], as benchmarks/studies/ab_vs_stored.py runs on the simulator. The rounds stop as
the plugin's do (``Ledger.end_block``), up to ``--blocks`` blocks.

With ``--prior K``, each A/B's ledger has the pooled spread of K earlier unchanged A/Bs of the
same model (their own seeds) as its prior, as ``--llm-ab-prior`` gives it (docs/judge.md, "A
prior from earlier A/Bs"); ``--write`` then writes ab_model_prior.md.

Usage: ``python -m benchmarks.studies.ab_model [--trials 600] [--prior K] [--write]``.
"""

from __future__ import annotations

import argparse
import math
import random

from benchmarks.common import RESULTS, command, table, utc_now, write_page
from pytest_llmspeed.gate.ab import BLOCK, FIGURES, KindSpread, Ledger, Round, arm_of, pool_spreads

CELLS = ("prefill[1K]", "decode[1K-c1]", "decode[1K-c8]")
VERDICTS = ("regressed", "improved", "same", "unknown")


def trial(
    factor: float,
    seed: int,
    args: argparse.Namespace,
    curvature: float,
    prior: dict[str, KindSpread] | None = None,
) -> tuple[Ledger, dict[str, int]]:
    rng = random.Random(seed)
    ledger = Ledger(args.tolerance)
    ledger.prior = prior or {}
    phase = rng.uniform(0, 2 * math.pi)
    for index in range(args.blocks * len(BLOCK)):
        arm = arm_of(index)
        r = Round(index, arm)
        level = rng.gauss(0, args.start) + args.drift * math.sin(phase + index * curvature)
        speed = math.exp(level) * (factor if arm == "new" else 1.0)
        for cell in CELLS:
            if not ledger.wanted(cell):
                continue
            prefill = cell.startswith("prefill")
            own = args.prefill if prefill else args.window
            names = ("prompt_tok_s",) if prefill else ("total_tok_s", "per_request_tok_s")
            r.cells[cell] = {n: 1000.0 * speed * math.exp(rng.gauss(0, own)) for n in names}
            r.se[cell] = dict.fromkeys(names, own)
        ledger.rounds.append(r)
        if (index + 1) % len(BLOCK) == 0:
            ledger.end_block(args.blocks, 1 << 30)
            if not any(ledger.wanted(c) for c in CELLS):
                break
    return ledger, {c: ledger.starts(c) for c in CELLS}


def prior_of(seed: int, args: argparse.Namespace, curvature: float) -> dict[str, KindSpread]:
    """The pooled spread of ``args.prior`` earlier unchanged A/Bs (seeds of their own)."""
    earlier = [
        trial(1.0, 1_000_000 + seed * args.prior + k, args, curvature)[0] for k in range(args.prior)
    ]
    out = {}
    for kind in FIGURES:
        got = pool_spreads(s for e in earlier if (s := e.kind_spread(kind)) is not None)
        if got is not None:
            out[kind] = got
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=600)
    parser.add_argument("--start", type=float, default=0.02, help="start noise (log sd)")
    parser.add_argument("--window", type=float, default=0.01, help="a decode window's own se")
    parser.add_argument("--prefill", type=float, default=0.03, help="a prefill cell's own se")
    parser.add_argument("--drift", type=float, default=0.2)
    parser.add_argument("--tolerance", type=float, default=0.05)
    parser.add_argument("--blocks", type=int, default=4)
    parser.add_argument("--prior", type=int, default=0, help="earlier A/Bs as the prior")
    parser.add_argument("--write", action="store_true")
    args = parser.parse_args()
    rows = []
    for curvature in (0.0, 0.3):
        for factor in (1.0, 0.95, 0.9, 0.8):
            counts = dict.fromkeys(VERDICTS, 0)
            decode = dict.fromkeys(VERDICTS, 0)
            starts = checks = 0
            for seed in range(args.trials):
                prior = prior_of(seed, args, curvature) if args.prior else None
                ledger, used = trial(factor, seed, args, curvature, prior)
                for cell, v in ledger.finish().items():
                    for j in v.figures.values():
                        counts[j.verdict.value] += 1
                        checks += 1
                        if cell.startswith("decode"):
                            decode[j.verdict.value] += 1
                starts += sum(used.values())
            n_decode = sum(decode.values())
            rows.append(
                [
                    f"{factor:.2f}",
                    f"{curvature:g}",
                    *(f"{100 * counts[v] / checks:.1f} %" for v in VERDICTS),
                    f"{100 * decode['regressed'] / n_decode:.1f} % / "
                    f"{100 * decode['same'] / n_decode:.1f} %",
                    f"{starts / (args.trials * len(CELLS)):.1f}",
                    str(checks),
                ]
            )
    head = [
        "new / old",
        "drift curvature (rad a round)",
        *VERDICTS,
        "decode: regressed / same",
        "starts a cell",
        "checks",
    ]
    lines = table(head, rows, "rrrrrrrrr")
    print("\n".join(lines))
    if args.write:
        name = "ab_model_prior.md" if args.prior else "ab_model.md"
        title = "# The A/B's arithmetic on a model of its conditions"
        if args.prior:
            title += f", with {args.prior} earlier A/Bs as the prior (--llm-ab-prior)"
        write_page(
            RESULTS / name,
            [
                title,
                "",
                f"Made {utc_now()} with `{command('benchmarks.studies.ab_model')}`: start noise "
                f"{args.start:.0%} common to every cell, decode windows ±{args.window:.0%} and "
                f"a prefill ±{args.prefill:.0%} (their own se, as their intervals state), a drift "
                f"within ±{args.drift:.0%}, tolerance {args.tolerance:.0%}, up to "
                f"{args.blocks} blocks; {args.trials} A/Bs of 5 checks each (prefill[1K], "
                "decode[1K-c1] and decode[1K-c8], two figures each for decode), the rounds "
                "stopping as the plugin's do. A check is one figure of one cell.",
                "",
                *lines,
            ],
        )


if __name__ == "__main__":
    main()
