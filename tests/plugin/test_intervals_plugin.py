"""Intervals end to end (issue 11): every decode cell carries them in the results, the JUnit
properties and the terminal; --llm-precision ends a steady window early and says so; a baseline
with intervals gates a slower server beyond them."""

import json
import re
import xml.etree.ElementTree as ET

import pytest

from tests.plugin.test_plugin_sim import TINY

pytestmark = pytest.mark.slow

STEADY = "sim:tiny?speed=1&noise=0.01"


def run(pytester, *args, endpoint=STEADY, max_output=128):
    return pytester.runpytest(
        f"--llm-endpoint={endpoint}",
        "--llm-contexts=1K",
        "--llm-concurrency=1,4",
        f"--llm-max-output={max_output}",
        "--llm-results=out.json",
        "--junitxml=out.xml",
        *args,
    )


def cells(pytester, phase="decode"):
    doc = json.loads((pytester.path / "out.json").read_text())
    return {c["id"]: c for c in doc["cells"] if c["phase"] == phase}


def test_every_decode_cell_has_its_intervals_in_every_output(pytester):
    result = run(pytester, "--llm-duration=2", "-v", "-rA")
    result.assert_outcomes(passed=3)
    for cid, c in cells(pytester).items():
        low, high = c["total_tok_s_ci"]
        assert low < c["total_tok_s"] < high, cid
        low, high = c["per_request_tok_s_ci"]
        assert low <= c["per_request_tok_s"] <= high, cid
        assert c["ci_method"].startswith("batch means (k=")
        # Chance: the client kept N in flight; a busy machine delays a stream's restart by tens
        # of ms in a 128-token request's 0.26 s (the next test's note), a residual of −5 % and
        # more: the bound is a quarter, load would have to add 87 ms to every turnaround of the
        # window, and a client that did not restart its streams would read far below it
        assert abs(c["little_residual"]) < 0.25, cid
        assert c.get("window_end") is None  # fixed windows: nothing to say
    # the terminal's all-measurements table shows the ± of total tok/s
    result.stdout.fnmatch_lines(["Sustained decode  1K * ±*"])
    props = {
        case.get("name"): {p.attrib["name"]: p.attrib["value"] for p in case.iter("property")}
        for case in ET.parse(pytester.path / "out.xml").iter("testcase")
    }
    decode = props["test_decode[1K-c4]"]
    assert float(decode["total_tok_s_ci_low"]) < float(decode["total_tok_s"])
    assert float(decode["total_tok_s_ci_high"]) > float(decode["total_tok_s"])


def test_precision_ends_a_steady_window_early_and_says_what_it_reached(pytester):
    # Chance: a busy machine makes the steady server less so: it delays a stream's restart
    # (tens of ms in a 128-token request's 0.26 s) or stalls a process for 0.2 s now and then.
    # With 512 tokens a request each window still gets within ±2 % in 7-19 s beside two busy
    # loops (6-10 s on a quiet machine); the window may run 60 s, three times the longest seen
    result = run(
        pytester,
        "--llm-duration=60",
        "--llm-precision=2%",
        "--llm-min-duration=2",
        max_output=512,
    )
    result.assert_outcomes(passed=3)
    for cid, c in cells(pytester).items():
        assert c["window_end"] == "precision", cid
        assert 2 <= c["measured_s"] < 60, cid
        # the window's end is decided on the tokens received so far, and the cell's interval
        # is computed on those same tokens (tests/unit/test_early_end.py): within the goal
        assert c["precision"] <= 0.02, cid
        low, high = c["total_tok_s_ci"]
        figure = c["total_tok_s"]  # the three rounded to 0.01 tok/s in the results: 0.011
        assert max(figure - low, high - figure) <= 0.02 * figure + 0.011, cid
    result.stdout.fnmatch_lines(
        [
            "llmspeed: * · window 2–60 s, until ±2.0% · *",
            "  window ended early, precise enough (--llm-precision): decode[[]1K-c1[]] (±*% "
            "after * s), decode[[]1K-c4[]] (±*% after * s)",
        ]
    )


def test_a_window_that_cannot_reach_the_precision_says_so(pytester):
    # 0.05 % in at most 2 s: not reachable on a noisy server; the window runs to its end.
    # Chance: steps 20 % apart at random give a 2 s window an interval of about ±1 % (some
    # 2,000 steps of about 1 ms at speed 4), twenty times the 0.05 % asked; load only widens it
    result = run(
        pytester,
        "--llm-duration=2",
        "--llm-precision=0.05%",
        "--llm-min-duration=1",
        endpoint=f"{TINY}&noise=0.2",
    )
    result.assert_outcomes(passed=3)
    for c in cells(pytester).values():
        assert c["window_end"] == "duration" and c["precision"] > 0.0005
    result.stdout.fnmatch_lines(
        [
            "  window ran to its end without the precision asked (--llm-precision): "
            "decode[[]1K-c1[]] (±*% at 2 s), decode[[]1K-c4[]] (±*% at 2 s)"
        ]
    )


def test_a_baseline_with_intervals_gates_beyond_them(pytester):
    run(pytester, "--llm-duration=2", "--llm-save-baseline=base.toml").assert_outcomes(passed=3)
    text = (pytester.path / "base.toml").read_text()
    assert "total_tok_s_ci = [" in text
    # Chance: 2 % tolerance, the steady cells gated tight; a server at half the speed fails beyond
    # both intervals on any machine (a 2 s window's interval on a loaded machine is a few %
    # wide, the change −50 %); whether a 10 % slowdown is told apart is benchmarks/intervals.py's
    (pytester.path / "base.toml").write_text(text.replace("tolerance = 0.05", "tolerance = 0.02"))
    same = run(pytester, "--llm-duration=2", "--llm-baseline=base.toml", "-m", "decode")
    slow = run(
        pytester,
        "--llm-duration=2",
        "--llm-baseline=base.toml",
        "-m",
        "decode",
        endpoint="sim:tiny?speed=0.5&noise=0.01",
    )
    slow.assert_outcomes(failed=2, deselected=1)
    slow.stdout.fnmatch_lines(["*decode[[]1K-c4[]] total tok/s * ±*% < floor *, beyond both*"])
    checks = cells(pytester)["decode[1K-c4]"]["baseline_checks"]
    assert all(c["reference_ci"] and c["values_ci"] for c in checks)
    assert same.ret in (0, 1)  # decided by the figures; the slower run's failure is the point


def test_requests_that_fail_and_restart_late_are_a_note_once_with_their_cells(
    results_doc, pytester
):
    # once each prefix is warm, every second request is answered HTTP 500; the client waits
    # before it restarts one that failed (longer after each failure in a row): the cells did
    # not keep N in flight, and the summary says so once, naming both
    from tests.plugin.test_error_paths import run_broken_after_warm_up

    result = run_broken_after_warm_up(
        pytester,
        "start500=0.5",
        "--llm-duration=2",
        "--llm-max-output=64",
        "--llm-max-error-rate=1",
        concurrency="1,4",
    )
    result.assert_outcomes(passed=2, deselected=1)
    cells = results_doc("out.json")["by_id"]
    for cid, n in (("decode[1K-c1]", 1), ("decode[1K-c4]", 4)):
        c = cells[cid]
        assert c["errors"] > 0
        # requests in flight on average: what the residual says, and well below N
        assert c["little_residual"] == pytest.approx(c["avg_active"] / n - 1, abs=2e-3)
        # Chance: half the requests fail at once and each failure waits 50 ms / N (more after
        # each in a row) before its stream restarts, against a success of about 35 ms (64
        # tokens, about two a 1 ms step at speed 4): about 0.3 of 1 and 2.4 of 4 in flight.
        # For 0.95 of N a success would have to take over 13 times as long, and load slows
        # this simulator by a fifth at most (tests/plugin/test_slo_sim.py: −21 %)
        assert c["avg_active"] < 0.95 * n, cid
    notes = [ln for ln in result.stdout.lines if "requests in flight than asked" in ln]
    assert len(notes) == 1
    assert re.fullmatch(
        r"  fewer requests in flight than asked: the client did not keep them in flight \(late "
        r"restarts or failing requests\): decode\[1K-c1\] \(0\.\d\d of 1 on average, −\d+\.\d%\), "
        r"decode\[1K-c4\] \([0-3]\.\d\d of 4 on average, −\d+\.\d%\)",
        notes[0],
    ), notes[0]
