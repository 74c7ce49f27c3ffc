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
