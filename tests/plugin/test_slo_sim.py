"""Capacity at service-level objectives, end to end on the simulator's H200 profile (issue 21,
docs/slo.md): the capacity a run reports is what its cells' own figures say, read back from
the results file; a baseline keeps it and a slower run that loses a cell fails the gate; a bad
objective is one line."""

import json
import re
import tomllib
from xml.etree import ElementTree

import pytest

pytestmark = pytest.mark.slow

PROFILE = "sim:h200-qwen3.5-27b-int4"
ARGS = (
    "--llm-contexts=8K,32K",
    "--llm-concurrency=1,2,64",
    "--llm-duration=2",
    "-m",
    "decode",
    "-p",
    "no:randomly",
)
#: Chance: at speed 10 the 8K cells' per-request tok/s are about 1,474 / 1,450 / 498 (c1 / c2 / c64;
#: 32K: 1,442 / 1,420 / over capacity): the bound is far from c1 and c2 (−45 %) and from c64
#: (+61 %), and a busy machine only slows a simulator (a nice'd run beside a benchmark read c1
#: 1,170-1,586 at 10x, −21 % at worst). So the capacity is 2 at both contexts on any machine
#: these tests run on, and an unchanged run keeps it; at speed 3 (70 % slower) c1 is about
#: 440: a miss on any machine.
OBJECTIVES = "per_request_tok_s>=800,ttft<=1s"
#: the floors' tolerance where the capacity, not the floors, is under test: a loaded CI run
#: read decode[8K-c64] at 10x 53 % below a quieter baseline run (24K tok/s of events: the client
#: and the simulator share two cores), past a 50 % tolerance; a tenth is what no load reaches
LOOSE = "--llm-tolerance=90%"


def next_concurrency(doc, requests):
    """The concurrency measured after ``requests`` (the cell that stopped the capacity)."""
    levels = sorted({c["concurrency"] for c in doc["cells"] if c["phase"] == "decode"})
    return levels[levels.index(requests) + 1] if requests else levels[0]


def run(pytester, speed, *extra):
    return pytester.runpytest(f"--llm-endpoint={PROFILE}?speed={speed}", *ARGS, *extra)


def read_capacity(doc):
    """Each context's capacity from the cells' figures and intervals as the file gives them:
    the most requests up to which every cell's interval is on the good side of each bound."""
    out = {}
    cells = [c for c in doc["cells"] if c["phase"] == "decode"]
    for context in dict.fromkeys(c["context"] for c in cells):
        best = None
        for c in sorted(
            (c for c in cells if c["context"] == context), key=lambda c: c["concurrency"]
        ):
            if c["status"] != "valid":
                break
            # a figure without an interval (one request in the window): its value
            rate_low = (c.get("per_request_tok_s_ci") or [c["per_request_tok_s"]])[0]
            ttft_high = (c.get("ttft_ms_ci") or [c["ttft_ms"]])[-1]
            if not (rate_low >= 800 and ttft_high <= 1000):
                break
            best = c["concurrency"]
        out[context] = best
    return out


def test_the_capacity_is_what_the_cells_figures_say(pytester):
    result = run(
        pytester,
        10,
        f"--llm-slo={OBJECTIVES}",
        "--llm-results=r.json",
        "--llm-html=page.html",
        "--junitxml=j.xml",
    )
    assert result.ret == 0, result.stdout.str()
    doc = json.loads((pytester.path / "r.json").read_text())
    reported = {k: v["requests"] for k, v in doc["run"]["capacity"].items()}
    assert reported == read_capacity(doc)
    assert reported["8K"] == 2, doc["run"]["capacity"]
    # what stopped each: the cell's own words
    stop = doc["run"]["capacity"]["8K"]["stopped_by"]
    # a miss, or on a busy machine an interval that straddles the bound (it stops it too)
    after = next_concurrency(doc, reported["8K"])
    assert stop.startswith(
        (f"{after} misses per_request_tok_s: ", f"{after} too close to call: per_request_tok_s: ")
    ), stop
    assert doc["run"]["settings"]["slo"] == OBJECTIVES
    shown = result.stdout.str()
    assert f"Capacity at {OBJECTIVES}" in shown
    assert f"  8K: {reported['8K']} request" in shown
    assert "SLO ✓" in (pytester.path / "page.html").read_text()
    # JUnit: each cell's verdict, the run's capacities on the suite
    suite = ElementTree.parse(pytester.path / "j.xml").find("testsuite")
    assert suite is not None
    props = {p.get("name"): p.get("value") for p in suite.iterfind("properties/property")}
    assert props["llmspeed_slo"] == OBJECTIVES
    assert props["llmspeed_capacity[8K]"] == str(reported["8K"])
    verdicts = [
        p.get("value") or "" for p in suite.iterfind("testcase/properties/property[@name='slo']")
    ]
    assert "meets" in verdicts and any(v.startswith("misses") for v in verdicts), verdicts
    for c in doc["cells"]:
        if c["phase"] == "decode" and c["status"] == "valid":
            assert c["slo"].startswith(("meets", "misses ", "too close to call: ")), c["slo"]
            assert 0 <= c["goodput_tok_s"] <= c["total_tok_s"] * 1.0001


def test_a_run_whose_capacity_dropped_fails_the_gate_and_an_unchanged_one_passes(pytester):
    saved = run(
        pytester,
        10,
        f"--llm-slo={OBJECTIVES}",
        "--llm-save-baseline=b.toml",
        "--llm-results=r.json",
    )
    assert saved.ret == 0, saved.stdout.str()
    text = (pytester.path / "b.toml").read_text()
    assert f'objectives = "{OBJECTIVES}"' in text
    # the baseline keeps the capacity the run measured (2 at each context)
    doc = json.loads((pytester.path / "r.json").read_text())
    measured = {k: v["requests"] or 0 for k, v in doc["run"]["capacity"].items()}
    kept = tomllib.loads(text)["slo"]["capacity"]
    assert kept == measured, (kept, measured)
    assert kept["8K"] >= 1, kept  # c1 at 8K is 84 % above the bound
    # Chance: the floors are gated with the capacity; at the default 5 % a loaded machine made
    # an unchanged prefill miss its floor (−5.1 %, twice confirmed). The capacity is what this
    # test is about: the floors get a tolerance (90 %) no load reaches on a simulator at 10x.
    same = run(pytester, 10, f"--llm-slo={OBJECTIVES}", "--llm-baseline=b.toml", LOOSE)
    assert same.ret == 0, same.stdout.str()
    # 70 % slower: c1 at 8K (about 440 per-request tok/s) is far below the bound, whatever
    # the machine, so the capacity kept drops to none
    slower = run(pytester, 3, f"--llm-slo={OBJECTIVES}", "--llm-baseline=b.toml", "--llm-confirm=0")
    assert slower.ret == 1, slower.stdout.str()
    out = slower.stdout.str()
    assert f"8K: capacity at SLO {kept['8K']} → 0: decode[8K-c1] misses per_request_tok_s" in out
    assert re.search(r"  8K: none \(", out), out
    assert f"DROPPED: capacity at SLO {kept['8K']} → 0 (baseline)" in out, out
    # objectives other than the baseline's: said once, capacity not gated
    other = run(pytester, 10, "--llm-slo=ttft<=2s", "--llm-baseline=b.toml", LOOSE)
    assert other.ret == 0, other.stdout.str()
    assert "capacity at other objectives" in other.stdout.str()


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ("ttft_p95<=2s", "unknown figure 'ttft_p95'"),
        ("ttft_p90<=2", "the bound has no unit"),
        ("ttft_p90>=2s", "its bound is at most (<=)"),
    ],
)
def test_a_bad_objective_is_one_usage_line(pytester, value, says):
    result = pytester.runpytest(f"--llm-endpoint={PROFILE}", f"--llm-slo={value}")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    err = result.stderr.str()
    assert f"--llm-slo='{value}': " in err and says in err, err
    assert "Traceback" not in err + result.stdout.str()
