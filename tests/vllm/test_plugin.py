"""The plugin against real vLLM (CPU build, tiny offline model): a small matrix end to end."""

import json

import pytest

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

CONTEXTS = (1024, 4096, 16384)
CONCURRENCY = (1, 4, 16)
MAX_OUTPUT = 256


def run_plugin(pytester, server, contexts="1K,4K,16K", concurrency="1,4,16", extra=()):
    return pytester.runpytest(
        f"--llm-endpoint={server.url}",
        f"--llm-contexts={contexts}",
        f"--llm-concurrency={concurrency}",
        "--llm-duration=4",
        f"--llm-max-output={MAX_OUTPUT}",
        "--llm-results=out.json",
        "--junitxml=out.xml",
        "-m",
        "decode",
        "-rs",
        *extra,
    )


def test_small_matrix_on_real_vllm(pytester, vllm_server):
    server = vllm_server()
    result = run_plugin(pytester, server)
    expected_over = {
        f"decode[{c // 1024}K-c{n}]"
        for c in CONTEXTS
        for n in CONCURRENCY
        if n * (c + MAX_OUTPUT) > server.kv_capacity_tokens
    }
    result.assert_outcomes(passed=9 - len(expected_over), skipped=len(expected_over))
    result.stdout.fnmatch_lines([f"*KV capacity {server.kv_capacity_tokens:,} tokens*"])
    doc = json.loads((pytester.path / "out.json").read_text())
    assert doc["run"]["engine"] == "vllm" and doc["run"]["model"] == server.model
    assert doc["run"]["kv_capacity"] == server.kv_capacity_tokens
    cells = {c["id"]: c for c in doc["cells"]}
    over = {cid for cid, c in cells.items() if c["status"] == "over capacity"}
    assert over == expected_over
    decode = [c for c in cells.values() if c["phase"] == "decode" and c["status"] == "valid"]
    assert len(decode) == 9 - len(expected_over)
    for cell in decode:
        assert cell["tokens"] == "usage", cell["id"]
        # what the server's counter says it generated over the window is what we counted
        # (within 2 %; the counter was read at an unknown moment of each /metrics request)
        lo, hi = cell["received_span"]
        assert lo * 0.98 <= cell["generation_tokens_delta"] <= hi * 1.02, cell["id"]
        assert cell["output_tokens"] > 0
    prefill = [c for c in cells.values() if c["phase"] == "prefill"]
    assert {c["context_tokens"] for c in prefill} == set(CONTEXTS)


def test_multi_token_chunks_are_counted_exactly(pytester, vllm_server):
    server = vllm_server(stream_interval=4)
    result = run_plugin(pytester, server, contexts="1K", concurrency="1,4")
    result.assert_outcomes(passed=2)
    doc = json.loads((pytester.path / "out.json").read_text())
    for cell in doc["cells"]:
        if cell["phase"] != "decode":
            continue
        lo, hi = cell["received_span"]
        assert lo * 0.98 <= cell["generation_tokens_delta"] <= hi * 1.02, cell["id"]
        # up to 4 tokens a chunk: the accounting saw multi-token chunks
        assert cell["received_tokens"] / cell["received_chunks"] > 1.5


def test_wrong_api_key_on_real_vllm(pytester, vllm_server):
    server = vllm_server(api_key="the-real-key")
    result = pytester.runpytest(f"--llm-endpoint={server.url}", "--llm-api-key=not-the-key")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["ERROR: pytest-llmspeed: API key rejected by*"])
    assert "not-the-key" not in result.stderr.str() + result.stdout.str()


def test_chat_api_on_real_vllm_sizes_prompts_exactly(pytester, vllm_server):
    # the tiny model's byte-level vocabulary splits words into several tokens: the chat prompt
    # must still come out at exactly C tokens (the plugin checks usage.prompt_tokens)
    server = vllm_server()
    result = run_plugin(pytester, server, contexts="1K,4K", concurrency="1,4",
                        extra=("--llm-api=chat",))  # fmt: skip
    result.assert_outcomes(passed=4)
    cells = {c["id"]: c for c in json.loads((pytester.path / "out.json").read_text())["cells"]}
    assert {cid for cid, c in cells.items() if c["phase"] == "prefill"} == {
        "prefill[1K]",
        "prefill[4K]",
    }
    for cid in ("decode[1K-c1]", "decode[1K-c4]", "decode[4K-c1]", "decode[4K-c4]"):
        assert cells[cid]["status"] == "valid" and cells[cid]["output_tokens"] > 0, cid
