"""The --llm-requests file's bounds (core/request_log.py): rows past its cap are not written and
the run says after how many; a write that fails stops the file with one line naming the path."""

from __future__ import annotations

import json

from pytest_llmspeed.core.client import StreamRecord
from pytest_llmspeed.core.request_log import KEYS, RequestLog, cell_rows


def _record(t_send: float, times: list[float], error: str | None = None) -> StreamRecord:
    rec = StreamRecord(t_send=t_send, t_first=times[0] if times else None, error=error)
    rec.token_times, rec.token_counts = times, [1] * len(times)
    rec.finished = error is None
    rec.finish_reason = "length" if error is None else None
    return rec


def test_a_row_holds_every_key_and_the_gaps_between_arrivals():
    rows = cell_rows(
        "decode[1K-c2]",
        [_record(10.5, [10.6, 10.7, 10.7, 10.9]), _record(10.0, [], error="HTTP 500:\\nboom")],
        window=(10.2, 11.2),
    )
    assert [list(r) for r in rows] == [list(KEYS)] * 2
    first, second = rows  # in the order sent
    assert (first["request"], first["sent_s"], first["status"]) == (1, 0.0, "error")
    assert first["error"] == "HTTP 500:\\nboom" and first["output_tokens"] == 0
    assert second["window_open_s"] == 0.2 and second["sent_s"] == 0.5
    assert second["gaps_ms"] == [100.0, 200.0]  # the two chunks of one read: one arrival
    assert (second["ttft_ms"], second["e2e_ms"], second["output_tokens"]) == (100.0, 400.0, 4)


def test_past_its_cap_no_row_is_written_and_the_note_says_after_how_many(tmp_path):
    log = RequestLog(tmp_path / "r.jsonl", cap_bytes=1500)
    rows = cell_rows("decode[1K-c1]", [_record(float(i), [i + 0.1, i + 0.2]) for i in range(10)])
    log.cell(rows)
    log.close()
    written = (tmp_path / "r.jsonl").read_text().splitlines()
    assert 0 < len(written) == log.rows < 10
    assert all(json.loads(line)["attempt"] == 1 for line in written)
    assert log.note() == (
        f"--llm-requests: {tmp_path / 'r.jsonl'} capped at 0 MiB after {log.rows} rows: the later "
        "requests are not in it"
    )


def test_a_path_that_cannot_be_written_is_one_line(tmp_path):
    (tmp_path / "r.jsonl").mkdir()  # a folder where the file would be
    log = RequestLog(tmp_path / "r.jsonl")
    log.cell(cell_rows("decode[1K-c1]", [_record(0.0, [0.1])]))
    assert log.note() == (
        f"--llm-requests: not written past 0 rows: {tmp_path / 'r.jsonl'}: Is a directory"
    )
