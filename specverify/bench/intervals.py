"""Latency summaries and speedup intervals of a paired, interleaved benchmark.

A benchmark runs the speculative configuration and its baseline in alternating rounds (A B B A
A B ...), so that a shared machine's drift -- another job, thermal state, a cache warming up --
falls on both arms alike.  Round ``i`` of one arm and round ``i`` of the other form a *pair*;
every speedup is a ratio of two statistics over the same pairs, and its confidence interval is
the percentile interval of the *paired bootstrap*: the pairs are resampled with replacement
(both arms' rounds of a pair together, which keeps the drift they share), the ratio recomputed
on each resample (Efron & Tibshirani 1993, ch. 13).  With few pairs the plain percentile
interval is too narrow (the bootstrap distribution's spread is that of an n-divisor standard
deviation, and a normal quantile stands where a t quantile belongs): 12 pairs gave a 90% interval
covering 0.80 of the time.  So the interval is Hesterberg's *expanded percentile* interval
(Hesterberg 2015, "What teachers should know about the bootstrap", The American Statistician
69(4), sec. 6.3): the tail quantiles are taken at ``Phi(-sqrt(n / (n - 1)) t_{n-1, 1-a/2})``
instead of ``a / 2``.  Percentiles are numpy's linear interpolation; every sum is float64; the
report states the number of pairs beside every interval.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import scipy.stats
import torch

from specverify.core.errors import InvalidArgument
from specverify.core.validation import check_int

__all__ = ["Interval", "paired_bootstrap", "percentile", "QUANTILES"]

#: The latency quantiles every summary states (p50, p90, p99).
QUANTILES = (50, 90, 99)


@dataclass(frozen=True)
class Interval:
    """An estimate and its bootstrap confidence interval (``pairs`` resampled, ``level`` coverage)."""

    estimate: float
    low: float
    high: float
    level: float
    pairs: int

    def covers(self, value: float) -> bool:
        return self.low <= value <= self.high

    def as_dict(self) -> dict:
        return {"estimate": self.estimate, "low": self.low, "high": self.high, "level": self.level, "pairs": self.pairs}

    def text(self, digits: int = 2) -> str:
        return f"{self.estimate:.{digits}f} [{self.low:.{digits}f}, {self.high:.{digits}f}]"


def percentile(values: Sequence[float] | np.ndarray, q: float) -> float:
    """The ``q``-th percentile (0-100, linear interpolation) of ``values`` in float64; nan when empty."""
    data = np.asarray(values, dtype=np.float64)
    return float(np.percentile(data, q)) if data.size else float("nan")


def expanded_tail(pairs: int, level: float) -> float:
    """The lower quantile of the expanded percentile interval: ``Phi(-sqrt(n / (n - 1)) t_{n-1, (1+level)/2})``."""
    t = scipy.stats.t.ppf((1 + level) / 2, pairs - 1)
    return float(scipy.stats.norm.cdf(-math.sqrt(pairs / (pairs - 1)) * t))


def paired_bootstrap(
    pairs: int,
    statistic: Callable[[np.ndarray], float],
    *,
    generator: torch.Generator,
    resamples: int = 2000,
    level: float = 0.95,
) -> Interval:
    """The paired bootstrap's percentile interval of ``statistic`` over ``pairs`` rounds.

    Parameters
    ----------
    pairs : int
        Number of paired rounds (>= 2).
    statistic : callable
        ``statistic(indices)`` -> float, computed on the pairs ``indices`` (an int array, with
        repeats in a resample); ``statistic(arange(pairs))`` is the estimate.
    generator : torch.Generator
        Draws the resamples (the interval is a function of the data and the generator's seed).
    resamples : int
        Bootstrap resamples (>= 100).
    level : float
        Coverage of the two-sided interval, in (0, 1).

    Returns
    -------
    Interval
        The estimate on all pairs, and the quantiles ``q`` and ``1 - q`` of the resampled
        statistic, ``q`` = :func:`expanded_tail` (resamples whose statistic is not finite are
        dropped; none finite gives a nan interval).
    """
    pairs = check_int("pairs", pairs, minimum=2)
    resamples = check_int("resamples", resamples, minimum=100)
    if not 0 < level < 1:
        raise InvalidArgument(f"level must be in (0, 1), got {level!r}")
    estimate = float(statistic(np.arange(pairs)))
    draws = torch.randint(0, pairs, (resamples, pairs), generator=generator).numpy()  # (R, pairs)
    values = np.array([statistic(row) for row in draws], dtype=np.float64)  # (R,)
    values = values[np.isfinite(values)]
    if not values.size:
        return Interval(estimate, float("nan"), float("nan"), level, pairs)
    tail = expanded_tail(pairs, level)
    low, high = np.quantile(values, [tail, 1 - tail])
    return Interval(estimate, float(low), float(high), level, pairs)
