"""``pytest --help`` shows the plugin's options in groups by task, each option in a line or two
(the full text of each is in docs/options.md)."""

from __future__ import annotations

import re
from pathlib import Path

from pytest_llmspeed.plugin.settings import HELP_GROUPS, OPTIONS

GROUPS = ["connection", "matrix", "workloads", "gate", "A/B", "outputs", "launch"]
#: where a help text starts when it is below its option: argparse's max_help_position
HELP_COLUMN = 24


def plugin_groups(text: str) -> dict[str, list[str]]:
    """The plugin's groups in ``--help``'s order: the title ("connection") → the lines below
    its heading, up to the next heading or blank line."""
    groups: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in text.splitlines():
        heading = re.match(r"llmspeed: (.+?)(?: \(.*\))?:$", line)
        if heading:
            current = groups.setdefault(heading.group(1), [])
        elif not line.strip() or not line.startswith(" "):
            current = None
        elif current is not None:
            current.append(line)
    return groups


def options_in(lines: list[str]) -> dict[str, int]:
    """Each option's flag → how many lines its help takes."""
    helps: dict[str, int] = {}
    flag = None
    for line in lines:
        start = re.match(r"  (--[\w-]+)(?:=\S+)?(.*)$", line)
        if start:
            flag = start.group(1)
            helps[flag] = int(bool(start.group(2).strip()))  # help on the flag's line
        elif flag is not None:
            helps[flag] += 1
    return helps


def test_help_shows_the_options_in_groups_by_task_a_line_or_two_each(pytester, monkeypatch):
    monkeypatch.setenv("COLUMNS", "100")
    result = pytester.runpytest("--help")
    assert result.ret == 0
    text = result.stdout.str()
    groups = plugin_groups(text)
    assert list(groups) == GROUPS
    assert "llmspeed: connection (every option: docs/options.md):" in text

    where: dict[str, list[str]] = {}
    for title, lines in groups.items():
        for flag, help_lines in options_in(lines).items():
            where.setdefault(flag, []).append(title)
            assert 1 <= help_lines <= 2, f"{flag}: its help takes {help_lines} lines"
    registered = {o.flag for o in OPTIONS}
    assert set(where) == registered
    assert {flag: titles for flag, titles in where.items() if len(titles) > 1} == {}
    # no --llm-* option of the plugin outside its groups
    assert set(re.findall(r"^  (--llm-[\w-]+)", text, re.MULTILINE)) == registered

    headings_and_blanks = 2 * len(groups)
    total = headings_and_blanks + sum(len(lines) for lines in groups.values())
    assert total < 150, f"the plugin's groups take {total} lines"


def test_every_option_is_in_one_help_group_and_docs_options_names_the_groups():
    names = [name for _, group in HELP_GROUPS for name in group]
    assert sorted(names) == sorted(o.name for o in OPTIONS)
    assert [title for title, _ in HELP_GROUPS] == GROUPS
    reference = (Path(__file__).parents[2] / "docs" / "options.md").read_text(encoding="utf-8")
    headings = re.findall(r"^## llmspeed: (.+)$", reference, re.MULTILINE)
    assert headings == GROUPS
    # each group's table in docs/options.md holds that group's options
    sections = re.split(r"^## ", reference, flags=re.MULTILINE)
    for title, group in HELP_GROUPS:
        section = next(s for s in sections if s.startswith(f"llmspeed: {title}\n"))
        for name in group:
            assert f"| `--llm-{name}` |" in section, (title, name)


def test_the_ini_keys_help_is_one_line(pytester, monkeypatch):
    monkeypatch.setenv("COLUMNS", "100")
    text = pytester.runpytest("--help").stdout.str()
    lines = text.splitlines()
    for opt in OPTIONS:
        i = next(i for i, line in enumerate(lines) if line.startswith(f"  {opt.ini} ("))
        after = lines[i].split("):", 1)[1].strip()  # help on the key's line
        below = 0
        for line in lines[i + 1 :]:
            if not line.startswith(" " * HELP_COLUMN):
                break
            below += 1
        assert (after and below == 0) or (not after and below == 1), opt.ini
