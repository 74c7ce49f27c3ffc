"""The README's and docs' quoted benchmark figures against the suite's JSON results
(``benchmarks/quotes.py``, docs/benchmarks.md): a quote that differs from its file, or names a
figure or a result that does not exist, fails here."""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks import quotes
from benchmarks.common import RESULTS
from benchmarks.harness import FORMAT, SUITE, Figure


def test_every_quoted_figure_matches_its_result() -> None:
    problems = quotes.check()
    assert not problems, "\n".join(problems) + "\n(python -m benchmarks quote rewrites them)"


def test_the_readme_quotes_the_suite() -> None:
    """The README's performance section quotes the suite's figures through markers, and each
    names a benchmark of the suite."""
    readme = quotes.documents()[0]
    found = quotes.quotes(readme.read_text(encoding="utf-8"), readme)
    assert found
    assert {q.bench for q in found} <= set(SUITE)


def test_every_result_of_the_suite_is_a_valid_file() -> None:
    """Each kept benchmark has a JSON result that says what it was measured on, and each
    figure's quoted text is the one its value, unit and digits give."""
    for name in SUITE:
        doc = json.loads((RESULTS / f"{name}.json").read_text(encoding="utf-8"))
        assert doc["format"] == FORMAT and doc["benchmark"] == name
        assert len(doc["commit"]["sha"]) == 40 and isinstance(doc["commit"]["dirty"], bool)
        assert doc["machine"]["cores"] and doc["machine"]["python"]
        assert len(doc["load"]["before"]) == 3 and len(doc["load"]["after"]) == 3
        assert "aiohttp" in doc["versions"] and "pytest-llmspeed" in doc["versions"]
        assert doc["error"] is None, f"{name}: {doc['error']}"
        if doc["skipped"]:
            assert not doc["figures"]
            continue
        assert doc["figures"], name
        for key, f in doc["figures"].items():
            assert set(f) == {"value", "unit", "target", "met", "text"}, key
            assert f["met"] is None or f["target"], key


def _result(folder: Path, bench: str, figures: dict[str, Figure], dirty: bool = False) -> None:
    doc = {
        "format": FORMAT,
        "benchmark": bench,
        "commit": {"sha": "a" * 40, "short": "a" * 7, "dirty": dirty, "changed": []},
        "skipped": None,
        "figures": {k: f.to_json() for k, f in figures.items()},
    }
    (folder / f"{bench}.json").write_text(json.dumps(doc), encoding="utf-8")


def _mark(bench: str, figure: str, text: str) -> str:
    return f"<!-- bench {bench}.{figure} -->{text}<!-- /bench -->"


def test_a_stale_or_unknown_quote_is_reported_and_rewritten(tmp_path: Path) -> None:
    figure = Figure(87_475.8, "tok/s", digits=0)
    _result(tmp_path, "speed", {"total": figure})
    doc = tmp_path / "doc.md"
    right = _mark("speed", "total", figure.text)
    stale = _mark("speed", "total", Figure(80_000.0, "tok/s", digits=0).text)
    text = "\n".join(
        [
            f"fresh {right} at {_mark('speed', 'commit', 'a' * 7)}",
            f"stale {stale}",
            f"unknown figure {_mark('speed', 'nothing', '1')}",
            f"unknown result {_mark('nobody', 'total', '1')}",
        ]
    )
    example = f"```markdown\n{_mark('speed', 'total', 'an example')}\n```\n"
    text += "\n" + example
    doc.write_text(text, encoding="utf-8")
    problems = quotes.check([doc], tmp_path)
    assert [p.split(":")[1] for p in problems] == ["2", "3", "4"]
    assert "quotes '80,000 tok/s'" in problems[0] and "'87,476 tok/s'" in problems[0]
    assert "no figure 'nothing'" in problems[1]
    assert "no result file nobody.json" in problems[2]
    fixed = quotes.rewrite(text, tmp_path)
    doc.write_text(fixed, encoding="utf-8")
    assert fixed.count(right) == 2 and fixed.endswith(example)
    assert [p.split(":")[1] for p in quotes.check([doc], tmp_path)] == ["3", "4"]


def test_a_quoted_commit_says_the_tree_had_changes(tmp_path: Path) -> None:
    _result(tmp_path, "speed", {"total": Figure(1.0)}, dirty=True)
    assert quotes.expected("speed", "commit", tmp_path) == "a" * 7 + "+changes"


def test_a_figure_is_quoted_with_its_unit_and_digits() -> None:
    assert Figure(87_475.84, "tok/s", digits=1).text == "87,475.8 tok/s"
    assert Figure(1_234, "ns").text == "1,234 ns"
    assert Figure(-0.0142, "%", digits=3).text == "−0.014 %"
    assert Figure(0.012, "ms", digits=3, signed=True).text == "+0.012 ms"
    assert Figure(0.77, "×", digits=2).text == "0.77×"
    assert Figure("59 of 60").text == "59 of 60"
    assert Figure(None, "ms").text == "– ms"
