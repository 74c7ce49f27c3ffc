"""A second real engine: ``transformers serve`` (continuous batching, CPU), from vLLM's offline
environment and tiny model (``scripts/setup_transformers_serve.py`` adds ``accelerate`` and two
copies of the model without EOS). It is less vLLM-like in every way issue 13 lists: it fails
``/v1/models`` offline (HTTP 500), takes text prompts only and has no tokenize route (prompts are
sized by ``usage.prompt_tokens``), rejects ``ignore_eos``/``min_tokens`` (HTTP 422), sends usage
only at the end of a stream, several tokens per chunk, and has no ``/metrics``. The plugin
measures it end to end and says each degradation once; and on the copy that draws only words
whose text tokenizes back to what was generated, its figures agree with an independent count of
the streamed text's tokens (behind a recording proxy, counted with the model's tokenizer)."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import engines.servers
from engines.home import vllm_home
from pytest_llmspeed.core import bench
from pytest_llmspeed.core.protocol import DecodeResult, run_decode
from tests.engines import started
from tests.engines.recording_proxy import Exchange, recording_proxy, timed_sse_events

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

MAX_OUTPUT = 64


@contextlib.contextmanager
def _serving(tmp: Path, home: Home, *, words: bool) -> Iterator[tuple[str, str]]:
    """(base URL, model name) of a running ``transformers serve --continuous-batching`` of one of
    the set-up's model copies."""
    log_path = tmp / "serve.log"
    engine = engines.servers.transformers_serve
    with started(engine(log_path, words=words, home=home.root, environ=home.environ)) as served:
        yield served


@dataclass(frozen=True)
class Home:
    root: Path  # vLLM's set-up
    environ: dict[str, str]


@pytest.fixture(scope="module")
def home() -> Home:
    """Taken before any test's pytester sets HOME to a temporary directory: where the set-up is
    and the servers' environment."""
    return Home(vllm_home(), dict(os.environ))


#: An engine that failed under load (HTTP 5xx, a broken stream: seen by the recording proxy)
#: gets one more fresh start; it fails the test only when it fails again.
ENGINE_STARTS = 2


def on_fresh_starts(
    words: bool, tmp: Path, home: Home, measure: Callable[[str, str, list[Exchange]], None]
) -> None:
    """``measure(url, model, exchanges)`` against a fresh start of ``transformers serve`` of one
    model copy (``words``: the one that draws words only), behind a recording proxy (one server
    at a time: two would double the CPU load of a busy machine). When it fails and the proxy saw
    the server fail, the test goes on with another fresh start, and fails after
    ``ENGINE_STARTS`` saying the engine failed; a failure without the server's fault fails at
    once."""
    failures = []
    for start in range(1, ENGINE_STARTS + 1):
        here = tmp / f"start{start}"
        here.mkdir()
        exchanges: list[Exchange] = []
        try:
            with (
                _serving(here, home, words=words) as (url, model),
                recording_proxy(url) as (proxy_url, exchanges),
            ):
                measure(proxy_url, model, exchanges)
            return
        except (AssertionError, OSError, pytest.fail.Exception) as exc:
            failed = [f for ex in exchanges if ex.path != "/v1/models" and (f := ex.server_failed)]
            if not failed and not isinstance(exc, pytest.fail.Exception | OSError):
                raise  # the plugin's (or this test's) failure, not the engine's
            why = "; ".join(failed[:3]) or str(exc).splitlines()[0]
            failures.append(f"start {start}: {why} ({len(failed)} failed exchange(s))")
    pytest.fail(
        f"transformers serve failed on {ENGINE_STARTS} fresh starts — the engine, not the "
        "plugin: " + " | ".join(failures),
        pytrace=False,
    )


def _stream(url: str, model: str, max_tokens: int) -> tuple[int, str | None, int, float]:
    """One streamed request of our own: (completion tokens in its final usage, finish reason,
    chunks with text, seconds it took)."""
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
    t0 = time.perf_counter()
    with urllib.request.urlopen(request, timeout=60) as resp:
        for line in resp:
            if not line.startswith(b"data:") or line.strip() == b"data: [DONE]":
                continue
            event = json.loads(line[5:])
            for choice in event.get("choices") or ():
                finish = choice.get("finish_reason") or finish
                chunks += bool(choice.get("text"))
            usage = (event.get("usage") or {}).get("completion_tokens", usage)
    return usage, finish, chunks, time.perf_counter() - t0


def window_for(request_s: float) -> float:
    """Seconds of a window in which at least two requests finish at c1 (and at c2) when one
    request takes ``request_s`` alone: five requests' time, 3 s at least. On a quiet machine a
    request takes 0.1-0.3 s; beside two busy loops, ten times that, and a fixed 3 s window then
    held a single finished request."""
    return max(3.0, round(5 * request_s, 1))


def _matrix(url: str, model: str, duration: float) -> list[str]:
    """A 1K × c1, c2 matrix of ``duration`` s windows."""
    return [
        f"--llm-endpoint={url}",
        f"--llm-model={model}",
        "--llm-max-model-len=4096",
        "--llm-contexts=1K",
        "--llm-concurrency=1,2",
        f"--llm-duration={duration:g}",
        f"--llm-max-output={MAX_OUTPUT}",
        "--llm-results=out.json",
    ]


def test_small_matrix_on_transformers_serve(pytester, tmp_path, home):
    on_fresh_starts(False, tmp_path, home, lambda *a: _small_matrix(pytester, *a))


def _small_matrix(pytester: pytest.Pytester, url: str, model: str, _: list[Exchange]) -> None:
    # without EOS every output reaches max_tokens (a chunk may carry several tokens)
    usage, finish, chunks, took = _stream(url, model, MAX_OUTPUT)
    assert (usage, finish) == (MAX_OUTPUT, "length") and 0 < chunks <= MAX_OUTPUT
    result = pytester.runpytest(*_matrix(url, model, window_for(took)))
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


#: Run with vLLM's Python (it has ``tokenizers``): argv = tokenizer.json, stdin = a JSON list of
#: texts; prints the tokens of each (no special tokens).
COUNT_TOKENS = r"""
import json, sys
from tokenizers import Tokenizer
tok = Tokenizer.from_file(sys.argv[1])
print(json.dumps([len(tok.encode(t, add_special_tokens=False).ids) for t in json.load(sys.stdin)]))
"""


def count_tokens(home: Home, model: str, texts: list[str]) -> list[int]:
    """Tokens of each text by the model's own tokenizer, outside the plugin and the server."""
    python = home.root / "venv" / "bin" / "python"
    cmd = [str(python), "-c", COUNT_TOKENS, str(Path(model) / "tokenizer.json")]
    out = subprocess.run(cmd, input=json.dumps(texts), capture_output=True, text=True, check=True)
    counts: list[int] = json.loads(out.stdout)
    return counts


def _text(events: list[dict]) -> str:
    return "".join(c.get("text") or "" for e in events for c in e.get("choices") or ())


def test_figures_agree_with_an_independent_count_of_the_streamed_text(
    pytester, tmp_path, home, monkeypatch
):
    """The model copy that draws words only, behind a recording proxy: the text of every stream
    is counted again with the model's tokenizer (``tokenizers``, in vLLM's environment) and
    compared with what the plugin reported. The copy's text tokenizes back to exactly what was
    generated (checked at set-up for the words, here for each stream's words), so the count of
    its text is the count of its tokens."""
    # each decode cell's result, with when it ran (a spy: the cell runs as it would)
    cells: list[tuple[float, float, DecodeResult]] = []

    async def spy(*args: Any, **kwargs: Any) -> DecodeResult:
        t0 = time.perf_counter()
        result = await run_decode(*args, **{**kwargs, "keep_reads": True})  # text, read below
        cells.append((t0, time.perf_counter(), result))
        return result

    monkeypatch.setattr(bench, "run_decode", spy)

    def measure(proxy_url: str, model: str, exchanges: list[Exchange]) -> None:
        cells.clear()
        _, _, _, took = _stream(proxy_url, model, MAX_OUTPUT)
        result = pytester.runpytest(*_matrix(proxy_url, model, window_for(took)))
        result.assert_outcomes(passed=3)
        _agree(pytester, home, model, cells, exchanges)

    on_fresh_starts(True, tmp_path, home, measure)


def _agree(
    pytester: pytest.Pytester,
    home: Home,
    model: str,
    cells: list[tuple[float, float, DecodeResult]],
    exchanges: list[Exchange],
) -> None:
    words = {w.strip() for w in json.loads((Path(model).parent / "words.json").read_text())}
    doc = json.loads((Path(pytester.path) / "out.json").read_text())
    by_id = {c["id"]: c for c in doc["cells"]}
    assert [r.concurrency for _, _, r in cells] == [1, 2]
    # the streams of each cell, as the server sent them (the proxy) and as the plugin read
    # them inside its window (its records' reads, parsed here)
    streams = []
    for t0, t1, res in cells:
        sent = [
            ex
            for ex in exchanges
            if ex.path == "/v1/completions"
            and t0 <= ex.t_start <= t1
            and ex.request().get("max_tokens") == MAX_OUTPUT
        ]
        assert len(sent) == len(res.records) == by_id[f"decode[1K-c{res.concurrency}]"]["requests"]
        streams.append([ex.events() for ex in sent])
    w_texts = [
        _text([e for t, e in timed_sse_events(rec.reads) if res.window[0] <= t < res.window[1]])
        for _, _, res in cells
        for rec in res.records
    ]
    texts = [_text(events) for cell in streams for events in cell]
    counts = count_tokens(home, model, texts + w_texts)
    full, in_window = counts[: len(texts)], counts[len(texts) :]
    assert all(set(t.split()) <= words for t in texts), "the model drew more than words"
    for (_, _, res), cell_streams in zip(cells, streams, strict=True):
        cell = by_id[f"decode[1K-c{res.concurrency}]"]
        n = len(cell_streams)
        mine, full = full[:n], full[n:]
        window, in_window = in_window[:n], in_window[n:]
        finished = 0
        for events, tokens in zip(cell_streams, mine, strict=True):
            usage = [e["usage"]["completion_tokens"] for e in events if e.get("usage")]
            if any(c.get("finish_reason") for e in events for c in e.get("choices") or ()):
                finished += 1  # exactly max_tokens, by the server's usage and by its text
                assert (tokens, usage) == (MAX_OUTPUT, [MAX_OUTPUT]), (tokens, usage)
        assert finished >= 2 and cell["tokens"] in ("final-usage", "ratio"), cell
        # Only the requests cut at the window's end (one per stream at most) can differ: the
        # plugin estimates them from the cell's tokens per chunk, and the proxy counts what it
        # forwarded after the plugin's last read. Within 1 % (the issue asks "a few percent").
        said = f"{cell['id']}: plugin {cell['received_tokens']}, text {sum(mine)}"
        assert abs(cell["received_tokens"] - sum(mine)) <= 0.01 * sum(mine), said
        # inside the window, by the plugin's own arrival times: total tok/s
        said = f"{cell['id']}: plugin {cell['output_tokens']} in the window, text {sum(window)}"
        assert abs(cell["output_tokens"] - sum(window)) <= 0.01 * sum(window), said
        independent = sum(window) / cell["measured_s"]
        assert cell["total_tok_s"] == pytest.approx(independent, rel=0.01), said
