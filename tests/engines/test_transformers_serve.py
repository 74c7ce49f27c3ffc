"""A second real engine: ``transformers serve`` (continuous batching, CPU), from vLLM's offline
environment and tiny model (``scripts/setup_transformers_serve.py`` adds ``accelerate`` and a
copy of the model without EOS). It is less vLLM-like in every way issue 13 lists: it fails
``/v1/models`` offline (HTTP 500), takes text prompts only and has no tokenize route (prompts are
sized by ``usage.prompt_tokens``), rejects ``ignore_eos``/``min_tokens`` (HTTP 422), sends usage
only at the end of a stream, several tokens per chunk, and has no ``/metrics``. The plugin
measures it end to end and says each degradation once."""

from __future__ import annotations

import json
import os
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.engines import running
from tests.vllm_server import free_port, offline_env, vllm_home

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

MAX_OUTPUT = 64
NOT_SET_UP = "transformers serve is not set up: run `python scripts/setup_transformers_serve.py`"


@pytest.fixture(scope="module")
def transformers_serve(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    """(base URL, model name) of a running ``transformers serve --continuous-batching``."""
    root = vllm_home()
    ts = root / "transformers-serve"
    python = root / "venv" / "bin" / "python"
    if not (ts / "setup.json").is_file() or not python.exists():
        pytest.fail(NOT_SET_UP, pytrace=False)
    model = str(ts / "model")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log_path = tmp_path_factory.mktemp("transformers-serve") / "serve.log"
    cmd = [
        str(python.parent / "transformers"), "serve", model, "--continuous-batching",
        "--device", "cpu", "--host", "127.0.0.1", "--port", str(port),
    ]  # fmt: skip
    env = {**offline_env(dict(os.environ)), "PYTHONPATH": str(ts / "site")}
    with running("transformers serve", cmd, env, f"{url}/health", log_path, 180):
        yield url, model


def _stream(url: str, model: str, max_tokens: int) -> tuple[int, str | None, int]:
    """One streamed request of our own: (completion tokens in its final usage, finish reason,
    chunks with text)."""
    body = {
        "model": model,
        "prompt": "river mountain forest",
        "max_tokens": max_tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    request = urllib.request.Request(
        f"{url}/v1/completions",
        json.dumps(body).encode(),
        {"Content-Type": "application/json"},
    )
    usage, finish, chunks = 0, None, 0
    with urllib.request.urlopen(request, timeout=60) as resp:
        for line in resp:
            if not line.startswith(b"data:") or line.strip() == b"data: [DONE]":
                continue
            event = json.loads(line[5:])
            for choice in event.get("choices") or ():
                finish = choice.get("finish_reason") or finish
                chunks += bool(choice.get("text"))
            usage = (event.get("usage") or {}).get("completion_tokens", usage)
    return usage, finish, chunks


def test_small_matrix_on_transformers_serve(pytester, transformers_serve):
    url, model = transformers_serve
    # without EOS every output reaches max_tokens (a chunk may carry several tokens)
    usage, finish, chunks = _stream(url, model, MAX_OUTPUT)
    assert (usage, finish) == (MAX_OUTPUT, "length") and 0 < chunks <= MAX_OUTPUT
    result = pytester.runpytest(
        f"--llm-endpoint={url}",
        f"--llm-model={model}",
        "--llm-max-model-len=4096",
        "--llm-contexts=1K",
        "--llm-concurrency=1,2",
        "--llm-duration=3",
        f"--llm-max-output={MAX_OUTPUT}",
        "--llm-results=out.json",
    )
    result.assert_outcomes(passed=3)
    said = [
        f"note: warning: {url}/v1/models answered HTTP 500*; going on with the model given*",
        "note: the server has no tokenize route: prompts sent as text",
        "note: server rejected ignore_eos/min_tokens: outputs may end early*",
        "note: tokens: the server sends usage only at the end of a stream*",
        "note: KV capacity unknown: every cell ran*",
        "note: prompts: text sized with usage.prompt_tokens of small non-streamed requests*",
    ]
    result.stdout.fnmatch_lines_random(said)
    out = result.stdout.str()
    assert all(out.count(line.split("*")[0].removeprefix("note: ")) == 1 for line in said[1:])
    doc = json.loads((Path(pytester.path) / "out.json").read_text())
    assert doc["run"]["prompt_form"] == "text" and doc["run"]["kv_capacity"] is None
    cells = {c["id"]: c for c in doc["cells"]}
    assert all(c["status"] == "valid" for c in cells.values()), cells
    assert cells["prefill[1K]"]["context_tokens"] == 1024  # usage.prompt_tokens checked
    for cid in ("decode[1K-c1]", "decode[1K-c2]"):
        cell = cells[cid]
        # finished requests: their final usage, exact; those cut at the window's end: the
        # cell's tokens per chunk
        assert cell["tokens"] in ("final-usage", "ratio"), cell
        assert cell["early_stops"] == 0  # every finished request reached max_tokens
        assert cell["completed"] >= 2 and cell["total_tok_s"] > 0
        # each request that finished in the window has exactly MAX_OUTPUT tokens (checked on
        # a request of our own above)
        assert cell["received_tokens"] >= cell["completed"] * MAX_OUTPUT
        assert cell["received_tokens"] >= cell["received_chunks"] > 0
