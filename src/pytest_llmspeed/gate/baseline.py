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
COMPARABLE = ("model", "api", "prompt_form", "max_output", "duration_s", "prefill_repeats")
DEFAULT_TOLERANCE = 0.05


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
    ]
    count = 0
    for rec in records:
        if rec.status is not Status.VALID:
            continue
        count += 1
        lines += ["", f'[cells."{rec.id}"]']
        if rec.phase is Phase.PREFILL:
            assert rec.prompt_tok_s is not None and rec.ttft_ms is not None
            lines.append(f"prompt_tok_s = {round(rec.prompt_tok_s, 1)!r}")
            lines.append(f"# ttft_ms = {round(rec.ttft_ms, 1)!r}")
            continue
        assert rec.total_tok_s is not None
        lines.append(f"total_tok_s = {round(rec.total_tok_s, 1)!r}")
        if rec.per_request_tok_s:
            lines.append(f"per_request_tok_s = {round(rec.per_request_tok_s, 1)!r}")
        if rec.ttft_ms:
            lines.append(f"# ttft_ms = {round(rec.ttft_ms, 1)!r}")
        if rec.tbt_ms:
            lines.append(f"# tbt_ms = {round(rec.tbt_ms, 3)!r}")
    return "\n".join(lines) + "\n", count
