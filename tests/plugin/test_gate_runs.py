"""A baseline of several runs through the plugin: --llm-save-baseline adds a run to a file of
the same settings, refuses one of other settings before any cell runs, still reads a file
written before runs; confirmations on a fresh start of a server the plugin starts; --llm-runs."""

import json
import shutil
import tomllib
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # every test here runs cells on the simulator

TODAY = Path(__file__).parents[1] / "data" / "baseline" / "one_run_dee8b0b.toml"

ARGS = (
    "--llm-contexts=1K",
    "--llm-concurrency=1",
    "--llm-duration=1",
    "--llm-max-output=128",
    "-p",
    "no:randomly",
)


def sim(query="speed=1&seed=3"):
    return f"--llm-endpoint=sim:tiny?{query}"


def runs_of(path):
    return tomllib.loads(Path(path).read_text())["run"].get("runs", 1)


def test_a_second_run_is_added_to_the_baseline(pytester):
    result = pytester.runpytest(sim(), *ARGS, "--llm-save-baseline=b.toml")
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(["note: baseline: 2 cells written to b.toml"])
    result = pytester.runpytest(sim(), *ARGS, "--llm-save-baseline=b.toml")
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(["note: baseline: run 2 added to b.toml (2 cells; 2 runs now)"])
    doc = tomllib.loads((pytester.path / "b.toml").read_text())
    assert doc["run"]["runs"] == 2 and len(doc["run"]["dates"]) == 2
    assert len(doc["cells"]["decode[1K-c1]"]["total_tok_s_runs"]) == 2


def test_a_run_of_other_settings_is_refused_before_any_cell(pytester):
    pytester.runpytest(sim(), *ARGS, "--llm-save-baseline=b.toml").assert_outcomes(passed=2)
    before = (pytester.path / "b.toml").read_text()
    result = pytester.runpytest(sim(), *ARGS, "--llm-max-output=64", "--llm-save-baseline=b.toml")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    errors = [line for line in result.stderr.lines if line.startswith("ERROR")]
    assert errors == [
        "ERROR: pytest-llmspeed: --llm-save-baseline: b.toml holds runs taken with other "
        "settings (max_output 128 in the baseline, 64 now): a run is added only to runs of the "
        "same settings and server; save to another file, or delete this one to start a new "
        "baseline"
    ]
    assert "Traceback" not in result.stderr.str()
    result.assert_outcomes()  # no cell ran
    assert (pytester.path / "b.toml").read_text() == before


def test_a_file_written_before_runs_is_gated_on_and_added_to(pytester):
    shutil.copy(TODAY, pytester.path / "b.toml")
    same = ("--llm-duration=2", "--llm-prefill-repeats=6")
    result = pytester.runpytest(sim(), *ARGS, *same, "--llm-baseline=b.toml", "--llm-confirm=0")
    result.stdout.fnmatch_lines(["Baseline *b.toml: * regression(s), *"])
    assert "other settings" not in result.stdout.str()
    result = pytester.runpytest(sim(), *ARGS, *same, "--llm-save-baseline=b.toml")
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(["note: baseline: run 2 added to b.toml (2 cells; 2 runs now)"])
    doc = tomllib.loads((pytester.path / "b.toml").read_text())
    assert doc["run"]["runs"] == 2
    assert len(doc["cells"]["decode[1K-c1]"]["total_tok_s_runs"]) == 2
    assert "total_tok_s_runs" not in doc["cells"]["decode[4K-c1]"]  # not measured: one run


def test_a_miss_is_re_measured_on_a_restarted_simulator(pytester):
    pytester.runpytest(sim(), *ARGS, "-m", "decode", "--llm-save-baseline=b.toml")
    result = pytester.runpytest(
        sim("speed=0.5&seed=3"),  # chance: half the speed, a miss on any machine, and again
        *ARGS,
        "-m",
        "decode",
        "--llm-baseline=b.toml",
        "--llm-confirm=1",
        "--llm-results=out.json",
    )
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(
        ["  REGRESSION  decode[[]1K-c1[]] total tok/s * [[]attempts on fresh starts: *, *[]]"]
    )
    result.stdout.fnmatch_lines(
        [
            "note: the server was restarted * time(s) to re-measure cells on a fresh start: a "
            "miss of the baseline to confirm, or a figure too noisy to tell"
        ]
    )
    cells = json.loads((pytester.path / "out.json").read_text())["cells"]
    cell = next(c for c in cells if c["id"] == "decode[1K-c1]")
    assert len(cell["attempts"]) == 2
    assert "re-measured 1 time(s), each after restarting the server" in cell["notes"]


def test_runs_make_a_baseline_of_several_starts(pytester):
    # start_seed unset: each start of the simulator draws its own speed factor
    result = pytester.runpytest(
        sim("seed=3&start_noise=0.05"),
        *ARGS,
        "--llm-runs=3",
        "--llm-save-baseline=b.toml",
        "--llm-results=out.json",
    )
    assert result.ret == pytest.ExitCode.OK
    result.assert_outcomes(passed=6)  # each test once per run
    result.stdout.fnmatch_lines(
        [
            "[[]run 1/3 · 1/2[]] prefill[[]1K[]]*",
            "[[]run 2/3 · 1/2[]] prefill[[]1K[]]*",
            "[[]run 3/3 · 2/2[]] decode[[]1K-c1[]]*",
            "note: baseline: 2 cells written to b.toml",
            "note: baseline: run 2 added to b.toml (2 cells; 2 runs now)",
            "note: baseline: run 3 added to b.toml (2 cells; 3 runs now)",
        ]
    )
    doc = tomllib.loads((pytester.path / "b.toml").read_text())
    assert doc["run"]["runs"] == 3
    values = doc["cells"]["decode[1K-c1]"]["total_tok_s_runs"]
    # three starts, each with its own speed (5 % apart): the runs differ (a window's token
    # count is whole, so two starts close in speed may give the same rate)
    assert len(values) == 3 and len(set(values)) > 1
    # the results are the last run's: its decode cell is the baseline's third run
    cells = json.loads((pytester.path / "out.json").read_text())["cells"]
    last = next(c for c in cells if c["id"] == "decode[1K-c1]")
    assert round(last["total_tok_s"], 1) == values[2]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--llm-runs=0",), "--llm-runs='0': must be a whole number of runs ≥ 1"),
        (("--llm-runs=two",), "--llm-runs='two': must be a whole number of runs ≥ 1"),
        (("--llm-runs=3",), "--llm-runs='3': needs --llm-save-baseline=FILE: *"),
        (
            ("--llm-runs=3", "--llm-save-baseline=b.toml", "--llm-endpoint=http://127.0.0.1:9"),
            "--llm-runs='3': needs a server the plugin starts (--llm-serve, or *",
        ),
    ],
)
def test_runs_refused_with_one_line(pytester, args, message):
    endpoint = () if any(a.startswith("--llm-endpoint") for a in args) else (sim(),)
    result = pytester.runpytest(*endpoint, *ARGS, *args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"ERROR: {message}"])
    assert len([line for line in result.stderr.lines if line.startswith("ERROR")]) == 1


def test_prefill_repeats_default_to_six_when_a_baseline_is_saved_or_gated(pytester, results_doc):
    args = (sim(), *ARGS, "-m", "prefill", "--llm-results=out.json")
    pytester.runpytest(*args).assert_outcomes(passed=1, deselected=1)
    assert results_doc("out.json")["run"]["settings"]["prefill_repeats"] == 1
    pytester.runpytest(*args, "--llm-save-baseline=b.toml").assert_outcomes(passed=1, deselected=1)
    assert results_doc("out.json")["run"]["settings"]["prefill_repeats"] == 6
    assert tomllib.loads((pytester.path / "b.toml").read_text())["run"]["prefill_repeats"] == 6
    # gated on it: six again; an explicit value wins, with the settings' warning
    pytester.runpytest(*args, "--llm-baseline=b.toml").assert_outcomes(passed=1, deselected=1)
    assert results_doc("out.json")["run"]["settings"]["prefill_repeats"] == 6
    result = pytester.runpytest(*args, "--llm-baseline=b.toml", "--llm-prefill-repeats=2")
    assert results_doc("out.json")["run"]["settings"]["prefill_repeats"] == 2
    result.stdout.fnmatch_lines(
        [
            "note: warning: baseline b.toml was taken with other settings: prefill_repeats 6 in "
            "the baseline, 2 now"
        ]
    )


def test_runs_from_the_ini_file_are_checked_too(pytester):
    pytester.makeini("[pytest]\nllm_runs = -2\n")
    result = pytester.runpytest(sim(), *ARGS)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        ["ERROR: ini key llm_runs='-2': must be a whole number of runs ≥ 1"]
    )
