"""The main job end to end: the reference matrix through the plugin on the simulator at 10x.

32 decode cells pass, 16 are skipped as over capacity, the prefill rows are reported, and every
figure is that of the published H200 matrix x 10, within what a 1 s window on a busy machine
allows (BAND below; the ±10 % fit is the benchmark's).
"""

import json

import pytest

from benchmarks import reference_fit as reference

SPEED = 10
LABEL = {"8K": "8K", "16K": "16K", "32K": "32K", "64K": "64K", "128K": "128K", "max": "251K"}


#: Chance: figures are not this test's: a 1 s window at 10x on a busy machine is off the reference
#: by what the machine did (the simulator's CPU is not scaled: the lag of its front end lands in the
#: window, +7 % of a 3 s window at decode[32K-c32] on a quiet machine, up to +21 % beside other
#: work, three times that in a 1 s window). Whether the reference profile reproduces the published
#: matrix within ±10 % is the benchmark benchmarks/reference_fit.py's (on the simulator's virtual
#: clock, where load cannot move it); whether the client measures a server's speed truly is
#: tests/core's (test_token_truth, test_protocol_truth) and the client benchmarks'. Here every
#: figure must only be within a factor of BAND of the reference × 10: a cell measured at the wrong
#: concurrency, context or speed (×2 or more at every step of the matrix) is caught; load is not
#: (measured: beside a llama.cpp build on both cores, the 38 figures were 0.96-1.24 × the reference
#: × 10, the widest decode[32K-c32]).
BAND = 3.0


def _run(pytester, *extra, results="out.json", duration=1, repeats=1):
    return pytester.runpytest(
        f"--llm-endpoint=sim:h200-qwen3.5-27b-int4?speed={SPEED}",
        f"--llm-duration={duration}",
        f"--llm-prefill-repeats={repeats}",
        "-m",
        "decode",
        "--junitxml=out.xml",
        f"--llm-results={results}",
        *extra,
    )


def _ratios(cells):
    """{cell id: measured / reference × 10} for every cell; over-capacity cells checked."""
    out: dict[str, float] = {}
    for ctx, label in LABEL.items():
        for n, ref in zip(reference.CONCURRENCY, reference.REF_DECODE[label], strict=True):
            cell = cells[f"decode[{ctx}-c{n}]"]
            if ref is None:
                assert cell["status"] == "over capacity", cell["id"]
                continue
            assert cell["status"] == "valid", cell["id"]
            out[cell["id"]] = cell["total_tok_s"] / (ref * SPEED)
        prefill = cells[f"prefill[{ctx}]"]
        out[prefill["id"]] = prefill["prompt_tok_s"] / (reference.REF_PREFILL[label][0] * SPEED)
    return out


@pytest.mark.slow
def test_reference_matrix_through_the_plugin(pytester):
    result = _run(pytester)
    result.assert_outcomes(passed=32, skipped=16, deselected=6)
    result.stdout.fnmatch_lines(["Sustained decode", "*8K*", "Over capacity: not run because*"])
    doc = json.loads((pytester.path / "out.json").read_text())
    ratios = _ratios({c["id"]: c for c in doc["cells"]})
    assert len(ratios) == 32 + len(LABEL)
    far = {cid: round(r, 2) for cid, r in ratios.items() if not 1 / BAND < r < BAND}
    widest = max(ratios.values(), key=lambda r: max(r, 1 / r))
    assert not far, f"off the reference × 10 by more than ×{BAND} (widest {widest:.2f}): {far}"
