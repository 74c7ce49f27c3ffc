"""Replay stored A/B results files through the ledger at hand (gate/ab.py of the importable
plugin): the same rounds, today's verdicts, counted per figure by the new version's slowdown.
What a change to the A/B's arithmetic does alone, on data already measured (the cells a run
stopped early stay stopped: their later rounds were never measured).

    python -m benchmarks.studies.ab_replay "/tmp/ab-run/b/*/slower*/r.json"

The slowdown is read from the folder name (``slower0.1``), as benchmarks/studies/ab_vs_stored.py
writes them.
"""

from __future__ import annotations

import argparse
import collections
import glob
import json
import re

from pytest_llmspeed.gate.ab import Ledger, Round


def replay(doc: dict) -> dict[str, str]:
    """Each figure's verdict (``cell figure`` → verdict) of an A/B's rounds, judged now."""
    ledger = Ledger(doc["tolerance"])
    for r in doc["rounds"]:
        ledger.rounds.append(
            Round(r["round"] - 1, r["arm"], r["cells"], r["missing"], r.get("se", {}))
        )
    return {
        f"{cell} {figure}": j.verdict.value
        for cell, v in ledger.finish().items()
        for figure, j in v.figures.items()
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("pattern", help="a glob of results files holding an A/B")
    args = parser.parse_args()
    now: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    then: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    for path in sorted(glob.glob(args.pattern)):
        with open(path, encoding="utf-8") as f:
            doc = json.load(f).get("ab")
        found = re.search(r"slower([0-9.]+)", path)
        if not doc or not found:
            continue
        slower = found.group(1)
        now[slower].update(replay(doc).values())
        for v in doc["cells"].values():
            then[slower].update(j["verdict"] for j in v.get("figures", {}).values())
    for slower in sorted(now, key=float):
        print(
            f"{float(slower):.0%} slower: as run {dict(then[slower])}; replayed {dict(now[slower])}"
        )


if __name__ == "__main__":
    main()
