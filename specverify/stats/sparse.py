"""A goodness-of-fit test strong against sparse deviations: the most extreme single token.

The binned chi-square spreads its power over every bin, so a little mass moved onto (or
off) one token needs 7-10x the samples of the likelihood-ratio limit
(``benchmarks/bench_stats.py``).  :func:`sparse_test` looks at each token's count alone:
the exact binomial tail of the most extreme token, corrected for the number of tokens
that could have produced a tail that small (a discrete Bonferroni bound in the manner of
Tarone 1990: a token whose most extreme count still has a larger tail cannot contribute).
It is meant to run *alongside* :func:`specverify.stats.gof.gof_test` on the same counts,
in the same error-budget family, so that smooth deviations keep the chi-square's power.

References: R. E. Tarone, "A modified Bonferroni method for discrete data", Biometrics 46
(1990) 515-522; W. Hoeffding, "On the distribution of the number of successes in
independent trials", Ann. Math. Statist. 27 (1956) 713-721 (Theorem 4); D. Donoho and
J. Jin, "Higher criticism for detecting sparse heterogeneous mixtures", Ann. Statist. 32
(2004) (the many-token analogue, not implemented here).
"""

from __future__ import annotations

import math

import numpy as np
from scipy import stats as _st

from specverify.core.errors import InvalidArgument
from specverify.core.results import TestResult

from ._common import as_counts, as_float_array, check_alpha, result_options
from .gof import gof_test

__all__ = ["gof_pair", "sparse_test", "token_tail_pvalues", "point_mass_mde"]


def token_tail_pvalues(counts: np.ndarray, probs: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Per-token upper and lower exact binomial tails, ``(upper (V,), lower (V,))``.

    ``upper = P(Bin(n, p) >= o)`` where ``o >= n p + 1``, else 1; ``lower = P(Bin(n, p) <= o)``
    where ``o <= n p - 1``, else 1.  The one-unit margin is what makes them valid for
    Poisson-binomial counts too (pooled contexts; Hoeffding 1956, Theorem 4).
    """
    mean = n * probs
    upper = np.ones_like(probs)
    lower = np.ones_like(probs)
    up = counts >= mean + 1
    low = counts <= mean - 1
    upper[up] = _st.binom.sf(counts[up] - 1, n, probs[up])
    lower[low] = _st.binom.cdf(counts[low], n, probs[low])
    return upper, lower


def _pair_weights(
    probs: np.ndarray, n: int, *, e_min: float, share: float, tilt: float
) -> tuple[np.ndarray, int, float]:
    """Bonferroni weight of each (token, side) pair, (S,), fixed from p and n (twice their sum is 1),
    the number of frequent tokens and the share they got.

    ``share`` goes to the tokens with ``n p >= e_min`` (where a small move is hard to see)
    in proportion to ``p**tilt``, the rest equally to the others (all of it to one group
    when the other is empty).
    """
    frequent = n * probs >= e_min  # (S,)
    nf, nr = int(frequent.sum()), int((~frequent).sum())
    share = share if nf and nr else (1.0 if nf else 0.0)
    tilted = np.where(frequent, probs**tilt, 0.0)  # (S,)
    rare = (1.0 - share) / (2 * max(nr, 1))
    weights = np.where(frequent, share * tilted / (2 * max(float(tilted.sum()), 1e-300)), rare)  # (S,)
    return weights, nf, share


def gof_pair(
    counts,
    expected_probs,
    *,
    alpha: float = 1e-3,
    name: str = "gof",
    family: str = "gof",
    scenario: str = "",
    position: str = "",
) -> list[TestResult]:
    """The chi-square (:func:`specverify.stats.gof.gof_test`) and :func:`sparse_test` of the same counts.

    The batteries run both wherever they test token counts against an exact law, in the
    same budget family, so the family's alpha is split over them: smooth deviations are
    the chi-square's, a little mass moved onto or off one token the sparse test's.  The
    sparse test's name is ``name`` with its ``gof`` suffix replaced by ``sparse``
    (``gof`` -> ``sparse``, ``declared_gof`` -> ``declared_sparse``).
    """
    stem = name[: -len("gof")] if name.endswith("gof") else f"{name}_"
    return [
        gof_test(counts, expected_probs, alpha=alpha, name=name, family=family, scenario=scenario, position=position),
        sparse_test(
            counts, expected_probs, alpha=alpha, name=f"{stem}sparse", family=family, scenario=scenario,
            position=position,
        ),
    ]  # fmt: skip


def point_mass_mde(n: int, top_prob: float, top_weight: float, alpha: float, power: float) -> float:
    """Point mass moved onto the most likely token that :func:`sparse_test` detects with probability ``power``.

    Parameters
    ----------
    n : int
        Samples.
    top_prob : float
        Probability of the most likely token.
    top_weight : float
        Its (token, side) weight in the test's weighted Bonferroni.
    alpha, power : float
        Level of the test (the share it is graded at) and the power wanted.

    Returns
    -------
    float
        ``(z_{alpha w} + z_{1 - power}) sqrt(p (1 - p) / n)`` (normal approximation of the
        token's count); inf when ``n`` is 0.
    """
    if n <= 0:
        return math.inf
    z_star = _st.norm.isf(alpha * top_weight) + _st.norm.isf(1 - power)
    return float(z_star * math.sqrt(top_prob * (1 - top_prob) / n))


def sparse_test(
    counts,
    expected_probs,
    *,
    alpha: float = 1e-3,
    power: float = 0.9,
    e_min: float = 20.0,
    frequent_share: float = 0.8,
    tilt: float = 1.0,
    name: str = "sparse",
    family: str = "gof",
    scenario: str = "",
    position: str = "",
) -> TestResult:
    """Most extreme single-token count against exact probabilities (weighted discrete Bonferroni).

    Parameters
    ----------
    counts : array (V,)
        Observed count of each token.
    expected_probs : array (V,)
        Exact probabilities, or non-negative weights proportional to the expected counts
        (e.g. a sum of per-sample conditionals; renormalised in float64).  Tokens of
        weight 0 are left to :func:`specverify.stats.gof.support_test`.
    alpha, power : float
        Level and power of the reported detectable point mass.
    e_min : float, default 20
        Tokens with ``n p >= e_min`` are *frequent* (the chi-square's singleton bins).
    frequent_share : float, default 0.8
        Share of the Bonferroni weight given to the frequent tokens (split over them in
        proportion to ``p**tilt``, half to each side); the rest goes equally to the others,
        where a point mass shows as an astronomically small tail anyway.  Fixed from p and
        n before looking.
    tilt : float, default 1
        Exponent of the frequent tokens' weights.  Mass ``d`` moved onto or off token x
        shifts its count by ``d n`` against a standard deviation ``sqrt(n p_x)``, so the
        likely tokens are the hard ones: weights proportional to ``p_x`` (tilt 1) bring a
        0.003-0.01 move between the top and 4th token of Zipf laws (V = 1000 and 32k)
        within 1.8-2.0x the likelihood-ratio limit, against 2.1-2.6x with equal weights
        (tilt 0), and change nothing on a flat law (``benchmarks/bench_stats.py --sparse``).
    name, family, scenario, position : str
        Labels; ``family="gof"`` puts the test in the chi-square's budget family.

    Returns
    -------
    TestResult
        With per-(token, side) weights ``w`` (summing to 1) and tails ``t_x``
        (:func:`token_tail_pvalues`): ``a = min_x t_x / w_x`` and ``pvalue = min(1, a W(a))``,
        ``W(a)`` the total weight of the (token, side) pairs whose most extreme possible
        tail is <= ``w_x a`` (the others cannot reach it).  ``statistic`` the largest
        |standardised residual| ``(o - n p)/sqrt(n p (1-p))``.  ``details``: the token, its
        side, observed and expected counts, ``min_tail``, ``weight_counted`` (W(a)),
        ``frequent_tokens`` and ``mde_point_mass`` -- the mass moved onto the most likely
        token that the test detects with probability ``power`` at ``alpha``
        (:func:`point_mass_mde`; rarer tokens need less) -- with what recomputes it at another
        alpha (``mde_n``, ``mde_top_prob``, ``mde_top_weight``, ``power``): grading
        (:func:`specverify.stats.budget.grade`) recomputes it at the test's budget share.

    Notes
    -----
    Valid (super-uniform p-values, exactly, no asymptotics) when the counts are
    multinomial with the given probabilities, and when they are a sum of independent
    multinomials with different probabilities (pooled contexts): every per-token tail is
    then super-uniform (Hoeffding's Theorem 4 needs the one-unit margin used here) and
    ``P(a <= c) <= sum_x P(t_x <= w_x c) <= c W(c)`` whatever the dependence between
    tokens (weighted Bonferroni; a pair that cannot reach ``w_x c`` adds nothing, as in
    Tarone's method), with ``c W(c)`` non-decreasing in c.
    Powerful when the deviation is concentrated on a few tokens; the chi-square remains
    the test for smooth deviations -- run both under one budget.
    """
    opts = result_options(name, scenario, position)
    alpha = check_alpha("alpha", alpha)
    power = check_alpha("power", power)
    share_in = float(frequent_share)
    if not 0.0 < share_in < 1.0:
        raise InvalidArgument(f"frequent_share must be in (0, 1), got {frequent_share!r}")
    if not float(e_min) > 0:
        raise InvalidArgument(f"e_min must be > 0, got {e_min!r}")
    if not 0.0 <= float(tilt) <= 4.0:
        raise InvalidArgument(f"tilt must be in [0, 4], got {tilt!r}")
    counts = as_counts("counts", counts)
    weights = as_float_array("expected_probs", expected_probs, ndim=1, nonneg=True)
    if weights.shape != counts.shape:
        raise InvalidArgument(
            f"counts and expected_probs must have the same shape (V,), got {counts.shape} and {weights.shape}"
        )
    if weights.sum() <= 0:
        raise InvalidArgument("expected_probs must have a positive sum")
    support = weights > 0
    probs = weights[support] / weights[support].sum()  # (S,)
    obs = counts[support].astype(np.float64)  # (S,)
    n = int(obs.sum())
    ids = np.flatnonzero(support)
    if n == 0 or probs.size < 2:
        why = "no samples" if n == 0 else "a single token of positive probability"
        return TestResult(
            0.0, 1.0, method=f"sparse: {why}; p-value 1, no power", family=family, n=n,
            details={"mde_point_mass": math.inf}, **opts,
        )  # fmt: skip
    upper, lower = token_tail_pvalues(obs, probs, n)
    w, nf, share = _pair_weights(probs, n, e_min=float(e_min), share=share_in, tilt=float(tilt))  # (S,) per side
    ratio = np.minimum(upper, lower) / w  # (S,)
    a = float(ratio.min())  # the weighted-Bonferroni statistic min tail / weight
    # most extreme tails each (token, side) can reach: all n draws on it / none on it
    with np.errstate(divide="ignore"):
        reach_up = np.where(n >= n * probs + 1, n * np.log(probs), 0.0)  # log P(Bin = n)
        reach_low = np.where(0 <= n * probs - 1, n * np.log1p(-probs), 0.0)  # log P(Bin = 0)
        log_cut = np.log(w * a) + 1e-12  # (S,) -inf when a tail underflowed to 0
    worst = int(np.argmin(ratio))
    counted = float((w * (reach_up <= log_cut)).sum() + (w * (reach_low <= log_cut)).sum())
    pvalue = min(1.0, a * max(counted, float(w[worst])))  # the attained pair always counts
    expected = n * probs
    with np.errstate(divide="ignore", invalid="ignore"):  # a token of p = 1 in float64 has no z (0 / 0)
        z = (obs - expected) / np.sqrt(expected * (1.0 - probs))
    z = np.where(np.isfinite(z), z, 0.0)
    side = "over" if upper[worst] <= lower[worst] else "under"
    top_id = int(np.argmax(probs))
    top = float(probs[top_id])
    details = {
        "token": int(ids[worst]),
        "side": side,
        "observed": int(obs[worst]),
        "expected": float(expected[worst]),
        "min_tail": float(np.minimum(upper, lower).min()),
        "weight_counted": counted,
        "frequent_tokens": nf,
        "mde_point_mass": point_mass_mde(n, top, float(w[top_id]), alpha, power),
        "mde_n": n,
        "mde_top_prob": top,
        "mde_top_weight": float(w[top_id]),
        "power": power,
    }
    return TestResult(
        statistic=float(np.abs(z).max()),
        pvalue=pvalue,
        method=(
            f"sparse: smallest weighted exact binomial tail over {probs.size} tokens (both sides; weight "
            f"{share:g} on the {nf} tokens with n p >= {e_min:g}), discrete weighted Bonferroni"
        ),
        family=family,
        n=n,
        details=details,
        **opts,
    )
