"""Within --llm-budget the stored gate measures its undecided cells again after every cell had
its first measurement, unknown cells first (issue 31; docs/gate.md, "Within a budget: the
undecided cells last, unknown first"), and reports each held test once, with its final verdict,
in the terminal, JUnit and the results file alike."""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET

import pytest

from pytest_llmspeed.gate.verdict import BUDGET_NOTE

pytestmark = pytest.mark.slow

ARGS = (
    "--llm-endpoint=sim:tiny?speed=1&seed=7",
    "--llm-contexts=1K",
    "--llm-concurrency=1,2",
    "--llm-duration=1",
    "--llm-max-output=128",
    "--llm-prefill-repeats=6",
    "-m",
    "decode",
    "-p",
    "no:randomly",
    "--llm-results=r.json",
    "--junitxml=j.xml",
)
FLOORS = ("total_tok_s", "per_request_tok_s")


def _edit(text: str, cell: str, change) -> str:
    """``change(name, value) -> str`` applied to the floor lines of ``cell``'s section."""
    head = f'[cells."{cell}"]\n'
    start = text.index(head) + len(head)
    end = text.index("\n[", start)
    body = re.sub(
        rf"^({'|'.join(FLOORS)}) = ([\d.]+)$\n(?:\1_ci = \[.*\]$\n)?",
        lambda m: change(m.group(1), float(m.group(2))),
        text[start:end] + "\n",
        flags=re.M,
    )
    return text[:start] + body.rstrip("\n") + text[end:]


def _doubled(name: str, value: float) -> str:  # twice as fast: a certain miss
    return f"{name} = {2 * value!r}\n{name}_ci = [{1.9 * value:.1f}, {2.1 * value:.1f}]\n"


def _wide(name: str, value: float) -> str:  # ±30 %: too noisy to tell at 5 %
    return f"{name} = {value!r}\n{name}_ci = [{0.7 * value:.1f}, {1.3 * value:.1f}]\n"


@pytest.fixture
def baseline(pytester: pytest.Pytester) -> str:
    """c1's floors twice the simulator's (a miss), c2's with ±30 % intervals (unknown)."""
    result = pytester.runpytest(*ARGS, "--llm-save-baseline=base.toml")
    result.assert_outcomes(passed=2, deselected=1)
    path = pytester.path / "base.toml"
    text = _edit(path.read_text(), "decode[1K-c1]", _doubled)
    path.write_text(_edit(text, "decode[1K-c2]", _wide))
    return str(path)


def _testcases(pytester: pytest.Pytester) -> dict[str, list[ET.Element]]:
    cases: dict[str, list[ET.Element]] = {}
    for case in ET.parse(pytester.path / "j.xml").getroot().iter("testcase"):
        cases.setdefault(case.get("name", ""), []).append(case)
    return cases


def test_the_unknown_cell_is_measured_again_first_and_each_test_reported_once(
    pytester: pytest.Pytester, baseline: str
) -> None:
    # a budget that one re-measurement spends (a fresh start and a 1 s window take longer):
    # c1's miss ran first, but c2's unknown takes the re-measurement
    result = pytester.runpytest(*ARGS, f"--llm-baseline={baseline}", "--llm-budget=1")
    out = result.stdout.str()
    assert result.ret == pytest.ExitCode.TESTS_FAILED, out
    result.stdout.fnmatch_lines(
        [
            "llmspeed: 2 cell(s) the first measurement did not decide, measured again now: "
            "1 unknown first, then 1 miss(es) to confirm, within --llm-budget (1 s)",
            "llmspeed: decode[[]1K-c2[]] measured again (unknown) · 1 s of the budget left",
            "llmspeed: decode[[]1K-c2[]]: * after 2 measurements",
        ]
    )
    assert "decode[1K-c1] measured again" not in out  # the budget was spent on c2
    # after every first measurement: the line comes after both cells' progress lines, which
    # say that they wait
    result.stdout.fnmatch_lines(
        [
            "[[]1/2] decode[[]1K-c1[]] (undecided: measured again after the others): * tok/s*",
            "[[]2/2] decode[[]1K-c2[]] (undecided: measured again after the others): * tok/s*",
            "llmspeed: 2 cell(s) the first measurement did not decide*",
        ]
    )
    doc = json.loads((pytester.path / "r.json").read_text())
    cells = {c["id"]: c for c in doc["cells"]}
    c1, c2 = cells["decode[1K-c1]"], cells["decode[1K-c2]"]
    assert len(c2["attempts"]) == 2  # measured again, on a fresh start
    assert not c1.get("attempts") and BUDGET_NOTE in c1["notes"]
    assert c1["baseline"] == "regressed" and c1["status"] == "failed"
    # each test reported once, with the final verdict its cell has in the results file
    cases = _testcases(pytester)
    for name, cell in (("test_decode[1K-c1]", c1), ("test_decode[1K-c2]", c2)):
        (case,) = cases[name]
        props = {p.get("name"): p.get("value") for p in case.iter("property")}
        assert props["gate_verdict"] == cell["baseline"], props
        assert (case.find("failure") is not None) == (cell["baseline"] == "regressed")
    result.stdout.fnmatch_lines(["FAILED *test_decode[[]1K-c1[]]*total tok/s*"])


def test_without_a_budget_each_cell_is_confirmed_as_its_test_runs(
    pytester: pytest.Pytester, baseline: str
) -> None:
    result = pytester.runpytest(*ARGS, f"--llm-baseline={baseline}")
    out = result.stdout.str()
    assert result.ret == pytest.ExitCode.TESTS_FAILED, out
    assert "measured again now" not in out
    doc = json.loads((pytester.path / "r.json").read_text())
    cells = {c["id"]: c for c in doc["cells"]}
    assert len(cells["decode[1K-c1]"]["attempts"]) == 2  # the miss confirmed, in its test
    assert len(cells["decode[1K-c2]"]["attempts"]) == 2
    assert [len(v) for v in _testcases(pytester).values()] == [1, 1]


def test_a_users_own_failure_stays_when_its_cell_waits(
    pytester: pytest.Pytester, baseline: str
) -> None:
    """A user's test whose cell waits (c2: unknown) and which fails on its own assertion after
    the cell: reported once, after the re-measurement, still failed with its own words."""
    pytester.makepyfile(
        test_mine="""
        import pytest

        @pytest.mark.parametrize("llm_prefix", ["1K"], indirect=True)
        def test_two_streams(llm_prefix, llm_cell):
            record = llm_cell.decode(llm_prefix, 2)
            assert record["total_tok_s"] > 1e9, "my own floor"
        """
    )
    args = [a for a in ARGS if a not in ("-m", "decode")]
    result = pytester.runpytest(*args, f"--llm-baseline={baseline}", "--llm-budget=60")
    result.stdout.fnmatch_lines(
        [
            "llmspeed: decode[[]1K-c2[]] measured again (unknown)*",
            "FAILED test_mine.py::test_two_streams[[]1K[]] - AssertionError: my own floor*",
        ]
    )
    result.assert_outcomes(failed=1)
    (case,) = _testcases(pytester)["test_two_streams[1K]"]
    failure = case.find("failure")
    assert failure is not None and "my own floor" in (failure.get("message") or "")
