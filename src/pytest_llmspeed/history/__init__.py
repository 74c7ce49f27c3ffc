"""The history of each cell across many results files, with its change points (issue 32,
docs/history.md): ``python -m pytest_llmspeed history FILES…|DIR``.

- :mod:`.series`: results files read, ordered by time, grouped into series of comparable runs,
  each cell's gated figures over the runs, its segments and the judge's verdicts;
- :mod:`.changes`: the change-point method (E-divisive means with a t-test and the merging of
  weak change points, as Apache Otava; the decision the one judge's, gate/judge.py).

Pure: no pytest, no output (report/history.py renders it).
"""

from .series import FigureHistory, History, Point, Run, Segment, Series, build, of_runs, read

__all__ = [
    "FigureHistory",
    "History",
    "Point",
    "Run",
    "Segment",
    "Series",
    "build",
    "of_runs",
    "read",
]
