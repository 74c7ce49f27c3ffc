"""--llm-preset (docs/options.md, "Presets"): a preset sets how long and how often cells are
measured; an option given anywhere wins over its preset's value, and the header says both."""

from __future__ import annotations

import pytest

from pytest_llmspeed.plugin.settings import PRESETS, load


def _settings(pytester, *args: str):
    config = pytester.parseconfig("--llm-endpoint=http://127.0.0.1:9", *args)
    return load(config)


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_a_preset_sets_its_options(pytester, name):
    s = _settings(pytester, f"--llm-preset={name}")
    wanted = dict(PRESETS[name])
    assert s.preset == name
    assert s.duration == float(wanted["duration"])
    assert s.prefill_repeats == int(wanted["prefill-repeats"])
    assert s.confirm == int(wanted["confirm"])
    assert s.precision == (
        None if "precision" not in wanted else float(wanted["precision"][:-1]) / 100
    )
    assert s.preset_note is not None and s.preset_note.startswith(f"preset {name}: --llm-")


def test_options_given_win_over_the_preset_and_are_named(pytester, monkeypatch):
    pytester.makeini("[pytest]\nllm_confirm = 4\n")
    monkeypatch.setenv("LLMSPEED_ENDPOINT", "http://127.0.0.1:9")
    s = _settings(pytester, "--llm-preset=gate", "--llm-duration=5")
    assert (s.duration, s.confirm, s.precision, s.prefill_repeats) == (5.0, 4, 0.02, 6)
    assert s.min_duration == 5.0  # the preset's 10 s, no longer than the window given
    assert "--llm-min-duration: the preset's 10 s is longer than the window given, 5 s" in (
        " ".join(s.notes)
    )
    assert s.budget == 1800.0
    assert s.preset_note == (
        "preset gate: --llm-precision=2% --llm-min-duration=10 --llm-prefill-repeats=6 "
        "--llm-budget=30m; given instead: --llm-duration=5 (--llm-duration), "
        "--llm-confirm=4 (ini key llm_confirm)"
    )


def test_an_unknown_preset_is_one_line(pytester):
    result = pytester.runpytest("--llm-endpoint=sim:tiny", "--llm-preset=fast")
    assert result.ret == 4
    result.stderr.fnmatch_lines(["ERROR: --llm-preset='fast': choose one of quick, gate, publish"])
