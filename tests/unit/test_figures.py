"""One list of figures (``figures.FIGURES``): every figure goes through the results file, the
JUnit properties and the baseline; and a figure added to the list appears in every output that
lists figures, with nothing else changed but the record's typed field."""

import dataclasses
from dataclasses import dataclass
from typing import Any

import pytest

from pytest_llmspeed import figures
from pytest_llmspeed.figures import Figure, Gate
from pytest_llmspeed.gate import baseline as baseline_file
from pytest_llmspeed.gate.verdict import verdict
from pytest_llmspeed.report.compare import headline
from pytest_llmspeed.report.page import render_page
from pytest_llmspeed.report.terminal import render
from pytest_llmspeed.results import (
    CellId,
    CellRecord,
    Outcome,
    Phase,
    Results,
    RunInfo,
    Samples,
    Status,
    loads,
)

RUN = RunInfo(
    "pytest-llmspeed", "2026-12-01T00:00:00+00:00", "sim:tiny", settings={"max_output": 128}
)
#: a cell's fields that are not figures: what it is, how it ended, its structure
STRUCTURE = {
    "id", "status", "context_tokens", "reason", "samples", "replica_tok_s", "gate", "attempts",
    "notes", "flags", "extra", "absent", "server",
}  # fmt: skip


def value_of(f: Figure, i: int):
    """A distinct value of the figure's type (a few decimals: the baseline rounds)."""
    return {
        float: 10.5 + i,
        int: 3 + i,
        str: f"word{i}",
        bool: True,
        dict: {"kind": i},
        tuple: (i, i + 1),
    }[f.kind]


def full_record(phase: Phase) -> CellRecord:
    """A valid cell of ``phase`` with every figure of its phase and every interval."""
    values = {}
    for i, f in enumerate(figures.of_phase(phase)):
        values[f.key] = value_of(f, i)
        if f.ci:
            values[f.ci_key] = (values[f.key] - 0.5, values[f.key] + 0.5)
    if phase is Phase.PREFILL:
        cid, samples = CellId.prefill(2048), Samples((1.0, 2.0))
    else:
        cid, samples = CellId.decode(2048, 4), Samples((1.0,), (2.0,), (3.0,))
    return CellRecord(cid, Status.VALID, 2048, samples=samples, **values)


def test_every_figure_is_a_typed_field_of_the_record_and_every_field_a_figure_or_structure():
    fields = {f.name for f in dataclasses.fields(CellRecord)}
    named = {f.key for f in figures.FIGURES} | {f.ci_key for f in figures.FIGURES if f.ci}
    assert named <= fields
    assert fields - named == STRUCTURE
    assert len(named) == len(figures.FIGURES) + len(figures.with_interval())  # no key twice


def test_the_lookups():
    assert [f.key for f in figures.floors()] == ["total_tok_s", "per_request_tok_s", "prompt_tok_s"]
    assert [f.key for f in figures.ceilings()] == [
        "ttft_ms", "tbt_ms", "sched_ttft_ms", "conv_ttft_ms",
    ]  # fmt: skip
    assert figures.headline(Phase.CONVERSATION).key == "conv_ttft_ms"
    assert figures.headline(Phase.DECODE).key == "total_tok_s"
    assert figures.headline(Phase.PREFILL).key == "prompt_tok_s"
    assert [f.key for f in figures.of_phase("prefill")] == [
        "prompt_tok_s", "ttft_ms", "completed", "max_tokens", "repeats",
    ]  # fmt: skip
    assert [f.key for f in figures.with_interval()] == [
        "total_tok_s", "per_request_tok_s", "ttft_ms", "tbt_ms", "prompt_tok_s",
        "sched_ttft_ms", "sched_e2e_ms", "open_tbt_ms",
    ]  # fmt: skip
    assert figures.headline(Phase.RATE).key == figures.headline(Phase.TRACE).key == "sched_ttft_ms"
    assert [f.key for f in figures.of_phase("rate")] == [f.key for f in figures.of_phase("trace")]
    assert not set(figures.of_phase("rate")) & set(figures.of_phase("decode"))
    assert figures.by_key("tbt_ms").digits == 3 and figures.by_key("tokens").junit == "tokens"
    with pytest.raises(KeyError, match="no figure 'tok_s'"):
        figures.by_key("tok_s")


@pytest.mark.parametrize("phase", [Phase.PREFILL, Phase.DECODE])
def test_every_figure_round_trips_through_the_file_junit_and_the_baseline(phase, tmp_path):
    record = full_record(phase)
    mine = figures.of_phase(phase)
    # the results file: written, read back equal, every figure and interval under its key
    doc = loads(Results(RUN, (record,)).dumps()).cells[0]
    assert doc == record
    written = record.to_v1()
    for f in mine:
        assert written[f.key] == figures.written(getattr(record, f.key)), f.key
        if f.ci:
            assert written[f.ci_key] == list(getattr(record, f.ci_key)), f.key
    # the JUnit properties: every scalar figure with a JUnit name, its interval as two
    props = dict(record.properties())
    for f in mine:
        if f.junit is None or f.kind in (dict, tuple):
            assert f.key not in props, f.key
            continue
        assert props[f.junit] == getattr(record, f.key), f.key
        if f.ci:
            low, high = getattr(record, f.ci_key)
            assert (props[f"{f.junit}_ci_low"], props[f"{f.junit}_ci_high"]) == (low, high)
    # the baseline: floors gated, ceilings commented out, each with its interval
    text, count = baseline_file.render({"model": "tiny"}, [record])
    path = tmp_path / "b.toml"
    path.write_text(text)
    entry = baseline_file.load(path).cells[str(record.id)]
    floors = [f for f in mine if f.gate is Gate.FLOOR]
    ceilings = [f for f in mine if f.gate is Gate.CEILING]
    assert count == 1 and floors and ceilings
    assert entry.limits == {f.key: round(getattr(record, f.key), f.digits) for f in floors}
    assert set(entry.ungated) == {f.key for f in ceilings}
    for f in floors:
        assert entry.figure_runs(f.key).intervals == (getattr(record, f.ci_key),)
    for f in ceilings:
        assert entry.ungated[f.key].values == (round(getattr(record, f.key), f.digits),)


# -- a figure added to the list ------------------------------------------------------------

MADE_UP = Figure("made_up_tok_s", "decode", "made-up tok/s", "tok/s", gate=Gate.FLOOR, ci=True)
MADE_UP_COUNT = Figure(
    "made_up_steps", "decode", "made-up steps", kind=int, optional=True, listed=True
)


@dataclass(frozen=True)
class Wider(CellRecord):
    """The record with the two made-up figures' typed fields (what adding them to
    ``CellRecord`` would give)."""

    made_up_tok_s: float | None = None
    made_up_tok_s_ci: tuple[float, float] | None = None
    made_up_steps: int | None = None


@pytest.fixture
def added(monkeypatch):
    base = full_record(Phase.DECODE)
    monkeypatch.setattr(figures, "FIGURES", (*figures.FIGURES, MADE_UP, MADE_UP_COUNT))
    return Wider(
        **{f.name: getattr(base, f.name) for f in dataclasses.fields(CellRecord)},
        made_up_tok_s=50.0,
        made_up_tok_s_ci=(49.0, 51.0),
        made_up_steps=7,
    )


def test_an_added_figure_is_written_read_and_a_junit_property(added):
    doc = added.to_v1()
    assert (doc["made_up_tok_s"], doc["made_up_tok_s_ci"], doc["made_up_steps"]) == (
        50.0,
        [49.0, 51.0],
        7,
    )
    assert Wider.from_v1(doc) == added
    props = added.properties()
    names = [k for k, _ in props]
    # after the figures always written, after the intervals, after those written when known
    assert names.index("made_up_tok_s") == names.index("stability_cv") + 1
    assert names.index("made_up_tok_s_ci_low") == names.index("tbt_ms_ci_high") + 1
    assert names[-1] == "made_up_steps"
    assert dict(props)["made_up_tok_s_ci_high"] == 51.0
    # a file that lacks it (written before it) keeps lacking it
    older = {k: v for k, v in doc.items() if k != "made_up_tok_s"}
    assert "made_up_tok_s" not in Wider.from_v1(older).to_v1()


def test_an_added_floor_is_written_to_the_baseline_and_gated(added, tmp_path):
    text, _ = baseline_file.render({"model": "tiny"}, [added])
    assert (
        "# Per cell: floors (total_tok_s, per_request_tok_s, prompt_tok_s, made_up_tok_s) and "
        "optional ceilings"
    ) in text
    assert "made_up_tok_s = 50.0\nmade_up_tok_s_ci = [49.0, 51.0]\n" in text
    assert "made_up_steps" not in text  # not gated
    path = tmp_path / "b.toml"
    path.write_text(text)
    entry = baseline_file.load(path).cells[str(added.id)]
    assert entry.limits["made_up_tok_s"] == 50.0
    slower = dataclasses.replace(added, made_up_tok_s=40.0, made_up_tok_s_ci=(39.9, 40.1))
    result = verdict(entry, [slower])
    assert result.outcome is Outcome.REGRESSION
    (check,) = result.regressions
    assert check.message().startswith(f"{added.id} made-up tok/s 40.0 ±0.3% < floor 47.5")


def test_the_headline_figure_compare_reads_is_the_lists():
    record = full_record(Phase.DECODE)
    assert headline(record) == ("total_tok_s", record.total_tok_s)


#: the decode cells' listed figures: the bandwidth bound's, reasoning and tool calls'
DECODE_LISTED = (
    "read_gb_s", "bandwidth_share", "itl_p99_ms", "itl_max_ms", "itl_stalls", "e2e_ms",
    "answer_ttft_ms", "reasoning_tokens", "answer_tokens",
    "reasoning_from", "tool_call_deltas",
)  # fmt: skip


NO_LISTED: dict[str, Any] = dict.fromkeys(DECODE_LISTED)


def test_a_listed_figure_is_in_the_terminal_with_v_and_on_the_page(added):
    # the list's own listed figures (the bandwidth bound, reasoning) are left out of these cells
    added = dataclasses.replace(added, **NO_LISTED)
    others = dataclasses.replace(added, id=CellId.decode(2048, 8), made_up_steps=None)
    cells = [added, others]
    lines = render(cells, 120, True, [])
    more = lines.index("More figures")
    assert lines[more + 1].split("\n") == [
        "Cell             made-up steps",
        "-------------  ---------------",
        "decode[2K-c4]                7",
    ]  # one row: the cell that has it; made_up_tok_s is not listed
    assert "More figures" not in render(cells, 120, False, [])
    html = render_page(Results(RUN, tuple(cells))).html
    assert '<h3 id="more-figures">More figures</h3>' in html
    assert "<tr><td>decode[2K-c4]</td><td>7</td></tr>" in html
    assert "<th>made-up steps</th>" in html and "<th>made-up tok/s</th>" not in html


def test_without_a_listed_figure_there_is_no_such_table():
    record = full_record(Phase.DECODE)
    listed = [f.key for f in figures.listed() if f.phase not in ("open", "conversation")]
    assert listed == list(DECODE_LISTED)
    record = dataclasses.replace(record, **NO_LISTED)
    assert "More figures" not in render([record], 120, True, [])
    assert "more-figures" not in render_page(Results(RUN, (record,))).html
