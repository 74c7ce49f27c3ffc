"""The places that read another package's private members (each has no public way): these
tests fail loudly when that package changes, instead of the plugin failing quietly."""

import asyncio

import pytest


def test_asyncio_runner_still_counts_interrupts():
    from pytest_llmspeed.core.bench import was_interrupted

    runner = asyncio.Runner()
    try:
        assert hasattr(runner, "_interrupt_count"), "asyncio.Runner changed: see was_interrupted"
        assert was_interrupted(runner) is False
    finally:
        runner.close()


def test_pytest_benchmark_fixture_still_takes_samples(pytester):
    pytest.importorskip("pytest_benchmark")
    pytester.makepyfile(
        """
        from pytest_llmspeed.plugin.benchmark import record_samples

        def test_x(benchmark):
            record_samples(benchmark, [0.001, 0.002, 0.003])
        """
    )
    result = pytester.runpytest("-p", "no:cacheprovider", "--benchmark-json=b.json")
    result.assert_outcomes(passed=1)
    import json

    data = json.loads((pytester.path / "b.json").read_text())
    assert data["benchmarks"][0]["stats"]["rounds"] == 3
    assert data["benchmarks"][0]["stats"]["median"] == pytest.approx(0.002)


def test_pytest_timeout_still_offers_its_timer_and_settings():
    """plugin/timeouts.py takes pytest-timeout's timer over for the tests that need the server
    and keeps pytest-timeout's own, later, as the fallback: its hook implementation (a module
    function, not a documented API) and its Settings namedtuple."""
    pytest_timeout = pytest.importorskip("pytest_timeout")
    assert callable(pytest_timeout.pytest_timeout_set_timer)
    settings = pytest_timeout.Settings(1.0, "signal", False, False)
    assert settings._replace(timeout=6.0).timeout == 6.0
    assert settings.disable_debugger_detection is False
    assert callable(pytest_timeout.is_debugging)
