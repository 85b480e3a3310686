"""Shared helpers of the statistics meta-tests: null shapes, planted deviations, binomial bounds."""

from __future__ import annotations

import numpy as np
from scipy import optimize, stats

META_ALPHA = 1e-6  # per assertion on a rejection rate / KS: the suite never flakes


def flat(V=64):
    return np.full(V, 1.0 / V)


def zipf(V=32000, s=1.1):
    w = 1.0 / np.arange(1, V + 1) ** s
    return w / w.sum()


def dominant(V=100, top=0.95):
    p = np.full(V, (1 - top) / (V - 1))
    p[7] = top
    return p


def many_zeros(V=500, seed=3):
    rng = np.random.default_rng(seed)
    p = rng.dirichlet(np.full(V, 0.5))
    p[rng.random(V) < 0.6] = 0.0
    return p / p.sum()


def multinomial(rng, n, p):
    """Exact multinomial counts by inverse-CDF sampling of n tokens (fast for large V, small n)."""
    cdf = np.cumsum(p)
    idx = np.searchsorted(cdf, rng.random(n) * cdf[-1], side="right")
    return np.bincount(np.minimum(idx, p.size - 1), minlength=p.size)


NULL_SHAPES = {"flat": flat, "zipf32k": zipf, "dominant": dominant, "zeros": many_zeros}


def rate_bounds(reps: int, alpha: float, meta: float = META_ALPHA) -> tuple[int, int]:
    """Two-sided binomial acceptance region for the number of rejections at level ``alpha``."""
    return int(stats.binom.ppf(meta / 2, reps, alpha)), int(stats.binom.isf(meta / 2, reps, alpha))


def min_successes(reps: int, power: float, meta: float = META_ALPHA) -> int:
    """Fewest rejections compatible (at level ``meta``) with a true power of ``power``."""
    return int(stats.binom.ppf(meta, reps, power))


def binned_tv(bins, q) -> float:
    qb = np.bincount(
        bins.token_to_bin[bins.token_to_bin >= 0], weights=q[bins.token_to_bin >= 0], minlength=bins.num_bins
    )
    return 0.5 * float(np.abs(qb - bins.bin_probs).sum()) + 0.5 * float(q[bins.token_to_bin < 0].sum())


# Planted deviations: family(p, eps) -> q with q = p at eps = 0, deviating more as eps grows.
def mixture(p, eps):
    # a ramp over the support that favours the tail: differs from flat and from Zipf laws
    rank = np.empty(p.size)
    rank[np.argsort(-p, kind="stable")] = np.arange(p.size)
    other = np.where(p > 0, rank + 1.0, 0.0)
    return (1 - eps) * p + eps * other / other.sum()


def temperature(p, eps):
    # T = 1 - eps: sharper law (T = 0.9 at eps = 0.1)
    T = 1.0 - eps
    with np.errstate(divide="ignore"):
        logp = np.where(p > 0, np.log(np.where(p > 0, p, 1)), -np.inf)
    w = np.exp((logp - logp.max()) / T)
    return w / w.sum()


def topk(p, eps, k=None):
    k = k or max(1, int(np.count_nonzero(p) // 4))
    order = np.argsort(-p, kind="stable")
    t = np.zeros_like(p)
    t[order[:k]] = p[order[:k]]
    t /= t.sum()
    return (1 - eps) * p + eps * t


def move_mass(p, eps):
    order = np.argsort(-p, kind="stable")
    a, b = order[0], order[min(3, np.count_nonzero(p) - 1)]
    q = p.copy()
    take = min(eps, p[a])
    q[a] -= take
    q[b] += take
    return q


def least_favourable(p, eps, bins=None):
    """Deviation q - p = +-eps * p on two halves of the (binned) mass: chi2 = 4 TV^2 at TV eps."""
    order = np.argsort(-p, kind="stable")
    cum = np.cumsum(p[order])
    sign = np.where(cum - p[order] < 0.5, 1.0, -1.0)
    d = np.zeros_like(p)
    d[order] = sign * p[order]
    # balance so the total stays 1
    pos, neg = d[d > 0].sum(), -d[d < 0].sum()
    d = np.where(d > 0, d / pos, d / neg) * 0.5
    return p + 2 * eps * d


DEVIATIONS = {"mixture": mixture, "temperature": temperature, "topk": topk, "move_mass": move_mass}


def deviation_at_tv(family, p, bins, tv, hi=None):
    """The member of a deviation family whose binned TV equals ``tv``."""
    hi = hi or (0.999 if family is not move_mass else float(p.max()))
    f = lambda e: binned_tv(bins, family(p, e)) - tv  # noqa: E731
    if f(hi) < 0:
        return None
    eps = optimize.brentq(f, 0.0, hi, xtol=1e-12)
    return family(p, eps)
