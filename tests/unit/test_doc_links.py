"""Every relative link of the README, CONTRIBUTING.md and docs/ resolves: to a file that
exists, and to a heading of it where the link names one (GitHub's slugs)
(scripts/check_links.py, also runnable on its own)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).parents[2]


def _script():
    spec = importlib.util.spec_from_file_location("check_links", ROOT / "scripts/check_links.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_relative_link_resolves():
    links = _script()
    paths = links.documents(ROOT)
    assert ROOT / "README.md" in paths and ROOT / "docs/index.md" in paths
    assert links.check(paths) == []


def test_a_broken_link_and_a_missing_heading_are_found(tmp_path):
    links = _script()
    (tmp_path / "a.md").write_text("# Title\n\n[ok](#title) [gone](b.md) [no](#nowhere)\n")
    found = links.check([tmp_path / "a.md"], tmp_path)
    assert len(found) == 2 and any("b.md" in f for f in found), found
    assert any("nowhere" in f for f in found), found
