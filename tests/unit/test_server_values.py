"""Counters and gauges that are not figures (issue 29, docs/trust.md "Values that make sense"):
NaN, infinite or negative values are taken as not exposed for the cell, with a note; a
counter that goes back inside a window, between polls too, is said; the summary says each
kind once with its cells."""

from __future__ import annotations

import dataclasses

import pytest

from pytest_llmspeed.core.probe import parse_metrics, snapshot
from pytest_llmspeed.core.server_figures import snapshot as server_snapshot
from pytest_llmspeed.core.server_figures import went_back, window_figures
from pytest_llmspeed.report.notes import (
    SERVER_BUSY,
    SERVER_VALUES,
    SERVER_WENT_BACK,
    cell_flags,
    note_lines,
)
from pytest_llmspeed.results import CellId, CellRecord, Flag, FlagKind, Status


def metrics(generation: str = "100", running: str = "2", waiting: str = "0") -> str:
    return (
        "# TYPE vllm:generation_tokens counter\n"
        f'vllm:generation_tokens_total{{engine="0"}} {generation}\n'
        "# TYPE vllm:num_requests_running gauge\n"
        f'vllm:num_requests_running{{engine="0"}} {running}\n'
        "# TYPE vllm:num_requests_waiting gauge\n"
        f'vllm:num_requests_waiting{{engine="0"}} {waiting}\n'
    )


@pytest.mark.parametrize("bad", ["NaN", "+Inf", "-Inf", "-3"])
def test_a_generation_counter_that_is_not_a_count_is_not_a_figure(bad):
    open_, close = server_snapshot(metrics("100"), 0.0), server_snapshot(metrics(bad), 1.0)
    got = window_figures(open_, close)  # no "cannot convert float NaN to integer"
    assert got.generation_tokens is None and "generation_tokens" in got.missing
    assert got.running_mean == 2.0
    # the referee's snapshot: unknown, not NaN
    assert snapshot(parse_metrics(metrics(bad))).generation_tokens is None


@pytest.mark.parametrize("bad", ["NaN", "-3", "+Inf"])
def test_a_gauge_that_is_not_a_count_is_unknown_never_a_negative_concurrency(bad):
    snap = snapshot(parse_metrics(metrics(running=bad, waiting=bad)))
    assert snap.running is None and snap.waiting is None
    reads = [server_snapshot(metrics(running=v), t) for t, v in ((0.0, "2"), (0.5, bad), (1, "2"))]
    got = window_figures(reads[0], reads[2], [reads[1]])
    assert got.running_mean is None and got.running_max is None
    assert "running_mean" in got.missing


def test_a_counter_that_falls_between_polls_is_a_reset_of_its_figures():
    # open 100, a poll at 50 (a restart, or a flapping counter), close 300: never a rise of 200
    reads = [server_snapshot(metrics(v), t) for t, v in ((0, "100"), (0.5, "50"), (1, "300"))]
    got = window_figures(reads[0], reads[2], [reads[1]])
    assert got.generation_tokens is None and "generation_tokens" in got.reset
    assert went_back(reads[0], [reads[1]], reads[2]) == (
        "vllm:generation_tokens_total fell from 100 to 50"
    )
    rising = [server_snapshot(metrics(v), t) for t, v in ((0, "100"), (0.5, "150"), (1, "300"))]
    assert window_figures(rising[0], rising[2], [rising[1]]).generation_tokens == 200
    assert went_back(rising[0], [rising[1]], rising[2]) is None


def record(**kw: object) -> CellRecord:
    fields: dict[str, object] = dict(
        id=CellId.decode(1024, 2), status=Status.VALID, total_tok_s=100.0
    )
    return CellRecord(**{**fields, **kw})  # type: ignore[arg-type]


def test_the_summary_says_each_server_value_kind_once_with_its_cells():
    busy = "server busy at the window's start: 2 running, 1 waiting after waiting 10.0 s"
    refused = (
        "server values that are not figures: vllm:generation_tokens_total is NaN (taken as not "
        "exposed in this cell)"
    )
    back = (
        "server figures not kept: vllm:generation_tokens_total fell from 100 to 50 (the server "
        "restarted, or its counters are not to be trusted)"
    )
    cell = record(
        flags=(
            Flag(FlagKind.SERVER_BUSY, "2 running, 1 waiting after waiting 10.0 s"),
            Flag(FlagKind.SERVER_VALUES_REFUSED, "vllm:generation_tokens_total is NaN"),
            Flag(FlagKind.SERVER_WENT_BACK, "vllm:generation_tokens_total fell from 100 to 50"),
        )
    )
    assert [f.text() for f in cell.flags] == [busy, refused, back]  # the words, as before
    lines = note_lines([cell])
    assert (
        f"  {SERVER_BUSY.heading}: {cell.id} (2 running, 1 waiting after waiting 10.0 s)" in lines
    )
    assert f"  {SERVER_VALUES.heading}: {cell.id} (vllm:generation_tokens_total is NaN)" in lines
    fell = "vllm:generation_tokens_total fell from 100 to 50"
    assert f"  {SERVER_WENT_BACK.heading}: {cell.id} ({fell})" in lines
    assert cell_flags(cell) == ["server busy", "server values refused", "server figures not kept"]


def test_dataclass_replace_keeps_a_snapshots_refusals():
    snap = server_snapshot(metrics("NaN"), 0.0)
    assert "generation_tokens" in dataclasses.replace(snap, t=1.0).refused
