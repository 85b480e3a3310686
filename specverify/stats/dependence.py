"""Dependence between rows: a pair test of the joint law against the product of exact laws.

Rows of a batch must be independent draws: under H0 two rows a and b of one call emit
tokens y_a ~ P_a and y_b ~ P_b independently, each law known exactly.  For every pair the
test scores

    f(y_a, y_b) = m_a(y_a) m_b(y_b) + lam (1[y_a = y_b] - s),

with m the centred mid-distribution function of a token under its own law
(``m(y) = F(y-) + P(y)/2 - 1/2``: mean 0 for any discrete law, Ruschendorf's mid-rank
transform) and s = sum_v P_a(v) P_b(v) the collision probability of the pair.  The first
term sees rows whose inverse-CDF draws share a uniform (tokens move up and down together);
the second sees rows that share an exponential race or any random number that maps equal
laws to equal tokens.  Under H0, E f = 0 and

    Var f = v_a v_b + 2 lam c + lam^2 s (1 - s),   v = sum P m^2,   c = sum_v P_a P_b m_a m_b,

exactly.  ``lam = sqrt(v_a v_b / max(s (1 - s), 1/16))`` balances the two terms before any
token is seen (capped so that a rare collision does not dominate the sum).  The pairs of a
set are disjoint within a call and calls follow one another, so the f's form a martingale
difference sequence with these conditional variances: products of centred independent
scores are uncorrelated even when two pairs share a row, and a pair's laws are fixed
before its tokens are drawn.  The sum is tested by :func:`specverify.stats.score_test`
(martingale CLT, with the Bernstein-Freedman tail where one pair could dominate).

What a run could have detected: the dependence the bugs create is rows sharing a random
number.  If a fraction eps of the pairs drew both tokens from one uniform (inverse CDFs in
token order: the comonotone coupling) and the rest independently, the joint law of a pair
is within TV eps of the product of its laws and the mean of f moves by eps * sum_i
E_shared f_i, computed exactly per pair; ``details["mde_shared_fraction"]`` is the eps
detected with probability ``power``,
``(z_{1-alpha/2} + z_power) sqrt(sum Var f) / sum_i E_shared f_i``
(:func:`specverify.stats.grade` recomputes it at the share of alpha the test gets).

References: L. Ruschendorf, "Random variables with maximum sums", Adv. Appl. Probab. 14
(1982) (the mid-distribution transform); P. Hall and C. C. Heyde, *Martingale Limit Theory
and Its Application* (1980) (the martingale CLT); D. A. Freedman, Ann. Probab. 3 (1975).
"""

from __future__ import annotations

import math

import numpy as np
import torch

from specverify.core.errors import InvalidArgument
from specverify.core.results import TestResult

from ._common import as_float_array, as_probs, check_alpha, result_options
from .directed import score_test
from .power import z_shift

__all__ = ["PAIR_LAGS", "call_pairs", "midrank_pair_test", "pair_dependence_test", "pair_scores", "mid_distribution"]

#: Row offsets tested as lags (tile sizes of common kernels), besides a declared block size.
PAIR_LAGS = (32, 64, 128, 256)

#: Floor of s (1 - s) in the collision weight (a collision of probability < ~0.07 is down-weighted).
COLLISION_VARIANCE_FLOOR = 1.0 / 16.0
_CHUNK_CELLS = 1 << 22  # (pairs x V) cells per block of the pair sums


def mid_distribution(laws: np.ndarray) -> np.ndarray:
    """Centred mid-distribution values ``F(v-) + P(v)/2 - 1/2`` of every token of every law: (M, V).

    Cumulative sums run in token order in float64 (``np.cumsum`` is sequential: the same
    value on every CPU).
    """
    cdf = np.cumsum(laws, axis=-1)  # (M, V)
    return cdf - 0.5 * laws - 0.5


def _check_index(name: str, value, size: int) -> np.ndarray:
    arr = as_float_array(name, value, ndim=1)
    bad = (arr != np.floor(arr)) | (arr < 0) | (arr >= size)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise InvalidArgument(f"{name}[{i}] is {arr[i]}, not an index in [0, {size})")
    return arr.astype(np.int64)


def _distinct_pairs(law_a: np.ndarray, law_b: np.ndarray, M: int):
    """``(ua, ub, inverse)``: the distinct (law_a, law_b) pairs (U,) and each pair's index among them (N,)."""
    keys = law_a * M + law_b  # (N,)
    if M * M <= max(4 * keys.size, 1 << 16):  # a lookup table: linear time
        present = np.zeros(M * M, dtype=bool)
        present[keys] = True
        unique = np.flatnonzero(present)
        slot = np.zeros(M * M, dtype=np.int64)
        slot[unique] = np.arange(unique.size)
        inverse = slot[keys]
    else:
        unique, inverse = np.unique(keys, return_inverse=True)
    return unique // M, unique % M, inverse


def _pair_sums(laws: np.ndarray, mid: np.ndarray, ua: np.ndarray, ub: np.ndarray):
    """``(s, c)`` per distinct pair of laws: sum P_a P_b and sum P_a P_b m_a m_b."""
    V = laws.shape[1]
    s = np.empty(ua.size)  # (U,)
    c = np.empty(ua.size)  # (U,)
    step = max(1, _CHUNK_CELLS // max(1, V))
    for lo in range(0, ua.size, step):
        a, b = ua[lo : lo + step], ub[lo : lo + step]
        joint = laws[a] * laws[b]  # (n, V)
        s[lo : lo + step] = joint.sum(-1)
        c[lo : lo + step] = (joint * mid[a] * mid[b]).sum(-1)
    return s, c


def _comonotone_means(laws: np.ndarray, mid: np.ndarray, ua: np.ndarray, ub: np.ndarray, s, lam) -> np.ndarray:
    """E f per distinct pair of laws when both tokens come from one uniform u (token = F^-1(u)): (U,).

    The union of the two CDFs' steps cuts [0, 1) into intervals on which both tokens are
    constant; E f is the length-weighted sum over them.  (The pairs of a chunk are searched
    together by offsetting pair i's values by 2i, so one ``searchsorted`` serves the chunk;
    only an effect size depends on it, never a p-value.)
    """
    V = laws.shape[1]
    cdf = np.minimum(np.cumsum(laws, axis=-1), 1.0)  # (M, V)
    means = np.empty(ua.size)
    step = max(1, _CHUNK_CELLS // max(1, 4 * V))
    for lo in range(0, ua.size, step):
        a, b = ua[lo : lo + step], ub[lo : lo + step]
        n = a.size
        cuts = np.sort(np.concatenate([np.zeros((n, 1)), cdf[a], cdf[b]], axis=1), axis=1)  # (n, 2V+1)
        width = np.diff(cuts, axis=1)  # (n, 2V)
        shift = np.arange(n)[:, None] * 2.0  # (n, 1) pairs apart by 2 > any value in [0, 1]
        centre = (cuts[:, :-1] + 0.5 * width + shift).ravel()  # (n * 2V,)
        base = np.arange(n)[:, None] * V  # (n, 1)
        ta = np.searchsorted((cdf[a] + shift).ravel(), centre, side="right").reshape(n, -1) - base
        tb = np.searchsorted((cdf[b] + shift).ravel(), centre, side="right").reshape(n, -1) - base
        ta, tb = np.minimum(ta, V - 1), np.minimum(tb, V - 1)  # (n, 2V)
        rows = np.arange(n)[:, None]
        f = mid[a][rows, ta] * mid[b][rows, tb] + lam[lo : lo + step, None] * ((ta == tb) - s[lo : lo + step, None])
        means[lo : lo + step] = (width * f).sum(-1)
    return means


def pair_scores(laws, law_a, tokens_a, law_b, tokens_b):
    """The pair scores of the module docstring: ``(f, var, shared)``, each (N,) float64.

    Parameters
    ----------
    laws : array (M, V)
        Every law a token was drawn from (rows renormalised in float64).
    law_a, law_b : int arrays (N,)
        Row of ``laws`` of each pair's first and second token.
    tokens_a, tokens_b : int arrays (N,)
        The two tokens of each pair.

    Returns
    -------
    f : ndarray (N,)
        Scores with mean 0 when the two tokens of a pair are independent draws from their laws.
    var : ndarray (N,)
        Their exact variances under independence.
    shared : ndarray (N,)
        E f when the pair's two tokens come from one shared uniform (the comonotone coupling).
    """
    return _pair_terms(laws, law_a, tokens_a, law_b, tokens_b)[:3]


def _pair_terms(laws, law_a, tokens_a, law_b, tokens_b):
    """``(f, var, shared, s, collided, range)`` per pair.

    :func:`pair_scores`, then the collision probabilities and events and ``max f - min f``.
    """
    P = as_probs("laws", laws, ndim=2)
    M, V = P.shape
    ia, ib = _check_index("law_a", law_a, M), _check_index("law_b", law_b, M)
    ya, yb = _check_index("tokens_a", tokens_a, V), _check_index("tokens_b", tokens_b, V)
    if not (ia.shape == ib.shape == ya.shape == yb.shape):
        raise InvalidArgument(
            f"law_a, tokens_a, law_b and tokens_b must have one shape, got {ia.shape}, {ya.shape}, {ib.shape}, "
            f"{yb.shape}"
        )
    mid = mid_distribution(P)  # (M, V)
    v = (P * mid * mid).sum(-1)  # (M,)
    reach = np.where(P > 0, np.abs(mid), 0.0).max(-1)  # (M,) largest |m| of a possible token
    ua, ub, inverse = _distinct_pairs(ia, ib, M)
    s_u, c_u = _pair_sums(P, mid, ua, ub)  # (U,) per distinct pair of laws
    lam_u = np.sqrt(v[ua] * v[ub] / np.maximum(s_u * (1.0 - s_u), COLLISION_VARIANCE_FLOOR))  # (U,)
    s, c, lam = s_u[inverse], c_u[inverse], lam_u[inverse]  # (N,)
    vv = v[ia] * v[ib]  # (N,)
    f = mid[ia, ya] * mid[ib, yb] + lam * ((ya == yb) - s)
    span = 2.0 * reach[ia] * reach[ib] + lam  # (N,) range of f
    var = np.maximum(vv + 2.0 * lam * c + lam * lam * s * (1.0 - s), 0.0)
    shared = _comonotone_means(P, mid, ua, ub, s_u, lam_u)[inverse]
    return f, var, shared, s, ya == yb, span


def pair_dependence_test(
    laws,
    law_a,
    tokens_a,
    law_b,
    tokens_b,
    *,
    alpha: float = 1e-3,
    power: float = 0.9,
    name: str = "pairs",
    family: str = "dependence",
    scenario: str = "",
    position: str = "",
) -> TestResult:
    """Two-sided test that the two tokens of each pair are independent draws from their exact laws.

    Parameters
    ----------
    laws, law_a, tokens_a, law_b, tokens_b
        As in :func:`pair_scores`.  Pairs must be disjoint within a batch (a row in at most one
        pair of the set per call) and each pair's laws fixed before its tokens were drawn.
    alpha, power : float
        Level and power of the detectable-dependence statement.

    Returns
    -------
    TestResult
        ``statistic`` z = sum f / sqrt(sum Var f), ``pvalue`` two-sided (normal, or the
        Bernstein-Freedman bound where one pair could dominate); ``details``: ``pairs``,
        ``mean_collision`` (average s), ``observed_collisions`` and ``expected_collisions``,
        ``mde_shared_fraction`` (the fraction of pairs sharing one uniform, hence the TV
        between joint and product, detected with probability ``power`` at ``alpha``) and
        ``mde_per_z`` (the same per unit of z, from which :func:`specverify.stats.grade`
        recomputes it at the share the budget gives the test).

    Notes
    -----
    Dependence of either sign fails: shared random numbers make rows agree too often;
    stratified (antithetic) sampling across rows makes them agree too rarely.
    """
    alpha = check_alpha("alpha", alpha)
    opts = result_options(name, scenario, position)
    f, var, shared, s, collided, span = _pair_terms(laws, law_a, tokens_a, law_b, tokens_b)
    if f.size == 0:
        raise InvalidArgument("pair_dependence_test needs at least one pair")
    bound = float(np.max(span))
    res = score_test(f, var, bound=bound, alpha=alpha, power=power, family=family, **opts)
    total_var = float(np.sum(var))
    total_shift = float(np.sum(shared))
    per_z = math.sqrt(total_var) / total_shift if total_var > 0 and total_shift > 0 else math.inf
    expected = float(np.sum(s))
    details = {
        **res.details,
        "pairs": int(f.size),
        "observed_collisions": int(collided.sum()),
        "expected_collisions": expected,
        "mean_collision": expected / f.size,
        "mean_shared_shift": total_shift / f.size,
        "mde_key": "mde_shared_fraction",
        "mde_per_z": per_z,
        "mde_shared_fraction": z_shift(alpha, power) * per_z,
        "power": power,
    }
    method = "pair dependence (mid-rank product + collision score) vs product of exact laws; " + res.method
    return res.replace(details=details, method=method)


def _boundaries(b: int, block_size: int | None) -> list[int]:
    edges, t = set(), 32
    while t < b:
        edges.add(t)
        t *= 2
    if block_size and 1 < block_size < b:
        edges.add(block_size)
    return sorted(edges)


def _lag_pairs(b: int, lag: int) -> tuple[np.ndarray, np.ndarray]:
    j = np.arange(max(0, b - lag))
    j = j[(j % (2 * lag)) < lag]
    return j, j + lag


def call_pairs(b: int, *, block_size: int | None = None, generator: torch.Generator) -> dict[str, tuple]:
    """Disjoint pairs of rows ``(first, second)`` of a batch of ``b`` rows, per class.

    ``adjacent`` (2i, 2i+1); ``lag<T>`` (j, j+T) for j mod 2T < T, T in :data:`PAIR_LAGS` and
    ``block_size``; ``boundary`` (T-1, T) for the powers of two from 32 and ``block_size`` below
    b; ``first_last`` (0, b-1); ``random`` a perfect matching drawn from ``generator``.  The
    pairs of one class are disjoint, so their scores are independent under H0.
    """
    out: dict[str, tuple] = {}
    if b < 2:
        return out
    half = np.arange(b // 2)
    out["adjacent"] = (2 * half, 2 * half + 1)
    lags = sorted(set(PAIR_LAGS) | ({block_size} if block_size and block_size > 1 else set()))
    for lag in lags:
        if lag < b:
            out[f"lag{lag}"] = _lag_pairs(b, lag)
    edges = np.array(_boundaries(b, block_size), dtype=np.int64)
    if edges.size:  # (T-1, T) pairs are disjoint for distinct T >= 2 unless T and T-1 are both edges
        edges = edges[np.concatenate([[True], np.diff(edges) > 1])]
        out["boundary"] = (edges - 1, edges)
    out["first_last"] = (np.array([0]), np.array([b - 1]))
    perm = torch.randperm(b, generator=generator).numpy()[: 2 * (b // 2)]
    out["random"] = (perm[0::2], perm[1::2])
    return out


def midrank_pair_test(
    mid_a,
    var_a,
    mid_b,
    var_b,
    *,
    alpha: float = 1e-3,
    power: float = 0.9,
    name: str = "pairs",
    family: str = "dependence",
    scenario: str = "",
    position: str = "",
) -> TestResult:
    """Pair test from each token's centred mid-rank alone (when the pair's laws are not kept together).

    ``mid_a`` (N,) the centred mid-distribution value of each pair's first token under its
    own law (:func:`mid_distribution`), ``var_a`` (N,) its variance ``sum P m^2``; the same for
    the second token.  The score is the first term of :func:`pair_dependence_test`'s,
    ``f = m_a m_b`` with variance ``v_a v_b``: it sees rows whose tokens move together (a
    shared uniform in an inverse CDF), not the collisions of an exponential race.

    Returns
    -------
    TestResult
        As :func:`specverify.stats.score_test`, with ``details["mde_correlation"]``: the
        correlation between the two tokens' mid-ranks detected with probability ``power``
        (recomputed at the graded share by :func:`specverify.stats.grade`).
    """
    alpha = check_alpha("alpha", alpha)
    opts = result_options(name, scenario, position)
    arrays = [
        as_float_array(k, v, ndim=1)
        for k, v in (("mid_a", mid_a), ("var_a", var_a), ("mid_b", mid_b), ("var_b", var_b))
    ]
    ma, va, mb, vb = arrays
    if not (ma.shape == va.shape == mb.shape == vb.shape) or ma.size == 0:
        raise InvalidArgument(
            f"mid_a, var_a, mid_b and var_b must be non-empty and of one shape, got {[a.shape for a in arrays]}"
        )
    if np.any(np.abs(ma) > 0.5) or np.any(np.abs(mb) > 0.5) or np.any(va < 0) or np.any(vb < 0):
        raise InvalidArgument("mid values must lie in [-1/2, 1/2] and variances be >= 0")
    f, var = ma * mb, va * vb
    bound = float(np.max(np.abs(ma)) * np.max(np.abs(mb)))
    res = score_test(f, var, bound=bound, alpha=alpha, power=power, family=family, **opts)
    scale = float(np.sum(np.sqrt(var)))
    per_z = math.sqrt(float(np.sum(var))) / scale if scale > 0 else math.inf
    details = {
        **res.details,
        "pairs": int(f.size),
        "mde_key": "mde_correlation",
        "mde_per_z": per_z,
        "mde_correlation": z_shift(alpha, power) * per_z,
        "power": power,
    }
    return res.replace(details=details, method="pair dependence (mid-rank products) vs independence; " + res.method)
