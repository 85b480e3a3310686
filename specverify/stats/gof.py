"""One-sample goodness of fit against exact probabilities, and the support test.

``gof_test`` pools tokens into bins fixed from p and N (:mod:`.binning`) and
compares observed with expected bin counts with the Cressie-Read lambda = 2/3
statistic against chi-square(bins - 1).  ``support_test`` is the separate, exact
check that no token of probability zero was emitted.

References: N. Cressie and T. R. C. Read, JRSS B 46 (1984); T. R. C. Read and
N. Cressie, *Goodness-of-Fit Statistics for Discrete Multivariate Data* (1988).
"""

from __future__ import annotations

import math

import numpy as np
from scipy import stats as _st

from specverify.core.errors import InvalidArgument
from specverify.core.results import TestResult

from ._common import as_counts, as_float_array, check_alpha, cressie_read, cressie_read_terms, result_options
from .binning import Bins, bin_counts, make_bins
from .power import min_detectable_tv

__all__ = ["gof_test", "support_test", "binned_details"]

#: Bins with at most this many tokens list their token ids in ``details``.
SMALL_BIN = 8


def _pair(counts, expected_probs, counts_name="counts", probs_name="expected_probs"):
    counts = as_counts(counts_name, counts)
    weights = as_float_array(probs_name, expected_probs, ndim=1, nonneg=True)
    if weights.shape != counts.shape:
        raise InvalidArgument(
            f"{counts_name} and {probs_name} must have the same shape (V,), got {counts.shape} and {weights.shape}"
        )
    if weights.size == 0 or weights.sum() <= 0:
        raise InvalidArgument(
            f"{probs_name} must have a positive sum, got {weights.sum() if weights.size else 'empty'}"
        )
    return counts, weights


def binned_details(
    bins: Bins, observed: np.ndarray, expected: np.ndarray, contributions: np.ndarray | None = None
) -> dict:
    """Per-bin observed/expected counts, token ids of small bins, the worst bins."""
    details = {
        "observed": observed.astype(np.float64).tolist(),
        "expected": expected.tolist(),
        "tokens_per_bin": bins.tokens_per_bin.tolist(),
    }
    small = {}
    order_ids = np.argsort(bins.token_to_bin, kind="stable")
    sorted_bins = bins.token_to_bin[order_ids]
    first = np.searchsorted(sorted_bins, np.arange(bins.num_bins), side="left")
    last = np.searchsorted(sorted_bins, np.arange(bins.num_bins), side="right")
    for b in range(bins.num_bins):
        if bins.tokens_per_bin[b] <= SMALL_BIN:
            small[b] = order_ids[first[b] : last[b]].tolist()
    details["bin_tokens"] = small
    if contributions is not None and contributions.size:
        worst = np.argsort(-contributions, kind="stable")[:5]
        details["worst_bins"] = [
            {
                "bin": int(b),
                "observed": float(observed[b]),
                "expected": float(expected[b]),
                "tokens": small.get(int(b), f"{int(bins.tokens_per_bin[b])} tokens"),
            }
            for b in worst
        ]
    return details


def gof_test(
    counts,
    expected_probs,
    *,
    e_min: float = 20.0,
    alpha: float = 1e-3,
    power: float = 0.9,
    name: str = "gof",
    family: str = "gof",
    scenario: str = "",
    position: str = "",
) -> TestResult:
    """Cressie-Read (lambda = 2/3) goodness of fit of token counts to exact probabilities.

    Parameters
    ----------
    counts : array (V,)
        Observed count of each token.
    expected_probs : array (V,)
        Exact probabilities, or any non-negative weights proportional to the expected
        counts (renormalised in float64).  Tokens with weight 0 are ignored here
        (their counts are dropped; :func:`support_test` covers them).
    e_min : float, default 20
        Minimum expected count per bin (see :func:`make_bins`).
    alpha : float, default 1e-3
        Level at which ``mde_tv`` is reported (the test itself only returns a p-value).
    power : float, default 0.9
        Power at which ``mde_tv`` is reported.
    name, family, scenario, position : str
        Labels copied into the result.

    Returns
    -------
    TestResult
        ``statistic`` the Cressie-Read statistic, ``pvalue`` from chi-square(bins - 1),
        ``df``, ``bins``, ``multi_token_mass``, ``mde_tv``; ``details`` holds observed and
        expected counts per bin, token ids of bins with <= 8 tokens and the 5 bins
        contributing most to the statistic.

    Notes
    -----
    Valid (asymptotically, chi-square reference) when the counts are multinomial with
    fixed total N and probabilities ``expected_probs``: the bins depend only on
    ``expected_probs`` and N, never on the observed counts, and every bin has an
    expected count >= ``e_min`` (20 by default, where the chi-square approximation of
    Cressie-Read lambda = 2/3 is accurate far into the tail).

    ``expected_probs`` may be an unnormalised sum of per-sample conditionals
    ``sum_t p(. | context_t)`` (counts pooled over contexts, e.g. one position of many
    sequences).  The counts are then a sum of independent multinomials with different
    probabilities (Poisson-binomial per bin), whose covariance is smaller than that of
    one multinomial with the averaged probabilities; the test is then conservative
    (p-values stochastically larger than uniform) but valid.

    With a single bin (a one-hot law, or N too small to form two bins) the statistic
    is 0 and the p-value 1: the test has no power, which ``method`` says and ``mde_tv``
    (``inf``) reflects.

    ``mde_tv`` is ``sqrt(lambda* / (4 N))``, the binned TV of the deviation whose
    noncentrality reaches ``lambda*`` when spread evenly over the bins; it is tight for
    concentrated deviations and for few bins.  A deviation that takes a little mass from
    each of hundreds of low-count tail bins is harder: the chi-square is biased there
    (its mean falls by about the sum of the relative mass changes), and on Zipf over 32k
    tokens with ~900 bins the worst such deviation at the reported ``mde_tv`` was caught
    about 70% of the time rather than 90% (``tests/stats``, an expected-failure test).
    """
    opts = result_options(name, scenario, position)
    alpha = check_alpha("alpha", alpha)
    counts, weights = _pair(counts, expected_probs)
    support = weights > 0
    n = int(counts[support].sum())
    bins = make_bins(weights, n, e_min=e_min)
    nb = bins.num_bins
    observed = bin_counts(bins, counts)
    expected = n * bins.bin_probs
    common = dict(opts, family=family, n=n, bins=nb, multi_token_mass=bins.multi_token_mass)
    dropped = int(counts[~support].sum())
    if n == 0 or nb < 2:
        why = "no samples" if n == 0 else "a single bin (one-hot law or N too small to form two bins)"
        details = binned_details(bins, observed, expected)
        details.update(mde_n=n, e_min=bins.e_min, dropped_zero_prob=dropped)
        return TestResult(
            statistic=0.0,
            pvalue=1.0,
            method=f"Cressie-Read lambda=2/3 goodness of fit: {why}; statistic 0, p-value 1, no power",
            df=0,
            mde_tv=math.inf,
            details=details,
            **common,
        )
    stat = cressie_read(observed, expected)
    df = nb - 1
    pvalue = float(_st.chi2.sf(stat, df))
    details = binned_details(bins, observed, expected, cressie_read_terms(observed, expected))
    details.update(mde_n=n, e_min=bins.e_min, dropped_zero_prob=dropped, power=power)
    return TestResult(
        statistic=stat,
        pvalue=pvalue,
        method=(
            f"Cressie-Read lambda=2/3 on {nb} bins fixed from p and N (singletons where N p >= {bins.e_min:g}, "
            f"p-ordered tail bins of expected >= {bins.e_min:g}); chi-square({df}) reference"
        ),
        df=df,
        mde_tv=min_detectable_tv(n, df, alpha, power),
        details=details,
        **common,
    )


def support_test(
    counts,
    expected_probs,
    *,
    name: str = "support",
    family: str = "support",
    scenario: str = "",
    position: str = "",
) -> TestResult:
    """Exact check that no token of probability zero was observed.

    Parameters
    ----------
    counts : array (V,)
        Observed count of each token.
    expected_probs : array (V,)
        Exact probabilities or non-negative weights; only their zero pattern matters.

    Returns
    -------
    TestResult
        ``pvalue`` 0.0 (a certain failure) if any token with probability 0 was observed,
        else 1.0; ``statistic`` the number of such observations; ``details["tokens"]``
        the offending token ids (up to 100) and ``details["counts"]`` their counts;
        ``details["mde_mass"]`` the mass on ids of probability 0 (padding ids, truncated
        tokens) seen at least once with probability 0.9, ``1 - 0.1^(1/N)`` (any alpha).

    Notes
    -----
    Always valid: under H0 a zero-probability token is never emitted.  Pass exact
    zeros (e.g. from top-k / top-p truncation); a float32 underflow to 0 of a token
    with tiny but positive probability would make a correct implementation fail.
    """
    opts = result_options(name, scenario, position)
    counts, weights = _pair(counts, expected_probs)
    bad = np.flatnonzero((weights <= 0) & (counts > 0))
    n = int(counts.sum())
    hits = int(counts[bad].sum())
    details = {
        "tokens": bad[:100].tolist(),
        "counts": counts[bad[:100]].tolist(),
        "num_tokens": int(bad.size),
        "zero_prob_tokens": int(np.count_nonzero(weights <= 0)),
        # mass m on ids of probability 0 shows in n tokens unless all miss it: (1 - m)^n <= 0.1
        "mde_mass": float(-math.expm1(math.log(0.1) / n)) if n else math.inf,
    }
    method = "support: observed tokens with probability exactly 0 (exact; any is a certain failure)"
    return TestResult(
        statistic=float(hits),
        pvalue=0.0 if hits else 1.0,
        method=method,
        family=family,
        n=n,
        details=details,
        **opts,
    )
