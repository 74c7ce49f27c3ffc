"""The files a run is written as besides its results file, registered once.

A format is one module of ``report/`` with a function ``write(results, comparison, path)`` and
one line in ``OUTPUTS``. Everything else follows from that line: the option ``--llm-KEY`` and
its ini twin ``llm_KEY`` (checked writable before any cell runs, rewritten after every cell,
named in the summary), ``python -m pytest_llmspeed report RESULTS -o PATH`` (the format chosen
by the path's suffix) and ``compare OLD NEW --KEY PATH`` (the new run with the comparison).

Import-light: a format's module is imported only when its file is written.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

if TYPE_CHECKING:
    from ..results import Results
    from .compare import Comparison

Writer = Callable[["Results", "Comparison | None", str], None]


@dataclass(frozen=True)
class Output:
    """One format a run is written as."""

    key: str  # the option's name: --llm-KEY, ini llm_KEY, compare --KEY
    module: str  # the module of report/ whose write(results, comparison, path) writes it
    label: str  # what the summary calls the file: "page: out/report.html"
    suffix: str  # the end of a file name that says this format (report -o)
    help: str  # what the file is, in words

    @property
    def dest(self) -> str:
        """The key as a Python name: where argparse and the settings keep its path."""
        return self.key.replace("-", "_")

    def write(self, results: Results, comparison: Comparison | None, path: str) -> None:
        module = importlib.import_module(f"{__package__}.{self.module}")
        cast(Writer, module.write)(results, comparison, path)


OUTPUTS: tuple[Output, ...] = (
    Output("html", "page", "page", ".html", "the speed-test page (one self-contained HTML file)"),
)


def by_suffix(path: str) -> Output:
    """The format a file name asks for: by its suffix, else the first one (the page)."""
    return next((o for o in OUTPUTS if path.lower().endswith(o.suffix)), OUTPUTS[0])
