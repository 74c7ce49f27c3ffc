"""The formats a run is written as are registered once (report/outputs.py): the plugin's
options, their ini twins, ``report -o`` and ``compare --KEY`` all follow the registry."""

import contextlib
import io
from pathlib import Path

import pytest

from pytest_llmspeed.__main__ import main
from pytest_llmspeed.plugin.settings import OPTIONS
from pytest_llmspeed.report.outputs import OUTPUTS, by_suffix
from pytest_llmspeed.results import load

DATA = Path(__file__).resolve().parents[1] / "data" / "v1" / "results.json"


def test_the_page_is_registered():
    assert [(o.key, o.label, o.suffix) for o in OUTPUTS] == [("html", "page", ".html")]


@pytest.mark.parametrize("output", OUTPUTS, ids=lambda o: o.key)
def test_each_output_is_an_option_with_an_ini_twin_and_a_compare_flag(output):
    option = next(o for o in OPTIONS if o.name == output.key)
    assert (option.flag, option.ini) == (f"--llm-{output.key}", f"llm_{output.key}")
    assert option.help == f"write {output.help} to this path, rewritten after every cell"
    shown = io.StringIO()
    with contextlib.redirect_stdout(shown), pytest.raises(SystemExit):
        main(["compare", "--help"])
    assert f"--{output.key} " in shown.getvalue()


def test_report_picks_the_format_by_the_suffix_else_the_page():
    page = OUTPUTS[0]
    assert by_suffix("speed.html") is page and by_suffix("SPEED.HTML") is page
    assert by_suffix("speed") is page  # what report -o always wrote


@pytest.mark.parametrize("output", OUTPUTS, ids=lambda o: o.key)
def test_each_output_is_written_by_its_module(output, tmp_path):
    target = tmp_path / f"run{output.suffix}"
    assert main(["report", str(DATA), "-o", str(target)]) == 0
    direct = tmp_path / f"direct{output.suffix}"
    output.write(load(DATA), None, str(direct))
    assert target.read_text() == direct.read_text() != ""
