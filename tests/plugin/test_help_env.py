"""Every environment variable the plugin reads is named in ``pytest --help`` (issue 30).

The variables are found by reading the package's source, so a new one cannot be left out:
a string constant given to ``os.environ.get`` / ``os.environ[...]`` / ``os.getenv`` /
``... in os.environ``, and the ``env=`` of each option in ``plugin/settings.py``. A read whose
name is not a constant is allowed only where the options' own variables are read.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest_llmspeed

PACKAGE = Path(pytest_llmspeed.__file__).resolve().parent
#: where os.environ is read with a name that is not a constant: the options' env= variables
DYNAMIC_READS = {"plugin/settings.py"}


def _is_environ(node: ast.AST) -> bool:
    """``os.environ`` or a bare ``environ``."""
    if isinstance(node, ast.Attribute):
        return node.attr == "environ" and isinstance(node.value, ast.Name)
    return isinstance(node, ast.Name) and node.id == "environ"


def _is_getenv(node: ast.AST) -> bool:
    if isinstance(node, ast.Attribute):
        return node.attr == "getenv"
    return isinstance(node, ast.Name) and node.id == "getenv"


def environment_reads(source: str) -> tuple[set[str], list[int]]:
    """The variables ``source`` reads by name, and the lines that read one by a name that is
    not a constant."""
    names: set[str] = set()
    dynamic: list[int] = []

    def key(node: ast.AST | None, line: int) -> None:
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            names.add(node.value)
        else:
            dynamic.append(line)

    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call):
            func = node.func
            reads = _is_getenv(func) or (
                isinstance(func, ast.Attribute)
                and func.attr in ("get", "pop", "setdefault", "__getitem__")
                and _is_environ(func.value)
            )
            if reads:
                key(node.args[0] if node.args else None, node.lineno)
            is_option = isinstance(func, ast.Name) and func.id == "Option"
            for kw in node.keywords if is_option else ():
                if kw.arg == "env":
                    for elt in getattr(kw.value, "elts", [kw.value]):
                        key(elt, node.lineno)
        elif isinstance(node, ast.Subscript) and _is_environ(node.value):
            key(node.slice, node.lineno)
        elif isinstance(node, ast.Compare) and any(_is_environ(c) for c in node.comparators):
            key(node.left, node.lineno)
    return names, dynamic


def read_by_the_package() -> dict[str, list[str]]:
    """Variable → the modules (relative paths) that read it."""
    found: dict[str, list[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        where = path.relative_to(PACKAGE).as_posix()
        names, dynamic = environment_reads(path.read_text(encoding="utf-8"))
        assert not dynamic or where in DYNAMIC_READS, (
            f"{where} reads the environment by a name that is not a constant (lines "
            f"{dynamic}): give the name, so that --help can be checked for it"
        )
        for name in names:
            found.setdefault(name, []).append(where)
    return found


def test_the_scan_finds_each_kind_of_read():
    source = (
        "import os\n"
        "from os import environ, getenv\n"
        "a = os.environ.get('A')\n"
        "b = os.environ['B']\n"
        "c = os.getenv('C', 'x')\n"
        "d = 'D' in os.environ\n"
        "e = environ.get('E') or getenv('F')\n"
        "g = Option('x', 'help', env=('G', 'H'))\n"
        "i = os.environ.get(name)\n"
        "child = {**os.environ, 'PYTHONUNBUFFERED': '1'}\n"  # a copy for a child: no read
    )
    names, dynamic = environment_reads(source)
    assert names == set("ABCDEFGH")
    assert dynamic == [9]


def test_the_package_reads_the_variables_it_documents():
    found = read_by_the_package()
    for name in ("LLMSPEED_ENDPOINT", "LLMSPEED_API_KEY", "OPENAI_API_KEY", "GITHUB_STEP_SUMMARY"):
        assert name in found, name


def test_help_names_every_environment_variable_the_plugin_reads(pytester):
    found = read_by_the_package()
    result = pytester.runpytest("--help")
    assert result.ret == 0
    # argparse wraps help lines: a name may not be split, so the words are joined first
    text = " ".join(result.stdout.str().split())
    missing = {name: where for name, where in found.items() if name not in text}
    assert not missing, f"read by the plugin, not named in --help: {missing}"
