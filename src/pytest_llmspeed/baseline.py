"""The baseline file: throughput floors and latency ceilings per cell, and the gate's verdicts.

A baseline is a commented TOML file, written by ``--llm-save-baseline`` and read with the
standard library's ``tomllib``; people edit it by hand. No pytest import here.
"""

from __future__ import annotations

import datetime as _dt
import math
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

#: floors (higher is better) and ceilings (lower is better) a cell may carry
FLOORS = ("total_tok_s", "per_request_tok_s", "prompt_tok_s")
CEILINGS = ("ttft_ms", "tbt_ms")
NAMES = {
    "total_tok_s": "total tok/s",
    "per_request_tok_s": "per-request tok/s",
    "prompt_tok_s": "prompt tok/s",
    "ttft_ms": "TTFT ms",
    "tbt_ms": "time between tokens ms",
}
#: run settings that make two runs comparable
COMPARABLE = ("model", "api", "prompt_form", "max_output", "duration_s")
DEFAULT_TOLERANCE = 0.05

_CELL_RE = re.compile(r"^(prefill\[(\d+K?|max)\]|decode\[(\d+K?|max)-c([1-9]\d*)\])$")


class BaselineError(ValueError):
    """A baseline file that cannot be used; the message names the file and the line."""


@dataclass
class CellBaseline:
    id: str
    limits: dict[str, float]  # metric → reference value
    tolerance: float
    line: int


@dataclass
class Baseline:
    path: Path
    run: dict[str, Any]
    tolerance: float
    cells: dict[str, CellBaseline] = field(default_factory=dict)


def _line_of(text: str, needle: str, after: int = 0) -> int:
    lines = text.splitlines()
    for i in range(after, len(lines)):
        if needle in lines[i]:
            return i + 1
    return after + 1 if after else 1


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


def load(path: str | Path) -> Baseline:
    """Read and check a baseline file; every problem is a BaselineError naming file and line."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise BaselineError(
            f"{p}: baseline file not found. Create one with --llm-save-baseline={p}"
        ) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise BaselineError(f"{p}: cannot read the baseline file: {exc}") from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise BaselineError(f"{p}: not valid TOML: {exc}") from None

    def err(line: int, what: str) -> BaselineError:
        return BaselineError(f"{p}, line {line}: {what}")

    unknown = set(data) - {"run", "defaults", "cells"}
    if unknown:
        key = sorted(unknown)[0]
        raise err(
            _line_of(text, key), f"unknown table or key {key!r} (expected run, defaults, cells)"
        )
    tolerance = DEFAULT_TOLERANCE
    defaults = data.get("defaults", {})
    if "tolerance" in defaults:
        tolerance = _tolerance(defaults["tolerance"], err(_line_of(text, "tolerance"), ""))
    cells_table = data.get("cells", {})
    if not isinstance(cells_table, dict):
        raise err(_line_of(text, "cells"), "'cells' must be a table of cells")
    baseline = Baseline(p, dict(data.get("run", {})), tolerance)
    for cid, body in cells_table.items():
        header = _line_of(text, f'"{cid}"')
        if not _CELL_RE.match(cid):
            raise err(
                header, f"unknown cell id {cid!r}: cell ids look like prefill[8K] or decode[32K-c8]"
            )
        if not isinstance(body, dict):
            raise err(header, f"cell {cid} must be a table of figures")
        limits: dict[str, float] = {}
        cell_tol = tolerance
        for key, value in body.items():
            line = _line_of(text, key, header)
            if key == "tolerance":
                cell_tol = _tolerance(value, err(line, ""))
                continue
            if key not in FLOORS + CEILINGS:
                raise err(
                    line,
                    f"unknown figure {key!r} in {cid} (expected one of "
                    f"{', '.join(FLOORS + CEILINGS)}, tolerance)",
                )
            number = _number(value)
            if number is None or number <= 0:
                raise err(line, f"{cid} {key} = {value!r} is not a positive number")
            limits[key] = number
        baseline.cells[cid] = CellBaseline(cid, limits, cell_tol, header)
    return baseline


def _tolerance(value: Any, where: BaselineError) -> float:
    number = _number(value)
    if number is None or not 0 <= number < 1:
        raise BaselineError(
            f"{where.args[0].rstrip(': ')}: tolerance = {value!r} must be a fraction between 0 "
            "and 1 (0.05 = 5 %)"
        )
    return number


def mismatches(baseline: Baseline, run: dict[str, Any]) -> list[str]:
    """Settings that differ between the baseline's run and this one, in words."""
    out = []
    for key in COMPARABLE:
        old, new = baseline.run.get(key), run.get(key)
        if old is not None and new is not None and old != new:
            out.append(f"{key} {old} in the baseline, {new} now")
    return out


# -- the gate ------------------------------------------------------------------------------


@dataclass
class Check:
    """One figure of one cell against its baseline, over one or more attempts."""

    cell: str
    metric: str
    reference: float
    tolerance: float
    values: list[float]  # one per attempt

    @property
    def is_floor(self) -> bool:
        return self.metric in FLOORS

    @property
    def limit(self) -> float:
        k = 1 - self.tolerance if self.is_floor else 1 + self.tolerance
        return self.reference * k

    @property
    def value(self) -> float:
        return sum(self.values) / len(self.values)

    @property
    def change(self) -> float:
        """Relative change of the (mean) value against the reference; + is better."""
        rel = self.value / self.reference - 1
        return rel if self.is_floor else -rel

    def misses(self, value: float) -> bool:
        return value < self.limit if self.is_floor else value > self.limit

    @property
    def regressed(self) -> bool:
        """Confirmed: every attempt misses, and so does their mean."""
        return all(self.misses(v) for v in self.values) and self.misses(self.value)

    @property
    def improved(self) -> bool:
        return self.change > self.tolerance

    def message(self) -> str:
        name = NAMES[self.metric]
        sign = "−" if self.is_floor else "+"
        cmp, word = ("<", "floor") if self.is_floor else (">", "ceiling")
        attempts = ""
        if len(self.values) > 1:
            shown = ", ".join(f"{v:,.1f}" for v in self.values)
            attempts = f" [attempts: {shown}]"
        delta = f"{self.value / self.reference - 1:+.1%}".replace("-", "−")
        return (
            f"{self.cell} {name} {self.value:,.1f} {cmp} {word} {self.limit:,.1f} "
            f"(baseline {self.reference:,.1f} {sign} {self.tolerance:.0%}): {delta}{attempts}"
        )


def checks_for(cell: CellBaseline, record: dict[str, Any]) -> list[Check]:
    """The checks of one measured cell record (figures it lacks are not checked)."""
    out = []
    for metric, ref in cell.limits.items():
        value = record.get(metric)
        if isinstance(value, int | float):
            out.append(Check(cell.id, metric, ref, cell.tolerance, [float(value)]))
    return out


# -- writing -------------------------------------------------------------------------------


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    text = str(value).replace("\\", "\\\\").replace('"', '\\"')
    return f'"{text}"'


def dump(
    path: str | Path,
    run: dict[str, Any],
    records: list[dict[str, Any]],
    tolerance: float = DEFAULT_TOLERANCE,
) -> int:
    """Write a baseline from measured cell records; returns the number of cells written."""
    lines = [
        "# pytest-llmspeed baseline: the figures a later run must not fall below (floors) or",
        "# rise above (ceilings), each with a tolerance. Written by --llm-save-baseline;",
        "# edit freely.",
        "# Gate a run with:  pytest --llm-baseline=THIS_FILE ...",
        "",
        "[run]  # the run the figures come from; a baseline of other settings gives a warning",
        f"date = {_toml_value(_dt.datetime.now(_dt.UTC).isoformat(timespec='seconds'))}",
    ]
    for key, value in run.items():
        if value is not None and isinstance(value, str | int | float | bool):
            lines.append(f"{key} = {_toml_value(value)}")
    lines += [
        "",
        "[defaults]",
        f"tolerance = {tolerance!r}  # a cell fails when worse than its reference by more than "
        "this fraction",
        "",
        "# Per cell: floors (total_tok_s, per_request_tok_s, prompt_tok_s) and optional ceilings",
        "# (ttft_ms, tbt_ms: uncomment to gate latency). 'tolerance = 0.1' overrides the default.",
    ]
    count = 0
    for rec in records:
        if rec.get("status") != "valid":
            continue
        count += 1
        lines += ["", f'[cells."{rec["id"]}"]']
        if rec["phase"] == "prefill":
            lines.append(f"prompt_tok_s = {round(rec['prompt_tok_s'], 1)!r}")
            lines.append(f"# ttft_ms = {round(rec['ttft_ms'], 1)!r}")
            continue
        lines.append(f"total_tok_s = {round(rec['total_tok_s'], 1)!r}")
        if rec.get("per_request_tok_s"):
            lines.append(f"per_request_tok_s = {round(rec['per_request_tok_s'], 1)!r}")
        if rec.get("ttft_ms"):
            lines.append(f"# ttft_ms = {round(rec['ttft_ms'], 1)!r}")
        if rec.get("tbt_ms"):
            lines.append(f"# tbt_ms = {round(rec['tbt_ms'], 3)!r}")
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return count
