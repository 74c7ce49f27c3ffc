"""The baseline file: each broken case has one message naming the file and the line."""

import pytest

from pytest_llmspeed.gate.baseline import BaselineError, dump, load, mismatches
from pytest_llmspeed.gate.verdict import attempt_misses, judged
from pytest_llmspeed.results import CellId, CellRecord, Check, Status

GOOD = """\
[run]
model = "tiny"
max_output = 128

[defaults]
tolerance = 0.05

[cells."decode[1K-c4]"]
total_tok_s = 1000.0
per_request_tok_s = 250.0
tolerance = 0.1

[cells."prefill[1K]"]
prompt_tok_s = 50000.0
ttft_ms = 20.0
"""


def write(tmp_path, text):
    path = tmp_path / "base.toml"
    path.write_text(text)
    return path


def test_good_file(tmp_path):
    b = load(write(tmp_path, GOOD))
    assert b.tolerance == 0.05
    cell = b.cells["decode[1K-c4]"]
    assert cell.limits == {"total_tok_s": 1000.0, "per_request_tok_s": 250.0}
    assert cell.tolerance == 0.1 and cell.line == 8
    assert b.cells["prefill[1K]"].limits["ttft_ms"] == 20.0


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[cells\n", r"base.toml: not valid TOML: .*line 1"),
        (
            GOOD.replace("decode[1K-c4]", "decode[1Q-c4]"),
            r"base.toml, line 8: unknown cell id 'decode\[1Q-c4\]'",
        ),
        (
            GOOD.replace("total_tok_s = 1000.0", 'total_tok_s = "fast"'),
            r"base.toml, line 9: decode\[1K-c4\] total_tok_s = 'fast' is not a positive number",
        ),
        (
            GOOD.replace("per_request_tok_s", "per_request_tok"),
            r"base.toml, line 10: unknown figure 'per_request_tok' in decode\[1K-c4\]",
        ),
        (
            GOOD.replace("tolerance = 0.05", "tolerance = 5"),
            r"base.toml, line 6: tolerance = 5 must be a fraction between 0 and 1",
        ),
        (GOOD + "\n[extra]\n", r"base.toml, line \d+: unknown table or key 'extra'"),
        (
            GOOD.replace("tolerance = 0.1", "total_tok_s_ci = [1010.0, 990.0]"),
            r"base.toml, line 11: decode\[1K-c4\] total_tok_s_ci = \[1010.0, 990.0\] must be an "
            r"interval \[low, high\] of two positive numbers, low ≤ high",
        ),
        (
            GOOD.replace("tolerance = 0.1", "total_tok_s_ci = 5"),
            r"line 11: decode\[1K-c4\] total_tok_s_ci = 5 must be an interval",
        ),
    ],
)
def test_broken_files(tmp_path, text, message):
    with pytest.raises(BaselineError, match=message):
        load(write(tmp_path, text))


def test_missing_file(tmp_path):
    with pytest.raises(BaselineError, match=r"nope.toml: baseline file not found"):
        load(tmp_path / "nope.toml")


def test_check_needs_every_attempt_to_miss():
    c = Check("decode[8K-c1]", "total_tok_s", 100.0, 0.05, (90.0,))
    assert c.verdict == "" and not c.regressed  # a check made by hand is not judged
    assert c.limit == pytest.approx(95.0) and attempt_misses(c, 0)
    assert judged(c).regressed
    c = Check("decode[8K-c1]", "total_tok_s", 100.0, 0.05, (90.0, 99.0))
    # the re-measurement passed: not a regression; the attempts disagree: unknown
    assert judged(c).verdict == "unknown"
    ceiling = Check("decode[8K-c1]", "ttft_ms", 100.0, 0.05, (110.0, 112.0))
    assert judged(ceiling).regressed and ceiling.change == pytest.approx(-0.11)


def test_message_shape():
    c = Check("decode[32K-c8]", "total_tok_s", 903.6, 0.05, (812.4,))
    assert c.message() == (
        "decode[32K-c8] total tok/s 812.4 < floor 858.4 (baseline 903.6 − 5%): −10.1%"
    )


def test_dump_then_load_round_trip(tmp_path):
    records = [
        CellRecord(CellId.parse("prefill[1K]"), Status.VALID, 1024, prompt_tok_s=5e4, ttft_ms=20.5),
        CellRecord(
            CellId.parse("decode[1K-c4]"),
            Status.VALID,
            1024,
            total_tok_s=1000.04,
            per_request_tok_s=250.0,
            ttft_ms=5.0,
            tbt_ms=4.0,
        ),
        CellRecord(CellId.parse("decode[4K-c64]"), Status.OVER_CAPACITY),
    ]
    path = tmp_path / "b.toml"
    assert dump(path, {"model": "tiny", "max_output": 128, "note": 'say "hi"'}, records) == 2
    b = load(path)
    assert set(b.cells) == {"prefill[1K]", "decode[1K-c4]"}
    assert b.cells["decode[1K-c4]"].limits == {"total_tok_s": 1000.0, "per_request_tok_s": 250.0}
    assert mismatches(b, {"model": "tiny", "max_output": 256}) == [
        "max_output 128 in the baseline, 256 now"
    ]
    # a file of an earlier version has no tools nor prompt_text: not compared
    assert mismatches(b, {"model": "tiny", "tools": True, "prompt_text": "mine.txt"}) == []
    dump(path, {"model": "tiny", "tools": False}, records)
    assert mismatches(load(path), {"model": "tiny", "tools": True}) == [
        "tools off in the baseline, on now"
    ]


def test_intervals_are_written_rounded_outwards_and_read_back(tmp_path):
    rec = CellRecord(
        CellId.parse("decode[1K-c4]"),
        Status.VALID,
        1024,
        total_tok_s=1000.04,
        total_tok_s_ci=(995.06, 1004.91),
        per_request_tok_s=250.0,
        ttft_ms=5.0,
        ttft_ms_ci=(4.5, 5.52),
    )
    path = tmp_path / "b.toml"
    dump(path, {"model": "tiny"}, [rec])
    text = path.read_text()
    assert "total_tok_s_ci = [995.0, 1005.0]" in text  # never narrower than measured
    assert "# ttft_ms_ci = [4.5, 5.6]" in text  # commented out with its figure
    cell = load(path).cells["decode[1K-c4]"]
    assert cell.intervals == {"total_tok_s": (995.0, 1005.0)}
    # an interval whose figure was removed by hand is ignored with it
    path.write_text(text.replace("total_tok_s = 1000.0\n", ""))
    assert load(path).cells["decode[1K-c4]"].intervals == {}
