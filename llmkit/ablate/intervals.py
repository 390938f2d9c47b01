"""Confidence intervals over seeds: Student's t, computed here (no scipy).

A variant's mean over its seeds is given with the t-interval mean ± t(1 − α/2, n − 1) · s / √n
(s the sample standard deviation). Its difference to the baseline is paired by seed — the same
seed draws the same initial weights and data order in both runs, so the per-seed differences
carry less noise than two independent means — and gets the same interval over those differences.
One seed gives a mean without an interval.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class Interval:
    n: int
    mean: float
    sd: float | None  # sample standard deviation (n − 1); None for one value
    low: float | None
    high: float | None

    def record(self) -> dict:
        return asdict(self)


def _beta_fraction(a: float, b: float, x: float) -> float:
    """The continued fraction of the regularized incomplete beta function (modified Lentz)."""
    tiny, c, d = 1e-300, 1.0, 1.0 - (a + b) * x / (a + 1)
    d = 1 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 400):
        for num in (m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
                    -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))):
            d = 1 + num * d
            d = 1 / (d if abs(d) > tiny else tiny)
            c = 1 + num / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1) < 1e-16:
            break
    return h


def incomplete_beta(a: float, b: float, x: float) -> float:
    """I_x(a, b), the regularized incomplete beta function."""
    if x <= 0 or x >= 1:
        return 0.0 if x <= 0 else 1.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1) / (a + b + 2):
        return front * _beta_fraction(a, b, x) / a
    return 1 - front * _beta_fraction(b, a, 1 - x) / b


def t_cdf(t: float, df: int) -> float:
    """P(T <= t) for Student's t with `df` degrees of freedom."""
    tail = 0.5 * incomplete_beta(df / 2, 0.5, df / (df + t * t))
    return 1 - tail if t >= 0 else tail


def t_quantile(p: float, df: int) -> float:
    """The t with P(T <= t) = p (bisection on the CDF, to about 1e-13)."""
    if not 0 < p < 1 or df < 1:
        raise ValueError(f"t_quantile needs 0 < p < 1 and df >= 1, got p={p}, df={df}")
    if p < 0.5:
        return -t_quantile(1 - p, df)
    low, high = 0.0, 1.0
    while t_cdf(high, df) < p:
        high *= 2
    for _ in range(200):
        mid = (low + high) / 2
        low, high = (mid, high) if t_cdf(mid, df) < p else (low, mid)
        if high - low < 1e-13 * max(1.0, high):
            break
    return (low + high) / 2


def t_interval(values: list[float], confidence: float) -> Interval:
    """The mean of `values` and its two-sided t-interval at `confidence`."""
    n = len(values)
    if n == 0:
        raise ValueError("t_interval of no values")
    mean = math.fsum(values) / n
    if n == 1:
        return Interval(1, mean, None, None, None)
    sd = math.sqrt(math.fsum((v - mean) ** 2 for v in values) / (n - 1))
    half = t_quantile((1 + confidence) / 2, n - 1) * sd / math.sqrt(n)
    return Interval(n, mean, sd, mean - half, mean + half)


def paired_difference(variant: dict[int, float], baseline: dict[int, float], confidence: float) -> Interval | None:
    """variant − baseline over the seeds both have (seed -> value), with its t-interval; None
    without a common seed."""
    seeds = [s for s in variant if s in baseline]
    if not seeds:
        return None
    return t_interval([variant[s] - baseline[s] for s in seeds], confidence)
