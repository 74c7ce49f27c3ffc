"""Open-loop cells through the plugin (docs/workloads.md): --llm-rates and --llm-trace against
the built-in simulator, as users run them; a broken trace is one line."""

import json

import pytest
from junitparser import JUnitXml

pytestmark = pytest.mark.slow  # each test here runs cells on the simulator

TINY = "sim:tiny?speed=4"


def _cells(pytester, name: str = "out.json") -> dict[str, dict]:
    doc = json.loads((pytester.path / name).read_text())
    return {c["id"]: c for c in doc["cells"]}


def _properties(pytester, name: str) -> dict[str, str]:
    xml = JUnitXml.fromfile(str(pytester.path / "out.xml"))
    for suite in xml:
        for case in suite:
            if case.name == name:
                return {p.get("name"): p.get("value") for p in case._elem.iter("property")}
    raise AssertionError(f"no test {name} in the JUnit file")


def test_rate_cells_run_per_context_and_rate_and_report_from_the_schedule(pytester):
    result = pytester.runpytest(
        f"--llm-endpoint={TINY}",
        "--llm-contexts=1K",
        "--llm-concurrency=1",
        "--llm-rates=4,16",
        "--llm-duration=1",
        "--llm-max-output=16",
        "--llm-results=out.json",
        "--junitxml=out.xml",
        "-m",
        "rate",
        "-v",
        "-p",
        "no:benchmark",
    )
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(
        [
            # what the rate cells' TTFTs are: returning users', on a warm shared prefix
            "llmspeed: api * · rate cells: each request the context's shared prefix, warm · *",
            "llmspeed::test_rate[[]1K-r4[]] PASSED*",
            "llmspeed::test_rate[[]1K-r16[]] PASSED*",
            "Open loop (requests sent at their scheduled times; latencies are medians*",
            "*rate[[]1K-r4[]]*",
        ]
    )
    cells = _cells(pytester)
    assert {"rate[1K-r4]", "rate[1K-r16]", "prefill[1K]"} <= set(cells)
    for cid in ("rate[1K-r4]", "rate[1K-r16]"):
        cell = cells[cid]
        assert cell["phase"] == "rate" and cell["status"] == "valid"
        assert cell["open_requests"] >= 1 and cell["open_failed"] == 0
        assert cell["open_completed"] == cell["open_requests"]
        # from the schedule, never less than from the send
        assert cell["sched_ttft_ms"] >= cell["sent_ttft_ms"] - 0.01
        assert cell["sched_e2e_ms"] >= cell["sched_ttft_ms"]
        assert cell["offered_rate"] == pytest.approx(cell["open_requests"] / 1.0)
    # the same seed: the same arrivals at a rate, however often the run is repeated
    assert cells["rate[1K-r16]"]["open_requests"] > cells["rate[1K-r4]"]["open_requests"]
    props = _properties(pytester, "test_rate[1K-r4]")
    assert float(props["sched_ttft_ms"]) == cells["rate[1K-r4]"]["sched_ttft_ms"]
    assert props["phase"] == "rate" and "achieved_rate" in props


def test_a_trace_is_replayed_as_trace_name_with_its_blocks_shared(pytester):
    lines = [
        {"timestamp": 0, "input_length": 1100, "output_length": 4, "hash_ids": [1, 2, 3]},
        {"timestamp": 300, "input_length": 1100, "output_length": 4, "hash_ids": [1, 2, 4]},
        {"timestamp": 600, "input_length": 300, "output_length": 4},
    ]
    (pytester.path / "day1.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    result = pytester.runpytest(
        f"--llm-endpoint={TINY}",
        "--llm-trace=day1.jsonl",
        "--llm-trace-speed=2",
        "--llm-results=out.json",
        "--junitxml=out.xml",
        "-m",
        "trace",
        "-v",
        "-p",
        "no:benchmark",
    )
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(
        [
            # its own settings: no window, no max output of ours (the trace has its lengths)
            "llmspeed: api completions (* prompts) · trace at 2× its speed · trace day1",
            "llmspeed::test_trace[[]day1[]] PASSED*",
            "*trace[[]day1[]]*",
        ]
    )
    cell = _cells(pytester)["trace[day1]"]
    assert cell["phase"] == "trace" and cell["status"] == "valid"
    assert cell["open_requests"] == 3 and cell["open_completed"] == 3
    # 2 blocks of 512 shared by the second request: (2 × 512) / (1100 + 1100 + 300)
    assert cell["expected_hit_share"] == pytest.approx(1024 / 2500, abs=1e-4)
    # Chance: the hit needs the first request's prefill (one step of about 2.4 ms at speed 4:
    # (4 ms + 1,100 × 5 µs) / 4) done before the second reaches the server, 150 ms later by
    # the schedule: only a stall of the client or the simulator of 150 ms, 60 times the step,
    # at that moment would put both in one step
    assert cell["server"]["prefix_cache_hit_rate"] == pytest.approx(1024 / 2500)
    assert cell["offered_rate"] == pytest.approx(3 / 0.3)  # 600 ms at twice the speed


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ('{"timestamp": 0, "input_length": 5, "output_length": 5}\n{oops\n', "line 2: not JSON"),
        ("", "no request in it: give a JSONL or CSV file of requests"),
    ],
)
def test_a_broken_trace_is_one_line_before_any_cell(pytester, text, words):
    (pytester.path / "bad.jsonl").write_text(text)
    result = pytester.runpytest(f"--llm-endpoint={TINY}", "--llm-trace=bad.jsonl", "-m", "trace")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    err = result.stderr.str()
    assert f"ERROR: --llm-trace='bad.jsonl': {words}" in err
    assert "Traceback" not in err + result.stdout.str()


def test_trace_requests_longer_than_the_servers_context_are_left_out_with_their_line(pytester):
    lines = [
        {"timestamp": 0, "input_length": 100, "output_length": 4},
        {"timestamp": 10, "input_length": 2000, "output_length": 100},
    ]
    (pytester.path / "long.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    args = ("--llm-trace=long.jsonl", "-m", "trace", "--llm-results=out.json")
    result = pytester.runpytest("--llm-endpoint=sim:tiny?speed=4&max_model_len=2048", *args)
    result.assert_outcomes(passed=1)
    cell = _cells(pytester)["trace[long]"]
    assert cell["open_requests"] == 1
    assert cell["notes"] == [
        "trace long: 1 of 2 requests left out, longer than the server's context (the first: "
        "line 2: input_length 2,000 + output_length 100 = 2,100 > the server's max_model_len "
        "2,048)"
    ]
    assert f"note: {cell['notes'][0]}" in result.stdout.str()  # the terminal says it too
    # none fits: the cell's error names the first's line, no traceback
    result = pytester.runpytest("--llm-endpoint=sim:tiny?speed=4&max_model_len=100", *args)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        ["*--llm-trace=long.jsonl: no request fits the server (line 1: input_length 100 + "
         "output_length 4 = 104 > the server's max_model_len 100, and every other)*"]
    )  # fmt: skip
    assert "Traceback" not in result.stdout.str()


def test_a_rate_too_high_for_one_cell_is_one_line_before_the_server_starts(pytester):
    result = pytester.runpytest("--llm-endpoint=sim", "--llm-rates=2,5000", "--llm-duration=30")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        ["ERROR: --llm-rates='2,5000': 5000/s for --llm-duration 30 s is about 150,000 requests, "
         "more than 100,000 in one cell: lower the rate or the duration"]
    )  # fmt: skip


def test_an_open_loop_cell_is_gated_and_compared_by_its_ttft_from_the_schedule(pytester):
    """An open-loop cell has no floor: its headline, the TTFT from the scheduled send, is the
    figure a saved baseline gates as written, and `compare` judges it by the same rule (a
    server eight times slower regresses it in both: about 4 ms against 30).

    Chance: load only slows a simulator, so the slower server's TTFT is 30 ms or more on any
    machine; the baseline's would have to grow from about 4 ms to near 30 (over 20 ms added to
    the median request of a 3 s window) for the change to fall inside the 5 % tolerance."""
    import re
    import subprocess
    import sys

    args = (
        "--llm-contexts=1K", "--llm-concurrency=1", "--llm-rates=16", "--llm-duration=3",
        "--llm-max-output=16", "-m", "rate", "-p", "no:benchmark", "-p", "no:randomly",
    )  # fmt: skip
    first = pytester.runpytest(
        f"--llm-endpoint={TINY}", *args, "--llm-results=a.json", "--llm-save-baseline=b.toml"
    )
    first.assert_outcomes(passed=1)
    text = (pytester.path / "b.toml").read_text()
    cell = text.split('[cells."rate[1K-r16]"]', 1)[1].split("[cells.", 1)[0]
    assert re.search(r"^sched_ttft_ms = [\d.]+$", cell, re.M), cell  # gated as written
    slower = pytester.runpytest(
        "--llm-endpoint=sim:tiny?speed=0.5", *args, "--llm-results=b.json", "--llm-baseline=b.toml"
    )
    assert slower.ret == 1, slower.stdout.str()
    slower.stdout.fnmatch_lines(
        ["*REGRESSION  rate[[]1K-r16[]] TTFT from the scheduled send ms*ceiling*"]
    )
    cell = _cells(pytester, "b.json")["rate[1K-r16]"]
    assert cell["baseline"] == "regressed", cell.get("baseline_checks")
    (check,) = cell["baseline_checks"]
    assert check["metric"] == "sched_ttft_ms" and check["verdict"] == "regressed"
    out = subprocess.run(
        [sys.executable, "-m", "pytest_llmspeed", "compare", "a.json", "b.json"],
        capture_output=True, text=True, cwd=pytester.path,
    )  # fmt: skip
    assert out.returncode == 1, out.stdout + out.stderr
    (line,) = [x for x in out.stdout.splitlines() if "rate[1K-r16]" in x]
    assert line.lstrip().startswith("REGRESSION  rate[1K-r16] sched_ttft_ms"), line
    # the interval is of the change the line shows (a rise), not of the judge's 1 − X / R
    low, high = (float(x) for x in re.findall(r"([+−-][\d.]+)%", line.replace("−", "-"))[1:3])
    assert 0 < low < high, line
    assert "not measured in both" not in out.stdout


def test_a_replayed_trace_is_re_measured_on_fresh_starts_and_gated(pytester):
    """A trace's cell names no context: its confirmation restarts the server without warming
    a prefix (it stopped the run: "invalid literal for int() with base 10: 'day2'").

    Chance: as in the rate cell's test above, the slower server is eight times slower (speed
    0.5 against 4), and load only slows a simulator: the baseline's TTFT from the schedule
    would have to grow about eightfold for the slower one to pass its gate."""
    rows = [{"timestamp": 40 * i, "input_length": 1100, "output_length": 4,
             "hash_ids": [1, 2, 3 + i]} for i in range(20)]  # fmt: skip
    (pytester.path / "day2.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    args = ("--llm-trace=day2.jsonl", "-m", "trace", "-p", "no:benchmark", "-p", "no:randomly")
    first = pytester.runpytest(f"--llm-endpoint={TINY}", *args, "--llm-save-baseline=b.toml")
    first.assert_outcomes(passed=1)
    slower = pytester.runpytest(
        "--llm-endpoint=sim:tiny?speed=0.5", *args, "--llm-baseline=b.toml", "--llm-results=b.json"
    )
    assert slower.ret == 1, slower.stdout.str()
    slower.stdout.fnmatch_lines(
        ["*REGRESSION  trace[[]day2[]] TTFT from the scheduled send ms*attempts on fresh starts*"]
    )
    assert "Interrupted" not in slower.stdout.str()
    cell = _cells(pytester, "b.json")["trace[day2]"]
    assert cell["baseline"] == "regressed" and len(cell["attempts"]) >= 2  # re-measured


def test_the_capacity_as_a_rate_is_the_highest_rate_that_meets_the_objectives(
    pytester, monkeypatch
):
    """One running request at a time, a quarter of the simulator's speed: 1 request a second
    meets TTFT ≤ 1 s from the schedule; 32 a second queue for seconds and miss it. The
    capacity as a rate is 1/s, in the terminal, the results file, JUnit and the job summary
    (the page's: tests/page/test_rate_page.py).

    Chance: at 1/s a request's TTFT is its 1K prefill and front end, about 41 ms at speed 0.25
    ((4 ms + 1,024 × 5 µs + 1.1 ms) / 0.25), and each request is done (16 tokens, about 0.2 s)
    before the next arrives: 24 times under the 1 s bound. At 32/s requests served one at a
    time in about 0.2 s queue by about 0.14 s each, so the median waits seconds; load only
    makes that queue longer."""
    from xml.etree import ElementTree

    summary = pytester.path / "summary.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))

    result = pytester.runpytest(
        "--llm-endpoint=sim:tiny?speed=0.25&max_num_seqs=1",
        "--llm-contexts=1K", "--llm-rates=1,32", "--llm-duration=2", "--llm-max-output=16",
        "--llm-slo=ttft<=1s", "-m", "rate", "-p", "no:benchmark", "-p", "no:randomly",
        "--llm-results=out.json", "--junitxml=out.xml",
    )  # fmt: skip
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(
        [
            "Capacity as an arrival rate at ttft<=1s (the highest rate, open loop, *",
            "  1K: 1 request/s (32/s misses ttft: * s > 1 s)",
        ]
    )
    doc = json.loads((pytester.path / "out.json").read_text())
    cells = {c["id"]: c for c in doc["cells"]}
    low = cells["rate[1K-r1]"]
    # met: the whole interval (4 requests have none: their median)
    assert (low.get("sched_ttft_ms_ci") or [low["sched_ttft_ms"]])[-1] < 1000
    assert cells["rate[1K-r32]"]["sched_ttft_ms_ci"][0] > 1000  # missed: the whole interval
    (rated,) = doc["run"]["rate_capacity"].values()
    assert rated["rate"] == 1 and rated["stopped_by"].startswith("32/s misses ttft: ")
    suite = ElementTree.parse(pytester.path / "out.xml").find("testsuite")
    assert suite is not None
    props = {p.get("name"): p.get("value") for p in suite.iterfind("properties/property")}
    assert props["llmspeed_rate_capacity[1K]"] == "1.0"
    md = summary.read_text()
    assert "**Capacity as an arrival rate at `ttft<=1s`** (the highest rate" in md
    assert "\n- 1K: 1 request/s (32/s misses ttft: " in md


@pytest.mark.parametrize(("prompts", "said"), [("shared", "shared prefix, warm"), ("cold", "cold")])
def test_rate_prompts_shared_hit_the_warm_prefix_and_cold_ones_nothing(pytester, prompts, said):
    """--llm-rate-prompts: shared prompts (returning users) hit the context's warm prefix in
    the server's cache, cold ones (new users, each a prompt of its own) nothing: the
    simulator's own prefix-cache counters over the cell say so, and the header says which.
    Certain: the cache holds exactly the prompts' token ids, whatever the machine's load."""
    result = pytester.runpytest(
        f"--llm-endpoint={TINY}",
        "--llm-contexts=4K",
        "--llm-rates=4",
        "--llm-duration=1",
        "--llm-max-output=16",
        f"--llm-rate-prompts={prompts}",
        "--llm-results=out.json",
        "-m",
        "rate",
        "-p",
        "no:randomly",
    )
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines([f"*rate cells: each request * {said}*"])
    cell = _cells(pytester)["rate[4K-r4]"]
    hits = cell["server"]["prefix_cache_hit_rate"]
    assert hits > 0.9 if prompts == "shared" else hits == 0.0, hits
    settings = json.loads((pytester.path / "out.json").read_text())["run"]["settings"]
    assert settings["rate_prompts"] == prompts
