"""Conversation cells through the plugin (docs/workloads.md, "Conversations"): --llm-turns
against the built-in simulator, as users run them: the cells' ids, their marker, their
figures per turn in the results file and in JUnit, and the terminal's summary."""

import json

import pytest
from junitparser import JUnitXml

pytestmark = pytest.mark.slow  # each test here runs cells on the simulator

TINY = "sim:tiny?speed=4"


def _cells(pytester) -> dict[str, dict]:
    doc = json.loads((pytester.path / "out.json").read_text())
    return {c["id"]: c for c in doc["cells"]}


def _properties(pytester, name: str) -> dict[str, str]:
    xml = JUnitXml.fromfile(str(pytester.path / "out.xml"))
    for suite in xml:
        for case in suite:
            if case.name == name:
                return {p.get("name"): p.get("value") for p in case._elem.iter("property")}
    raise AssertionError(f"no test {name} in the JUnit file")


def test_conversation_cells_run_per_context_and_users_and_report_each_turn(pytester):
    result = pytester.runpytest(
        f"--llm-endpoint={TINY}",
        "--llm-contexts=1K",
        "--llm-concurrency=1,3",
        "--llm-turns=3",
        "--llm-turn-tokens=64",
        "--llm-turn-output=16",
        "--llm-think-time=0",
        "--llm-results=out.json",
        "--junitxml=out.xml",
        "--llm-save-baseline=base.toml",
        "-m",
        "conversation",
        "-v",
        "-p",
        "no:benchmark",
    )
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(
        [
            # its own settings, not the decode cells' window and max output
            "llmspeed: api completions (* prompts) · turns of 64 new tokens, at most 16 out, 0 s "
            "apart · conversations at 1K · users 1,3 · turns 3",
            "llmspeed::test_conversation[[]1K-u1-t3[]] PASSED*",
            "*conversation[[]1K-u1-t3[]]: 3 turns · TTFT * ms after the first · prefix cache *%"
            " (should hit *%)*",
            "llmspeed::test_conversation[[]1K-u3-t3[]] PASSED*",
        ]
    )
    cells = _cells(pytester)
    assert {"conversation[1K-u1-t3]", "conversation[1K-u3-t3]"} == set(cells)
    for users in (1, 3):
        cell = cells[f"conversation[1K-u{users}-t3]"]
        assert cell["phase"] == "conversation" and cell["status"] == "valid"
        assert cell["concurrency"] == users and cell["conv_turns"] == 3
        assert cell["turn_users"] == [users] * 3
        assert cell["turn_prompt_tokens"] == [1024, 1024 + 16 + 64, 1024 + 2 * (16 + 64)]
        assert cell["conv_answers"] == "token ids"
        # the simulator caches prompt blocks: each later turn hits its previous prompt's
        assert cell["turn_hit_rate"][0] == 0
        assert cell["turn_hit_rate"][1:] == cell["turn_expected_hit_share"][1:]
        assert cell["conv_hit_rate"] == pytest.approx(cell["conv_expected_hit_share"])
        assert len(cell["samples"]["ttft_ms"]) == 2 * users  # turns 2 and 3
        assert cell["conv_failed"] == 0 and cell["conv_requests"] == 3 * users
    props = _properties(pytester, "test_conversation[1K-u3-t3]")
    assert props["phase"] == "conversation"
    assert float(props["conv_ttft_ms"]) == cells["conversation[1K-u3-t3]"]["conv_ttft_ms"]
    assert float(props["conv_hit_rate"]) == cells["conversation[1K-u3-t3]"]["conv_hit_rate"]
    # a saved baseline holds each cell's TTFT after the first turn, gated as written (a kind
    # of cell with no floor has its headline ceiling gated)
    baseline = (pytester.path / "base.toml").read_text()
    for users in (1, 3):
        cell = cells[f"conversation[1K-u{users}-t3]"]
        assert f'[cells."conversation[1K-u{users}-t3]"]\nconv_ttft_ms = ' in baseline
        assert cell["conv_ttft_ms"] > 0
    result.stdout.fnmatch_lines(
        [
            "Conversations (users in step; per turn the medians over its users*",
            "conversation[[]1K-u1-t3[]] * 1 * 1 * 1,024 * ms * 0.0% * 0.0% / 0.0%",
            "* 2 * 1 * 1,104 * ms *%*% / *%",
            "*Conversation*1K*3*valid*",
        ]
    )


def test_without_turns_there_is_no_conversation_cell_and_a_bad_value_is_one_line(pytester):
    result = pytester.runpytest(
        f"--llm-endpoint={TINY}", "--llm-turns=0", "-m", "conversation", "-p", "no:benchmark"
    )
    assert result.ret != 0
    result.stderr.fnmatch_lines(["*--llm-turns*0*must be a whole number of turns from 1 to 1000*"])
    result = pytester.runpytest(
        f"--llm-endpoint={TINY}", "-m", "conversation", "--co", "-q", "-p", "no:benchmark"
    )
    assert "test_conversation" not in result.stdout.str()
