"""``python -m pytest_llmspeed``: the page and the comparison of results files, after a run.

    python -m pytest_llmspeed report RESULTS.json -o PAGE.html
    python -m pytest_llmspeed compare OLD.json NEW.json [--html PAGE.html] [--markdown OUT.md]
    python -m pytest_llmspeed history FILES…|DIR [--html PAGE.html] [--json OUT.json]

The formats a run can be written as are those of ``report.outputs`` (``-o`` picks one by the
file's suffix, ``compare`` has an option for each). Reads any results file pytest-llmspeed has
written (``results.load``). ``compare`` judges each cell as the stored-baseline gate would
(gate/judge.py's four verdicts: regressed, improved, same, unknown); ``history`` finds the
change points of each cell over many runs (docs/history.md). Exit status: 0, or 1 when
``compare`` finds a regression (or a cell too noisy to tell, with ``--unknown=fail``) or the
newest segment of a cell regressed in ``history``, 2 on bad input (one line saying what and
what to do). No pytest import.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING

from .report.outputs import OUTPUTS, by_suffix
from .results import ResultsError, load

if TYPE_CHECKING:
    from .report.compare import Comparison
    from .results import Results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m pytest_llmspeed",
        description="The speed-test page, the comparison of two runs and the history of many, "
        "from results files.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    report = sub.add_parser("report", help="render the page of a results file")
    report.add_argument("results", help="a results file (--llm-results)")
    report.add_argument(
        "-o",
        "--output",
        required=True,
        help="the file to write; its suffix picks the format: "
        + "; ".join(f"{o.suffix} {o.help}" for o in OUTPUTS),
    )
    cmp = sub.add_parser(
        "compare",
        help="compare two runs, cell by cell; or show the A/B one results file holds "
        "(--llm-serve-baseline: old against new, measured side by side)",
    )
    cmp.add_argument(
        "old", help="the earlier results file (before the upgrade), or an A/B's results file"
    )
    cmp.add_argument(
        "new", nargs="?", help="the later results file (after the upgrade); none for an A/B's"
    )
    for output in OUTPUTS:
        cmp.add_argument(
            f"--{output.key}",
            dest=output.dest,
            help=f"also write {output.help} of the new run, with the comparison",
        )
    cmp.add_argument("--markdown", help="also write the comparison as Markdown")
    _tolerance(
        cmp,
        "the change tolerated, a fraction (default 0.05): a cell is regressed when worse by "
        "more beyond the noise, same when shown within it",
    )
    cmp.add_argument(
        "--unknown",
        choices=("warn", "fail"),
        default="warn",
        help="what a cell too noisy to tell does to the exit status: warn (exit 0, the cells "
        "named) or fail (exit 1), as --llm-unknown (default: warn)",
    )
    hist = sub.add_parser(
        "history",
        help="the history of each cell over many runs, with its change points (docs/history.md)",
    )
    hist.add_argument(
        "paths",
        nargs="+",
        metavar="FILES|DIR",
        help="results files, or folders: every results file under them (CI artifacts of many runs)",
    )
    hist.add_argument("--html", help="also write the history's page (one self-contained file)")
    hist.add_argument("--json", help="also write the history as JSON")
    _tolerance(
        hist,
        "the smallest change reported, a fraction (default 0.05, the gate's): a change point "
        "is kept when the judge calls it regressed or improved at this tolerance",
    )
    args = parser.parse_args(argv)
    try:
        return _run(args)
    except ResultsError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"error: cannot write {exc.filename}: {exc.strerror}", file=sys.stderr)
        return 2


def _tolerance(parser: argparse.ArgumentParser, words: str) -> None:
    parser.add_argument("--tolerance", type=float, default=0.05, help=words)


def _run(args: argparse.Namespace) -> int:
    from .report.compare import compare, lines, markdown

    if args.command == "history":
        return _history(args)
    if args.command == "report":
        output = by_suffix(args.output)
        output.write(load(args.results), None, args.output)
        print(f"{output.label}: {args.output}")
        return 0
    if args.new is None:
        return _ab(args)
    old, new = load(args.old), load(args.new)
    result = compare(old, new, args.tolerance)
    for line in lines(result, args.old)[1:]:
        print(line)
    _written(args, lambda: markdown(result, args.old, args.new), new, result)
    return result.exit_status(unknown_fails=args.unknown == "fail")


def _written(
    args: argparse.Namespace,
    text: Callable[[], str],
    results: Results,
    comparison: Comparison | None,
) -> None:
    """``--markdown`` (``text``) and each registered output asked for, each said in a line."""
    if args.markdown:
        with open(args.markdown, "w", encoding="utf-8") as fh:
            fh.write(text())
        print(f"markdown: {args.markdown}")
    for output in OUTPUTS:
        path = getattr(args, output.dest)
        if path:
            output.write(results, comparison, path)
            print(f"{output.label}: {path}")


def _history(args: argparse.Namespace) -> int:
    """``history FILES…|DIR``: the summary, the page and JSON asked for; exit 1 when the
    newest segment of a cell's figure regressed."""
    from .history import build
    from .report.history import lines, render, write_json

    found = build(args.paths, args.tolerance)
    for line in lines(found):
        print(line)
    if args.html:
        render(found).write(args.html)
        print(f"page: {args.html}")
    if args.json:
        write_json(found, args.json)
        print(f"json: {args.json}")
    return found.exit_status()


def _ab(args: argparse.Namespace) -> int:
    """``compare AB.json``: the A/B that one results file holds, as the run showed it; the
    exit status is its verdicts' (1 on a regression; on an unknown only with --unknown=fail)."""
    from .report.ab import lines, markdown

    results = load(args.old)
    if results.ab is None:
        raise ResultsError(
            f"{args.old}: not an A/B's results file (no 'ab' key): give two results files, "
            "the earlier run's and the later one's, or a file written with --llm-serve-baseline"
        )
    ab = results.ab
    for line in lines(ab):
        print(line)
    _written(args, lambda: markdown(ab), results, None)
    counts = results.ab.get("counts", {})
    if counts.get("regressed"):
        return 1
    return 1 if counts.get("unknown") and args.unknown == "fail" else 0


if __name__ == "__main__":
    sys.exit(main())
