"""--llm-prompt-text on real vLLM (CPU build), issue 33's "a text file as the prompt material
changes n-gram speculative decoding's acceptance as the server's counters show": the plugin
launches vLLM with n-gram (prompt lookup) speculative decoding, once with the matrix's default
prompts and once with a text file as their material.

The tiny model has random weights and vLLM samples its answers, so a draft is almost never
accepted (about 1 in 500, whatever the prompt): what the text moves is how often the lookup
finds the answer's last tokens in the prompt and proposes drafts at all. A text of one repeated
token ("0 0 0 ...") gives it almost nothing to find; the default prompts' ~100 distinct ids of
the 512 give it more.

Measured by hand (vLLM 0.32.0, decode[1K-c1], 16-token answers, 5 s; the machine shared):
default prompts 1,832 steps, 297 drafts (0.162 a step), 883 draft tokens, 2 accepted; the
"0 0 0" text 1,825 steps, 55 drafts (0.030 a step), 161 draft tokens, 0 accepted; a paragraph
repeated 1,852 steps, 220 drafts (0.119 a step), 0 accepted. With 256-token answers the answers'
own history gives matches too: 668 drafts in 1,972 steps default, 595 in 1,926 the paragraph.
Greedy answers (``--override-generation-config '{"temperature":0}'``, 64-token answers) loop,
and the lookup finds the loop in the answer itself: acceptance rate 0.90, 0.99, 0.83 on three
salts of the default prompts, 0.998, 0.998, 0.997 with the "0 0 0" text (acceptance length
3.3–3.9 either way): the text moves it, but the default's spread between salts is too wide for
a test of a few seconds, so the test counts drafts."""

import json

import pytest

from engines.home import Layout, vllm_home
from engines.servers import NOT_SET_UP
from tests.vllm.test_explain_vllm import one_at_a_time

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

VLLM = Layout(vllm_home())
SPEC = '{"method":"ngram","num_speculative_tokens":3,"prompt_lookup_max":3,"prompt_lookup_min":1}'


def _vllm() -> str:
    """vLLM's own command line, several requests at once, n-gram speculative decoding."""
    command = one_at_a_time()
    assert " --max-num-seqs 1" in command
    return command.replace(" --max-num-seqs 1", "") + f" --speculative-config '{SPEC}'"


def _decode(pytester, name: str, *extra: str) -> tuple[dict, dict]:
    result = pytester.runpytest(
        f"--llm-serve={_vllm()}", "--llm-serve-timeout=300", "--llm-contexts=1K",
        "--llm-concurrency=1", "--llm-duration=5", "--llm-max-output=16", "-m", "decode",
        "-p", "no:benchmark", "-p", "no:randomly", f"--llm-results={name}.json", *extra,
    )  # fmt: skip
    assert result.ret == 0, result.stdout.str()
    doc = json.loads((pytester.path / f"{name}.json").read_text())
    (cell,) = [c for c in doc["cells"] if c["id"] == "decode[1K-c1]"]
    assert cell["status"] == "valid"  # every prompt exactly 1,024 tokens by vLLM's usage
    server = cell["server"]
    # the figures are vLLM's spec-decode counters over the window, as they relate there
    drafts, accepted = server["spec_drafts"], server["spec_accepted_tokens"]
    assert drafts >= 0 and server["steps"] > 0
    assert server["spec_draft_tokens"] <= 3 * drafts
    if drafts:  # Chance: a loaded machine's few steps may propose none with a poor material
        assert server["acceptance_length"] == pytest.approx(1 + accepted / drafts, rel=1e-12)
        assert server["acceptance_rate"] == pytest.approx(
            accepted / server["spec_draft_tokens"], rel=1e-12
        )
    assert sum(server.get("spec_accepted_per_position") or [0]) == accepted
    return server, doc


def test_a_text_file_changes_what_n_gram_speculative_decoding_finds(pytester):
    if not VLLM.installed():
        pytest.fail(NOT_SET_UP)
    (pytester.path / "zeros.txt").write_text("0 " * 3000)
    default, _ = _decode(pytester, "default")
    text, doc = _decode(pytester, "text", "--llm-prompt-text=zeros.txt")
    notes = doc["run"]["notes"]
    assert any(n.startswith("prompt text zeros.txt: 5,999 characters") for n in notes), notes
    assert doc["run"]["settings"]["prompt_text"] == "zeros.txt"
    # Chance: how often the lookup proposes drafts with each material (quiet: 0.162 and 0.030
    # drafts a step) is a measured figure of sampled answers, and load moves it (beside busy
    # loops the text's read 0.229 against the default's 0.187, in a fifth of the steps): it is
    # measured by benchmarks/studies/ngram_prompt_text.py, not asserted here. What is certain
    # is asserted: the text reached the prompts (the note, the setting, every prompt exactly
    # 1,024 tokens by vLLM's usage) and vLLM's counters relate as it defines them (_decode).
    assert default["steps"] > 0 and text["steps"] > 0
