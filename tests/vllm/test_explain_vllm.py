"""Why a cell changed, on real vLLM (CPU build): the same 1K × c2 cell measured on the session's
server and on a server the plugin launches with ``--max-num-seqs 1`` (one request runs, the
other waits). The explanation read from the server's own counters names the factor that
setting moves: the requests running (issue 20's "Done when").

Measured here (quiet machine): `decode[1K-c2] −28.0%: running 2 → 1 (−50.0%), steps/s 505 →
724 (+43.5%); requests waiting 0.0 → 0.9, at most 1 (capacity); at most 1 of 2 requests running
(was 2)`. On a busy machine the means move with the load and the 1 Hz polls of the gauges can
miss a request that waited; the queue-time histogram counts every request that finished in the
window. So the test asserts the findings of a queue and of a cap on running requests, which
hold either way."""

import shlex

import pytest

from engines.home import Layout, vllm_home
from engines.servers import KV_CACHE_MEMORY_BYTES, MAX_MODEL_LEN, NOT_SET_UP, SERVED_MODEL
from pytest_llmspeed.gate.explain import Explanation, Side, explain
from pytest_llmspeed.report.compare import compare
from pytest_llmspeed.results import Phase, load

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

# found at import: pytester points HOME at a temporary folder before the test body runs
VLLM = Layout(vllm_home())
OFFLINE = "HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1"
ARGS = (
    "--llm-contexts=1K",
    "--llm-concurrency=2",
    "--llm-duration=4",
    "--llm-max-output=256",
    "-m",
    "decode",
)


def one_at_a_time() -> str:
    """vLLM's own command line, as the tests' servers run it, with ``--max-num-seqs 1``."""
    return (
        f"env -u PYTHONPATH {OFFLINE} {shlex.quote(str(VLLM.python))} "
        f"-m vllm.entrypoints.openai.api_server --model {shlex.quote(str(VLLM.model))} "
        f"--served-model-name {SERVED_MODEL} --host 127.0.0.1 --port {{port}} "
        f"--max-model-len {MAX_MODEL_LEN} --kv-cache-memory-bytes {KV_CACHE_MEMORY_BYTES} "
        "--max-num-seqs 1 --disable-uvicorn-access-log"
    )


def test_a_running_cap_is_named_on_real_vllm(pytester, vllm_server):
    if not VLLM.installed():
        pytest.fail(NOT_SET_UP)
    server = vllm_server()
    first = pytester.runpytest(f"--llm-endpoint={server.url}", *ARGS, "--llm-results=a.json")
    assert first.ret == 0, first.stdout.str()
    slowed = pytester.runpytest(
        f"--llm-serve={one_at_a_time()}",
        "--llm-serve-timeout=300",
        *ARGS,
        "--llm-results=b.json",
    )
    # the capped cell may pass or fail its own checks; it is measured either way
    assert slowed.ret in (0, 1), slowed.stdout.str()
    old, new = load(pytester.path / "a.json"), load(pytester.path / "b.json")
    a, b = (next(c for c in r.cells if c.phase is Phase.DECODE) for r in (old, new))
    assert a.server is not None and b.server is not None, (a.server, b.server)
    assert a.total_tok_s and b.total_tok_s, (a, b)
    # the server's own figures: never more than 1 request running with the cap, and requests
    # that queued a share of their time in the engine (the histograms: every request counted)
    assert b.server.running_max is not None and b.server.running_max <= 1, b.server
    found = explain(
        str(a.id), "decode", Side(a.total_tok_s, a.server), Side(b.total_tok_s, b.server),
        concurrency=2,
    )  # fmt: skip
    assert isinstance(found, Explanation), found
    said = {f.key: f.text for f in found.findings}
    # the queue, from the polls' waiting requests or else from the queue-time histogram
    assert {"queued", "queue_time"} & said.keys(), found.line()
    if a.server.running_max == 2:  # the polls saw both requests run at once before the cap
        assert said.get("running_capped") == "at most 1 of 2 requests running (was 2)", said
    # what compare says of the cell, in its own words (the terminal's "why:" and the Markdown;
    # said as a finding when the windows' noise hides the change itself)
    (change,) = [c for c in compare(old, new).cells if c.concurrency is not None]
    assert all(text in change.explanation for text in said.values()), change
