"""Cost of encoding one request body at 256K tokens: the plugin encodes a prompt's shared head
once per context and joins it with each request's tail, instead of re-encoding the whole body
(which would hold the event loop, and every other stream's reads, for milliseconds).

    python -m benchmarks.request_encoding [--out PAGE]
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

from benchmarks.common import RESULTS, table, write_page
from pytest_llmspeed.core.prompts import Prompt

OUT = RESULTS / "request_encoding.md"
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=OUT, help="the results page (Markdown)")
    args = ap.parse_args()
    ids = list(range(1000, 1000 + 262144 - 32))
    suffix = list(range(32))
    head = "run 1:" + " river mountain ocean" * 65000  # ~1.4 MB of text
    tail = " river" * 8
    cases = {
        "token ids (262,144), whole body": Prompt({"prompt": ids + suffix}, 0),
        "token ids, shared prefix's JSON reused": Prompt(
            {"prompt": ids + suffix}, 0, json.dumps(ids)[:-1].encode(), suffix
        ),
        f"text ({len(head) / 1e6:.1f} MB), whole body": Prompt({"prompt": head + tail}, 0),
        "text, shared head's JSON reused": Prompt(
            {"prompt": head + tail}, 0, head_json=json.dumps(head)[:-1].encode(), tail=tail
        ),
    }
    lines = [
        "# Encoding one request body at 256K tokens",
        "",
        "Written by `benchmarks/request_encoding.py`; Python "
        f"{platform.python_version()}, {platform.machine()}. Median of 5 × 50 encodings.",
        "",
        *table(
            ["prompt", "ms per request"],
            [
                [name, f"{sorted(per_request_ms(prompt) for _ in range(5))[2]:.2f}"]
                for name, prompt in cases.items()
            ],
            "lr",
        ),
        "",
    ]
    print("\n".join(lines))
    write_page(args.out, lines, "request-encoding")


if __name__ == "__main__":
    main()
