"""The baseline file: throughput floors and latency ceilings per cell.

A baseline is a commented TOML file, written by the pytest layer's save option and read with
the standard library's ``tomllib``; people edit it by hand. No pytest import here.
"""

from __future__ import annotations

import datetime as _dt
import math
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..results import CEILINGS, FLOORS, CellId, CellRecord, Phase, Status

#: run settings that make two runs comparable
COMPARABLE = (
    "model", "api", "prompt_form", "max_output", "duration_s", "prefill_repeats", "replicas",
)  # fmt: skip
DEFAULT_TOLERANCE = 0.05


class BaselineError(ValueError):
    """A baseline file that cannot be used; the message names the file and the line."""


@dataclass
class CellBaseline:
    id: str
    limits: dict[str, float]  # metric → reference value
    tolerance: float
    line: int
    intervals: dict[str, tuple[float, float]] = field(default_factory=dict)  # metric → 95 % CI


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
        raise BaselineError(f"{p}: baseline file not found") from None
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
        try:
            CellId.parse(cid)
        except ValueError as exc:
            raise err(header, str(exc)) from None
        if not isinstance(body, dict):
            raise err(header, f"cell {cid} must be a table of figures")
        limits: dict[str, float] = {}
        intervals: dict[str, tuple[float, float]] = {}
        cell_tol = tolerance
        for key, value in body.items():
            line = _line_of(text, key, header)
            if key == "tolerance":
                cell_tol = _tolerance(value, err(line, ""))
                continue
            if key.endswith("_ci") and key[:-3] in FLOORS + CEILINGS:
                pair = value if isinstance(value, list) else []
                nums = [_number(v) for v in pair]
                if len(nums) != 2 or None in nums or not 0 < nums[0] <= nums[1]:  # type: ignore[operator]
                    raise err(
                        line,
                        f"{cid} {key} = {value!r} must be an interval [low, high] of two "
                        "positive numbers, low ≤ high",
                    )
                intervals[key[:-3]] = (nums[0], nums[1])  # type: ignore[assignment]
                continue
            if key not in FLOORS + CEILINGS:
                raise err(
                    line,
                    f"unknown figure {key!r} in {cid} (expected one of "
                    f"{', '.join(FLOORS + CEILINGS)}, their _ci intervals, tolerance)",
                )
            number = _number(value)
            if number is None or number <= 0:
                raise err(line, f"{cid} {key} = {value!r} is not a positive number")
            limits[key] = number
        intervals = {k: v for k, v in intervals.items() if k in limits}
        baseline.cells[cid] = CellBaseline(cid, limits, cell_tol, header, intervals)
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
    records: list[CellRecord],
    tolerance: float = DEFAULT_TOLERANCE,
) -> int:
    """Write a baseline from measured cell records; returns the number of cells written."""
    date = _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")
    text, count = render(run, records, tolerance, date)
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(text, encoding="utf-8")
    return count


def _figure(
    key: str, value: float, ci: tuple[float, float] | None, nd: int, prefix: str = ""
) -> list[str]:
    """``total_tok_s = 6987.0`` and, when measured, ``total_tok_s_ci = [6950.1, 7023.9]``
    (rounded outwards, so rounding never narrows the interval)."""
    out = [f"{prefix}{key} = {round(value, nd)!r}"]
    if ci is not None:
        step = 10.0**-nd
        low = max(math.floor(ci[0] / step) * step, step)
        high = math.ceil(ci[1] / step) * step
        out.append(f"{prefix}{key}_ci = [{round(low, nd)!r}, {round(high, nd)!r}]")
    return out


def render(
    run: dict[str, Any],
    records: list[CellRecord],
    tolerance: float = DEFAULT_TOLERANCE,
    date: str = "",
) -> tuple[str, int]:
    """The baseline file's text for the valid cells of ``records``, and their number."""
    lines = [
        "# pytest-llmspeed baseline: the figures a later run must not fall below (floors) or",
        "# rise above (ceilings), each with a tolerance. Written by --llm-save-baseline;",
        "# edit freely.",
        "# Gate a run with:  pytest --llm-baseline=THIS_FILE ...",
        "",
        "[run]  # the run the figures come from; a baseline of other settings gives a warning",
        f"date = {_toml_value(date)}",
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
        "# A figure's 95 % interval (NAME_ci = [low, high]) makes the gate allow for noise: a",
        "# figure fails only when worse than the limit beyond both intervals (docs/gate.md).",
    ]
    count = 0
    for rec in records:
        if rec.status is not Status.VALID:
            continue
        count += 1
        lines += ["", f'[cells."{rec.id}"]']
        if rec.phase is Phase.PREFILL:
            assert rec.prompt_tok_s is not None and rec.ttft_ms is not None
            lines += _figure("prompt_tok_s", rec.prompt_tok_s, rec.prompt_tok_s_ci, 1)
            lines += _figure("ttft_ms", rec.ttft_ms, rec.ttft_ms_ci, 1, "# ")
            continue
        assert rec.total_tok_s is not None
        lines += _figure("total_tok_s", rec.total_tok_s, rec.total_tok_s_ci, 1)
        if rec.per_request_tok_s:
            lines += _figure(
                "per_request_tok_s", rec.per_request_tok_s, rec.per_request_tok_s_ci, 1
            )
        if rec.ttft_ms:
            lines += _figure("ttft_ms", rec.ttft_ms, rec.ttft_ms_ci, 1, "# ")
        if rec.tbt_ms:
            lines += _figure("tbt_ms", rec.tbt_ms, rec.tbt_ms_ci, 3, "# ")
    return "\n".join(lines) + "\n", count
