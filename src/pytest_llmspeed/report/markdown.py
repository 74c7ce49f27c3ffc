"""A Markdown summary of the run, appended to ``$GITHUB_STEP_SUMMARY`` on GitHub Actions."""

from __future__ import annotations

from typing import Any

from tabulate import tabulate

from . import records as R
from .terminal import fmt_ms, fmt_rate


def summary(
    title: str, cells: list[dict[str, Any]], regressions: list[str], notes: list[str]
) -> str:
    lines = [f"## {title}", ""]
    prefill = [c for c in cells if c["phase"] == "prefill"]
    decode = [c for c in cells if c["phase"] == "decode"]
    if prefill:
        rows = [
            [c["context"], fmt_rate(c.get("prompt_tok_s")), fmt_ms(c.get("ttft_ms"))]
            if c["status"] == R.VALID
            else [c["context"], c["status"], ""]
            for c in prefill
        ]
        lines += [
            "**Prefill** (cold cache)",
            "",
            tabulate(
                rows,
                headers=["Context", "prompt tok/s", "TTFT"],
                tablefmt="github",
                disable_numparse=True,
            ),
            "",
        ]
    if decode:
        conc = sorted({c["concurrency"] for c in decode})
        ctxs: list[str] = []
        for c in decode:
            if c["context"] not in ctxs:
                ctxs.append(c["context"])
        by = {(c["context"], c["concurrency"]): c for c in decode}
        rows = []
        for ctx in ctxs:
            row = [ctx]
            for n in conc:
                c = by.get((ctx, n))
                if c is None:
                    row.append("")
                elif c.get("total_tok_s") is None:
                    row.append(c["status"].capitalize())
                else:
                    mark = " ❌" if c["status"] == R.FAILED else ""
                    row.append(f"{fmt_rate(c['total_tok_s'])} · {fmt_ms(c['ttft_ms'])}{mark}")
            rows.append(row)
        lines += [
            "**Sustained decode**: total tok/s · TTFT; rows context, columns requests in flight",
            "",
            tabulate(
                rows, headers=["Context", *map(str, conc)], tablefmt="github", disable_numparse=True
            ),
            "",
        ]
    if regressions:
        lines += ["**Regressions**", ""] + [f"- `{r}`" for r in regressions] + [""]
    lines += [f"> {n}" for n in notes]
    return "\n".join(lines) + "\n"
