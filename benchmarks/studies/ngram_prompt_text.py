"""What ``--llm-prompt-text`` does to n-gram (prompt lookup) speculative decoding on real vLLM
(CPU build, the tiny model): how often the lookup proposes drafts, by vLLM's own counters
(drafts a step), with the matrix's default prompts and with a text of one repeated token
("0 0 0 …").

The tiny model has random weights and vLLM samples its answers: a draft is almost never
accepted, and what the prompt material moves is how often the lookup finds the answer's last
tokens in the prompt at all. That rate is a measured figure, subject to sampling and to the
machine's load (a run beside two busy loops and a test suite made a fifth of the steps and
read the text's rate above the default's), so it is measured here, pair by pair, not asserted
by a test (tests/vllm/test_prompt_text_vllm.py checks what is certain: the text reaches the
prompts and the counters relate as vLLM defines them).

Usage: ``python -m benchmarks.studies.ngram_prompt_text [--pairs 3] [--write]`` (each run starts
vLLM: about a minute and a half a run on two cores).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks.common import RESULTS, command, machine, table, utc_now, write_page
from engines.home import Layout, vllm_home

SPEC = '{"method":"ngram","num_speculative_tokens":3,"prompt_lookup_max":3,"prompt_lookup_min":1}'


def _vllm() -> str:
    from tests.vllm.test_explain_vllm import one_at_a_time

    return one_at_a_time().replace(" --max-num-seqs 1", "") + f" --speculative-config '{SPEC}'"


def one_run(folder: Path, name: str, *extra: str) -> dict[str, float]:
    """One run of decode[1K-c1] (5 s, 16-token answers) on a fresh vLLM: its server figures."""
    subprocess.run(
        [
            sys.executable, "-m", "pytest", f"--llm-serve={_vllm()}", "--llm-serve-timeout=300",
            "--llm-contexts=1K", "--llm-concurrency=1", "--llm-duration=5",
            "--llm-max-output=16", "-m", "decode", "-p", "no:benchmark", "-p", "no:randomly",
            "-p", "no:cacheprovider", f"--llm-results={name}.json", *extra,
        ],
        cwd=folder, capture_output=True, text=True, timeout=900, check=True,
        env={k: v for k, v in os.environ.items() if k != "PYTEST_ADDOPTS"},
    )  # fmt: skip
    doc = json.loads((folder / f"{name}.json").read_text())
    (cell,) = [c for c in doc["cells"] if c["id"] == "decode[1K-c1]"]
    server: dict[str, float] = cell["server"]
    return server


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--write", action="store_true")
    args = ap.parse_args(argv)
    if not Layout(vllm_home()).installed():
        sys.exit("real vLLM is not set up: python scripts/setup_engines.py")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        (folder / "zeros.txt").write_text("0 " * 3000)
        for pair in range(1, args.pairs + 1):
            for label, extra in (
                ("default prompts", ()),
                ('"0 0 0" text', ("--llm-prompt-text=zeros.txt",)),
            ):
                s = one_run(folder, f"p{pair}", *extra)
                rate = s["spec_drafts"] / s["steps"]
                rows.append([str(pair), label, f"{s['steps']:,.0f}", f"{s['spec_drafts']:,.0f}",
                             f"{rate:.3f}", f"{s['spec_accepted_tokens']:,.0f}"])  # fmt: skip
                print(" · ".join(rows[-1]), flush=True)
    lines = [
        "# n-gram speculative decoding on real vLLM: default prompts against a text",
        "",
        f"{utc_now()} · {machine()} · `{command('benchmarks.studies.ngram_prompt_text', argv)}` · "
        "decode[1K-c1], 5 s, 16-token answers, one fresh vLLM a run",
        "",
        *table(["pair", "prompts", "steps", "drafts", "drafts a step", "accepted"], rows),
        "",
        "A draft is proposed when the lookup finds the answer's last tokens in the prompt; the",
        "tiny model's sampled answers are almost never accepted. See the module's docstring.",
    ]
    print("\n".join(lines))
    if args.write:
        write_page(RESULTS / "ngram_prompt_text.md", lines)


if __name__ == "__main__":
    main()
