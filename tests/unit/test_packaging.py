"""The package's metadata (pyproject.toml) as a package page shows it: a long description
whose links and images resolve there, the license as PEP 639 has it (issue 30). The built
sdist and wheel themselves are checked by tox's ``package`` environment."""

import re
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
PROJECT = PYPROJECT["project"]

# where a Markdown or HTML text points: inline links and images, reference definitions, and
# the href / src of raw HTML
TARGETS = (
    re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)"),
    re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s|$)", re.MULTILINE),
    re.compile(r"""\b(?:href|src)\s*=\s*["']?([^"'\s>]+)""", re.IGNORECASE),
)


def relative_targets(text: str) -> list[str]:
    """The link and image targets of ``text`` that a package page cannot resolve: everything
    but an absolute https:// or http:// address (a path, ./x, #anchor, or a bare name)."""
    # code is not a link: fenced blocks and inline code spans left out
    prose = re.sub(r"```.*?```", "", text, flags=re.DOTALL)
    prose = re.sub(r"`[^`\n]*`", "", prose)
    found = [m.group(1) for pattern in TARGETS for m in pattern.finditer(prose)]
    return [t for t in found if not re.match(r"https?://[^/\s]+", t)]


def long_description() -> Path:
    readme = PROJECT["readme"]
    path = readme if isinstance(readme, str) else readme["file"]
    return ROOT / path


def test_the_long_description_has_no_relative_link_or_image():
    path = long_description()
    assert path.name != "README.md", "the README links into docs/ by relative paths"
    text = path.read_text(encoding="utf-8")
    assert text.startswith("# pytest-llmspeed\n")
    assert relative_targets(text) == []


def test_the_check_finds_what_a_package_page_cannot_resolve():
    text = (
        "see [metrics](docs/metrics.md), [a section](#options), ![page](docs/page.png),\n"
        '<img src="docs/page.png"> <a href="./x.md">x</a>\n'
        "[ref]: docs/gate.md\n"
        "fine: [home](https://example.org/x), `[not](a/link)`\n"
    )
    assert relative_targets(text) == [
        "docs/metrics.md",
        "#options",
        "docs/page.png",
        "docs/gate.md",
        "docs/page.png",
        "./x.md",
    ]
    # the README is what the package page showed before: the check sees its relative links
    assert len(relative_targets((ROOT / "README.md").read_text(encoding="utf-8"))) > 10


def test_license_is_an_spdx_string_with_its_file():
    assert PROJECT["license"] == "MIT"  # PEP 639; the TOML table is deprecated
    assert PROJECT["license-files"] == ["LICENSE"]
    text = (ROOT / "LICENSE").read_text(encoding="utf-8")
    assert text.startswith("MIT License\n")
    assert "the pytest-llmspeed authors" in text
    # PEP 639: no License :: classifier beside a license expression (setuptools refuses it)
    assert not [c for c in PROJECT["classifiers"] if c.startswith("License ::")]


def test_the_build_backend_supports_pep_639():
    (setuptools,) = [r for r in PYPROJECT["build-system"]["requires"] if "setuptools" in r]
    low = re.search(r">=\s*(\d+)", setuptools)
    high = re.search(r"<\s*(\d+)", setuptools)
    assert low and int(low.group(1)) >= 77, setuptools  # 77.0.0: the first with PEP 639
    assert high and int(high.group(1)) > int(low.group(1)), setuptools


@pytest.mark.parametrize(
    "classifier",
    [
        "Framework :: Pytest",
        "Topic :: Software Development :: Testing",
        "Intended Audience :: Developers",
        "Operating System :: POSIX :: Linux",
    ],
)
def test_classifiers(classifier):
    assert classifier in PROJECT["classifiers"]


def test_python_classifiers_follow_requires_python():
    low = re.fullmatch(r">=\s*3\.(\d+)", PROJECT["requires-python"])
    assert low, PROJECT["requires-python"]
    minors = sorted(
        int(m.group(1))
        for c in PROJECT["classifiers"]
        if (m := re.fullmatch(r"Programming Language :: Python :: 3\.(\d+)", c))
    )
    assert minors[0] == int(low.group(1))
    assert minors == list(range(minors[0], minors[0] + len(minors)))  # no gap
    assert minors[-1] >= 13


def test_author():
    assert {"name": "the pytest-llmspeed authors"} in PROJECT["authors"]
