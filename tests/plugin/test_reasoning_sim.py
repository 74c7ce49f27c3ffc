"""Reasoning and answer end to end (issue 33): a chat run on the simulator carries the time to
the first answer token, the reasoning and answer tokens and (with --llm-tools) the tool-call
deltas into the results file and the JUnit properties; a completions run carries none of
them; --llm-tools without chat is refused in one line."""

import json
import xml.etree.ElementTree as ET

import pytest

pytestmark = pytest.mark.slow

TINY = "sim:tiny?speed=5"
REASONING = 8  # the tiny profile's reasoning tokens


def run(pytester, *options, endpoint=TINY):
    result = pytester.runpytest(
        f"--llm-endpoint={endpoint}",
        "--llm-contexts=1K",
        "--llm-concurrency=2",
        "--llm-duration=1",
        "--llm-max-output=64",
        "--llm-results=r.json",
        "--junitxml=out.xml",
        "-m",
        "decode",
        "-p",
        "no:randomly",
        *options,
    )
    assert result.ret == 0, result.stdout.str()
    doc = json.loads((pytester.path / "r.json").read_text())
    (cell,) = [c for c in doc["cells"] if c["phase"] == "decode"]
    props = {
        p.get("name"): p.get("value")
        for case in ET.parse(pytester.path / "out.xml").iter("testcase")
        if "decode" in case.get("name", "")
        for p in case.iter("property")
    }
    return result, cell, props


def test_a_chat_run_carries_the_reasoning_figures(pytester):
    _, cell, props = run(pytester, "--llm-api=chat", "-v")
    assert cell["status"] == "valid"
    assert cell["answer_ttft_ms"] > cell["ttft_ms"] > 0
    # finished requests: the simulator's reasoning_tokens; requests cut at the window's end
    # from their stream, an estimate where a chunk carried both (the weakest is said)
    assert cell["reasoning_from"] in ("server", "stream", "estimate")
    assert cell["reasoning_tokens"] + cell["answer_tokens"] == cell["received_tokens"]
    # every request reasons for its first 8 tokens (a request cut before them reasons less)
    assert 0 < cell["reasoning_tokens"] <= REASONING * cell["requests"]
    assert cell.get("tool_call_deltas") is None  # optional: not written
    for key in ("answer_ttft_ms", "reasoning_tokens", "answer_tokens", "reasoning_from"):
        assert props[key] == str(cell[key]), key
    assert "tool_call_deltas" not in props


def test_tool_calls_are_counted_and_shown(pytester):
    _, cell, props = run(pytester, "--llm-api=chat", "--llm-tools")
    assert cell["status"] == "valid"
    assert cell["tool_call_deltas"] > 0
    assert props["tool_call_deltas"] == str(cell["tool_call_deltas"])


def test_a_completions_run_has_none_of_them(pytester):
    _, cell, props = run(pytester)
    for key in ("answer_ttft_ms", "reasoning_tokens", "answer_tokens", "tool_call_deltas"):
        assert cell.get(key) is None and key not in props, key


def test_tools_without_chat_is_refused(pytester):
    result = pytester.runpytest(f"--llm-endpoint={TINY}", "--llm-tools")
    assert result.ret != 0
    result.stderr.fnmatch_lines(["*--llm-tools*give --llm-api=chat too*"])
