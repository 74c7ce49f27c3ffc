"""The performance gate end to end on the simulator: baseline, regressions, pytest-benchmark."""

import json

import pytest

pytestmark = pytest.mark.slow  # every test here runs a matrix on the simulator

ARGS = (
    "--llm-contexts=1K",
    "--llm-concurrency=1,4",
    "--llm-duration=2",
    "--llm-max-output=256",
    # A cold 1K prompt prefills in about 12 ms, and one such request on a busy machine moves by
    # ±20 %: the median of 6 carries an interval, so the gate judges the prefill figure with its
    # noise (docs/judge.md, "With intervals") instead of a flat 5 % on one request.
    "--llm-prefill-repeats=6",
    "-m",
    "decode",
    "-p",
    "no:randomly",
)


# Where a test needs a 10 % slowdown told from noise: each window runs until its total tok/s
# is within ±1 % (2 s at the least, 5 s at the most: a window that does not get there ends with
# the interval of 5 s, ±0.5-1.5 %), so it adapts to the machine's load. With fixed 2 s windows
# a busy machine widened the intervals to ±2.6 % and ±3.7 %: a −9.2 % cell was within them,
# "too noisy to tell".
PRECISE = (
    *(a for a in ARGS if not a.startswith("--llm-duration=")),
    "--llm-duration=5",
    "--llm-precision=1%",
    "--llm-min-duration=2",
)


def sim(speed):
    return f"--llm-endpoint=sim:tiny?speed={speed}&seed=3"


def save_baseline(pytester, args):
    result = pytester.runpytest(sim(1), *args, "--llm-save-baseline=base.toml")
    result.assert_outcomes(passed=2, deselected=1)
    result.stdout.fnmatch_lines(["note: baseline: 3 cells written to base.toml"])
    text = (pytester.path / "base.toml").read_text()
    assert '[cells."decode[1K-c4]"]' in text and "total_tok_s = " in text
    return pytester.path / "base.toml"


@pytest.fixture
def baseline(pytester):
    return save_baseline(pytester, ARGS)


@pytest.fixture
def precise_baseline(pytester):
    return save_baseline(pytester, PRECISE)


def test_same_server_passes_the_gate(pytester):
    # A baseline of 3 runs (the simulator restarted between them): on a machine whose load
    # changes, a one-run baseline's 12 ms prefills were 15 % faster than every later attempt,
    # confirmations on fresh starts included; the runs' spread is what the gate needs to know
    result = pytester.runpytest(sim(1), *ARGS, "--llm-runs=3", "--llm-save-baseline=base.toml")
    result.assert_outcomes(passed=6, deselected=1)
    assert "runs = 3" in (pytester.path / "base.toml").read_text()
    # Chance: at 25 %, a correct gate calls the same server regressed only when a cell of today's
    # run and both its confirmations read 25 % below the baseline's three runs beyond their spread;
    # a busy machine moved this simulator's figures by at most 15 % (the prefills); whether 5 %
    # tells a 10 % slower server from the same one is the gate's benchmark
    # (benchmarks/gate_noise.py), not a test's
    result = pytester.runpytest(
        sim(1), *ARGS, "--llm-baseline=base.toml", "--llm-confirm=2", "--llm-tolerance=25%"
    )
    result.assert_outcomes(passed=2, deselected=1)
    result.stdout.fnmatch_lines(
        [
            "Baseline *base.toml: 0 regression(s), *",
            "  between-run spread of the baseline's 3 runs*",
        ]
    )


def test_slower_server_fails_exactly_the_affected_cells(results_doc, pytester, precise_baseline):
    # Chance: 40 % slower, each decode cell regresses on any machine (its ±1 % windows, ±3.7 % at
    # the widest seen beside other work, cannot reach the 5 % floor); the prefill, 40 % slower too,
    # may regress or, with its ±20 % cold requests on a busy machine, be unknown
    result = pytester.runpytest(
        sim(0.6),
        *PRECISE,
        f"--llm-baseline={precise_baseline}",
        "--llm-results=out.json",
        "--junitxml=out.xml",
    )
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.assert_outcomes(failed=2, deselected=1)
    result.stdout.fnmatch_lines(
        [
            "*decode[[]1K-c1[]] total tok/s * < floor * (baseline * − 5%): −*%*",
            # (", 1 unknown" when the warm-up's prefill, ±20 % on a busy machine, cannot tell)
            "Baseline *: * regression(s), 0 improvement(s) beyond tolerance*",
            "  REGRESSION  decode[[]1K-c1[]] total tok/s *",
        ]
    )
    assert "Traceback" not in result.stdout.str()
    cells = results_doc("out.json")["by_id"]
    for cid in ("decode[1K-c1]", "decode[1K-c4]"):
        assert cells[cid]["status"] == "failed" and cells[cid]["baseline"] == "regressed"
        assert len(cells[cid]["attempts"]) == 2  # the miss was confirmed by a re-measurement
    assert 'name="status" value="failed"' in (pytester.path / "out.xml").read_text()


def test_deselected_no_floor_and_improvements(pytester):
    (pytester.path / "base.toml").write_text(
        '[defaults]\ntolerance = 0.05\n\n[cells."decode[1K-c1]"]\ntotal_tok_s = 10.0\n\n'
        '[cells."decode[2K-c1]"]\ntotal_tok_s = 10.0\n'
    )
    result = pytester.runpytest(sim(1), *ARGS, "--llm-baseline=base.toml")
    result.assert_outcomes(passed=2, deselected=1)
    result.stdout.fnmatch_lines(
        [
            "Baseline base.toml: 0 regression(s), 1 improvement(s) beyond tolerance",
            "  2 baseline cell(s): 0 same, 1 improved, 0 unknown, 0 regressed, 0 not run, "
            "1 deselected, 0 not gated",
            "  improvement decode[[]1K-c1[]] total_tok_s * vs baseline 10.0: +*%",
            "  deselected: decode[[]2K-c1[]]",
            "  no floor (not in the baseline): decode[[]1K-c4[]]",
        ]
    )


def test_settings_mismatch_warns_and_strict_refuses(pytester, baseline):
    other = ("--llm-max-output=128", *ARGS[:3], *ARGS[4:])
    result = pytester.runpytest(sim(1), *other, f"--llm-baseline={baseline}")
    result.stdout.fnmatch_lines(
        [
            "note: warning: baseline * was taken with other settings: max_output 256 in the "
            "baseline, 128 now"
        ]
    )
    result = pytester.runpytest(
        sim(1), *other, f"--llm-baseline={baseline}", "--llm-baseline-strict"
    )
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["ERROR: pytest-llmspeed: baseline * (--llm-baseline-strict)"])


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "*nope.toml: baseline file not found. Create one with --llm-save-baseline=*"),
        ("[cells\n", "*bad.toml: not valid TOML: *(at line 1, column *)"),
        ('[cells."decode[8K-x1]"]\ntotal_tok_s = 1\n', "*bad.toml, line 1: unknown cell id*"),
        ('[cells."decode[8K-c1]"]\ntotal_tok_s = "x"\n', "*bad.toml, line 2: *not a positive*"),
    ],
)
def test_bad_baseline_is_a_usage_error(pytester, content, message):
    name = "nope.toml" if content is None else "bad.toml"
    if content is not None:
        (pytester.path / name).write_text(content)
    result = pytester.runpytest(sim(1), *ARGS, f"--llm-baseline={name}")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"ERROR: --llm-baseline: {message}"])
    assert "Traceback" not in result.stderr.str()


def test_pytest_benchmark_entries_and_compare_fail(pytester):
    result = pytester.runpytest(
        sim(1),
        *ARGS,
        "--benchmark-json=bench.json",
        "--benchmark-storage=store",
        "--benchmark-save=base",
    )
    result.assert_outcomes(passed=2, deselected=1)
    data = json.loads((pytester.path / "bench.json").read_text())
    assert data["machine_info"]["llm_server"]["model"] == "tiny"
    entries = {b["name"]: b for b in data["benchmarks"]}
    assert set(entries) == {"test_decode[1K-c1]", "test_decode[1K-c4]"}
    entry = entries["test_decode[1K-c4]"]
    assert entry["extra_info"]["concurrency"] == 4 and entry["extra_info"]["total_tok_s"] > 0
    assert entry["stats"]["rounds"] >= 4  # one time-between-tokens sample per request
    assert entry["stats"]["median"] == pytest.approx(entry["extra_info"]["tbt_ms"] / 1e3, rel=0.01)

    result = pytester.runpytest_subprocess(
        sim(
            0.5
        ),  # chance: half the speed, its time between tokens twice the stored, whatever the load
        *ARGS,
        "--benchmark-storage=store",
        "--benchmark-compare=0001",
        "--benchmark-compare-fail=median:10%",
    )
    assert result.ret != 0
    result.stderr.fnmatch_lines(
        [
            "Performance has regressed:",
            "*test_decode[[]1K-c1[]] (0001_base) - Field 'median' has failed*",
        ]
    )

    result = pytester.runpytest(sim(1), *ARGS, "-p", "no:benchmark")
    result.assert_outcomes(passed=2, deselected=1)


def test_github_step_summary(pytester, monkeypatch):
    summary = pytester.path / "summary.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    result = pytester.runpytest(sim(4), *ARGS)
    result.assert_outcomes(passed=2, deselected=1)
    text = summary.read_text()
    assert text.startswith("## LLM speed: ")
    assert "| Context   |" in text and "**Sustained decode**" in text


def test_failed_decode_cells_are_not_gated_as_warm_ups(pytester, baseline):
    # A decode cell that fails (a request ends with an error event: over the error rate) has no
    # verdict, and at the session's end only prefill warm-ups are gated. A failed decode cell
    # whose figures were past their limit was taken for a warm-up and re-measured as a
    # prefill: a traceback from pytest_sessionfinish (seen on real vLLM under load). The
    # simulator's faults are drawn per request from its seed: with seed 2 at half speed the
    # first prefill fails (c1 not run) and one of c4's requests does.
    result = pytester.runpytest(
        "--llm-endpoint=sim:tiny?speed=0.5&seed=2&faults=midstream=0.08",
        *ARGS,
        f"--llm-baseline={baseline}",
        "--llm-results=out.json",
    )
    assert result.ret == 1
    assert "Traceback" not in result.stdout.str() + result.stderr.str()
    cells = {c["id"]: c for c in json.loads((pytester.path / "out.json").read_text())["cells"]}
    c4 = cells["decode[1K-c4]"]
    assert c4["status"] == "failed" and "requests failed" in c4["reason"]
    assert "baseline" not in c4
    assert not any("warm-up" in note for note in c4.get("notes", []))
