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
