"""The one implementation of the normal and Student's t quantiles (pytest_llmspeed.quantiles)
that the core's intervals and the gate both use: exact at integer degrees of freedom, the
incomplete beta function between them, and the normal quantile for a known variance."""

from __future__ import annotations

import math

import pytest

from pytest_llmspeed.core import intervals
from pytest_llmspeed.gate import noise
from pytest_llmspeed.quantiles import _beta_regularized, _t, normal_quantile, t_cdf, t_quantile


@pytest.mark.parametrize(
    ("p", "df", "table"),
    [
        (0.975, 1, 12.706),
        (0.975, 2, 4.303),
        (0.975, 6, 2.447),
        (0.99, 2, 6.965),
        (0.99, 4, 3.747),
        (0.995, 1, 63.657),
        (0.995, 3, 5.841),
        (0.975, 30, 2.042),
    ],
)
def test_t_quantiles_are_the_tables(p: float, df: int, table: float) -> None:
    assert t_quantile(p, df) == pytest.approx(table, abs=5e-4)


def test_the_beta_function_is_the_exact_series_at_integers() -> None:
    for df in (1, 2, 3, 5, 9, 30):
        for t in (0.3, 1.7, 3.0, 12.0):
            beta = 1 - 0.5 * _beta_regularized(df / 2, 0.5, df / (df + t * t))
            assert beta == pytest.approx(t_cdf(t, df), abs=1e-10)


def test_a_non_integer_df_lies_between_its_neighbours_and_converges() -> None:
    for p in (0.975, 0.995):
        values = [t_quantile(p, df) for df in (1, 1.25, 1.5, 2, 2.5, 3, 6.3, 7)]
        assert values == sorted(values, reverse=True)  # falls with the degrees of freedom
    assert t_quantile(0.975, 5000.5) == pytest.approx(normal_quantile(0.975), rel=1e-3)
    assert t_quantile(0.99, None) == pytest.approx(2.326347874040841, abs=1e-8)
    assert normal_quantile(0.025) == pytest.approx(-1.959963984540054, abs=1e-8)


def test_the_core_and_the_gate_use_the_same_one() -> None:
    assert intervals.t_quantile is t_quantile and noise.t_quantile is t_quantile
    assert math.isclose(intervals._z(0.9), normal_quantile(0.9))
    with pytest.raises(ValueError):
        t_quantile(0.975, 0.5)


def test_many_degrees_of_freedom_take_the_expansion_as_exact_as_the_bisection() -> None:
    # from 100 degrees of freedom on, A&S 26.7.5 in 1/df; the CDF's bisection below (and as
    # the reference here); a history asks for hundreds of them (docs/history.md)
    for p in (0.6, 0.9, 0.975, 0.99, 0.995, 0.9995, 0.99998):
        for df in (100, 101, 150.5, 300, 1000, 10**5):
            assert t_quantile(p, df) == pytest.approx(_t(p, float(df)), rel=2e-7)
    below, above = t_quantile(0.99, 99), t_quantile(0.99, 100)
    assert 0 < below - above < 1e-3  # no step where the method changes
