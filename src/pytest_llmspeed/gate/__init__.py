"""The performance gate: the baseline file (floors and ceilings per cell) and the verdicts,
as pure functions of a baseline entry and a cell's measurements. No pytest import."""
