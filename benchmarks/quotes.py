"""Figures quoted in the README and docs, kept equal to the suite's JSON results.

A quoted figure is marked in Markdown as

    <!-- bench client_throughput.client_total_tok_s -->87,476 tok/s<!-- /bench -->

an HTML comment naming the benchmark and the figure, the figure's ``text`` from
``benchmarks/results/client_throughput.json``, and a closing comment (both invisible once
rendered). The figure ``commit`` is the commit its result was measured at (``8ae081e``, with
``+changes`` when the tree had uncommitted changes). ``python -m benchmarks quote`` rewrites
every marked figure from the JSON files; ``--check`` only reports the differences, and
``tests/unit/test_benchmark_quotes.py`` fails on any.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.common import RESULTS, ROOT

#: one marked figure: its benchmark, its figure's name, the quoted text
MARK = re.compile(
    r"<!-- bench (?P<bench>[a-z0-9_]+)\.(?P<figure>[A-Za-z0-9_]+) -->"
    r"(?P<text>.*?)<!-- /bench -->"
)


def documents(root: Path = ROOT) -> list[Path]:
    """The Markdown files that may quote figures: the README and docs/."""
    return [root / "README.md", *sorted((root / "docs").glob("*.md"))]


@dataclass(frozen=True)
class Quote:
    """One marked figure in a document."""

    path: Path
    line: int
    bench: str
    figure: str
    text: str

    def where(self) -> str:
        return f"{self.path.name}:{self.line}: {self.bench}.{self.figure}"


FENCE = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)


def _fenced(text: str) -> list[tuple[int, int]]:
    """The spans of fenced code blocks: a marker shown there is an example, not a quote."""
    return [(m.start(), m.end()) for m in FENCE.finditer(text)]


def quotes(text: str, path: Path) -> list[Quote]:
    """The marked figures of one document (outside its code blocks)."""
    out = []
    fences = _fenced(text)
    for m in MARK.finditer(text):
        if any(a <= m.start() < b for a, b in fences):
            continue
        line = text.count("\n", 0, m.start()) + 1
        out.append(Quote(path, line, m["bench"], m["figure"], m["text"]))
    return out


def load(bench: str, results: Path = RESULTS) -> dict[str, Any] | None:
    """A benchmark's JSON result; None when there is none."""
    path = results / f"{bench}.json"
    if not path.exists():
        return None
    doc: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    return doc


def expected(bench: str, figure: str, results: Path = RESULTS) -> str:
    """The text a marker of ``bench.figure`` must hold; KeyError saying why when none."""
    doc = load(bench, results)
    if doc is None:
        raise KeyError(f"no result file {bench}.json")
    if figure == "commit":
        c = doc["commit"]
        return str(c["short"]) + ("+changes" if c["dirty"] else "")
    if doc.get("skipped"):
        raise KeyError(f"{bench} was skipped: {doc['skipped']}")
    if figure not in doc["figures"]:
        raise KeyError(f"{bench}.json has no figure {figure!r}")
    return str(doc["figures"][figure]["text"])


def check(paths: list[Path] | None = None, results: Path = RESULTS) -> list[str]:
    """Every marked figure that differs from its JSON file or names none: one line each."""
    problems = []
    for path in paths or documents():
        for q in quotes(path.read_text(encoding="utf-8"), path):
            try:
                want = expected(q.bench, q.figure, results)
            except KeyError as exc:
                problems.append(f"{q.where()}: {exc.args[0]}")
                continue
            if q.text != want:
                problems.append(f"{q.where()}: quotes {q.text!r}, the result says {want!r}")
    return problems


def rewrite(text: str, results: Path = RESULTS) -> str:
    """A document with every marked figure set from its JSON file (unknown ones left)."""

    fences = _fenced(text)

    def one(m: re.Match[str]) -> str:
        if any(a <= m.start() < b for a, b in fences):
            return m.group(0)
        try:
            want = expected(m["bench"], m["figure"], results)
        except KeyError:
            return m.group(0)
        return f"<!-- bench {m['bench']}.{m['figure']} -->{want}<!-- /bench -->"

    return MARK.sub(one, text)


def main(argv: list[str]) -> int:
    """``python -m benchmarks quote [--check]``."""
    if "--check" in argv:
        problems = check()
        print("\n".join(problems) or "every quoted figure matches its result")
        return 1 if problems else 0
    for path in documents():
        text = path.read_text(encoding="utf-8")
        new = rewrite(text)
        if new != text:
            path.write_text(new, encoding="utf-8")
            print(f"rewrote the quoted figures of {path.relative_to(ROOT)}")
    problems = check()
    print("\n".join(problems))
    return 1 if problems else 0
