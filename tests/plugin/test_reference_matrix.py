"""The main job end to end: the reference matrix through the plugin on the simulator at 10x.

Issue 3's acceptance: 32 decode cells pass, 16 are skipped as over capacity, the prefill rows
are reported, and every figure agrees with the published H200 matrix x 10 within ±10 %.
"""

import json

import pytest

from benchmarks import reference_fit as reference

SPEED = 10
LABEL = {"8K": "8K", "16K": "16K", "32K": "32K", "64K": "64K", "128K": "128K", "max": "251K"}


#: a cell off by more than 10 % is measured again, alone, in a window three times as long;
#: more misses than RETRIES at the first pass are a systematic error and fail at once. At 10x
#: the simulator's own CPU is not scaled: its front end parses 32 prompts of 32K token ids in
#: about 0.2 s, the engine loop falls that far behind and catches up (sim.server.LAG_RESET_S,
#: as vLLM's engine keeps stepping while its API server is busy), and the tokens of that lag
#: land in the window that opens just then: +7 % of a 3 s window at decode[32K-c32] on a quiet
#: machine, up to +21 % beside other work. Three times the window is a third of that; a figure
#: wrong by design is wrong both times.
RETRIES = 6
AGAIN_DURATION = 9


def _run(pytester, *extra, results="out.json", duration=3, repeats=6):
    return pytester.runpytest(
        f"--llm-endpoint=sim:h200-qwen3.5-27b-int4?speed={SPEED}",
        f"--llm-duration={duration}",
        # the prefill rows come from the decode warm-ups: a cold 8K prefill at 10x takes 8 ms,
        # and one such request beside busy cores read 11 % slow (the simulator scheduled a
        # millisecond late): the median of 6 cold requests, as when gating
        f"--llm-prefill-repeats={repeats}",
        "-m",
        "decode",
        "--junitxml=out.xml",
        f"--llm-results={results}",
        *extra,
    )


def _misses(cells, only=None):
    """(ctx, n or None for prefill, message) for each figure off the reference x 10."""
    out: list[tuple[str, int | None, str]] = []
    for ctx, label in LABEL.items():
        for n, ref in zip(reference.CONCURRENCY, reference.REF_DECODE[label], strict=True):
            if only is not None and (ctx, n) not in only:
                continue
            cell = cells[f"decode[{ctx}-c{n}]"]
            if ref is None:
                assert cell["status"] == "over capacity", cell["id"]
                continue
            assert cell["status"] == "valid", cell["id"]
            if abs(cell["total_tok_s"] / (ref * SPEED) - 1) > 0.10:
                figure = f"{cell['total_tok_s']:.0f} vs {ref * SPEED:.0f}"
                out.append((ctx, n, f"{cell['id']}: {figure}"))
        if only is not None and (ctx, None) not in only:
            continue
        prefill = cells[f"prefill[{ctx}]"]
        ref_rate = reference.REF_PREFILL[label][0] * SPEED
        if abs(prefill["prompt_tok_s"] / ref_rate - 1) > 0.10:
            figure = f"{prefill['prompt_tok_s']:.0f} vs {ref_rate:.0f}"
            out.append((ctx, None, f"{prefill['id']}: {figure}"))
    return out


@pytest.mark.slow
def test_reference_matrix_through_the_plugin(pytester):
    result = _run(pytester)
    result.assert_outcomes(passed=32, skipped=16, deselected=6)
    result.stdout.fnmatch_lines(["Sustained decode", "*8K*", "Over capacity: not run because*"])
    doc = json.loads((pytester.path / "out.json").read_text())
    first = _misses({c["id"]: c for c in doc["cells"]})
    assert len(first) <= RETRIES, "figures off the reference x 10 by more than 10 %: " + "; ".join(
        m for _, _, m in first
    )
    still = []
    for ctx, n, message in first:
        # the cell alone: its context, and its concurrency (a prefill row comes with any)
        conc = n if n is not None else 1
        again = _run(
            pytester,
            f"--llm-contexts={ctx}",
            f"--llm-concurrency={conc}",
            results="again.json",
            duration=AGAIN_DURATION,
            repeats=6 if n is None else 1,  # a decode cell's retry needs no prefill figure
        )
        again.assert_outcomes(passed=1, deselected=1)
        doc = json.loads((pytester.path / "again.json").read_text())
        second = _misses({c["id"]: c for c in doc["cells"]}, only={(ctx, n)})
        if second:
            still.append(f"{message}, then {second[0][2].split(': ')[1]}")
    assert not still, "figures off the reference x 10 by more than 10 %, twice: " + "; ".join(still)
