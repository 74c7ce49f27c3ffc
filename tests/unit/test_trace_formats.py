"""The trace files --llm-trace reads (docs/workloads.md, "Trace files"): Mooncake JSONL, the
Azure LLM inference traces, BurstGPT and a generic CSV, told apart by their content; rows of
0 tokens left out and said; a file past the bounds replayed in part and said."""

from __future__ import annotations

import json
import subprocess

import pytest

from pytest_llmspeed.core import openloop
from pytest_llmspeed.core.openloop import (
    TraceError,
    fitting,
    parse_trace,
    read_trace,
    trace_name,
    trace_schedule,
)

# rows as the public files have them (Azure/AzurePublicDataset 2023 code and 2024 week-long
# files, HPMLL/BurstGPT)
AZURE_2023 = """TIMESTAMP,ContextTokens,GeneratedTokens
2023-11-16 18:15:46.6805900,374,44
2023-11-16 18:15:50.9951690,396,109
2023-11-16 18:15:51.2079270,879,0
2023-11-16 18:15:52.4311700,2185,31
"""
AZURE_2024 = """TIMESTAMP,ContextTokens,GeneratedTokens
2024-05-10 00:00:00.009930+00:00,2162,5
2024-05-10 00:00:00.53+00:00,1059,23
2024-05-10 00:00:01+00:00,4496,7
"""
BURSTGPT = """Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type
5,ChatGPT,472,18,490,Conversation log
45,ChatGPT,1087,0,1087,Conversation log
118,GPT-4,417,30,447,API log
120.5,ChatGPT,1360,220,1580,Conversation log
"""


def _write(tmp_path, name: str, text: str, encoding: str = "utf-8"):
    path = tmp_path / name
    path.write_bytes(text.encode(encoding))
    return path


def _rows(trace):
    return [(r.line, round(r.timestamp_ms, 4), r.input_length, r.output_length)
            for r in trace.requests]  # fmt: skip


def test_an_azure_trace_reads_its_date_times_as_ms_from_the_first_row(tmp_path):
    trace = read_trace(_write(tmp_path, "AzureLLMInferenceTrace_code.csv", AZURE_2023))
    assert trace.name == "AzureLLMInferenceTrace_code"
    # 7 fractional digits kept: 50.9951690 − 46.6805900 s = 4,314.579 ms
    assert _rows(trace) == [(2, 0.0, 374, 44), (3, 4314.579, 396, 109), (5, 5750.58, 2185, 31)]
    assert all(r.hash_ids == () for r in trace.requests)  # no shared blocks: distinct prompts
    assert trace.notes == (
        "trace AzureLLMInferenceTrace_code: 1 of 4 requests left out, with 0 input or 0 output "
        "tokens: nothing to replay (the first: line 4: GeneratedTokens 0)",
    )
    assert trace_schedule(trace) == pytest.approx((0.0, 4.314579, 5.75058))


def test_an_azure_2024_trace_with_a_zone_and_fewer_digits(tmp_path):
    trace = read_trace(_write(tmp_path, "week.csv", AZURE_2024))
    assert _rows(trace) == [(2, 0.0, 2162, 5), (3, 520.07, 1059, 23), (4, 990.07, 4496, 7)]
    assert trace.notes == ()
    # a zone is honoured; a row without one is UTC
    text = "TIMESTAMP,ContextTokens,GeneratedTokens\n2024-05-10T02:00:00+02:00,5,5\n"
    text += "2024-05-10 00:00:01.5,5,5\n2024-05-10 00:00:02Z,5,5\n"
    assert [r.timestamp_ms for r in parse_trace(text.splitlines(), "z.csv").requests] == [
        0.0, 1500.0, 2000.0,
    ]  # fmt: skip


def test_a_burstgpt_trace_leaves_out_its_failed_rows_and_says_how_many(tmp_path):
    trace = read_trace(_write(tmp_path, "BurstGPT_1.csv", BURSTGPT))
    assert trace.name == "BurstGPT_1"
    assert _rows(trace) == [(2, 5000.0, 472, 18), (4, 118000.0, 417, 30),
                            (5, 120500.0, 1360, 220)]  # fmt: skip
    assert trace.notes == (
        "trace BurstGPT_1: 1 of 4 requests left out, with 0 input or 0 output tokens: nothing "
        "to replay (the first: line 3: Response tokens 0)",
    )
    assert trace.span_s == pytest.approx(115.5)


def test_a_generic_csv_in_seconds_or_ms_by_its_column_name(tmp_path):
    # no unit in the name: seconds, and a note says so
    plain = read_trace(_write(tmp_path, "mine.csv", "time,input_tokens,output_tokens\n0,10,2\n"
                              "1.25,20,3\n"))  # fmt: skip
    assert _rows(plain) == [(2, 0.0, 10, 2), (3, 1250.0, 20, 3)]
    assert plain.notes == (
        "trace mine: times read as seconds ('time' names no unit; time_ms would be read as ms)",
    )
    ms = parse_trace(["timestamp_ms,prompt_tokens,completion_tokens", "0,10,2", "1250,20,3"], "a")
    assert _rows(ms) == [(2, 0.0, 10, 2), (3, 1250.0, 20, 3)] and ms.notes == ()
    secs = parse_trace(["arrival_time_s,input_length,output_length", "2.5,10,2"], "a")
    assert _rows(secs) == [(2, 2500.0, 10, 2)] and secs.notes == ()
    # a time column of no unit may hold date-times; extra columns and their order do not matter
    dates = parse_trace(
        ["id,completion_tokens,arrival_time,prompt_tokens", "a,2,2025-01-02 03:04:05.25,10",
         "b,3,2025-01-02 03:04:06,20"], "a",
    )  # fmt: skip
    assert _rows(dates) == [(2, 0.0, 10, 2), (3, 750.0, 20, 3)] and dates.notes == ()
    # whole numbers written as floats (a data frame's export) are read
    assert _rows(parse_trace(["time_ms,input_length,output_length", "0,10.0,2.0"], "a")) == [
        (2, 0.0, 10, 2)
    ]


@pytest.mark.parametrize(
    "header",
    [
        "timestamp,contexttokens,generatedtokens",
        ' "Timestamp" , Context Tokens , GENERATED_TOKENS',
        "TIMESTAMP\tContextTokens\tGeneratedTokens",
    ],
)
def test_headers_are_matched_whatever_their_case_spaces_and_underscores(header):
    sep = "\t" if "\t" in header else ","
    trace = parse_trace([header, sep.join(["2023-11-16 18:15:46.6805900", "374", "44"])], "x")
    assert _rows(trace) == [(2, 0.0, 374, 44)]
    burst = parse_trace(["TIMESTAMP,MODEL,REQUEST_TOKENS,response tokens", "3,m,5,6"], "x")
    assert _rows(burst) == [(2, 3000.0, 5, 6)] and burst.notes == ()
    # BurstGPT_3's columns: a session and an elapsed time besides (not the arrival time)
    head = "Timestamp,Session ID,Elapsed time,Model,Request tokens,Response tokens,Total tokens,"
    third = parse_trace([head + "Log Type", "7.5,a1,3.2,ChatGPT,5,6,11,Conversation log"], "x")
    assert _rows(third) == [(2, 7500.0, 5, 6)]


def test_a_header_matching_no_format_says_what_it_found_and_what_it_needs(tmp_path):
    path = _write(tmp_path, "odd.csv", "\nwhen,tokens_in,tokens_out\n1,2,3\n")
    with pytest.raises(TraceError) as info:
        read_trace(path)
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(
        f"{path}: line 2: a CSV header of no trace format known: found the columns 'when', "
        "'tokens_in', 'tokens_out'; a trace needs a time (timestamp, time, arrival_time; _ms "
        "or _s for the unit); the input tokens (input_length, input_tokens, prompt_tokens); "
        "the output tokens (output_length, output_tokens, completion_tokens) (or the Azure "
    )
    assert message.endswith("name its columns so (docs/workloads.md lists the names read)")
    # only what is missing is named
    with pytest.raises(TraceError, match=r"'prompt_tokens'; a trace needs the output tokens \("):
        parse_trace(["time,prompt_tokens", "1,2"], "x")
    with pytest.raises(TraceError, match="line 1: a JSON array: give one JSON object per line"):
        parse_trace(['[{"timestamp": 0}]'], "x")


@pytest.mark.parametrize(
    ("text", "words"),
    [
        (
            AZURE_2023 + "2023-11-16 18:15:53,12,x\n",
            "line 6: 'GeneratedTokens' must be a whole number of tokens ≥ 0, got 'x'",
        ),
        (
            AZURE_2023 + "2023-11-16 18:15:53,-3,4\n",
            "'ContextTokens' must be a whole number of tokens ≥ 0, got '-3'",
        ),
        (AZURE_2023 + "2023-11-16 18:15:53,3.5,4\n", "got '3.5'"),
        (
            AZURE_2023 + "2023-13-16 18:15:53,3,4\n",
            "line 6: 'TIMESTAMP' must be a date-time "
            "like 2023-11-16 18:15:46.6805900, got '2023-13-16 18:15:53'",
        ),
        (AZURE_2023 + "1700000000,3,4\n", "'TIMESTAMP' must be a date-time"),
        (
            AZURE_2023 + "2023-11-16 18:15:53,3\n",
            "line 6: 2 fields, where the header names "
            "'TIMESTAMP', 'ContextTokens' and 'GeneratedTokens' (up to field 3)",
        ),
        (
            BURSTGPT + "-1,ChatGPT,5,5,10,API log\n",
            "line 6: 'Timestamp' must be a number of seconds ≥ 0, got '-1'",
        ),
        (BURSTGPT + "soon,ChatGPT,5,5,10,API log\n", "got 'soon'"),
        (BURSTGPT + '121,"ChatGPT,5,5\n', "line 6: not a CSV row"),
        (
            "time_ms,input_length,output_length\n1,2,3\nnan,2,3\n",
            "line 3: 'time_ms' must be a number of ms ≥ 0, got 'nan'",
        ),
        (
            "time,input_length,output_length\n1,2,3\n2025-01-01 00:00:00,2,3\n",
            "line 3: 'time' must be a number of seconds",
        ),
    ],
)
def test_a_bad_row_is_one_line_naming_the_file_and_its_line(tmp_path, text, words):
    with pytest.raises(TraceError) as info:
        read_trace(_write(tmp_path, "t.csv", text))
    message = str(info.value)
    assert words in message, message
    assert message.startswith(f"{tmp_path / 't.csv'}: line ") and "\n" not in message
    assert message.endswith(": fix that line or drop it")


def test_a_trace_of_only_empty_rows_is_an_error():
    with pytest.raises(
        TraceError,
        match=r"no request in it: all its 1 rows have 0 input or 0 "
        r"output tokens \(the first: line 2: Response tokens 0\): give a trace",
    ):
        parse_trace(["Timestamp,Model,Request tokens,Response tokens", "1,m,5,0"], "x")
    with pytest.raises(TraceError, match="no request in it: give a JSONL or CSV file"):
        parse_trace(["TIMESTAMP,ContextTokens,GeneratedTokens", ""], "x")


def test_past_the_request_limit_the_first_rows_are_replayed_and_the_rest_said(
    tmp_path, monkeypatch
):
    monkeypatch.setattr(openloop, "TRACE_MAX_LINES", 3)
    rows = [f"{t},ChatGPT,{10 + t},{t % 4},0,API log" for t in range(10)]  # 0 and 4 empty
    path = _write(tmp_path, "BurstGPT_2.csv", BURSTGPT.splitlines()[0] + "\n" + "\n".join(rows))
    trace = read_trace(path)
    # t = 0 has 0 output tokens: the first 3 requests are t = 1, 2, 3 (lines 3 to 5)
    assert [r.input_length for r in trace.requests] == [11, 12, 13]
    assert trace.notes == (
        "trace BurstGPT_2: 1 of 4 requests left out, with 0 input or 0 output tokens: nothing "
        "to replay (the first: line 2: Response tokens 0)",
        f"trace BurstGPT_2: the first 3 requests replayed (to line 5), 6 more lines from line 6 "
        f"left out (a replay takes at most 3 requests): to replay another part, cut it to a "
        f"file of its own, e.g. (head -n 1 {path}; tail -n +6 {path} | head -n 3) > part.csv",
    )
    # the note's command cuts a trace of the next rows (t = 4, 0 tokens again, 5 and 6)
    cmd = trace.notes[1].split("e.g. ", 1)[1]
    subprocess.run(["bash", "-c", cmd], cwd=tmp_path, check=True)
    part = read_trace(tmp_path / "part.csv")
    assert [r.input_length for r in part.requests] == [15, 16] and part.name == "part"
    # JSONL alike (no header to keep), in memory too
    jsonl = [json.dumps({"timestamp": i, "input_length": 5, "output_length": 5}) for i in range(5)]
    trace = parse_trace(jsonl, "d.jsonl")
    assert len(trace.requests) == 3
    assert trace.notes[0].endswith(
        "2 more lines from line 4 left out (a replay takes at most 3 requests): to replay "
        "another part, cut it to a file of its own, e.g. tail -n +4 d.jsonl | head -n 3 > "
        "part.jsonl"
    )


def test_past_the_byte_bound_the_file_is_read_in_part_and_said(tmp_path, monkeypatch):
    monkeypatch.setattr(openloop, "TRACE_MAX_BYTES", 200)
    rows = "".join(f"{t},{100 + t},{t + 1}\n" for t in range(100))  # 11-12 bytes a row
    path = _write(tmp_path, "big.csv", "time_ms,input_length,output_length\n" + rows)
    assert path.stat().st_size > 200
    trace = read_trace(path)
    n = len(trace.requests)
    assert 10 < n < 20 and [r.input_length for r in trace.requests] == list(range(100, 100 + n))
    (note,) = trace.notes
    assert note.startswith(f"trace big: the first {n} requests replayed (to line {n + 1}), ")
    left = f"{100 - n} more lines from line {n + 2} left out (a trace is read up to 200 bytes)"
    assert left in note
    monkeypatch.setattr(openloop, "TRACE_COUNT_BYTES", 100)  # the rest counted up to a bound
    assert "more than 11 more lines" in read_trace(path).notes[0]


def test_jsonl_still_reads_and_a_byte_order_mark_is_no_content(tmp_path):
    line = {"timestamp": 20, "input_length": 600, "output_length": 4, "hash_ids": [1, 2]}
    path = _write(tmp_path, "day.jsonl", json.dumps(line) + "\n", encoding="utf-8-sig")
    trace = read_trace(path)
    assert trace.name == "day" and trace.requests[0].hash_ids == (1, 2) and trace.notes == ()
    azure = read_trace(_write(tmp_path, "az.csv", AZURE_2024, encoding="utf-8-sig"))
    assert len(azure.requests) == 3
    # a JSONL line of 0 tokens stays an error, as the Mooncake format has none
    with pytest.raises(TraceError, match="line 1: 'output_length' must be a whole number ≥ 1"):
        parse_trace(['{"timestamp": 0, "input_length": 5, "output_length": 0}'], "x")


def test_a_gzip_file_is_read_as_published_and_a_zip_is_refused(tmp_path, monkeypatch):
    import gzip
    import zipfile

    # Azure's 2025 multimodal trace ships as .csv.gz, with a column more
    text = "TIMESTAMP,NumImages,ContextTokens,GeneratedTokens\n2024-10-15T12:00:00.269Z,1,900,40\n"
    text += "2024-10-15T12:00:05.819Z,0,0,12\n2024-10-15T12:00:06.513Z,2,1500,20\n"
    path = tmp_path / "AzureLMMInferenceTrace_multimodal.csv.gz"
    path.write_bytes(gzip.compress(text.encode()))
    trace = read_trace(path)
    assert trace.name == "AzureLMMInferenceTrace_multimodal"
    assert _rows(trace) == [(2, 0.0, 900, 40), (4, 6244.0, 1500, 20)]
    assert "1 of 3 requests left out" in trace.notes[0]
    # past the limit, the note's command cuts the decompressed text
    monkeypatch.setattr(openloop, "TRACE_MAX_LINES", 1)
    note = read_trace(path).notes[-1]
    cmd = note.split("e.g. ", 1)[1]
    assert cmd.startswith(f"(zcat {path} | head -n 1; zcat {path} | tail -n +3 | head -n 1)")
    subprocess.run(["bash", "-c", cmd], cwd=tmp_path, check=True)
    assert (tmp_path / "part.csv").read_text() == "".join(text.splitlines(True)[i] for i in (0, 2))
    # a broken gzip and a zip archive are one line each
    path.write_bytes(gzip.compress(text.encode())[:30])
    with pytest.raises(TraceError, match=r"cannot be read \(.+\): give a readable file"):
        read_trace(path)
    archive = tmp_path / "BurstGPT_1.zip"
    with zipfile.ZipFile(archive, "w") as z:
        z.writestr("BurstGPT_1.csv", BURSTGPT)
    with pytest.raises(TraceError, match="a zip archive: unzip it and give the CSV or JSONL"):
        read_trace(archive)


def test_csv_names_and_notes_through_the_servers_context():
    assert trace_name("/data/AzureLLMInferenceTrace_conv.csv") == "AzureLLMInferenceTrace_conv"
    assert trace_name("BurstGPT_without_fails_1.CSV") == "BurstGPT_without_fails_1"
    trace = parse_trace(BURSTGPT.splitlines(), "b.csv")
    kept, note = fitting(trace, 1000)
    assert [r.input_length for r in kept.requests] == [472, 417]
    assert kept.notes == trace.notes and note is not None and "1 of 3 requests" in note


def test_hash_ids_that_do_not_cover_the_prompt_in_512_token_blocks_are_a_note(tmp_path):
    """One id a 512-token block (the Mooncake format's): a line with fewer ids than its
    prompt's blocks, or more (a trace made with smaller blocks), is named in the notes."""
    lines = [
        {"timestamp": 0, "input_length": 1100, "output_length": 4, "hash_ids": [1, 2, 3]},
        {"timestamp": 5, "input_length": 1100, "output_length": 4, "hash_ids": [1]},
        {"timestamp": 9, "input_length": 64, "output_length": 4, "hash_ids": [1, 2, 3, 4]},
        {"timestamp": 12, "input_length": 300, "output_length": 4},
    ]
    path = _write(tmp_path, "t.jsonl", "".join(json.dumps(r) + "\n" for r in lines))
    (note,) = read_trace(path).notes
    assert note.startswith("trace t: 1 request(s) with fewer hash_ids than their prompt's blocks")
    assert "(the first: line 2, 1 ids for 1,100 tokens, 3 blocks of 512)" in note
    assert "1 request(s) with more hash_ids than their prompt's blocks" in note
    assert "(the first: line 3, 4 ids for 64 tokens, 1 blocks of 512)" in note
    # ids that cover the prompt, or none at all: nothing to say
    good = _write(tmp_path, "g.jsonl", "".join(json.dumps(r) + "\n" for r in lines[::3]))
    assert read_trace(good).notes == ()
