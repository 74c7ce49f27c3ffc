"""Cost of encoding one request body at 256K tokens: the plugin encodes a prompt's shared head
once per context and joins it with each request's tail, instead of re-encoding the whole body
(which would hold the event loop, and every other stream's reads, for milliseconds).

    python -m benchmarks.request_encoding
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time

from benchmarks.common import table
from benchmarks.harness import Figure, Outcome, cli
from pytest_llmspeed.core.prompts import Prompt

FIELDS = {
    "model": "m", "max_tokens": 4096, "stream": True, "ignore_eos": True, "min_tokens": 4096,
    "stream_options": {"include_usage": True, "continuous_usage_stats": True},
}  # fmt: skip


def per_request_ms(prompt: Prompt, repeats: int = 50) -> float:
    assert json.loads(prompt.encode(FIELDS)) == {**prompt.body, **FIELDS}
    t0 = time.perf_counter()
    for _ in range(repeats):
        prompt.encode(FIELDS)
    return (time.perf_counter() - t0) / repeats * 1e3


def measure(argv: list[str]) -> Outcome:
    """Milliseconds to encode one 256K-token body, whole and with its head's JSON reused."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.parse_args(argv)
    ids = list(range(1000, 1000 + 262144 - 32))
    suffix = list(range(32))
    head = "run 1:" + " river mountain ocean" * 65000  # ~1.4 MB of text
    tail = " river" * 8
    cases = {
        "ids_whole_ms": ("token ids (262,144), whole body", Prompt({"prompt": ids + suffix}, 0)),
        "ids_ms": (
            "token ids, shared prefix's JSON reused",
            Prompt({"prompt": ids + suffix}, 0, json.dumps(ids)[:-1].encode(), suffix),
        ),
        "text_whole_ms": (
            f"text ({len(head) / 1e6:.1f} MB), whole body",
            Prompt({"prompt": head + tail}, 0),
        ),
        "text_ms": (
            "text, shared head's JSON reused",
            Prompt({"prompt": head + tail}, 0, head_json=json.dumps(head)[:-1].encode(), tail=tail),
        ),
    }
    figures = {
        key: Figure(round(sorted(per_request_ms(prompt) for _ in range(5))[2], 3), "ms", digits=2)
        for key, (_, prompt) in cases.items()
    }
    lines = [
        "# Encoding one request body at 256K tokens",
        "",
        "Written by `benchmarks/request_encoding.py`; Python "
        f"{platform.python_version()}, {platform.machine()}. Median of 5 × 50 encodings.",
        "",
        *table(
            ["prompt", "figure", "ms per request"],
            [[label, key, figures[key].text] for key, (label, _) in cases.items()],
            "llr",
        ),
    ]
    return Outcome(figures, lines, {})


def main() -> None:
    sys.exit(cli("request_encoding", measure))


if __name__ == "__main__":
    main()
