"""The results model: the cell-id codec, and one clear error for every file it cannot read."""

import json
import math

import pytest

from pytest_llmspeed.results import CellId, Phase, ResultsError, Status, load


@pytest.mark.parametrize(
    ("text", "phase", "context", "concurrency"),
    [
        ("decode[32K-c8]", Phase.DECODE, 32768, 8),
        ("prefill[max]", Phase.PREFILL, "max", None),
        ("prefill[1500]", Phase.PREFILL, 1500, None),
        ("decode[max-c128]", Phase.DECODE, "max", 128),
    ],
)
def test_cell_id_parses_and_formats_back(text, phase, context, concurrency):
    cid = CellId.parse(text)
    assert (cid.phase, cid.context, cid.concurrency) == (phase, context, concurrency)
    assert str(cid) == text


@pytest.mark.parametrize("bad", ["decode[32K]", "prefill[8K-c1]", "decode[8K-c0]", "x[8K]", ""])
def test_cell_id_rejects(bad):
    with pytest.raises(ValueError, match="cell ids look like prefill"):
        CellId.parse(bad)


def test_a_decode_id_needs_a_concurrency():
    with pytest.raises(ValueError):
        CellId(Phase.DECODE, 8192)


def test_status_words_are_the_v1_words():
    assert [s.value for s in Status] == [
        "valid",
        "over capacity",
        "exceeds max_model_len",
        "failed",
        "error",
        "skipped",
    ]
    assert {s for s in Status if s.measured} == {Status.VALID, Status.FAILED}


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, r"r\.json: no such results file"),
        ("{not json", r"r\.json: not a pytest-llmspeed results file \(not JSON"),
        ('{"cells": []}', r"r\.json: not a pytest-llmspeed results file \(no 'schema' key"),
        ('{"schema": "other/v1"}', r"schema 'other/v1', expected 'pytest-llmspeed/results/v1'"),
        (
            '{"schema": "pytest-llmspeed/results/v2", "run": {}, "cells": []}',
            r"r\.json: results schema v2 is newer than this pytest-llmspeed reads \(v1\): upgrade",
        ),
        (
            '{"schema": "pytest-llmspeed/results/v1", "run": {}, "cells": [{"id": "x"}]}',
            r"r\.json: a malformed results file \(ValueError: unknown cell id 'x'",
        ),
        (
            '{"schema": "pytest-llmspeed/results/v1", "run": {}, '
            '"cells": [{"id": "prefill[1K]", "status": "great"}]}',
            r"a malformed results file \(ValueError: 'great' is not a valid Status",
        ),
    ],
)
def test_files_it_cannot_read_give_one_clear_error(tmp_path, content, message):
    path = tmp_path / "r.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(ResultsError, match=message):
        load(path)


def test_unknown_keys_are_kept_and_written_back(tmp_path):
    doc = {
        "schema": "pytest-llmspeed/results/v1",
        "run": {"tool": "pytest-llmspeed 0.2.0", "started": "x", "endpoint": "e", "new": 1},
        "cells": [
            {
                "id": "decode[8K-c64]",
                "phase": "decode",
                "context": "8K",
                "concurrency": 64,
                "status": "over capacity",
                "reason": "Over capacity: …",
                "future_field": [1, 2],
            }
        ],
    }
    path = tmp_path / "r.json"
    path.write_text(json.dumps(doc))
    results = load(path)
    assert results.cells[0].extra == {"future_field": [1, 2]}
    assert results.cells[0].status is Status.OVER_CAPACITY
    again = results.to_document()
    assert again["cells"] == doc["cells"]
    assert again["run"]["new"] == 1


def test_the_constants_json_is_not_are_read_with_their_sign(tmp_path):
    # the writer never emits them; a file edited by hand or by another tool may
    path = tmp_path / "r.json"
    path.write_text(
        '{"schema": "pytest-llmspeed/results/v1", "run": {}, "cells": [{"id": "prefill[1K]", '
        '"status": "valid", "low": -Infinity, "high": Infinity, "none": NaN}]}'
    )
    extra = load(path).cells[0].extra
    assert extra["low"] == -math.inf
    assert extra["high"] == math.inf
    assert math.isnan(extra["none"])
