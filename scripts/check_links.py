#!/usr/bin/env python3
"""Check the relative links of the project's Markdown: every link or image in README.md,
CONTRIBUTING.md and docs/*.md that is not an absolute http(s) address must point to a file
that exists, and a ``#anchor`` to a heading of that file (GitHub's slugs: lower case,
punctuation dropped, spaces as hyphens, a repeated heading suffixed ``-1``, ``-2``, ...).

Standard library only:

    python scripts/check_links.py            # exits 1 and lists each broken link
"""

from __future__ import annotations

import re
import sys
import unicodedata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

FENCE = re.compile(r"^ {0,3}(```|~~~).*?^ {0,3}\1", re.MULTILINE | re.DOTALL)
CODE_SPAN = re.compile(r"`[^`\n]*`")
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)")
REFERENCE = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s|$)", re.MULTILINE)
HTML = re.compile(r"""\b(?:href|src)\s*=\s*["']?([^"'\s>]+)""", re.IGNORECASE)
HEADING = re.compile(r"^ {0,3}#{1,6}\s+(.*?)\s*#*\s*$", re.MULTILINE)


def documents(root: Path = ROOT) -> list[Path]:
    """The Markdown files whose links are checked."""
    found = [root / "README.md", root / "CONTRIBUTING.md", *sorted((root / "docs").glob("*.md"))]
    return [p for p in found if p.exists()]


def slug(heading: str) -> str:
    """GitHub's anchor for a heading's text (before de-duplication)."""
    text = CODE_SPAN.sub(lambda m: m.group(0)[1:-1], heading)
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", text)  # a link's text stays
    text = re.sub(r"<[^>]+>", "", text).lower()
    kept = "".join(c for c in text if c in " -_" or unicodedata.category(c)[0] in ("L", "N", "M"))
    return kept.replace(" ", "-")


def anchors(text: str) -> set[str]:
    """Every anchor the headings of a Markdown text give, outside code blocks."""
    seen: dict[str, int] = {}
    out = set()
    for m in HEADING.finditer(FENCE.sub("", text)):
        base = slug(m.group(1))
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


def targets(text: str) -> list[tuple[int, str]]:
    """(line, target) of each link, image and reference outside code."""
    prose = FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), text)
    prose = CODE_SPAN.sub(lambda m: " " * len(m.group(0)), prose)
    found = []
    for pattern in (LINK, REFERENCE, HTML):
        for m in pattern.finditer(prose):
            found.append((prose.count("\n", 0, m.start()) + 1, m.group(1)))
    return sorted(found)


def check(paths: list[Path], root: Path = ROOT) -> list[str]:
    """One line per broken link (paths shown relative to ``root``)."""
    problems = []
    for path in paths:
        text = path.read_text(encoding="utf-8")
        for line, target in targets(text):
            if re.match(r"[a-z][a-z0-9+.-]*:", target, re.IGNORECASE):
                continue  # https:, mailto:: not a file of the project
            file_part, _, anchor = target.partition("#")
            where = f"{path.relative_to(root)}:{line}: {target}"
            dest = (path.parent / file_part).resolve() if file_part else path
            if not dest.exists():
                problems.append(f"{where}: no such file")
                continue
            if (
                anchor
                and dest.suffix == ".md"
                and anchor not in anchors(dest.read_text(encoding="utf-8"))
            ):
                problems.append(f"{where}: no heading #{anchor} there")
    return problems


def main() -> int:
    problems = check(documents())
    for p in problems:
        print(p)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
