"""Power of chi-square-type tests: the minimum detectable binned total-variation distance.

A binned test with B bins and N samples rejects when its statistic exceeds
``chi2.isf(alpha, B - 1)``.  Under a local alternative q close to p the Pearson and
Cressie-Read statistics are approximately noncentral chi-square with ``df = B - 1``
and noncentrality ``lam = N * chi2div(q, p) = N * sum (q_b - p_b)^2 / p_b`` (Cochran
1952; Cressie & Read 1984, sec. 4).  By Cauchy-Schwarz

    TV(q, p) = 1/2 sum |q_b - p_b| <= 1/2 sqrt(chi2div(q, p)),

so every deviation with binned TV >= t has ``lam >= 4 N t^2``.  With ``lam*`` solving
``P(ncx2(df, lam*) > chi2.isf(alpha, df)) = power`` the test therefore has (asymptotic)
power >= ``power`` against every deviation whose binned TV is at least

    mde_tv = sqrt(lam* / (4 N)),

with equality for the least favourable deviation (q_b - p_b proportional to +-p_b on
two halves of the mass).  ``samples_needed`` inverts this.

References: W. G. Cochran, "The chi-square test of goodness of fit", Ann. Math.
Statist. 23 (1952); N. Cressie and T. R. C. Read (1984).
"""

from __future__ import annotations

import functools
import math

from scipy import optimize
from scipy import stats as _st

from specverify.core.errors import InvalidArgument

from ._common import check_alpha

__all__ = ["noncentrality_needed", "min_detectable_tv", "samples_needed"]


def _check_df(df) -> float:
    try:
        df = float(df)
    except (TypeError, ValueError):
        raise InvalidArgument(f"df must be a positive number, got {df!r}") from None
    if not (math.isfinite(df) and df > 0):
        raise InvalidArgument(f"df must be a positive finite number, got {df!r}")
    return df


@functools.lru_cache(maxsize=4096)
def _lam_star(df: float, alpha: float, power: float) -> float:
    crit = _st.chi2.isf(alpha, df)
    if _st.chi2.sf(crit, df) >= power:  # alpha >= power: no shift needed
        return 0.0

    def gap(lam: float) -> float:
        return _st.ncx2.sf(crit, df, lam) - power

    hi = max(1.0, crit)
    while gap(hi) < 0:
        hi *= 2.0
    return float(optimize.brentq(gap, 0.0, hi, xtol=1e-10, rtol=1e-12))


def noncentrality_needed(df, alpha, power: float = 0.9) -> float:
    """Noncentrality ``lam*`` with ``P(ncx2(df, lam*) > chi2.isf(alpha, df)) = power``.

    Parameters
    ----------
    df : float
        Degrees of freedom (> 0), ``bins - 1`` for a binned test.
    alpha : float
        Level of the test, in (0, 1).
    power : float
        Target power, in (0, 1).
    """
    return _lam_star(_check_df(df), check_alpha("alpha", alpha), check_alpha("power", power))


def min_detectable_tv(n, df, alpha, power: float = 0.9) -> float:
    """Minimum binned TV distance detectable with probability ``power``.

    Parameters
    ----------
    n : float
        Number of samples (an effective number ``n m / (n + m)`` for two-sample tests).
    df : float
        Degrees of freedom of the chi-square reference (bins - 1).
    alpha : float
        Level at which the test is run.
    power : float, default 0.9
        Required power.

    Returns
    -------
    float
        ``sqrt(lam* / (4 n))``; ``inf`` when ``n == 0``.  May exceed 1 (then no
        deviation is reliably detectable).

    Notes
    -----
    Valid for the local (small-deviation) noncentral chi-square approximation of a
    binned Pearson/Cressie-Read statistic with expected counts >= ~5-20 per bin.
    """
    try:
        n = float(n)
    except (TypeError, ValueError):
        raise InvalidArgument(f"n must be a non-negative number, got {n!r}") from None
    if not (math.isfinite(n) and n >= 0):
        raise InvalidArgument(f"n must be a non-negative finite number, got {n!r}")
    lam = noncentrality_needed(df, alpha, power)
    if n == 0:
        return math.inf
    return math.sqrt(lam / (4.0 * n))


def samples_needed(tv, df, alpha, power: float = 0.9) -> int:
    """Samples a binned test needs to detect a binned TV of ``tv`` with probability ``power``.

    The inverse of :func:`min_detectable_tv`: ``ceil(lam* / (4 tv^2))``.  For a
    deviation that is not least favourable, ``lam* / (N chi2div)`` samples suffice
    (use :func:`noncentrality_needed` with the deviation's chi-square divergence).
    """
    try:
        tv = float(tv)
    except (TypeError, ValueError):
        raise InvalidArgument(f"tv must be a number in (0, 1], got {tv!r}") from None
    if not (0.0 < tv <= 1.0):
        raise InvalidArgument(f"tv must be in (0, 1], got {tv!r}")
    lam = noncentrality_needed(df, alpha, power)
    return max(1, int(math.ceil(lam / (4.0 * tv * tv) - 1e-9)))


def z_shift(alpha: float, power: float) -> float:
    """``z_{1-alpha/2} + z_power``: the mean shift, in standard deviations, a two-sided z-test detects with ``power``."""
    return float(_st.norm.isf(alpha / 2)) + float(_st.norm.isf(1 - power))
