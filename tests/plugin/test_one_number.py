"""One number for one figure: a gated cell measured three times (a miss confirmed on fresh
starts) shows the mean its verdict judged in every output of the run — the progress line, the
terminal's table, the verdict lines, the results file, JUnit, the page and the job summary —
and lists the three attempts."""

import json
import re
import xml.etree.ElementTree as ET

import pytest

pytestmark = pytest.mark.slow  # cells on the simulator

ARGS = (
    "--llm-contexts=1K",
    "--llm-concurrency=2",
    "--llm-duration=1",
    "--llm-max-output=128",
    "-m",
    "decode",
    "-p",
    "no:randomly",
)
CELL = "decode[1K-c2]"


def glob(text: str) -> str:
    """``text`` matched literally by fnmatch (its brackets as sets of one)."""
    return "".join({"[": "[[]", "]": "[]]", "*": "[*]", "?": "[?]"}.get(c, c) for c in text)


def test_a_confirmed_cell_prints_the_mean_it_was_judged_on_everywhere(pytester, monkeypatch):
    """Chance: decode twice as slow against a one-run baseline at 5 %: each attempt misses by
    about 50 %, far beyond both intervals (±3 % measured; a loaded machine moved the 20 %
    slower decode this test first used to −17 % and once out of its regression), so every
    confirmation is taken and the cell regresses; what is asserted is that the outputs agree,
    whatever the figures."""
    sim = "--llm-endpoint=sim:tiny?speed=1&seed=3"
    pytester.runpytest(sim, *ARGS, "--llm-save-baseline=b.toml").assert_outcomes(passed=1)
    summary = pytester.path / "summary.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    result = pytester.runpytest(
        f"{sim}&slower=decode:1.0", *ARGS, "--llm-baseline=b.toml", "--llm-confirm=2",
        "--llm-results=r.json", "--junitxml=j.xml", "--llm-html=p.html",
    )  # fmt: skip
    assert result.ret == 1
    out = result.stdout.str()
    cells = json.loads((pytester.path / "r.json").read_text())["cells"]
    (cell,) = [c for c in cells if c["id"] == CELL]
    assert len(cell["attempts"]) == 3
    total, per_request = cell["total_tok_s"], cell["per_request_tok_s"]
    # the results file: the mean of the attempts it lists, and the verdict's value
    attempts = [a["total_tok_s"] for a in cell["attempts"]]
    assert total == pytest.approx(sum(attempts) / 3)
    (check,) = [c for c in cell["baseline_checks"] if c["metric"] == "total_tok_s"]
    assert check["values"] == attempts
    shown, shown_pr = f"{total:,.1f}", f"{per_request:,.1f}"
    ttft = f"{cell['ttft_ms']:.0f} ms"
    # the progress line that ends the cell
    progress = re.search(rf"\[1/1\] {re.escape(CELL)} FAILED: (\S+) tok/s · (\S+) tok/s per", out)
    assert progress and progress.groups() == (shown, shown_pr), out
    # the terminal's table: the row of 1K
    row = re.search(r"^1K\s+(\S+) · (\d+ ms) ✗", out, re.M)
    assert row and row.groups() == (shown, ttft), out
    # the verdict lines, with the attempts listed
    listed = ", ".join(f"{a:,.1f}" for a in attempts)
    result.stdout.fnmatch_lines(
        [
            glob(f"  REGRESSION  {CELL} total tok/s {shown} ±")
            + "* "
            + glob(f"[attempts on fresh starts: {listed}]"),
            glob(f"  REGRESSION  {CELL} per-request tok/s {shown_pr} ±") + "*",
        ]
    )
    # JUnit's properties
    props = {
        p.get("name"): p.get("value")
        for case in ET.parse(pytester.path / "j.xml").iter("testcase")
        if case.get("name") == f"test_decode[{CELL[7:-1]}]"
        for p in case.iter("property")
    }
    assert float(props["total_tok_s"] or "nan") == pytest.approx(total)
    assert float(props["per_request_tok_s"] or "nan") == pytest.approx(per_request)
    # the page and the job summary
    page = (pytester.path / "p.html").read_text()
    assert shown in page and shown_pr in page
    text = summary.read_text()
    assert f"| {shown} · {ttft} ❌ |" in text
    assert f"`{CELL} total tok/s {shown} ±" in text
    # the attempts' own values are not the cell's figure anywhere but where they are listed
    first = f"{attempts[0]:,.1f}"
    if first != shown:
        assert f"| {first} ·" not in text and not re.search(rf"^1K\s+{re.escape(first)} ", out)
