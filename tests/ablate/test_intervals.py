"""The interval arithmetic on planted numbers: Student's t quantiles as tables give them, the
mean's t-interval and the paired difference to the baseline, exactly."""

import math

import pytest

from llmkit.ablate.intervals import incomplete_beta, paired_difference, t_interval, t_quantile


@pytest.mark.parametrize("df, p, table", [
    (1, 0.975, 12.706204736174707), (2, 0.975, 4.302652729749464), (3, 0.975, 3.182446305284263),
    (4, 0.975, 2.7764451051977987), (9, 0.975, 2.2621571628540993), (2, 0.95, 2.919985580355516),
    (2, 0.995, 9.924843200918276), (30, 0.975, 2.0422724563012373)])
def test_t_quantiles_equal_the_tables(df, p, table):
    assert t_quantile(p, df) == pytest.approx(table, abs=1e-9)
    assert t_quantile(1 - p, df) == pytest.approx(-table, abs=1e-9)


def test_incomplete_beta_at_known_points():
    assert incomplete_beta(1, 1, 0.3) == pytest.approx(0.3, abs=1e-14)  # the uniform distribution
    assert incomplete_beta(2, 3, 0.4) == pytest.approx(0.5248, abs=1e-13)  # 1 - (1-x)^3 (1 + 3x)


def test_the_mean_and_its_interval_on_planted_values():
    # mean 2, sample sd 1, t(0.975, 2) = 4.302652729749464: 2 ± 4.302652729749464 / sqrt(3)
    iv = t_interval([1.0, 2.0, 3.0], 0.95)
    half = 4.302652729749464 / math.sqrt(3)
    assert (iv.n, iv.mean, iv.sd) == (3, 2.0, 1.0)
    assert iv.low == pytest.approx(2 - half, abs=1e-12) and iv.high == pytest.approx(2 + half, abs=1e-12)
    assert iv.low == pytest.approx(-0.4841377117501, abs=1e-12)
    # two values 4 and 6: sd sqrt(2), t(0.975, 1) = 12.706204736174707 -> 5 ± 12.7062...
    two = t_interval([4.0, 6.0], 0.95)
    assert two.high - two.mean == pytest.approx(12.706204736174707, abs=1e-9)
    one = t_interval([3.5], 0.95)
    assert (one.mean, one.sd, one.low, one.high) == (3.5, None, None, None)


def test_the_difference_is_paired_by_seed():
    baseline = {0: 3.0, 1: 5.0, 2: 4.0}
    variant = {0: 2.0, 1: 3.0, 2: 4.0}  # differences -1, -2, 0: mean -1, sd 1
    iv = paired_difference(variant, baseline, 0.95)
    half = 4.302652729749464 / math.sqrt(3)
    assert iv.mean == -1.0 and iv.sd == 1.0
    assert (iv.low, iv.high) == (pytest.approx(-1 - half, abs=1e-12), pytest.approx(-1 + half, abs=1e-12))
    # a variant better by 0.5 on every seed: certain once paired, though each mean spreads by seed
    shifted = paired_difference({s: v - 0.5 for s, v in baseline.items()}, baseline, 0.95)
    assert (shifted.mean, shifted.low, shifted.high) == (-0.5, -0.5, -0.5)
    assert paired_difference({5: 1.0}, baseline, 0.95) is None


def test_a_wider_confidence_gives_a_wider_interval():
    values = [0.1, 0.4, 0.35, 0.2]
    assert t_interval(values, 0.99).high > t_interval(values, 0.95).high > t_interval(values, 0.8).high
