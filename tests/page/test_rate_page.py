"""Rate cells and the capacity as an arrival rate on the page as a person sees it (issue 33:
"the page shows the new cells, checked in headless Chromium"): the plugin runs two open-loop
rates on a simulator that keeps one request running, with an objective on TTFT, and writes its
page; the browser finds the capacity section, the cells' rows, and asks for and logs nothing."""

import pytest

from .test_page_in_browser import plugin_page

pytestmark = pytest.mark.slow


def test_the_page_shows_rate_cells_and_the_capacity_as_a_rate(tmp_path):
    dom, console, asked = plugin_page(
        tmp_path,
        "--llm-endpoint=sim:tiny?speed=0.25&max_num_seqs=1", "--llm-contexts=1K",
        "--llm-rates=1,32", "--llm-duration=2", "--llm-max-output=16", "--llm-slo=ttft<=1s",
        "-m", "rate",
    )  # fmt: skip
    assert "<h2>Capacity as an arrival rate at <code>ttft&lt;=1s</code></h2>" in dom
    assert "<li><b>1K: 1 request/s (32/s misses ttft: " in dom
    assert "<td>rate[1K-r1]</td>" in dom and "<td>rate[1K-r32]</td>" in dom
    # the chart of TTFT from the schedule against the rates asked for; no empty decode charts
    assert "TTFT from the schedule against the arrival rate (open loop)" in dom
    assert ">32/s</text>" in dom
    assert "no data" not in dom
    assert console == []
    assert asked == set()
