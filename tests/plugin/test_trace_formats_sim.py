"""The public trace formats through the plugin (docs/workloads.md, "Trace files"): an Azure LLM
inference trace and a BurstGPT trace replayed against the built-in simulator as users run
them; their rows of 0 tokens left out, said in the terminal and the results file."""

from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.slow  # each test here runs a trace cell on the simulator

TINY = "sim:tiny?speed=4"

# the published files' headers and rows, times squeezed to a fraction of a second
AZURE = """TIMESTAMP,ContextTokens,GeneratedTokens
2023-11-16 18:15:46.6805900,374,4
2023-11-16 18:15:46.7951690,396,6
2023-11-16 18:15:46.8079270,879,0
2023-11-16 18:15:46.9311700,215,3
2023-11-16 18:15:47.0102,108,5
"""
BURSTGPT = """Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type
0.0,ChatGPT,472,5,477,Conversation log
0.1,ChatGPT,1087,0,1087,Conversation log
0.15,GPT-4,417,3,420,API log
0.2,ChatGPT,0,0,0,Conversation log
0.3,ChatGPT,360,4,364,Conversation log
"""


@pytest.mark.parametrize(
    ("name", "text", "kept", "rows", "first"),
    [
        ("AzureLLMInferenceTrace_code", AZURE, 4, 5, "line 4: GeneratedTokens 0"),
        ("BurstGPT_1", BURSTGPT, 3, 5, "line 3: Response tokens 0"),
    ],
)
def test_a_public_csv_trace_is_replayed_without_its_empty_rows(
    pytester, name, text, kept, rows, first
):
    (pytester.path / f"{name}.csv").write_text(text)
    result = pytester.runpytest(
        f"--llm-endpoint={TINY}",
        f"--llm-trace={name}.csv",
        "--llm-results=out.json",
        "-m",
        "trace",
        "-v",
        "-p",
        "no:benchmark",
        "-p",
        "no:randomly",
    )
    result.assert_outcomes(passed=1)
    note = (
        f"trace {name}: {rows - kept} of {rows} requests left out, with 0 input or 0 output "
        f"tokens: nothing to replay (the first: {first})"
    )
    out = result.stdout.str()
    assert f"llmspeed::test_trace[{name}] PASSED" in out
    assert note in out, out
    cells = {c["id"]: c for c in json.loads((pytester.path / "out.json").read_text())["cells"]}
    cell = cells[f"trace[{name}]"]
    assert cell["status"] == "valid"
    assert cell["open_requests"] == kept and cell["open_completed"] == kept
    assert note in cell["notes"]
    assert cell["expected_hit_share"] == 0  # no hash ids: every prompt its own


def test_a_trace_cell_has_its_progress_lines_numbered_with_the_matrix(pytester):
    """A trace cell starts and ends with a line, as every cell does, counted with the matrix's
    cells and saying how long its arrivals last at --llm-trace-speed (0.4 s of BurstGPT rows
    at twice their speed: 0 s)."""
    (pytester.path / "BurstGPT_1.csv").write_text(BURSTGPT)
    result = pytester.runpytest(
        f"--llm-endpoint={TINY}",
        "--llm-trace=BurstGPT_1.csv",
        "--llm-trace-speed=2",
        "--llm-contexts=1K",
        "--llm-concurrency=1",
        "--llm-duration=1",
        "--llm-max-output=32",
        "-p",
        "no:randomly",
    )
    result.assert_outcomes(passed=3)
    result.stdout.fnmatch_lines(
        [
            "[[]1/3] prefill[[]1K] · cold prefill · *",
            "[[]2/3] decode[[]1K-c1] · window 1 s · *",
            "[[]3/3] trace[[]BurstGPT_1] · trace replayed at its times (0 s of arrivals) · *",
            "[[]3/3] trace[[]BurstGPT_1]: 3/3 requests · * req/s done (took * s)*",
        ]
    )
