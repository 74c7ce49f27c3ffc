"""``python -m benchmarks``: the suite of the project's own benchmarks (docs/benchmarks.md).

python -m benchmarks list                   # the suite's benchmarks
python -m benchmarks run [--quick] [NAME…]  # run them (all when none is named)
python -m benchmarks quote [--check]        # the README's and docs' quoted figures
"""

from __future__ import annotations

import sys

from benchmarks import harness, quotes


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0
    command, rest = argv[0], argv[1:]
    if command == "list":
        for e in harness.SUITE.values():
            print(f"{e.name:20} {e.about}")
        return 0
    if command == "run":
        quick = "--quick" in rest
        docs = harness.run([a for a in rest if a != "--quick"], quick=quick)
        missed = [
            f"{d['benchmark']}.{k}"
            for d in docs
            for k, f in d["figures"].items()
            if f["met"] is False
        ]
        skipped = [d["benchmark"] for d in docs if d["skipped"]]
        failed = [d["benchmark"] for d in docs if d["error"]]
        print(
            f"[suite] {len(docs)} benchmarks, skipped: {', '.join(skipped) or 'none'}, "
            f"failed: {', '.join(failed) or 'none'}"
        )
        if missed:
            print(f"[suite] targets missed: {', '.join(missed)}")
        return 1 if failed else 0
    if command == "quote":
        return quotes.main(rest)
    print(f"unknown command {command!r}\n{__doc__}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
