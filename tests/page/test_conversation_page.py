"""Conversation cells on the page as a person sees it (issue 33: "the page shows the new
cells, checked in headless Chromium"): the plugin runs conversations on the simulator and
writes its page; the browser finds the cells' rows and the per-turn table, asks for nothing
and logs nothing."""

import pytest

from .test_page_in_browser import plugin_page

pytestmark = pytest.mark.slow


def test_the_page_shows_conversations_turn_by_turn(tmp_path):
    dom, console, asked = plugin_page(
        tmp_path,
        "--llm-endpoint=sim:tiny?speed=4", "--llm-contexts=1K", "--llm-concurrency=2",
        "--llm-turns=3", "--llm-turn-tokens=64", "--llm-turn-output=16", "--llm-think-time=0",
        "-m", "conversation",
    )  # fmt: skip
    assert '<h3 id="conversations">Conversations, turn by turn</h3>' in dom
    assert "<td>conversation[1K-u2-t3]</td><td>1</td><td>2</td><td>1,024</td>" in dom
    assert (
        "<td>2</td><td>2</td><td>1,104</td>" in dom and "<td>3</td><td>2</td><td>1,184</td>" in dom
    )
    assert "<td>Conversation</td>" in dom  # its row in all measurements
    assert console == []
    assert asked == set()
