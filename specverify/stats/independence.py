"""Independence of the rows of one batch: within-batch collision counts.

If the n rows of a batch are i.i.d. draws from p, the number of colliding pairs
C = sum_{i<j} 1[x_i = x_j] has mean C(n,2) s2 and variance

    Var C = C(n,2) (s2 - s2^2) + n (n-1) (n-2) (s3 - s2^2),

with s2 = sum p^2, s3 = sum p^3.  Derivation: Var C = sum over ordered pairs of
pairs of Cov(Y_ij, Y_kl) with Y_ij = 1[x_i = x_j].  A pair with itself gives
Var Y = s2 - s2^2 (C(n,2) terms); two pairs sharing exactly one index, {i,j} and
{i,k}, give Cov = P(x_i = x_j = x_k) - s2^2 = s3 - s2^2, and there are n (n-1) (n-2)
such ordered couples (n choices of the shared index, (n-1)(n-2) ordered others);
disjoint pairs are independent (Cov 0).  This is the Hoeffding decomposition of
the U-statistic C (Hoeffding 1948).  Batches are independent, so means and
variances add.  Shared randomness between rows (a common seed, a common uniform)
makes collisions too frequent; anti-correlated schemes (stratified sampling across
rows) make them too rare: the test is two-sided.

References: W. Hoeffding, "A class of statistics with asymptotically normal
distribution", Ann. Math. Statist. 19 (1948); O. Goldreich and D. Ron, "On testing
expansion in bounded-degree graphs" (2000) (collision statistics).
"""

from __future__ import annotations

import math

import numpy as np
from scipy import stats as _st

from specverify.core.errors import InvalidArgument
from specverify.core.results import TestResult

from ._common import as_float_array, as_probs, check_alpha, result_options

__all__ = ["collision_test", "collision_moments"]


def collision_moments(probs, n: int) -> tuple[float, float]:
    """Exact mean and variance of the collision count of one batch of ``n`` i.i.d. draws."""
    p = as_probs("probs", probs)
    s2 = float(np.sum(p * p))
    s3 = float(np.sum(p * p * p))
    pairs = n * (n - 1) / 2.0
    mean = pairs * s2
    var = pairs * (s2 - s2 * s2) + n * (n - 1) * (n - 2) * (s3 - s2 * s2)
    return mean, max(var, 0.0)


def collision_test(
    tokens,
    probs,
    *,
    alpha: float = 1e-3,
    power: float = 0.9,
    name: str = "collisions",
    family: str = "independence",
    scenario: str = "",
    position: str = "",
) -> TestResult:
    """Two-sided z-test of within-batch collision counts against their exact null moments.

    Parameters
    ----------
    tokens : array (n_batches, n)
        Tokens of each batch (rows of one batch drawn from the same law ``probs``).
    probs : array (V,)
        The exact law of every token.

    Returns
    -------
    TestResult
        ``statistic`` z = (C - E C) / sqrt(Var C) over all batches, ``pvalue`` two-sided
        normal; ``details``: observed and expected collisions, variance, s2, s3 and the
        relative collision excess detectable with probability ``power``.

    Notes
    -----
    Valid (normal approximation) when the total expected number of collisions and its
    variance are large (>= ~20): many batches, or n^2 s2 large.  With zero variance
    (n < 2, or a one-hot law) the count is deterministic: any deviation is a certain
    failure.  Tokens of probability 0 are a support failure (tested elsewhere); they
    are counted like any other token here.
    """
    opts = result_options(name, scenario, position)
    alpha = check_alpha("alpha", alpha)
    tok = as_float_array("tokens", tokens, ndim=2)
    p = as_probs("probs", probs)
    V = p.shape[0]
    if np.any(tok != np.floor(tok)) or np.any((tok < 0) | (tok >= V)):
        i = np.unravel_index(int(np.flatnonzero((tok != np.floor(tok)) | (tok < 0) | (tok >= V))[0]), tok.shape)
        raise InvalidArgument(f"tokens[{i[0]}, {i[1]}] is {tok[i]}, not a token id in [0, {V})")
    tok = tok.astype(np.int64)
    n_batches, n = tok.shape
    # per batch: sum_v C(count_v, 2), via the counts of (batch, token) pairs
    keys = (np.arange(n_batches, dtype=np.int64)[:, None] * V + tok).ravel()  # (n_batches * n,)
    _, mult = np.unique(keys, return_counts=True)
    observed = int(np.sum(mult * (mult - 1) // 2))
    mean1, var1 = collision_moments(p, n)
    mean, var = n_batches * mean1, n_batches * var1
    s2 = float(np.sum(p * p))
    details = {
        "observed": observed,
        "expected": mean,
        "variance": var,
        "batches": n_batches,
        "batch_size": n,
        "sum_p2": s2,
        "sum_p3": float(np.sum(p**3)),
    }
    base = dict(opts, family=family, n=n_batches * n)
    if var <= 0:
        ok = abs(observed - mean) < 0.5
        return TestResult(
            statistic=0.0 if ok else math.copysign(math.inf, observed - mean),
            pvalue=1.0 if ok else 0.0,
            method="collision count: deterministic under H0 (zero variance); "
            + ("as expected" if ok else "deviation: certain failure"),
            details=details,
            **base,
        )
    z = (observed - mean) / math.sqrt(var)
    details["mde_relative_excess"] = (
        (float(_st.norm.isf(alpha / 2)) + float(_st.norm.isf(1 - power))) * math.sqrt(var) / mean
        if mean > 0
        else math.inf
    )
    return TestResult(
        statistic=z,
        pvalue=float(min(1.0, 2.0 * _st.norm.sf(abs(z)))),
        method="within-batch collision count vs exact mean C(n,2) sum p^2 and variance (Hoeffding), two-sided normal",
        details=details,
        **base,
    )
