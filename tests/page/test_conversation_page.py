"""Conversation cells on the page as a person sees it (issue 33: "the page shows the new
cells, checked in headless Chromium"): the plugin runs conversations on the simulator and
writes its page; the browser finds the cells' rows and the per-turn table, asks for nothing
and logs nothing."""

import subprocess
import sys

import pytest

from .test_page_in_browser import open_page

pytestmark = pytest.mark.slow


def test_the_page_shows_conversations_turn_by_turn(tmp_path):
    work = tmp_path / "run"
    work.mkdir()
    run = subprocess.run(
        [
            sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-W", "ignore",
            "--llm-endpoint=sim:tiny?speed=4", "--llm-contexts=1K", "--llm-concurrency=2",
            "--llm-turns=3", "--llm-turn-tokens=64", "--llm-turn-output=16",
            "--llm-think-time=0", "-m", "conversation", "--llm-html=page.html",
        ],
        cwd=work, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout[-2000:]
    dom, console, asked = open_page(tmp_path, (work / "page.html").as_uri())
    assert '<h3 id="conversations">Conversations, turn by turn</h3>' in dom
    assert "<td>conversation[1K-u2-t3]</td><td>1</td><td>2</td><td>1,024</td>" in dom
    assert (
        "<td>2</td><td>2</td><td>1,104</td>" in dom and "<td>3</td><td>2</td><td>1,184</td>" in dom
    )
    assert "<td>Conversation</td>" in dom  # its row in all measurements
    assert console == []
    assert asked == set()
