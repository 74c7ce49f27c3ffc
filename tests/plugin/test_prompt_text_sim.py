"""--llm-prompt-text on the built-in simulator, as users run it (issue 33, "Real text")."""

import pytest

TINY = "sim:tiny?speed=4"


@pytest.mark.parametrize(
    ("name", "data", "words"),
    [
        ("p.txt", b"", "has no text: give a file with the prompts' text"),
        ("p.txt", b"\xff\xfe", "not UTF-8 text (byte 0)"),
        ("p.jsonl", b'{"prompt": "a"}\n{oops\n', "line 2 is not JSON"),
        ("p.jsonl", b'{"title": "a"}\n', "line 1 has no text"),
        ("missing.txt", None, "cannot be read (No such file or directory)"),
    ],
)
def test_a_file_that_is_no_prompt_text_is_one_line_before_any_cell(pytester, name, data, words):
    if data is not None:
        (pytester.path / name).write_bytes(data)
    result = pytester.runpytest(f"--llm-endpoint={TINY}", f"--llm-prompt-text={name}")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    err = result.stderr.str()
    assert f"ERROR: --llm-prompt-text={name!r}: {words}" in err, err
    assert "Traceback" not in err + result.stdout.str()


def _decode_cell(pytester, name: str) -> dict:
    import json

    doc = json.loads((pytester.path / f"{name}.json").read_text())
    (cell,) = [c for c in doc["cells"] if c["id"] == "decode[1K-c2]"]
    return {"cell": cell, "notes": doc["run"]["notes"]}


def test_the_simulators_acceptance_follows_the_users_text(pytester):
    """sim:tiny?accept=text: a text that repeats itself accepts more drafts than one that never
    does, through the plugin as users run it; every prompt exactly 1K tokens (a valid cell)."""
    import random

    rng = random.Random(3)
    words = ("".join(rng.choice("bcdfghjklmnpqrstvwxz") for _ in range(8)) for _ in range(3000))
    (pytester.path / "never.txt").write_text(" ".join(words))
    (pytester.path / "again.txt").write_text("the budget was agreed after a long talk. " * 300)
    rates = {}
    for name in ("again", "never"):
        result = pytester.runpytest(
            f"--llm-endpoint={TINY}&accept=text", f"--llm-prompt-text={name}.txt",
            "--llm-contexts=1K", "--llm-concurrency=2", "--llm-duration=1", "-m", "decode",
            "-p", "no:randomly", f"--llm-results={name}.json",
        )  # fmt: skip
        assert result.ret == 0, result.stdout.str()
        got = _decode_cell(pytester, name)
        assert got["cell"]["status"] == "valid"
        assert any(n.startswith(f"prompt text {name}.txt: ") for n in got["notes"])
        server = got["cell"]["server"]
        assert server["acceptance_rate"] == pytest.approx(
            server["spec_accepted_tokens"] / server["spec_draft_tokens"], rel=1e-12
        )
        rates[name] = server["acceptance_rate"]
    assert rates["again"] > 0.6 > 0.05 > rates["never"], rates


def test_trace_and_conversation_cells_are_made_of_the_text_and_still_hit_exactly(pytester):
    """--llm-prompt-text reaches every prompt: a trace's shared blocks and a conversation's
    messages are the user's text, and the simulator's prefix cache still hits exactly what
    the trace and the turns share (the blocks and the histories are exact token ids)."""
    import json

    rows = [
        {"timestamp": 0, "input_length": 1100, "output_length": 4, "hash_ids": [1, 2, 3]},
        {"timestamp": 300, "input_length": 1100, "output_length": 4, "hash_ids": [1, 2, 4]},
        {"timestamp": 600, "input_length": 300, "output_length": 4},
    ]
    (pytester.path / "day1.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (pytester.path / "mine.txt").write_text("the budget was agreed after a long talk. " * 50)
    result = pytester.runpytest(
        f"--llm-endpoint={TINY}", "--llm-prompt-text=mine.txt", "--llm-trace=day1.jsonl",
        "--llm-contexts=1K", "--llm-concurrency=2", "--llm-turns=2", "--llm-turn-tokens=64",
        "--llm-turn-output=16", "--llm-think-time=0", "-m", "trace or conversation",
        "-p", "no:randomly", "-p", "no:benchmark", "--llm-results=out.json",
    )  # fmt: skip
    assert result.ret == 0, result.stdout.str()
    doc = json.loads((pytester.path / "out.json").read_text())
    cells = {c["id"]: c for c in doc["cells"]}
    assert any(n.startswith("prompt text mine.txt: ") for n in doc["run"]["notes"])
    trace = cells["trace[day1]"]
    assert trace["status"] == "valid" and trace["open_completed"] == 3
    assert trace["server"]["prefix_cache_hit_rate"] == pytest.approx(1024 / 2500)
    conv = cells["conversation[1K-u2-t2]"]
    assert conv["status"] == "valid" and conv["conv_failed"] == 0
    assert conv["conv_hit_rate"] == pytest.approx(conv["conv_expected_hit_share"])
