"""A cell's flags (``CellRecord.flags``): the notes that code reads, typed as (kind, detail),
made where the core finds them, written to the results file and read back; a file written
before them says them in its notes' words, which one function reads (``flags_of_notes``).
What a person sees is the same words as before."""

from __future__ import annotations

import json

from pytest_llmspeed.core.heartbeat import LoopLag
from pytest_llmspeed.core.records import decode_record
from pytest_llmspeed.report.markdown import summary
from pytest_llmspeed.report.notes import (
    CLIENT_BEHIND,
    METRICS_UNPARSED,
    SERVER_BUSY,
    SERVER_VALUES,
    SERVER_WENT_BACK,
    TOKENS_ESTIMATED,
    by_kind,
    cell_flags,
    cell_notes,
    note_lines,
    row_notes,
)
from pytest_llmspeed.report.page import _details
from pytest_llmspeed.results import (
    SCHEMA,
    CellRecord,
    Flag,
    FlagKind,
    flags_of_notes,
    loads,
)

from .test_counter_trust import decode

TOKENS = (
    "2 request(s) cut at the window's end estimated at 3.00 tokens per chunk (±1.0%, from 6 "
    "request(s) whose totals are exact)"
)
CLIENT = "up to 80 ms late, 1.6 s of 3.0 s more than 50 ms behind"
BUSY = "2 running, 1 waiting after waiting 10.0 s"
UNPARSED = 'line 2: "vllm:num_requests_running{a=\\"x"'
REFUSED = "vllm:generation_tokens_total is NaN"
BACK = "vllm:generation_tokens_total fell from 100 to 50"
#: the notes of such a cell as the versions before flags wrote them, in their order
OLD_NOTES = [
    f"tokens: {TOKENS}",
    f"client: event loop {CLIENT}",
    f"server busy at the window's start: {BUSY}",
    f"/metrics did not parse: {UNPARSED}",
    f"server values that are not figures: {REFUSED} (taken as not exposed in this cell)",
    f"server figures not kept: {BACK} (the server restarted, or its counters are not to be "
    "trusted)",
    "client processes: 2 asked, 1 used (one per stream at most)",
]


def new_cell() -> CellRecord:
    """A decode cell built the new way: the core's result with its flags, made a record."""
    result = decode(
        token_accounting="ratio",
        token_flag=Flag(FlagKind.TOKENS, TOKENS),
        client_lag=LoopLag(80.0, 1.6, 3.0),
        flags=(
            Flag(FlagKind.SERVER_BUSY, BUSY),
            Flag(FlagKind.METRICS_UNPARSED, UNPARSED),
            Flag(FlagKind.SERVER_VALUES_REFUSED, REFUSED),
            Flag(FlagKind.SERVER_WENT_BACK, BACK),
        ),
        notes=("client processes: 2 asked, 1 used (one per stream at most)",),
    )
    return decode_record(1024, result)


def old_cell() -> CellRecord:
    """The same cell as a results file before flags holds it: the flags in its notes' words."""
    doc = new_cell().to_v1()
    doc.pop("flags")
    doc["notes"] = list(OLD_NOTES)
    return CellRecord.from_v1(doc)


def test_the_core_makes_flags_in_the_order_the_notes_were_said():
    cell = new_cell()
    assert [f.kind for f in cell.flags] == [
        FlagKind.TOKENS,
        FlagKind.CLIENT_BEHIND,
        FlagKind.SERVER_BUSY,
        FlagKind.METRICS_UNPARSED,
        FlagKind.SERVER_VALUES_REFUSED,
        FlagKind.SERVER_WENT_BACK,
    ]
    assert cell.notes == ("client processes: 2 asked, 1 used (one per stream at most)",)
    # each flag in words is the note it replaced
    assert [f.text() for f in cell.flags] == OLD_NOTES[:-1]


def test_a_record_with_flags_is_written_and_read_back_as_it_was():
    cell = new_cell()
    written = cell.to_v1()
    assert written["flags"][:2] == [
        {"kind": "tokens", "detail": TOKENS},
        {"kind": "client_behind", "detail": CLIENT},
    ]
    assert written["notes"] == ["client processes: 2 asked, 1 used (one per stream at most)"]
    back = CellRecord.from_v1(json.loads(json.dumps(written)))
    assert back == cell
    assert back.to_v1() == written


def test_a_file_before_flags_gives_the_same_flags_and_is_written_back_as_it_was():
    doc = new_cell().to_v1()
    doc.pop("flags")
    doc["notes"] = list(OLD_NOTES)
    text = json.dumps({"schema": SCHEMA, "run": {}, "cells": [doc]})
    (old,) = loads(text).cells
    assert old.flags == new_cell().flags
    assert old.notes == ("client processes: 2 asked, 1 used (one per stream at most)",)
    assert old.to_v1() == doc  # no flags key added: the file's words, in their order


def test_only_notes_in_a_flags_words_are_flags():
    flags, rest = flags_of_notes(["client processes: 2 asked", "tokens: final usage, spread"])
    assert flags == (Flag(FlagKind.TOKENS, "final usage, spread"),)
    assert rest == ("client processes: 2 asked",)


def test_a_later_versions_kind_is_kept_and_shown_in_its_words():
    doc = new_cell().to_v1()
    doc["flags"] = [*doc["flags"], {"kind": "gpu_throttled", "detail": "at 83 °C"}]
    cell = CellRecord.from_v1(doc)
    assert cell.flags[-1] == Flag("gpu_throttled", "at 83 °C")
    assert cell.to_v1() == doc
    assert "gpu_throttled: at 83 °C" in row_notes(cell)  # shown in its words


def test_the_reports_say_the_same_words_for_a_cell_built_either_way():
    new, old = new_cell(), old_cell()
    assert cell_notes(new) == cell_notes(old)
    assert [(n.kind, n.detail) for n in cell_notes(new)] == [
        (CLIENT_BEHIND, CLIENT),
        (SERVER_BUSY, BUSY),
        (TOKENS_ESTIMATED, TOKENS),
        (METRICS_UNPARSED, UNPARSED),
        (SERVER_VALUES, REFUSED),
        (SERVER_WENT_BACK, BACK),
    ]
    assert note_lines([new]) == note_lines([old])
    assert note_lines([new])[0] == f"  {CLIENT_BEHIND.heading}: {new.id} ({CLIENT})"
    assert by_kind([new]) == by_kind([old])
    assert summary("t", [new], []) == summary("t", [old], [])
    # the page's row: the short forms, then the notes in words but the client's (its short
    # form says it in full), as the page composed them from the notes' text before flags
    before = [*cell_flags(old), *(n for n in OLD_NOTES if not n.startswith("client: event"))]
    assert row_notes(new) == row_notes(old) == before
    assert cell_flags(new)[:3] == [f"client behind: {CLIENT}", "server busy", "tokens estimated"]
    assert _details([new]) == _details([old])


def test_a_kind_given_as_its_word_is_that_kind():
    flag = Flag("server_busy", BUSY)
    assert flag.kind is FlagKind.SERVER_BUSY and flag == Flag(FlagKind.SERVER_BUSY, BUSY)
    assert flag.text() == f"server busy at the window's start: {BUSY}"
