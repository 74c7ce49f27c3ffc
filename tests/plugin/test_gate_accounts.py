"""The gate must not look away: the suite runs where the user means it, every baseline cell is
accounted for, and what a run measures is gated whatever selected it."""

import re

import pytest

from pytest_llmspeed.sim.engine import EngineCore, SimRequest
from pytest_llmspeed.sim.profiles import get_profile

pytestmark = pytest.mark.slow

TINY = "sim:tiny?speed=4&seed=5"
MATRIX = (
    "--llm-contexts=1K",
    "--llm-concurrency=1,4",
    "--llm-duration=1",
    "--llm-max-output=64",
    "-p",
    "no:randomly",
)
UNIT_TEST = "def test_unit():\n    assert 1 + 1 == 2\n"


# -- where the built-in suite runs -----------------------------------------------------------


def test_marker_selects_the_decode_cells_next_to_a_unit_test(pytester):
    pytester.makepyfile(test_unit=UNIT_TEST)
    result = pytester.runpytest(f"--llm-endpoint={TINY}", *MATRIX, "-m", "decode", "-v")
    result.assert_outcomes(passed=2, deselected=2)  # the unit test and test_prefill[1K]
    result.stdout.fnmatch_lines(
        [
            "llmspeed: built-in suite added: -m 'decode' names its markers",
            "*test_decode[[]1K-c4[]] PASSED*",
        ]
    )


def test_endpoint_on_the_command_line_runs_the_unit_test_and_the_matrix(pytester):
    pytester.makepyfile(test_unit=UNIT_TEST)
    result = pytester.runpytest(f"--llm-endpoint={TINY}", *MATRIX)
    result.assert_outcomes(passed=4)
    result.stdout.fnmatch_lines(
        ["llmspeed: built-in suite added: --llm-endpoint given on the command line"]
    )


def test_a_started_server_and_a_baseline_on_the_command_line_run_the_matrix(pytester):
    """The README's one-command gate in a repository with tests: --llm-serve and
    --llm-save-baseline (then --llm-baseline) on the command line ask for the matrix; the
    unit test runs beside it, the baseline is written, then gated against."""
    import sys

    pytester.makepyfile(test_unit=UNIT_TEST)
    serve = f"--llm-serve={sys.executable} -m pytest_llmspeed.sim --port {{port}} --profile tiny"
    saved = pytester.runpytest(serve, *MATRIX, "--llm-save-baseline=b.toml")
    saved.assert_outcomes(passed=4)
    saved.stdout.fnmatch_lines(
        [
            "llmspeed: built-in suite added: --llm-serve and --llm-save-baseline given on the "
            "command line"
        ]
    )
    assert "decode[1K-c4]" in (pytester.path / "b.toml").read_text()
    # Chance: the test is about what asks for the matrix, not about verdicts: the gate gets a
    # tolerance (90 %) no load reaches on the simulator (a busy machine read an unchanged
    # prefill −33 %, beyond both intervals, at the file's 5 %). --llm-tolerance given stands
    # over the file's default.
    gated = pytester.runpytest(serve, *MATRIX, "--llm-baseline=b.toml", "--llm-tolerance=90%")
    gated.assert_outcomes(passed=4)
    gated.stdout.fnmatch_lines(["*Baseline b.toml: 0 regression(s)*"])
    assert "tolerance = 0.05" in (pytester.path / "b.toml").read_text()  # the file's, kept


def test_a_baseline_asked_for_with_nothing_measured_fails_saying_so(pytester):
    """A baseline to save (or to gate) asked for on the command line, and a selection that
    leaves no cell: exit 1 and one line, not exit 0 (or 5) with no baseline written. In the
    ini file it configures: plain pytest on the unit test passes."""
    pytester.makepyfile(test_unit=UNIT_TEST)
    result = pytester.runpytest(
        f"--llm-endpoint={TINY}", *MATRIX, "--llm-save-baseline=b.toml", "-k", "unit"
    )
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.assert_outcomes(passed=1, deselected=3)
    result.stdout.fnmatch_lines(
        [
            "llmspeed: ERROR: --llm-save-baseline asked for a verdict or a baseline, but no cell "
            "was measured (the selection left none: *): nothing was gated or saved"
        ]
    )
    assert not (pytester.path / "b.toml").exists()
    pytester.makeini(f"[pytest]\nllm_endpoint = {TINY}\nllm_save_baseline = b.toml\n")
    plain = pytester.runpytest()
    assert plain.ret == pytest.ExitCode.OK
    assert "ERROR" not in plain.stdout.str()


def test_endpoint_in_the_ini_file_does_not_turn_plain_pytest_into_a_matrix(pytester):
    pytester.makepyfile(test_unit=UNIT_TEST)
    pytester.makeini(
        f"[pytest]\nllm_endpoint = {TINY}\nllm_contexts = 1K\nllm_concurrency = 1,4\n"
        "llm_duration = 1\nllm_max_output = 64\n"
    )
    plain = pytester.runpytest()
    plain.assert_outcomes(passed=1)
    plain.stdout.fnmatch_lines(["llmspeed: built-in suite left out: the endpoint comes from *"])
    asked = pytester.runpytest("-m", "decode")
    asked.assert_outcomes(passed=2, deselected=2)


def test_own_speed_tests_stand_in_for_the_built_in_suite(pytester):
    pytester.makepyfile(
        test_mine="""
        import pytest

        @pytest.mark.parametrize("llm_prefix", ["1K"], indirect=True)
        def test_two_users(llm_prefix, llm_cell):
            assert llm_cell.decode(llm_prefix, 2).total_tok_s > 0
        """,
        test_unit=UNIT_TEST,
    )
    result = pytester.runpytest(f"--llm-endpoint={TINY}", *MATRIX)
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(
        ["llmspeed: built-in suite left out: 1 selected test(s) of yours use *"]
    )
    always = pytester.runpytest(f"--llm-endpoint={TINY}", *MATRIX, "--llm-builtin-suite=always")
    always.assert_outcomes(passed=5)


# -- every baseline cell accounted for -------------------------------------------------------


def model_prompt_tok_s(context: int, speed: float) -> float:
    """The prompt tok/s of one cold ``context``-token prompt in the simulator's own model
    (``EngineCore`` on a virtual clock: front end, then the prefill step) on ``tiny`` at
    ``speed``: the best the server can do, since a busy machine only adds to a measured TTFT
    (1K at speed 4: 2.56 ms in the model, 2.6-2.8 ms in the server's record, 3.0-3.4 measured
    quiet, up to 9 ms beside two busy loops)."""
    core = EngineCore(get_profile("tiny"), speed=speed)
    req = SimRequest(list(range(300, 300 + context)), 1, ignore_eos=True)
    core.add(req, 0.0)
    now = 0.0
    while req.first_token_time is None:
        due = core.next_event(now)
        assert due is not None
        now = max(now, due)
        plan = core.plan(now)
        assert plan is not None
        now += plan.duration
        core.complete(plan, now)
    return context / req.first_token_time


# The baseline and the slower run: their decode figures 30 % apart must lie beyond the gate's
# intervals. With 1 s windows of 64-token requests (one restart every 32 ms at speed 4) a busy
# machine widened a baseline's to ±19 % and ±26 %, and a −17 % cell was "too noisy to tell";
# 256-token requests, and windows that run until ±3 % (1-4 s).
GATED = (
    *(a for a in MATRIX if not a.startswith(("--llm-duration=", "--llm-max-output="))),
    "--llm-max-output=256",
    "--llm-duration=4",
    "--llm-precision=3%",
    "--llm-min-duration=1",
)


@pytest.fixture
def full_baseline(pytester):
    result = pytester.runpytest(f"--llm-endpoint={TINY}", *GATED, "--llm-save-baseline=b.toml")
    result.assert_outcomes(passed=3)
    # The prefill's reference: the model's figure at the baseline's speed, not one cold 1K
    # request of ~3 ms that a busy machine made 5.4 ms (the slower server's, 7 ms, then passed)
    path = pytester.path / "b.toml"
    text, found = re.subn(
        r'(\[cells\."prefill\[1K\]"\]\nprompt_tok_s = )[\d.]+',
        rf"\g<1>{model_prompt_tok_s(1024, 4):.1f}",
        path.read_text(),
    )
    assert found == 1, text
    path.write_text(text)
    return path


def test_decode_selection_still_gates_the_prefill_the_warm_up_measured(
    results_doc, pytester, full_baseline
):
    # 30 % slower than the baseline's speed=4: its cold prefill takes at least the model's
    # 3.65 ms, at most 70 % of the reference's prompt tok/s, below the 95 % floor whatever the
    # machine does; its decode figures measured 30 % below the baseline's, far beyond noise
    result = pytester.runpytest(
        "--llm-endpoint=sim:tiny?speed=2.8&seed=5",
        *GATED,
        "-m",
        "decode",
        f"--llm-baseline={full_baseline}",
        "--llm-results=out.json",
    )
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.assert_outcomes(failed=2, deselected=1)
    result.stdout.fnmatch_lines(
        [
            "Baseline *b.toml: 3 regression(s), 0 improvement(s) beyond tolerance",
            "  3 baseline cell(s): 0 same, 0 improved, 0 unknown, 3 regressed, 0 not run, "
            "0 deselected, 0 not gated",
            "  REGRESSION  prefill[[]1K[]] prompt tok/s * < floor *",
        ]
    )
    cells = results_doc("out.json")["by_id"]
    prefill = cells["prefill[1K]"]
    assert prefill["status"] == "failed" and prefill["baseline"] == "regressed"
    assert any("decode warm-up" in n for n in prefill["notes"])


def test_a_baseline_cell_that_no_longer_fits_fails_the_run(pytester):
    pytester.path.joinpath("b.toml").write_text(
        '[run]\nmodel = "tiny"\n\n[cells."decode[1K-c1]"]\ntotal_tok_s = 1.0\n\n'
        '[cells."decode[16K-c1]"]\ntotal_tok_s = 1.0\n\n[cells."decode[8K-c1]"]\n'
        "total_tok_s = 1.0\n"
    )
    args = (
        f"--llm-endpoint={TINY}&max_model_len=8192",
        "--llm-contexts=1K,16K",
        "--llm-concurrency=1",
        "--llm-duration=1",
        "--llm-max-output=64",
        "-m",
        "decode",
        "--llm-baseline=b.toml",
    )
    result = pytester.runpytest(*args)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.assert_outcomes(passed=1, skipped=1, deselected=2)
    result.stdout.fnmatch_lines(
        [
            "  3 baseline cell(s): 0 same, 1 improved, 0 unknown, 0 regressed, 1 not run, "
            "1 deselected, 0 not gated",
            "  NOT RUN     decode[[]16K-c1[]]: does not fit: 16K + 64 = 16,448 > max_model_len *",
            "  deselected: decode[[]8K-c1[]]",
        ]
    )
    warned = pytester.runpytest(*args, "--llm-baseline-missing=warn")
    assert warned.ret == pytest.ExitCode.OK
    warned.stdout.fnmatch_lines(
        [
            "  not run     decode[[]16K-c1[]]: does not fit: *",
            "  (--llm-baseline-missing=warn: cells not run are accepted)",
        ]
    )
