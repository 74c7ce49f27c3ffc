"""The plugin against servers less vLLM-like than vLLM: the simulator's ``quirks`` make it refuse
vendor fields (422), send no usage in streams, have no /metrics, or refuse token-id prompts.
Each run degrades gracefully: the cells run, and the report says what was estimated."""

import json

import pytest

from tests.plugin.test_plugin_sim import TINY, run_matrix

pytestmark = pytest.mark.slow  # every test here runs a matrix on the simulator


def _doc(pytester):
    return json.loads((pytester.path / "out.json").read_text())


def test_server_that_refuses_vendor_fields(pytester):
    result = run_matrix(pytester, endpoint=f"{TINY}&quirks=no-vendor-fields")
    result.assert_outcomes(passed=6)
    note = "server rejected ignore_eos/min_tokens: outputs may end early (flagged per cell)"
    result.stdout.fnmatch_lines([f"note: {note}"])
    doc = _doc(pytester)
    assert note in doc["run"]["notes"]
    decode = [c for c in doc["cells"] if c["phase"] == "decode"]
    # the tiny profile ends outputs at random without ignore_eos: counted, not hidden
    assert all(c["output_tokens"] > 0 for c in decode)
    assert sum(c["early_stops"] for c in decode) > 0


def test_server_without_usage_in_streams_counts_exactly_where_it_can_and_says_how(pytester):
    result = run_matrix(pytester, endpoint=f"{TINY}&quirks=no-stream-usage&stream_interval=3")
    result.assert_outcomes(passed=6)
    result.stdout.fnmatch_lines(["note: tokens: the server sends no usage in streams: *"])
    decode = [c for c in _doc(pytester)["cells"] if c["phase"] == "decode"]
    # requests that finished count max_tokens exactly; those cut at the window's end take the
    # cell's tokens per chunk, and the cell says so. A window that happens to end while every
    # stream waits for its next first token cuts no request mid-stream: that cell is exact.
    says = {"ratio": "tokens per chunk", "max-tokens": "max_tokens at finish_reason length"}
    assert decode and all(c["tokens"] in says for c in decode)
    assert all(
        any(f["kind"] == "tokens" and says[c["tokens"]] in f["detail"] for f in c["flags"])
        for c in decode
    )
    assert any(c["tokens"] == "ratio" for c in decode)  # 4 cells: all exact is ~1e-4 likely
    assert all(c["total_tok_s"] > 0 and c["tbt_ms"] > 0 for c in decode)
    assert sum(c["early_stops"] for c in decode) == 0  # each one reached max_tokens


def test_a_cell_the_servers_counter_refutes_fails_with_both_figures(pytester):
    # no usage, 3 tokens per chunk, outputs longer than the window: no request finishes, no
    # tokenize route to count their text, one token per chunk is all the client can assume,
    # and the server's counter says 3x more
    result = run_matrix(
        pytester,
        "--llm-max-output=4096",
        "-m",
        "decode",
        endpoint=f"{TINY}&quirks=no-stream-usage,no-tokenize&stream_interval=3",
    )
    result.assert_outcomes(failed=4, deselected=2)
    result.stdout.fnmatch_lines(
        [
            "*decode[[]1K-c1[]]: the server's generation counter rose by * tokens over the window "
            "while *–* were received (+*%): likely chunks that carry several tokens, counted "
            "without usage*",
            "*ONE TOKEN PER CHUNK ASSUMED*",
        ]
    )
    cells = {c["id"]: c for c in _doc(pytester)["cells"]}
    assert cells["decode[1K-c1]"]["status"] == "failed"
    assert cells["decode[1K-c1]"]["tokens"] == "chunk-count"


def test_server_without_metrics_runs_every_cell(pytester):
    result = run_matrix(pytester, endpoint=f"{TINY}&quirks=no-metrics")
    result.assert_outcomes(passed=6)
    result.stdout.fnmatch_lines(
        ["note: KV capacity unknown: every cell ran (no over-capacity skips)"]
    )
    doc = _doc(pytester)
    assert doc["run"]["kv_capacity"] is None
    assert doc["run"]["kv_capacity_source"] == "unknown: every cell runs"


def test_server_without_metrics_still_skips_by_the_given_capacity(pytester):
    result = run_matrix(pytester, "--llm-kv-capacity=9000", endpoint=f"{TINY}&quirks=no-metrics")
    result.assert_outcomes(passed=5, skipped=1)
    assert _doc(pytester)["run"]["kv_capacity_source"] == "--llm-kv-capacity"


@pytest.mark.parametrize(("quirk", "status"), [("text-only", 400), ("text-only-500", 500)])
def test_server_that_refuses_token_ids_gets_text_prompts(pytester, quirk, status):
    """400 as vLLM would; 500 as llama-cpp-python's server answers its validation errors."""
    result = run_matrix(pytester, endpoint=f"{TINY}&quirks={quirk}")
    result.assert_outcomes(passed=6)
    note = (
        f"server rejected token-id prompts (HTTP {status}): prompts sent as text sized with its "
        "tokenizer"
    )
    result.stdout.fnmatch_lines(["llmspeed: api completions (text prompts)*", f"note: {note}"])
    doc = _doc(pytester)
    assert doc["run"]["prompt_form"] == "text" and note in doc["run"]["notes"]
    # exact lengths: the protocol checks usage.prompt_tokens == C and would fail the cell
    prefill = {c["id"]: c for c in doc["cells"] if c["phase"] == "prefill"}
    assert prefill["prefill[4K]"]["status"] == "valid"
    assert prefill["prefill[4K]"]["context_tokens"] == 4096


@pytest.mark.parametrize(
    ("quirks", "says"),
    [
        ("no-tokenize,text-only", "usage.prompt_tokens of small non-streamed requests"),
        ("tokenize-extras,text-only", "llama-cpp-python's /extras/tokenize"),
    ],
)
def test_server_without_vllms_tokenize_gets_exact_text_prompts(pytester, quirks, says):
    """No /tokenize (llama-cpp-python's server): text prompts sized by another route, said once;
    the protocol checks usage.prompt_tokens == C on every request, so valid cells are exact."""
    result = run_matrix(pytester, "--llm-prompt-form=text", endpoint=f"{TINY}&quirks={quirks}")
    result.assert_outcomes(passed=6)
    result.stdout.fnmatch_lines([f"note: prompts: text sized with {says}*"])
    assert result.stdout.str().count("prompts: text sized with") == 1
    doc = _doc(pytester)
    assert doc["run"]["prompt_form"] == "text"
    assert sum("prompts: text sized with" in n for n in doc["run"]["notes"]) == 1
    cells = {c["id"]: c for c in doc["cells"]}
    assert all(c["status"] == "valid" for c in cells.values())
    assert cells["prefill[4K]"]["context_tokens"] == 4096
    assert all(c["total_tok_s"] > 0 for c in cells.values() if c["phase"] == "decode")


def test_llama_cpp_pythons_differences_together(pytester):
    """llama-cpp-python's server (tests/engines/test_llama_cpp.py) as quirks: token ids
    refused with HTTP 500, /extras/tokenize only, no usage in streams, no /metrics. Each is said
    once, prompts are exact and every finished request counts max_tokens, as on the real one."""
    quirks = "text-only-500,tokenize-extras,no-stream-usage,no-metrics"
    result = run_matrix(pytester, endpoint=f"{TINY}&quirks={quirks}")
    result.assert_outcomes(passed=6)
    said = [
        "server rejected token-id prompts (HTTP 500): prompts sent as text sized with its "
        "tokenizer",
        "prompts: text sized with llama-cpp-python's /extras/tokenize",
        "tokens: the server sends no usage in streams: a request that ends at max_tokens",
        "KV capacity unknown: every cell ran",
    ]
    out = result.stdout.str()
    assert [out.count(f"note: {line}") for line in said] == [1] * len(said), out
    doc = _doc(pytester)
    assert doc["run"]["prompt_form"] == "text"
    cells = {c["id"]: c for c in doc["cells"]}
    assert all(c["status"] == "valid" for c in cells.values())
    assert cells["prefill[4K]"]["context_tokens"] == 4096
    for cell in (c for c in cells.values() if c["phase"] == "decode"):
        assert cell["tokens"] in ("max-tokens", "ratio") and cell["early_stops"] == 0
        assert cell["received_tokens"] >= cell["completed"] * 128


@pytest.mark.parametrize("form", ["ids", "text"])
def test_prompt_form_option(pytester, form):
    result = run_matrix(pytester, f"--llm-prompt-form={form}")
    result.assert_outcomes(passed=6)
    shown = {"ids": "token-id", "text": "text"}[form]
    result.stdout.fnmatch_lines([f"llmspeed: api completions ({shown} prompts)*"])
    doc = _doc(pytester)
    assert doc["run"]["prompt_form"] == form
    assert doc["run"]["settings"]["prompt_form"] == form


def test_decode_cell_whose_prompts_the_server_counts_otherwise_fails(pytester):
    """Text prompts rest on the server's tokenizer counting words additively (checked when the
    template is built); if the server still counts another length, the cell fails and says so
    (here a conftest makes every prompt after the warm-up one slot word too long)."""
    pytester.makeconftest(
        """
        from pytest_llmspeed.core.prompts import PromptFactory

        make = PromptFactory._text

        async def longer(self, context, index):
            head, tail = await make(self, context, index)
            return (head, tail + " river") if index >= 1 else (head, tail)

        def pytest_configure(config):
            PromptFactory._text = longer

        def pytest_unconfigure(config):  # pytester runs in this process: undo the patch
            PromptFactory._text = make
        """
    )
    result = pytester.runpytest(
        f"--llm-endpoint={TINY}", "--llm-prompt-form=text", "--llm-contexts=1K",
        "--llm-concurrency=2", "--llm-duration=1", "--llm-max-output=64",
        "--llm-results=out.json",
    )  # fmt: skip
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(
        ["*decode[[]1K-c2[]]: the server counted other prompt lengths than 1024 tokens: 1,02* "
         "(*×); the figures would be for other prompts*"]
    )  # fmt: skip
    cell = {c["id"]: c for c in _doc(pytester)["cells"]}["decode[1K-c2]"]
    assert cell["status"] == "failed" and cell["wrong_prompt_lengths"]


@pytest.mark.parametrize("suffix", ["/v1", "/v1/"])
def test_endpoint_written_with_v1_measures_the_same_server(pytester, sim_url, suffix):
    result = pytester.runpytest(
        f"--llm-endpoint={sim_url}{suffix}",
        "--llm-contexts=1K",
        "--llm-concurrency=1",
        "--llm-duration=1",
        "--llm-max-output=64",
        "--llm-results=out.json",
    )
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(
        [f"note: --llm-endpoint ends in /v1, the API's path: measuring the server at {sim_url}"]
    )
    assert _doc(pytester)["run"]["endpoint"] == sim_url


def test_models_list_failing_goes_on_with_the_model_given(pytester):
    endpoint = f"{TINY}&quirks=models-500"
    result = run_matrix(pytester, "--llm-model=tiny", endpoint=endpoint)
    result.assert_outcomes(passed=6)
    result.stdout.fnmatch_lines(
        [
            "note: warning: */v1/models answered HTTP 500: *; going on with the model given (tiny)",
            "note: max_model_len 32,768 from the server's /tokenize answer",
        ]
    )
    refused = pytester.runpytest(f"--llm-endpoint={endpoint}")
    assert refused.ret == pytest.ExitCode.USAGE_ERROR
    refused.stderr.fnmatch_lines(["ERROR: pytest-llmspeed: */v1/models answered HTTP 500*"])


def test_server_without_tokenize_is_one_message_naming_the_url_and_its_purpose(pytester):
    # no tokenize route, and the requests that would size prompts by their usage fail
    endpoint = f"{TINY}&quirks=no-tokenize&faults=start500=1"
    result = pytester.runpytest(f"--llm-endpoint={endpoint}", "--llm-contexts=1K")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        [
            "ERROR: pytest-llmspeed: http://127.0.0.1:*/v1/completions (sizing a text prompt by "
            "the server's usage.prompt_tokens) answered HTTP 500: *"
        ]
    )


def test_limit_on_a_server_that_does_not_report_max_model_len_is_one_line(pytester):
    # no /v1/models (the model given) and no /tokenize: max_model_len is nowhere
    endpoint = f"{TINY}&quirks=models-500,no-tokenize"
    result = pytester.runpytest(
        f"--llm-endpoint={endpoint}",
        "--llm-model=tiny",
        "--llm-contexts=1K",
        "--llm-prefill-contexts=1K,limit",
    )
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    err = result.stderr.str()
    assert (
        "ERROR: pytest-llmspeed: the context 'limit' needs the server's max_model_len, which it "
        "does not report (not in /v1/models, nor in a /tokenize answer). Give "
        "--llm-max-model-len=TOKENS, or drop max and limit from the contexts." in err
    ), err
    assert "Traceback" not in err + result.stdout.str()
