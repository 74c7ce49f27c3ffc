"""Client overhead before a request reaches the server: the plugin's client vs `vllm bench serve`'s.

A TTFT clock starts in the client, before the request is written; whatever the client does
between that moment and the request reaching the server is in its TTFT. This measures that part
alone, against a raw asyncio server on loopback that stamps the moment a request's headers are
in (one clock, one process) and answers at once. Both clients run in one event loop, requests
alternating, the same body (a 1,024-token-sized text prompt and the plugin's fields):

- plugin: ``pytest_llmspeed.core.client.stream_request`` on the plugin's ``Connection``;
- vllm: vLLM's own ``async_request_openai_completions`` on a session built as
  ``vllm bench serve`` builds it (``trust_env=True``), and once more with ``trust_env=False``.

It needs vLLM's benchmark code: it runs itself again with the Python of scripts/setup_vllm.py's
environment, which it finds by itself (``$LLMSPEED_VLLM_HOME``, default
``~/.cache/pytest-llmspeed/vllm``), the project's ``src`` on that Python's path.

    python -m benchmarks.studies.client_overhead [--requests 300]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.common import RESULTS, ROOT, command, machine, table, utc_now, write_page

OUT = RESULTS / "client_overhead.md"

_CHUNK = (
    b'data: {"id":"x","object":"text_completion","created":1,"model":"tiny","choices":[{"index":0,'
    b'"text":" a","logprobs":null,"finish_reason":null}],"usage":{"prompt_tokens":1024,'
    b'"completion_tokens":1,"total_tokens":1025}}\n\n'
)


def _chunked(b: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(b), b)


async def _serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, seen: list[float]):
    """HTTP/1.1 keep-alive: stamp each request when its headers are in, stream two chunks."""
    while True:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()
            return
        seen.append(time.perf_counter())
        length = 0
        for line in head.split(b"\r\n"):
            if line.lower().startswith(b"content-length:"):
                length = int(line.split(b":")[1])
        await reader.readexactly(length)
        writer.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
            b"transfer-encoding: chunked\r\n\r\n" + _chunked(_CHUNK)
        )
        await writer.drain()
        last = _CHUNK.replace(b'"completion_tokens":1', b'"completion_tokens":2')
        writer.write(_chunked(last) + _chunked(b"data: [DONE]\n\n") + b"0\r\n\r\n")
        await writer.drain()


async def measure(requests: int) -> dict[str, dict[str, float]]:
    import aiohttp
    from vllm.benchmarks.lib.endpoint_request_func import (
        RequestFuncInput,
        async_request_openai_completions,
    )

    from pytest_llmspeed.core.client import Connection, account_tokens, stream_request

    seen: list[float] = []
    server = await asyncio.start_server(lambda r, w: _serve(r, w, seen), "127.0.0.1", 0)
    url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    conn = Connection.open(url, None, 60)

    def vllm_session(trust_env: bool) -> aiohttp.ClientSession:
        # as vllm/benchmarks/serve.py (0.32) builds its session
        connector = aiohttp.TCPConnector(
            limit=1, limit_per_host=1, ttl_dns_cache=300, use_dns_cache=True,
            keepalive_timeout=60, enable_cleanup_closed=True, force_close=False,
        )  # fmt: skip
        return aiohttp.ClientSession(
            connector=connector, trust_env=trust_env, timeout=aiohttp.ClientTimeout(total=600)
        )

    sessions = {"vllm": vllm_session(True), "vllm, trust_env=False": vllm_session(False)}
    text = " river" * 1000
    extra = {"min_tokens": 2, "stream_options": {"include_usage": True,
                                                 "continuous_usage_stats": True}}  # fmt: skip
    body = json.dumps({"model": "tiny", "prompt": text, "max_tokens": 2, "stream": True,
                       "ignore_eos": True, **extra}).encode()  # fmt: skip
    names = ["plugin", *sessions]
    ttft: dict[str, list[float]] = {n: [] for n in names}
    trip: dict[str, list[float]] = {n: [] for n in names}
    for i in range(requests + 20):  # the first 20 of each warm up and are dropped
        for name in names if i % 2 else names[::-1]:
            if name == "plugin":
                rec = await stream_request(conn, "/v1/completions", body)
                account_tokens(rec)
                assert not rec.error and rec.t_first is not None, rec.error
                start, first = rec.t_send, rec.t_first
            else:
                inp = RequestFuncInput(
                    prompt=text, api_url=url + "/v1/completions", prompt_len=1024,
                    output_len=2, model="tiny", model_name="tiny", ignore_eos=True,
                    request_id=f"bench-{i}", extra_body=extra,
                )  # fmt: skip
                out = await async_request_openai_completions(inp, sessions[name])
                assert out.success, out.error
                start, first = out.start_time, out.start_time + out.ttft
            if i >= 20:
                ttft[name].append((first - start) * 1e3)
                trip[name].append((seen[-1] - start) * 1e3)
    for s in sessions.values():
        await s.close()
    await conn.close()
    server.close()
    return {
        n: {"to_server_ms": statistics.median(trip[n]), "ttft_ms": statistics.median(ttft[n]),
            "to_server_p90_ms": statistics.quantiles(trip[n], n=10)[-1]}
        for n in names
    }  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=300, help="requests per client")
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args()
    try:
        import vllm  # noqa: F401
    except ImportError:
        from benchmarks.common import vllm_python

        # vLLM's environment has vLLM but not this project: its src goes on the path
        path = os.pathsep.join(x for x in (str(ROOT / "src"), os.environ.get("PYTHONPATH")) if x)
        argv = [str(vllm_python()), "-m", "benchmarks.studies.client_overhead", *sys.argv[1:]]
        sys.exit(subprocess.call(argv, env={**os.environ, "PYTHONPATH": path}, cwd=ROOT))
    t0 = time.monotonic()
    res = asyncio.run(measure(args.requests))
    lines = [
        "# Client overhead: the plugin's client and `vllm bench serve`'s",
        "",
        "Written by `benchmarks/studies/client_overhead.py` (its docstring says how).",
        "",
        "Command: "
        f"`{command('benchmarks.studies.client_overhead', ['--requests', str(args.requests)])}` "
        f"({time.monotonic() - t0:.0f} s). Date: {utc_now()}. Machine: {machine()}, loopback, "
        f"Python {platform.python_version()}. Medians over {args.requests} requests per client.",
        "",
        *table(
            [
                "client",
                "clock start → server has the headers, ms (p90)",
                "TTFT against an instant server, ms",
            ],
            [
                [
                    name,
                    f"{r['to_server_ms']:.3f} ({r['to_server_p90_ms']:.3f})",
                    f"{r['ttft_ms']:.3f}",
                ]
                for name, r in res.items()
            ],
            "lrr",
        ),
        "",
    ]
    print("\n".join(lines))
    write_page(args.out, lines, "client-overhead")


if __name__ == "__main__":
    main()
