"""Issue 29's "Done when", case by case: the plugin run as a user runs it against a server that
misbehaves in one way (``python -m pytest_llmspeed.sim.hostile --case NAME``, docs/simulator.md),
with every output asked for (terminal with ``--tb=long -l``, JUnit, results, page, Markdown job
summary).

Every run (:func:`conftest.check_common`): it ends within its bound (the timeouts plus 10 s),
its peak RSS stays under 200 MB, no INTERNALERROR, and no output holds the key (or 8 of its
characters in a row), an ESC byte or a line beginning ``::``. Then what its case must do
(``EXPECT``): a malformed stream is never a valid figure; a run that cannot go on exits
non-zero with one line naming the route and what was wrong; a value that makes no sense is
refused or taken as unknown with a note; a redirect is not followed.

Stream cases run twice: misbehaving from the first request (the run's first small request,
before any cell) and from the 4th (the first two, the dialect's request and prefill[1K]'s,
behave: every decode cell then has malformed streams in it).

``good`` is the positive control: a well-behaved server gives valid cells, and the searches
find the key, an ESC and a ``::`` line in what the injection cases really send.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from concurrent.futures import Future

import pytest

from pytest_llmspeed.sim.hostile import ANNOUNCED_S, CASES, INJECTED, MARKDOWN, encoded_key

from .conftest import CELLS, KEY, Outcome, Spec, check_common, json_strings, leaks, start_server

pytestmark = pytest.mark.slow

#: the dialect's request and prefill[1K]'s behave; decode[1K-c1]'s first does not (one good
#: request could fill a loaded machine's 1 s window alone and make the cell valid)
MID = ("--from-request", "3")

#: every run of the battery, by id
RUNS: dict[str, Spec] = {"good": Spec("good")}
#: stream shapes, and the words one of which the line saying what was wrong holds
SHAPES: dict[str, tuple[str, ...]] = {
    "tokens_string": ("completion_tokens",),
    "tokens_float": ("completion_tokens",),
    "tokens_huge": ("completion_tokens",),
    "tokens_falling": ("completion_tokens",),
    "usage_list": ("usage",),
    "choices_object": ("choices",),
    "delta_string": ("delta",),
    "not_json": ("json",),
    "sse_long_line": ("mib", "long", "large", "line"),
    # beyond the list
    "json_bomb": ("json",),
    "count_digits": ("completion_tokens",),
    "tokens_10x": ("max_tokens",),
    "choices_empty": ("no choice",),
    "event_error": ("engine failure",),
    "no_finish": ("finish_reason",),
    "stream_html": ("text/html",),
    "after_finish": ("after its finish_reason",),
    "done_only": ("no output token",),
}
for _case in SHAPES:
    RUNS[f"{_case}-first"] = Spec(_case)
    RUNS[f"{_case}-mid"] = Spec(_case, MID)
RUNS["sse_long_line-first"] = Spec("sse_long_line", ("--size", str(50 << 20)))
RUNS["sse_long_line-mid"] = Spec("sse_long_line", ("--size", str(50 << 20), *MID))
RUNS |= {
    # beyond the list, misbehaving once a decode cell has begun
    "finish_esc": Spec("finish_esc", MID),
    "stop_at_once": Spec("stop_at_once", MID),
    "after_done": Spec("after_done", MID),
    # usage that does not count what was sent, refereed by the stream and the counter
    "usage_double": Spec("usage_double", MID),
    "usage_double_blind": Spec("usage_double_blind", MID),
    "usage_half": Spec("usage_half", MID),
    "usage_first": Spec("usage_first"),
    "close_after_headers": Spec("close_after_headers", MID),
    "stream_bad_chunk": Spec("stream_bad_chunk", MID),
    "stream_gzip_bomb": Spec("stream_gzip_bomb", MID),
    "retry_after": Spec("retry_after", MID),
    "key_json_escaped": Spec("key_json_escaped", ("--from-request", "2")),
    "key_encoded": Spec("key_encoded", ("--from-request", "2")),
    # time
    "ping_forever": Spec("ping_forever", ("--interval", "1")),
    "token_trickle": Spec("token_trickle", ("--interval", "1")),
    "done_keep_open": Spec("done_keep_open"),
    "models_trickle": Spec("models_trickle", ("--interval", "1")),
    "metrics_slow": Spec("metrics_slow", ("--delay", "25")),
    "metrics_slow_mid": Spec("metrics_slow_mid", ("--delay", "25")),
    "two_backends": Spec("two_backends"),
    "gauges_busy": Spec("gauges_busy"),
    # size
    "models_huge": Spec("models_huge", ("--size", str(100 << 20))),
    "metrics_huge": Spec("metrics_huge", ("--size", str(24 << 20))),
    "header_huge": Spec("header_huge"),
    "model_id_huge": Spec("model_id_huge"),
    # values
    "mml_huge": Spec("mml_huge", plugin_args=("--llm-contexts=1K,max",)),
    "mml_negative": Spec("mml_negative"),
    "mml_bool": Spec("mml_bool"),
    "models_data_int": Spec("models_data_int"),
    "kv_string_zero": Spec("kv_string_zero"),
    "gen_counter_nan": Spec("gen_counter_nan"),
    "gen_counter_inf": Spec("gen_counter_inf"),
    "gauges_negative": Spec("gauges_negative"),
    "counter_restart": Spec("counter_restart", ("--from-request", "2")),
    "counter_10x": Spec("counter_10x"),
    "metrics_garbage": Spec("metrics_garbage"),
    "metrics_label_newline": Spec("metrics_label_newline"),
    # secrets
    "key_in_stream_error": Spec("key_in_stream_error", ("--from-request", "2")),
    "key_in_error_body": Spec("key_in_error_body", ("--from-request", "2")),
    "key_across_cut-first": Spec("key_across_cut"),
    "key_across_cut-mid": Spec("key_across_cut", ("--from-request", "2")),
    "serve_fails": Spec("serve_fails", serve=True),
    "health_trickle": Spec("health_trickle", ("--interval", "2"), serve=True),
    # output injection
    "esc_in_model_id": Spec("esc_in_model_id"),
    "esc_in_version": Spec("esc_in_version"),
    "esc_in_error_body-first": Spec("esc_in_error_body"),
    "esc_in_error_body-mid": Spec("esc_in_error_body", ("--from-request", "2")),
    "esc_in_stream_error": Spec("esc_in_stream_error", ("--from-request", "2")),
    "markdown_in_model_id": Spec("markdown_in_model_id"),
    "html_error_page-first": Spec("html_error_page"),
    "html_error_page-mid": Spec("html_error_page", ("--from-request", "2")),
    # redirects
    "redirect_other_port": Spec("redirect_other_port"),
    "redirect_loop": Spec("redirect_loop"),
}

#: beyond the issue's list, run as they come (no server or plugin options); nul_in_stream and
#: bad_utf8 from the first request only: mid-stream the fast path does not look at a chunk's
#: text, which does not enter the figures (docs/trust.md)
RUNS |= {
    name: Spec(name)
    for name in (
        "nul_in_stream",
        "bad_utf8",
        "crlf",
        "cr_only",
        "data_no_space",
        "bom",
        "http10",
        "tokenize_huge",
        "tokenize_wrong",
        "key_in_model_id",
        "models_bad_chunk",
        "models_gzip_bomb",
        "models_length_short",
        "models_length_long",
        "models_html",
        "models_continue",
        "models_bomb",
        "headers_many",
        "header_nul",
        "metrics_bad_chunk",
        "metrics_timestamps",
        "metrics_many_series",
        "version_list",
        "version_bomb",
        "mml_string",
        "mml_2_63",
        "mml_digits",
        "blocks_zero",
        "bidi_in_model_id",
    )
}

Check = Callable[[Outcome], list[str]]


# -- what a case must do ---------------------------------------------------------------------


def valid_cells(out: Outcome, phase: str | None = None) -> list[str]:
    return [
        cid
        for cid, c in out.cells.items()
        if c.get("status") == "valid" and (phase is None or c.get("phase") == phase)
    ]


def stops_with(route: str, *what: str) -> Check:
    """The run cannot go on: it exits non-zero with one line naming the route and what was
    wrong."""

    def check(out: Outcome) -> list[str]:
        problems = []
        if out.exit == 0:
            problems.append("exit status 0: the run went on as if nothing was wrong")
        if out.line_with(route, any_of=what) is None:
            problems.append(f"no line names {route} and one of {what}")
        return problems

    return check


def named(route: str, *what: str) -> Check:
    """One line names the route and what was wrong (the run may go on)."""

    def check(out: Outcome) -> list[str]:
        if out.line_with(route, any_of=what) is None:
            return [f"no line names {route} and one of {what}"]
        return []

    return check


def malformed(first: bool, what: tuple[str, ...]) -> Check:
    """No figure from a malformed stream is valid: every stream misbehaves from the first (the
    run stops, or no cell is valid), or from the 3rd (no decode cell valid); and a line names
    the route and what was wrong."""

    def check(out: Outcome) -> list[str]:
        problems = []
        bad = valid_cells(out) if first else valid_cells(out, "decode")
        if bad:
            shown = {
                c: out.cells[c].get("total_tok_s") or out.cells[c].get("prompt_tok_s") for c in bad
            }
            problems.append(f"cells with malformed streams reported valid: {shown}")
        if first and out.exit == 0:
            problems.append("exit status 0 though every stream was malformed")
        if out.line_with("/v1/completions", any_of=what) is None:
            problems.append(f"no line names /v1/completions and one of {what}")
        return problems

    return check


def goes_on(out: Outcome) -> list[str]:
    """The run can go on without what the server got wrong: some cell is measured."""
    if not valid_cells(out):
        return [f"no valid cell (exit {out.exit}): the run did not go on without the value"]
    return []


def no_words(*words: str, unless: str = "") -> Check:
    """The terminal never says any of ``words`` (but as part of ``unless``: "not a lagging
    server" is the right thing to say)."""

    def check(out: Outcome) -> list[str]:
        text = out.terminal.lower()
        if unless:
            text = text.replace(unless.lower(), "")
        found = [w for w in words if w.lower() in text]
        return [f"the terminal says {found}"] if found else []

    return check


def all_of(*checks: Check) -> Check:
    def check(out: Outcome) -> list[str]:
        return [p for c in checks for p in c(out)]

    return check


def good(out: Outcome) -> list[str]:
    problems = []
    if out.exit != 0:
        problems.append(f"exit status {out.exit}")
    statuses = {cid: c.get("status") for cid, c in out.cells.items()}
    if sorted(statuses) != ["decode[1K-c1]", "decode[1K-c2]", "prefill[1K]"] or set(
        statuses.values()
    ) != {"valid"}:
        problems.append(f"cells {statuses}")
    for name in ("junit", "results", "page", "summary"):
        if not out.files.get(name):
            problems.append(f"no {name} output")
    if out.stats.get("misbehaved") != 0 or not out.stats.get("streams"):
        problems.append(f"server stats {out.stats}")
    return problems


def no_negative(*fields: str) -> Check:
    def check(out: Outcome) -> list[str]:
        problems = []
        for cid, c in out.cells.items():
            server = c.get("server")
            server = server if isinstance(server, dict) else {}
            for f in fields:
                v = c.get(f, server.get(f))
                if isinstance(v, int | float) and v < 0:
                    problems.append(f"{cid}: {f} {v} (negative, from the server's gauges)")
        return problems

    return check


def not_skipped(out: Outcome) -> list[str]:
    skipped = {
        cid: c.get("status")
        for cid, c in out.cells.items()
        if c.get("status") in ("over capacity", "exceeds max_model_len", "skipped")
    }
    return [f"cells not run for a value the server got wrong: {skipped}"] if skipped else []


def no_absurd_context(out: Outcome) -> list[str]:
    big = {cid: c.get("context_tokens") for cid, c in out.cells.items()}
    big = {k: v for k, v in big.items() if isinstance(v, int | float) and v > 2**31}
    return [f"cells of absurd contexts: {big}"] if big else []


def redirect(out: Outcome) -> list[str]:
    problems = stops_with("", "redirect", "307")(out)
    port = out.stats.get("redirect_port")
    if out.spec.case == "redirect_other_port":
        if out.stats.get("other_port"):
            problems.append(
                f"the redirect was followed: {out.stats['other_port']} requests went to port {port}"
            )
        if port and out.line_with(str(port), any_of=("redirect", "307")) is None:
            problems.append(f"no line names where the redirect pointed (port {port})")
    return problems


def markdown_escaped(out: Outcome) -> list[str]:
    problems = []
    summary = out.files.get("summary", "")
    for raw in ("<img", "<script", "](javascript:", "| a | b |"):
        if raw in summary:
            problems.append(f"the Markdown summary holds {raw!r} unescaped")
    page = out.files.get("page", "")
    for raw in ("<img src=x", "<script>alert(2)"):
        if raw in page:
            problems.append(f"the page holds {raw!r} unescaped")
    return problems


def bounded_strings(out: Outcome) -> list[str]:
    """A 1 MB model id is not copied whole into the outputs."""
    problems = []
    for name, text in [("terminal", out.terminal), *out.files.items()]:
        if "m" * 2000 in text:
            problems.append(f"{name} holds 2,000+ characters of the 1 MB model id")
    return problems


def all_valid(out: Outcome) -> list[str]:
    """A shape a well-behaved server may send: the run is as the good server's."""
    problems = [] if out.exit == 0 else [f"exit status {out.exit}"]
    statuses = {cid: c.get("status") for cid, c in out.cells.items()}
    if len(statuses) != CELLS or set(statuses.values()) != {"valid"}:
        problems.append(f"cells {statuses}")
    return problems


def no_text(out: Outcome, *texts: str) -> list[str]:
    """No output (decoded, for the results) holds any of ``texts``."""
    problems = []
    outputs = [("terminal", out.terminal), *out.files.items()]
    doc = out.results
    if doc is not None:
        outputs.append(("results (decoded)", "\n".join(json_strings(doc))))
    for name, text in outputs:
        found = [t for t in texts if t in text]
        if found:
            problems.append(f"{name} holds {found[0]!r}")
    return problems


def fails_requests(*what: str) -> Check:
    """Every decode cell's requests misbehave: none is valid, and a line says why."""

    def check(out: Outcome) -> list[str]:
        problems = []
        if valid_cells(out, "decode"):
            problems.append(f"decode cells reported valid: {valid_cells(out, 'decode')}")
        if out.line_with("", any_of=what) is None:
            problems.append(f"no line says one of {what}")
        return problems

    return check


EXPECT: dict[str, Check] = {
    "good": good,
    "nul_in_stream": malformed(True, ("json",)),
    "bad_utf8": malformed(True, ("json",)),
    "finish_esc": lambda o: [],
    # an early stop (flagged, by design), but a request with no token is restarted after a
    # back-off, and 4N+8 in a row stop the cell (restarted at once, 1,300 a second held a
    # record each)
    "stop_at_once": all_of(
        named("", "no output token"),
        lambda o: [] if o.stats.get("streams", 0) < 500 else [f"{o.stats['streams']} requests"],
    ),
    # nothing after [DONE] is counted: the figures are the server's counter's (the referee)
    "after_done": all_of(all_valid, no_words("not to be trusted")),
    # twice the tokens sent: the counter rose by fewer than were received before its read
    # (a token is generated before it is sent), whatever the window's length
    "usage_double": all_of(
        fails_requests("usage counts more tokens than it sent"),
        no_words("lagging", "lags", unless="not a lagging"),
    ),
    # twice, and no /metrics: the text re-count (core/recount.py) finds one token a chunk
    "usage_double_blind": fails_requests("counts more tokens than the stream carried"),
    # half: each chunk with text carries a token, so the usage is refused at the stream's end
    "usage_half": fails_requests("fewer than the"),
    # a usage-only first chunk: the TTFT waits for the first chunk with a token (its text
    # 0.3 s later), and a note says the usage came first
    "usage_first": all_of(
        all_valid,
        named("", "before the chunk that carried them"),
        lambda o: (
            []
            if (o.cells.get("prefill[1K]", {}).get("ttft_ms") or 0) >= ANNOUNCED_S * 1e3
            else [f"prefill TTFT {o.cells.get('prefill[1K]', {}).get('ttft_ms')} ms"]
        ),
    ),
    "close_after_headers": fails_requests("stream broken", "not completed"),
    "stream_bad_chunk": fails_requests("stream broken", "chunk", "finish_reason"),
    "stream_gzip_bomb": fails_requests("content-encoding"),
    "retry_after": fails_requests("429"),
    "crlf": all_valid,
    "cr_only": all_valid,
    "data_no_space": all_valid,
    "bom": all_valid,
    "http10": all_valid,
    "tokenize_huge": stops_with("/tokenize", "cap"),
    # token-id prompts: the server counts the ids sent, whatever /tokenize said
    "tokenize_wrong": all_valid,
    "key_in_model_id": goes_on,
    "models_bad_chunk": stops_with("/v1/models", "http"),
    "models_gzip_bomb": stops_with("/v1/models", "content-encoding"),
    "models_length_short": stops_with("/v1/models", "http", "json"),
    "models_length_long": stops_with("/v1/models", "within"),
    "models_html": stops_with("/v1/models", "json"),
    "models_continue": all_valid,
    "models_bomb": stops_with("/v1/models", "json"),
    "headers_many": stops_with("/v1/models", "header"),
    "header_nul": stops_with("/v1/models", "header"),
    # Chance: aiohttp 3.14's C parser (llhttp) does not end a read whose chunk size is not hex
    # when the head came in an earlier segment: the read then waits for the probe's timeout
    # (measured: 6 of 10 reads a parse error, 4 a 3 s timeout). Both notes name /metrics and
    # say why there are no server figures; the run goes on either way.
    "metrics_bad_chunk": all_of(goes_on, named("/metrics", "http", "did not answer within")),
    "metrics_timestamps": all_of(all_valid, no_words("did not parse")),
    # under the 16 MiB cap, 200,000 series: 358 MB and past the run's bound, parsed
    "metrics_many_series": all_of(goes_on, named("/metrics", "lines")),
    "version_list": goes_on,
    "version_bomb": goes_on,
    "mml_string": all_of(named("max_model_len", '"32768"'), goes_on, not_skipped),
    "mml_2_63": all_of(named("max_model_len", "9223372036854775808"), goes_on, not_skipped),
    "mml_digits": all_of(named("max_model_len", "infinity"), goes_on, not_skipped),
    "blocks_zero": all_of(named("", "num_gpu_blocks"), goes_on, not_skipped),
    "key_json_escaped": stops_with("", "500"),
    "key_encoded": all_of(stops_with("", "500"), lambda o: no_text(o, *encoded_key(KEY))),
    "bidi_in_model_id": all_of(
        stops_with("/v1/models", "format"), lambda o: no_text(o, "\u202e", "\u200b")
    ),
    "ping_forever": stops_with("/v1/completions", "token", "timeout", "within"),
    "token_trickle": stops_with("/v1/completions", "token", "timeout", "within"),
    # [DONE] ends a stream: the figures are right, the cells valid, the hold said once
    "done_keep_open": all_of(
        goes_on,
        named("", "open after their data: [DONE]"),
        lambda o: (
            []
            if len(valid_cells(o)) == 3
            else [f"not every cell valid: { {c: v.get('status') for c, v in o.cells.items()} }"]
        ),
    ),
    "models_trickle": stops_with("/v1/models", "timeout", "within", "answer", "time"),
    # a slow /metrics: no server figures, with a note; not "cannot reach"
    "metrics_slow": all_of(goes_on, no_words("cannot reach"), named("/metrics", "")),
    # the referee could not read the counter inside the cells: said, never silence
    "metrics_slow_mid": all_of(goes_on, named("/metrics", "not refereed")),
    # the second backend's model is named where the cells are (several backends, mixed)
    "two_backends": all_of(goes_on, named("hostile-backend-b", "several models")),
    "gauges_busy": named("", "busy"),
    "models_huge": stops_with("/v1/models", "mib", "large", "size"),
    "metrics_huge": named("/metrics", "mib", "large", "size"),
    "header_huge": stops_with("/v1/models", "header"),
    "model_id_huge": all_of(stops_with("/v1/models", "model"), bounded_strings),
    "mml_huge": all_of(named("max_model_len", "1e+30", "1e30", "10000000000"), no_absurd_context),
    "mml_negative": all_of(named("max_model_len", "-5", "−5"), goes_on, not_skipped),
    "mml_bool": all_of(named("max_model_len", "true"), goes_on, not_skipped),
    "models_data_int": stops_with("/v1/models", "data", "list", "openai"),
    "kv_string_zero": all_of(
        named("", "kv_cache_size_tokens", "kv capacity"), goes_on, not_skipped
    ),
    "gen_counter_nan": all_of(goes_on, named("", "generation_tokens", "nan")),
    "gen_counter_inf": all_of(goes_on, named("", "generation_tokens", "inf")),
    "gauges_negative": all_of(
        no_negative(
            "effective_concurrency",
            "max_waiting",
            "running_mean",
            "running_max",
            "waiting_mean",
            "waiting_max",
            "kv_usage_mean",
            "kv_usage_max",
        ),
        named("", "negative", "num_requests_running"),
    ),
    "counter_restart": all_of(
        no_negative("generation_tokens_delta", "generation_tokens"),
        named("counter", "restart", "backwards", "fell", "falls", "reset"),
    ),
    "counter_10x": all_of(
        no_words("lagging", "lags", unless="not a lagging"), named("counter", "trust")
    ),
    "metrics_garbage": named("/metrics", "parse"),
    "metrics_label_newline": named("/metrics", "parse"),
    "key_in_stream_error": lambda o: (
        [f"valid: {valid_cells(o, 'decode')}"] if valid_cells(o, "decode") else []
    ),
    "key_in_error_body": stops_with("", "500"),
    "key_across_cut": stops_with("", "500"),
    "serve_fails": stops_with("", "serve", "start", "exit"),
    # each poll of a /health that trickles fails at its 2 s (the whole poll, not a read): the
    # serve timeout stops the run (a poll read byte by byte held it 80 s, then took the 200)
    "health_trickle": stops_with("/health", "within"),
    "esc_in_model_id": stops_with("/v1/models", "model"),
    "esc_in_version": lambda o: [],
    "esc_in_error_body": lambda o: [],
    "esc_in_stream_error": lambda o: [],
    "markdown_in_model_id": markdown_escaped,
    "html_error_page": stops_with("", "502"),
    "redirect_other_port": redirect,
    "redirect_loop": redirect,
}


def expectation(run_id: str) -> Check:
    spec = RUNS[run_id]
    if spec.case in SHAPES:
        return malformed(
            not spec.server_args or "--from-request" not in spec.server_args, SHAPES[spec.case]
        )
    return EXPECT[spec.case]


def test_every_case_is_run() -> None:
    assert {s.case for s in RUNS.values()} == set(CASES)
    assert set(EXPECT) | set(SHAPES) == set(CASES)


@pytest.mark.parametrize("run_id", list(RUNS))
def test_hostile(run_id: str, battery: dict[str, Future[Outcome]]) -> None:
    out = battery[run_id].result()
    problems = check_common(out) + expectation(run_id)(out)
    assert not problems, "\n".join(["", *problems, "", out.describe()])


# -- positive controls: the searches find what the servers send -------------------------------


def test_searches_find_what_they_look_for() -> None:
    assert leaks("terminal", f"key {KEY} here")
    assert leaks("terminal", f"cut {KEY[:11]}")  # 11 of its characters
    assert not leaks("terminal", "key <redacted> here ::not at a line's start")
    assert leaks("terminal", "a\x1b[2Jb")
    assert leaks("junit", "a#x1B[2Jb")  # pytest writes an ESC so in XML
    assert leaks("page", "a&#27;[2Jb")
    assert leaks("results", '{"a": "x\\u001b[2J"}')  # decoded
    assert leaks("page", 'data = {"a": "x\\u001b[2J"}')  # the page's data, read by a script
    assert not leaks("terminal", "x\\u001b[2J")  # six characters of text, no ESC
    assert leaks("summary", "ok\n::error title=x::y")
    assert leaks("results", '{"a": "x\\n::error title=x::y"}')  # in a decoded string


@pytest.mark.parametrize(
    ("case", "args", "path", "body", "sent"),
    [
        ("esc_in_model_id", (), "/v1/models", None, INJECTED),
        ("esc_in_version", (), "/version", None, INJECTED),
        ("markdown_in_model_id", (), "/v1/models", None, MARKDOWN),
        ("key_in_error_body", (), "/v1/completions", b'{"prompt": "a b", "max_tokens": 2}', KEY),
        ("key_across_cut", (), "/v1/completions", b'{"prompt": "a b", "max_tokens": 2}', KEY),
        ("esc_in_error_body", (), "/v1/completions", b'{"prompt": "a", "max_tokens": 2}', INJECTED),
    ],
)
def test_servers_send_what_the_searches_find(case, args, path, body, sent) -> None:
    """What the injection and key cases send holds what the searches look for (decoded, as
    a person would read it), so that a clean output is the plugin's doing."""
    server = start_server(case, *args)
    try:
        status, _, raw = server.raw(path, body)
    finally:
        server.stop()
    assert status == (200 if path != "/v1/completions" else 500)
    decoded = "\n".join(json_strings(json.loads(raw)))
    assert sent in decoded
    if sent != MARKDOWN:
        assert leaks("terminal", decoded), decoded[:300]
    if (
        case == "key_across_cut"
    ):  # across the message's 200th and 500th characters, the body's 500th
        message = json.loads(raw)["error"]["message"]
        assert all(message[i : i + len(KEY)] == KEY for i in (195, 495))
        assert raw.decode()[495 : 495 + len(KEY)] == KEY


def test_the_error_page_holds_what_the_line_search_finds() -> None:
    """The gateway's error page begins lines that the search for server-made line starts
    finds, as sent: a clean output is the plugin's doing."""
    server = start_server("html_error_page")
    try:
        status, _, raw = server.raw("/v1/completions", b'{"prompt": "a", "max_tokens": 2}')
    finally:
        server.stop()
    assert status == 502
    page = raw.decode()
    assert any("a line the server began" in p for p in leaks("terminal", page)), page
    assert any("'::'" in p for p in leaks("terminal", page)), page


@pytest.mark.parametrize(
    ("case", "args", "check"),
    [
        ("models_huge", ("--size", str(8 << 20)), lambda s, h, b: len(b) == 8 << 20),
        ("metrics_huge", ("--size", str(8 << 20)), lambda s, h, b: len(b) >= 8 << 20),
        ("redirect_loop", (), lambda s, h, b: s == 307 and h["Location"].endswith("/v1/models")),
        ("models_data_int", (), lambda s, h, b: b == b'{"data": 5}'),
        ("mml_huge", (), lambda s, h, b: b'"max_model_len":1e+30' in b),
        ("kv_string_zero", (), lambda s, h, b: b'kv_cache_size_tokens="0"' in b),
    ],
)
def test_servers_misbehave(case, args, check) -> None:
    """Each such server really does what its case says (the failures are the plugin's)."""
    path = "/metrics" if "metrics" in case or "kv" in case else "/v1/models"
    server = start_server(case, *args)
    try:
        status, headers, body = server.raw(path)
    finally:
        server.stop()
    assert check(status, headers, body)


def test_header_huge_sends_a_1_mb_header() -> None:
    server = start_server("header_huge")
    try:
        head = server.raw_head("/version")
    finally:
        server.stop()
    assert head.startswith(b"HTTP/1.1 200") and len(head) > 1 << 20
