"""core/text.py: secrets by type, redaction before any cut, and the one gate from a server
string to a person (docs/trust.md); with the renderers that use it (the server line, the
Markdown summary, the page's title, the results kept)."""

import dataclasses
import pickle
import traceback

import pytest

from pytest_llmspeed.core.errors import redact_secrets, secret_values
from pytest_llmspeed.core.text import (
    REDACTED,
    SHOWN_CHARS,
    Secret,
    for_person,
    forget_all,
    markdown_inline,
    printable,
    redact_known,
    register,
    reveal,
    secret,
)

KEY = "sk-test-0123456789abcdef"
ESC = "\x1b"
HOSTILE = (
    f"{ESC}[2J{ESC}]0;owned{ESC}\\model\n::error title=x::boom\r\n# Heading\n| a | b |\n"
    "[click](javascript:alert(1)) <script>alert(1)</script> \u202eevil\u202c"
)


@pytest.fixture(autouse=True)
def no_known_secrets():
    forget_all()
    yield
    forget_all()


# -- Secret ----------------------------------------------------------------------------------


def test_a_secret_never_shows_its_value():
    s = Secret(KEY)
    assert repr(s) == str(s) == f"{s}" == f"{s:>30}" == "%s" % (s,) == REDACTED  # noqa: UP031
    assert KEY not in repr([s, {"k": s}, (s,)])
    assert s.reveal() == KEY and reveal(s) == KEY and reveal("plain") == "plain"


def test_a_secret_compares_hashes_and_pickles_as_its_value():
    s = Secret(KEY)
    assert s == Secret(KEY) and s != Secret("other") and s != KEY
    assert hash(s) == hash(Secret(KEY)) and len({s, Secret(KEY)}) == 1
    again = pickle.loads(pickle.dumps(s))
    assert isinstance(again, Secret) and again.reveal() == KEY and again == s
    assert bool(s) and not bool(Secret(""))


def test_secret_registers_and_empty_is_none():
    assert secret(None) is None and secret("") is None
    s = secret(KEY)
    assert isinstance(s, Secret) and secret(s) is s
    assert redact_known(f"echo {KEY}!") == f"echo {REDACTED}!"


def test_a_dataclass_and_a_traceback_with_locals_show_no_key():
    from pytest_llmspeed.core.bench import BenchConfig

    cfg = BenchConfig("http://127.0.0.1:1", KEY, None, "completions", 64, 1.0, 5.0, None)  # type: ignore[arg-type]
    assert isinstance(cfg.api_key, Secret) and cfg.api_key.reveal() == KEY
    assert KEY not in repr(cfg) and REDACTED in repr(cfg)
    try:
        api_key = cfg.api_key  # noqa: F841 (a local the traceback shows)
        raise RuntimeError("boom")
    except RuntimeError as exc:
        text = "".join(
            traceback.TracebackException.from_exception(exc, capture_locals=True).format()
        )
    assert "boom" in text and KEY not in text


def test_a_serve_command_keeps_its_words_out_of_its_repr(tmp_path):
    from pytest_llmspeed.core.launch import plan

    command = plan(f"python -m http.server {{port}} --api-key {KEY} HF_TOKEN=hf_abcdefgh")
    assert KEY in command.words
    assert KEY not in repr(command) and KEY not in command.shown
    # registered: a server that echoes the bare value shows it nowhere
    assert redact_known(f"INFO using key {KEY} and hf_abcdefgh") == (
        f"INFO using key {REDACTED} and {REDACTED}"
    )


# -- redaction -------------------------------------------------------------------------------


def test_secret_values_are_what_redact_secrets_removes():
    text = (
        "vllm serve m --api-key sk-one --hf-token='tok two' --password=\"p w\" "
        "OPENAI_API_KEY=sk-three Authorization: Bearer sk-four --port 8000"
    )
    assert secret_values(text) == ["sk-one", "tok two", "p w", "sk-four", "sk-three"]
    out = redact_secrets(text)
    assert all(v not in out for v in ("sk-one", "tok two", "sk-three", "sk-four"))
    assert "--port 8000" in out


def test_redaction_comes_before_any_cut():
    register(KEY)
    text = "x" * (SHOWN_CHARS - 5) + KEY + "y" * 50
    shown = for_person(text)
    assert len(shown) < len(text)
    # no run of the key's characters survives the cut
    assert all(KEY[:n] not in shown for n in range(6, len(KEY) + 1))
    assert KEY[-8:] not in shown


def test_the_longest_secret_is_removed_whole():
    register("abcd")
    register("abcdefgh")
    assert redact_known("key abcdefgh") == f"key {REDACTED}"
    register("ab")  # too short to redact as a substring: would eat ordinary words
    assert redact_known("about") == "about"


def test_redact_known_takes_secrets_not_registered():
    assert redact_known(f"a {KEY} b", Secret(KEY)) == f"a {REDACTED} b"
    assert redact_known(f"a {KEY} b", None) == f"a {KEY} b"


# -- for_person, printable -------------------------------------------------------------------


def test_for_person_removes_escape_sequences_and_line_breaks():
    shown = for_person(f"{ESC}[2J{ESC}[31mred{ESC}[0m\nnext\r\nline\u2028sep\x85\x07bell")
    assert ESC not in shown and "\x07" not in shown and "\x85" not in shown
    assert "\n" not in shown and "\r" not in shown and "\u2028" not in shown
    assert "red" in shown and "next" in shown and "⏎" in shown


def test_for_person_never_starts_a_workflow_command():
    for value in ("\n::error title=x::boom", "::error::x", "  ::set-output name=a::b"):
        shown = for_person(value)
        assert not shown.lstrip().startswith("::"), shown
        assert "\n" not in shown
        assert not any(line.lstrip().startswith("::") for line in shown.splitlines())


def test_for_person_drops_bidirectional_overrides_and_other_format_characters():
    shown = for_person("model\u202egnp.exe\u202c\u2066x\u2069\u200b")
    assert all(c not in shown for c in "\u202e\u202c\u2066\u2069\u200b")
    assert shown == "modelgnp.exex"
    assert for_person("Qwen/Qwen3.5-27B · ünïcode ✓") == "Qwen/Qwen3.5-27B · ünïcode ✓"


def test_for_person_caps_a_megabyte():
    shown = for_person("m" * 1_000_000)
    assert len(shown) < SHOWN_CHARS + 30
    assert shown.startswith("m" * (SHOWN_CHARS - 1) + "…") and "chars)" in shown
    assert for_person("x" * SHOWN_CHARS) == "x" * SHOWN_CHARS  # at the cap: unchanged
    assert len(for_person("x" * 50, 10)) < 40


def test_a_well_behaved_string_is_unchanged():
    for value in ("Qwen/Qwen3.5-27B-GPTQ-Int4", "vllm", "0.26.1", "llmspeed-sim", "tiny"):
        assert for_person(value) == value


def test_printable_keeps_the_plugins_lines_and_breaks_a_workflow_command():
    register(KEY)
    text = f"first line\n::error title=x::injected\n  ::warning::y\n{ESC}[2Jkey {KEY}\tend"
    out = printable(text)
    assert out.splitlines()[0] == "first line" and len(out.splitlines()) == 4
    assert not any(line.lstrip().startswith("::") for line in out.splitlines())
    assert ESC not in out and KEY not in out and "\t" not in out
    assert printable("decode[1K-c1] valid: 903.6 tok/s") == "decode[1K-c1] valid: 903.6 tok/s"


# -- markdown_inline -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "value",
    [
        "# Heading",
        "## x\n### y",
        "| a | b |\n| - | - |\n| 1 | 2 |",
        "[click](https://evil.example)",
        "![img](https://evil.example/x.png)",
        "[x](javascript:alert(1))",
        "<script>alert(1)</script>",
        "<img src=x onerror=alert(1)>",
        "<details open><summary>x</summary></details>",
        "**bold** _it_ `code` ~~s~~",
        HOSTILE,
    ],
)
def test_markdown_inline_adds_no_markup(value):
    out = markdown_inline(value)
    assert "\n" not in out and ESC not in out
    assert "<" not in out and ">" not in out  # entities: no raw HTML
    # every character that makes a heading, table, link, image, emphasis or code is escaped
    assert not _unescaped(out, "#[]()|*_`~!")


def _unescaped(text: str, chars: str) -> list[str]:
    """The characters of ``chars`` in ``text`` that no backslash escapes."""
    found, i = [], 0
    while i < len(text):
        if text[i] == "\\":
            i += 2
            continue
        if text[i] in chars:
            found.append(text[i])
        i += 1
    return found


def test_markdown_inline_of_a_megabyte_is_short():
    assert len(markdown_inline("[" * 1_000_000)) < 2 * SHOWN_CHARS + 40


# -- the renderers that use the gate ---------------------------------------------------------


def _info(model: str, version: str = "0.26.1", engine: str = "vllm"):
    from pytest_llmspeed.core.probe import ServerInfo

    return ServerInfo(
        "http://127.0.0.1:8000", model, [model], 8192, engine, version, 20_000, "/metrics", True
    )


def _server(info):
    from pytest_llmspeed.plugin.server import ServerUnderTest
    from pytest_llmspeed.plugin.settings import Settings

    server = ServerUnderTest(Settings(endpoint="http://127.0.0.1:8000", api_key=secret(KEY)))
    server.info = info
    return server


def test_the_server_line_takes_the_servers_strings_through_for_person():
    server = _server(_info(HOSTILE + KEY, version=f"0.1{ESC}[2J\n::error::v", engine="x" * 10**6))
    line = server.header()[0]
    assert line.startswith("llmspeed server: http://127.0.0.1:8000 · engine ")
    assert ESC not in line and "\n" not in line and KEY not in line
    assert not line.lstrip().startswith("::")  # one line: a "::" inside it starts nothing
    assert len(line) < 1_000  # three strings of at most 200 characters, and the plugin's words
    assert "model" in line and "max_model_len 8,192" in line


def test_a_well_behaved_server_line_is_unchanged():
    line = _server(_info("Qwen/Qwen3.5-27B")).header()[0]
    assert line == (
        "llmspeed server: http://127.0.0.1:8000 · engine vllm 0.26.1 · model Qwen/Qwen3.5-27B · "
        "max_model_len 8,192 · KV capacity 20,000 tokens (/metrics)"
    )


def test_the_markdown_title_escapes_the_servers_strings():
    from pytest_llmspeed.core.text import markdown_inline as md

    line = _server(_info("# x [a](javascript:alert(1)) <b>")).header(md)[0]
    model = line.split(" · model ", 1)[1].split(" · max_model_len", 1)[0]
    assert model == r"\# x \[a\]\(javascript:alert\(1\)\) &lt;b&gt;"


def test_the_summary_is_cut_below_a_mebibyte_and_says_so():
    from pytest_llmspeed.report.markdown import SUMMARY_LIMIT, capped

    text = "".join(f"> line {i} " + "x" * 100 + "\n" for i in range(20_000))
    assert len(text.encode()) > 2 * SUMMARY_LIMIT
    out = capped(text)
    assert len(out.encode()) <= SUMMARY_LIMIT
    assert out.endswith(
        "GitHub shows at most 1 MiB of a step's summary. The whole run is in "
        "the results file and the page.\n"
    )
    assert out.startswith("> line 0 ")
    assert capped(text, written=SUMMARY_LIMIT - 1000).encode().__len__() <= 1000
    assert capped("small\n") == "small\n"


def test_the_summary_notes_add_no_markup():
    from pytest_llmspeed.report.markdown import note_line, summary

    register(KEY)
    text = summary("t", [], [f"the server said: {HOSTILE} {KEY}", "built-in simulator at x"])
    assert KEY not in text and ESC not in text and "<script>" not in text
    notes = [line for line in text.splitlines() if line.startswith(">")]
    assert len(notes) == 2 and notes[1] == "> built-in simulator at x"
    assert not _unescaped(notes[0][2:], "#[]|*_`~") and "<" not in notes[0]
    assert note_line("re-measured 1 time(s), each after a 5 s pause") == (
        "re-measured 1 time(s), each after a 5 s pause"
    )


def test_the_page_title_and_server_line_go_through_for_person():
    from pytest_llmspeed.report.page import render_page
    from pytest_llmspeed.results import Results, RunInfo

    run = RunInfo(
        tool="pytest-llmspeed",
        started="2025-01-01T00:00:00+00:00",
        endpoint="http://127.0.0.1:8000",
        model=HOSTILE + "m" * 1_000_000,
        engine=f"vllm{ESC}[2J",
        engine_version="0.1\n::error::x",
    )
    html = render_page(Results(run, ())).html
    title = html.split("<title>", 1)[1].split("</title>", 1)[0]
    assert ESC not in html and "\n" not in title and len(title) < 600
    assert "<script>" not in html
    assert len(html) < 200_000  # a megabyte model id does not make a megabyte page


def test_a_kept_record_holds_no_key_nor_control_character(tmp_path):
    import json

    from pytest_llmspeed.plugin.store import CellStore
    from pytest_llmspeed.results import CellId, CellRecord, Flag, FlagKind, Status

    server = _server(_info(f"m{KEY}"))
    settings = dataclasses.replace(server.settings, results=str(tmp_path / "out.json"))
    server.settings = settings
    store = CellStore(settings, server)
    echoed = f"stream error: invalid key {KEY}{ESC}[2J\n::error::x"
    rec = CellRecord(
        CellId.decode("1K", 2),
        Status.FAILED,
        reason=f"2 of 4 requests failed: {echoed}",
        error_summary={echoed: 2, "stream error: invalid key <redacted>[2J ⏎ ::error::x": 1},
        notes=(echoed,),
        flags=(Flag(FlagKind.METRICS_UNPARSED, echoed),),  # a /metrics line quoted
    )
    kept = store.record(rec)
    store.note(f"a note quoting the server: {echoed}")
    text = (tmp_path / "out.json").read_text()
    assert KEY not in text and "\\u001b" not in text and ESC not in text
    assert kept.error_summary is not None and sum(kept.error_summary.values()) == 3
    doc = json.loads(text)
    assert doc["run"]["model"] == f"m{REDACTED}"
    for line in json.dumps(doc, indent=1, ensure_ascii=False).splitlines():
        assert not line.lstrip().startswith("::")
