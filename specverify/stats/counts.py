"""Counts of events with exact per-trial probabilities: accepted drafts, tokens in a set.

Each trial i is an independent Bernoulli(pi_i) event given the past (a draft accepted with
probability ``sum_x min(p(x), q(x))``; an emitted token falling in a set S chosen from the laws
alone, with probability ``p_i(S)``), so the count is Poisson-binomial under H0.

* :func:`acceptance_test`: accepted drafts against the exact acceptance probabilities.
* :func:`set_mass_test`: emitted tokens in a set fixed by the laws before the tokens are looked
  at -- the tail beyond a law's head, the ids outside a reduced draft vocabulary -- against the
  exact mass of that set.  A deviation that moves mass ``d`` into or out of the set is a binned
  total-variation distance of ``d`` over the two bins (the set, the rest); the test states the
  ``d`` it detects at power 0.9 (``mde_tv``).

p-values: all probabilities 0 or 1: deterministic, any deviation is a certain failure (p = 0);
all equal: exact binomial (scipy ``binomtest``, two-sided "minlike"); at most 20000
non-degenerate trials or variance < 100: the exact Poisson-binomial pmf by convolution,
two-sided "minlike" (the probabilities of outcomes no more likely than the observed); otherwise
Hong's refined normal approximation with continuity and skewness correction (error
O(1/variance)), doubled smaller tail.

References: Y. Hong, "On computing the distribution function for the Poisson binomial
distribution", CSDA 59 (2013) (refined normal approximation).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from scipy import stats as _st
from scipy.special import gammaln

from specverify.core.errors import InvalidArgument
from specverify.core.results import TestResult

from ._common import as_float_array, check_alpha, result_options
from .power import z_shift

__all__ = ["acceptance_test", "set_mass_test", "MASS_KEY"]

#: ``details`` key of a set-mass test's detectable shift of the set's mass (its two-bin TV,
#: recomputed at the allocated alpha by :func:`specverify.stats.grade`, which also sets ``mde_tv``).
MASS_KEY = "mde_mass"


def _poisson_binomial_pmf(probs: np.ndarray) -> tuple[int, np.ndarray]:
    """(offset, pmf) of a Poisson-binomial, tails below 1e-30 trimmed as it is built."""
    pmf = np.ones(1)
    offset = 0
    for p in probs:
        nxt = np.empty(pmf.size + 1)
        nxt[:-1] = pmf * (1.0 - p)
        nxt[-1] = 0.0
        nxt[1:] += pmf * p
        lo = 0
        while lo < nxt.size - 1 and nxt[lo] < 1e-30:
            lo += 1
        hi = nxt.size
        while hi > lo + 1 and nxt[hi - 1] < 1e-30:
            hi -= 1
        pmf = nxt[lo:hi]
        offset += lo
    return offset, pmf


def _binomial_minlike(k: int, n: int, p: float) -> float:
    """Two-sided "minlike" p-value of k successes in n Binomial(n, p) trials, 0 < p < 1.

    scipy's ``binomtest``; where it overflows (SciPy 1.17's boost ``ibeta_derivative`` does for
    some p just above the smallest normal float64, e.g. 4.45e-308 with n = 95, but not for
    1e-300 or the subnormal 1e-310), the same sum from the log-pmf of every outcome, with
    binomtest's relative tolerance of 1e-7 for outcomes as likely as the observed one.
    """
    try:
        return float(_st.binomtest(k, n, p).pvalue)
    except OverflowError:
        j = np.arange(n + 1)
        log_pmf = gammaln(n + 1) - gammaln(j + 1) - gammaln(n - j + 1) + j * math.log(p) + (n - j) * math.log1p(-p)
        pmf = np.exp(log_pmf)  # (n+1,)
        return float(min(1.0, pmf[log_pmf <= log_pmf[k] + math.log1p(1e-7)].sum()))


def _count_law(k: int, probs: np.ndarray, alpha: float, power: float) -> tuple[float, float, str, dict[str, Any]]:
    """(z, two-sided p-value, method, details) of ``k`` events in Bernoulli trials of exact ``probs``.

    ``details`` holds the observed and expected counts and rates, the variance and ``mde_rate``
    (the shift of the mean per-trial probability detected with ``power`` at ``alpha``, normal
    approximation) and its ``mde_per_z``.
    """
    m = int(probs.size)
    mu = float(probs.sum())
    var = float((probs * (1 - probs)).sum())
    sd = math.sqrt(var)
    z = (k - mu) / sd if sd > 0 else (0.0 if abs(k - mu) < 0.5 else math.copysign(math.inf, k - mu))
    details: dict[str, Any] = {
        "observed": k,
        "expected": mu,
        "variance": var,
        "trials": m,
        "observed_rate": k / m if m else math.nan,
        "expected_rate": mu / m if m else math.nan,
    }
    sure = (probs == 0) | (probs == 1)
    fixed = int(np.count_nonzero(probs == 1))
    free = probs[~sure]
    kk = k - fixed
    if free.size == 0:
        ok = kk == 0
        pvalue, how = (1.0 if ok else 0.0), "deterministic (all probabilities 0 or 1): any deviation is certain failure"
    elif kk < 0 or kk > free.size:
        pvalue, how = 0.0, "impossible count given the trials with probability 0 or 1: certain failure"
    elif np.all(free == free[0]):
        pvalue = _binomial_minlike(kk, free.size, float(free[0]))
        how = "exact binomial (equal probabilities), two-sided minlike"
    elif free.size <= 20000 or var < 100:
        offset, pmf = _poisson_binomial_pmf(free)
        i = kk - offset
        pk = pmf[i] if 0 <= i < pmf.size else 0.0
        pvalue = float(min(1.0, pmf[pmf <= pk * (1 + 1e-7)].sum())) if pk > 0 else 0.0
        how = "exact Poisson-binomial (convolution), two-sided minlike"
    else:
        gamma = float((free * (1 - free) * (1 - 2 * free)).sum()) / var**1.5

        def cdf(x):  # refined normal approximation of P(X <= x)
            t = (x + 0.5 - mu) / sd
            return min(1.0, max(0.0, float(_st.norm.cdf(t) + gamma * (1 - t * t) * _st.norm.pdf(t) / 6)))

        lower, upper = cdf(k), 1.0 - cdf(k - 1)
        pvalue = min(1.0, 2.0 * min(lower, upper))
        how = "refined normal approximation (Hong 2013) with continuity and skewness correction, doubled tail"
    per_z = math.sqrt(var) / m if m else math.inf
    details["mde_per_z"] = per_z
    details["mde_rate"] = z_shift(alpha, power) * per_z
    return float(z), float(pvalue), how, details


def _check_count(name: str, value, trials: int) -> int:
    try:
        k = int(value)
        if k != float(value) or k < 0:
            raise ValueError
    except (TypeError, ValueError):
        raise InvalidArgument(f"{name} must be a non-negative integer, got {value!r}") from None
    if k > trials:
        raise InvalidArgument(f"{name} is {k}, more than the {trials} trials")
    return k


def _check_trial_probs(name: str, value) -> np.ndarray:
    probs = as_float_array(name, value, ndim=1, nonneg=True)
    if np.any(probs > 1 + 1e-9):
        i = int(np.flatnonzero(probs > 1 + 1e-9)[0])
        raise InvalidArgument(f"{name}[{i}] is {probs[i]} (must be in [0, 1])")
    return np.clip(probs, 0.0, 1.0)


def acceptance_test(
    num_accepted,
    accept_probs,
    *,
    alpha: float = 1e-3,
    power: float = 0.9,
    name: str = "acceptance",
    family: str = "acceptance",
    scenario: str = "",
    position: str = "",
) -> TestResult:
    """Observed number of accepted drafts vs the exact per-trial acceptance probabilities.

    Parameters
    ----------
    num_accepted : int
        Accepted drafts over all trials.
    accept_probs : array (trials,)
        Exact acceptance probability of each trial, ``sum_x min(p(x), q(x))``.
    alpha, power : float
        Level and power at which ``mde_rate`` is stated.

    Returns
    -------
    TestResult
        ``statistic`` the standardised deviation (k - mu) / sigma, ``pvalue`` two-sided.
        ``details``: observed, expected, variance, the method used and
        ``mde_rate`` (acceptance-rate shift detectable with probability ``power``).

    Notes
    -----
    The count is Poisson-binomial (independent trials); the p-value is exact or Hong's
    refined normal approximation (module docstring).
    """
    opts = result_options(name, scenario, position)
    alpha = check_alpha("alpha", alpha)
    probs = _check_trial_probs("accept_probs", accept_probs)
    k = _check_count("num_accepted", num_accepted, probs.size)
    z, pvalue, how, details = _count_law(k, probs, alpha, power)
    details["method"] = how
    return TestResult(
        statistic=z,
        pvalue=pvalue,
        method=f"acceptance count vs Poisson-binomial of exact per-trial probabilities: {how}",
        family=family,
        n=int(probs.size),
        details=details,
        **opts,
    )


def set_mass_test(
    in_set,
    set_probs,
    *,
    label: str,
    alpha: float = 1e-3,
    power: float = 0.9,
    name: str = "set_mass",
    family: str = "directed",
    scenario: str = "",
    position: str = "",
) -> TestResult:
    """Emitted tokens that fell in a set chosen from the laws vs the set's exact mass.

    Parameters
    ----------
    in_set : array of bool (N,)
        Whether emitted token i is in its set ``S_i`` (the set of its context's law).
    set_probs : array (N,)
        Exact probability ``p_i(S_i)`` of that set under token i's law (float64 sums).
    label : str
        What the set is, for a reader (``"tail beyond each law's top 1,024"``).
    alpha, power : float
        Level and power at which the detectable mass shift is stated (regraded by the run's budget).

    Returns
    -------
    TestResult
        ``statistic`` (k - mu) / sigma with k tokens in their sets, ``pvalue`` two-sided
        (exact Poisson-binomial or Hong's approximation); ``mde_tv`` and ``details["mde_mass"]``
        the shift of the mean set mass detected with ``power``, which is the two-bin TV (the set,
        the rest) of such a deviation; ``details`` also holds the observed and expected counts.

    Notes
    -----
    Valid whenever each ``S_i`` is fixed by the laws alone (never by the tokens): given the
    past, token i is in ``S_i`` with probability exactly ``p_i(S_i)``, independently of the
    other tokens' indicators given theirs, so the count is Poisson-binomial under H0.
    """
    opts = result_options(name, scenario, position)
    alpha = check_alpha("alpha", alpha)
    probs = _check_trial_probs("set_probs", set_probs)
    flags = np.asarray(in_set)
    if flags.dtype != np.bool_ or flags.shape != probs.shape:
        raise InvalidArgument(
            f"in_set must be a boolean array of shape {probs.shape} (one flag per token), "
            f"got dtype {flags.dtype} and shape {flags.shape}"
        )
    k = int(np.count_nonzero(flags))
    z, pvalue, how, details = _count_law(k, probs, alpha, power)
    if np.any(flags & (probs == 0)):  # a token in a set of mass zero: impossible under H0
        pvalue, how = 0.0, "a token fell in a set of exact mass 0: certain failure"
    details.update(set=label, method=how, power=power, mde_key=MASS_KEY)
    details[MASS_KEY] = details["mde_rate"]
    return TestResult(
        statistic=z,
        pvalue=pvalue,
        method=f"tokens in {label} vs the Poisson-binomial of the set's exact mass per token: {how}",
        family=family,
        n=int(probs.size),
        mde_tv=float(details[MASS_KEY]),
        details=details,
        **opts,
    )
