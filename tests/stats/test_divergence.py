"""Validity meta-tests of specverify.stats.divergence: coverage, centring, null lower bound.

Every rate is judged with an exact binomial bound at META_ALPHA = 1e-6 (the suite never
flakes): coverage of the interval must be compatible with at least its nominal level
(one-sided Clopper-Pearson on the coverage count), the lower bound of a lossless sample
must be 0 in all but about alpha/2 of the runs, and the bias-corrected TV must be centred
on 0 under exact sampling.  The CI-sized runs take a few seconds; ``slow`` ones repeat
them with 10x the runs.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from specverify.core.errors import InvalidArgument
from specverify.stats.divergence import binomial_mad, clopper_pearson_lower, divergence, null_expected_tv

META_ALPHA = 1e-6
LEVEL = 0.9  # a low level makes the coverage check sharp: misses are frequent enough to count


def _draw(rng, law, n):
    cdf = np.cumsum(law)
    return np.minimum(np.searchsorted(cdf, rng.random(n) * cdf[-1], side="right"), law.size - 1)


def _tv(a, b):
    return 0.5 * float(np.abs(a - b).sum())


def _laws(V, eps, seed):
    """Target P (Dirichlet(0.5)) and a lossy Q = (1 - eps) P + eps R; the exact TV."""
    rng = np.random.default_rng(seed)
    P = rng.dirichlet(np.full(V, 0.5))
    Q = (1 - eps) * P + eps * rng.dirichlet(np.full(V, 0.5))
    return P, Q, _tv(P, Q)


def _min_covered(reps, level):
    """Fewest covers compatible, at META_ALPHA, with a true coverage >= level."""
    return int(stats.binom.ppf(META_ALPHA, reps, level))


def _max_misses(reps, rate):
    """Most misses compatible, at META_ALPHA, with a true miss rate <= rate."""
    return int(stats.binom.isf(META_ALPHA, reps, rate))


# --------------------------------------------------------------------------- exact pieces


@pytest.mark.parametrize(("m", "p"), [(1, 0.3), (10, 0.5), (7, 1 / 7), (50, 0.02), (1000, 0.001), (3000, 0.37)])
def test_binomial_mad_is_exact(m, p):
    x = np.arange(m + 1)
    brute = float((np.abs(x - m * p) * stats.binom.pmf(x, m, p)).sum())
    assert binomial_mad(m, p) == pytest.approx(brute, rel=1e-9, abs=1e-12)


def test_null_expected_tv_by_enumeration():
    P = np.array([0.5, 0.3, 0.2])
    n = 6
    total = 0.0
    for a in range(n + 1):
        for b in range(n + 1 - a):
            c = n - a - b
            prob = stats.multinomial.pmf([a, b, c], n, P)
            total += prob * _tv(np.array([a, b, c]) / n, P)
    assert null_expected_tv(P, [n]) == pytest.approx(total, rel=1e-12)
    # several contexts: the count-weighted average of the per-context expectations
    rows = np.array([P, [0.1, 0.1, 0.8]])
    want = (4 * null_expected_tv(rows[0], [4]) + 9 * null_expected_tv(rows[1], [9])) / 13
    assert null_expected_tv(rows, [4, 9]) == pytest.approx(want, rel=1e-12)


def test_clopper_pearson_lower():
    assert clopper_pearson_lower(0, 10, 0.05) == 0.0
    lo = clopper_pearson_lower(7, 10, 0.05)
    assert stats.binom.sf(6, 10, lo) == pytest.approx(0.05, rel=1e-6)


# --------------------------------------------------------------------------- coverage


def _coverage(reps, V, n, eps, *, seed, contexts=1):
    rng = np.random.default_rng(seed)
    laws = [_laws(V, eps, seed + 1000 * c) for c in range(contexts)]
    P = np.array([law[0] for law in laws])  # (C, V)
    misses_low = misses_high = misses_coarse = 0
    for _ in range(reps):
        ctx = rng.integers(0, contexts, n)  # (n,)
        tokens = np.empty(n, dtype=np.int64)
        for c in range(contexts):
            tokens[ctx == c] = _draw(rng, laws[c][1], int((ctx == c).sum()))
        n_c = np.bincount(ctx, minlength=contexts)
        true_tv = float(sum(n_c[c] * laws[c][2] for c in range(contexts)) / n)
        est = divergence(tokens, P, contexts=ctx, level=LEVEL)
        misses_low += est.tv_lower > true_tv
        misses_high += est.tv_upper < true_tv
        if est.coarse is not None:  # the coarse interval covers the coarsened TV
            coarse_tv = 0.0
            for c in range(contexts):
                top = np.argsort(-P[c], kind="stable")[: est.coarse.top]
                rest = np.ones(V, bool)
                rest[top] = False
                a = np.append(laws[c][1][top], laws[c][1][rest].sum())
                b = np.append(P[c][top], P[c][rest].sum())
                coarse_tv += n_c[c] * _tv(a, b) / n
            misses_coarse += not (est.coarse.tv_lower <= coarse_tv <= est.coarse.tv_upper)
            assert coarse_tv <= true_tv + 1e-12  # data processing
    return misses_low, misses_high, misses_coarse


CASES = {
    "small_V": dict(V=10, n=2000, eps=0.15),
    "small_V_tiny_tv": dict(V=6, n=3000, eps=0.02),
    "large_V": dict(V=3000, n=2000, eps=0.3),
    "contexts": dict(V=8, n=2000, eps=0.2, contexts=4),
}


def _check_coverage(reps, case, seed):
    low, high, coarse = _coverage(reps, **CASES[case], seed=seed)
    side = (1 - LEVEL) / 2
    msg = f"{case}: lower misses {low}, upper misses {high}, coarse misses {coarse} in {reps} runs at level {LEVEL}"
    assert reps - (low + high) >= _min_covered(reps, LEVEL), msg
    assert low <= _max_misses(reps, side), msg  # each side keeps its own level
    assert high <= _max_misses(reps, side), msg
    assert reps - coarse >= _min_covered(reps, LEVEL), msg
    return low, high, coarse


@pytest.mark.parametrize("case", sorted(CASES))
def test_interval_covers_true_tv(case):
    _check_coverage(300, case, seed=7)


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(CASES))
def test_interval_covers_true_tv_slow(case):
    _check_coverage(3000, case, seed=8)


# --------------------------------------------------------------------------- under exact sampling


def _null_runs(reps, V, n, *, seed, level=0.95):
    rng = np.random.default_rng(seed)
    P = rng.dirichlet(np.full(V, 0.5))
    out = [divergence(_draw(rng, P, n), P, level=level) for _ in range(reps)]
    return P, out


@pytest.mark.parametrize(("V", "n"), [(10, 500), (200, 1000), (5000, 1000)])
def test_bias_corrected_tv_is_centred_under_exact_sampling(V, n):
    _, runs = _null_runs(300, V, n, seed=V)
    tv = np.array([r.tv for r in runs])
    plugin = np.array([r.tv_plugin for r in runs])
    half_width = stats.norm.isf(META_ALPHA / 2) * tv.std(ddof=1) / math.sqrt(tv.size)
    assert abs(tv.mean()) <= half_width, f"mean bias-corrected TV {tv.mean():.3g} (+-{half_width:.2g}), V={V}, n={n}"
    assert plugin.mean() > 5 * half_width  # the plug-in alone is far from centred


@pytest.mark.parametrize(("V", "n"), [(10, 500), (3000, 1000)])
def test_lower_bound_is_zero_for_lossless_samples(V, n):
    reps, level = 400, 0.8  # a low level: the null rate of a positive bound, (1 - level)/2 = 0.1, is measurable
    _, runs = _null_runs(reps, V, n, seed=V + 1, level=level)
    positive = sum(r.tv_lower > 0 for r in runs)
    assert positive <= _max_misses(reps, (1 - level) / 2), f"{positive} of {reps} lossless runs had a positive bound"


def test_kl_miller_madow_and_support_failure():
    _, runs = _null_runs(200, 20, 2000, seed=3)
    kl = np.array([r.kl for r in runs])
    plugin = np.array([r.kl_plugin for r in runs])
    assert abs(kl.mean()) < 0.2 * plugin.mean()  # the correction removes most of the (V-1)/2n bias
    P = np.array([0.5, 0.5, 0.0])
    est = divergence(np.array([0, 1, 2, 0, 1, 1]), P)
    assert est.support_failure and est.kl == math.inf and est.zero_prob_tokens == (2,)


def test_over_and_under_emitted_tokens_name_a_planted_move():
    rng = np.random.default_rng(5)
    P = rng.dirichlet(np.full(50, 1.0))
    Q = P.copy()
    Q[17] += 0.05
    Q[int(np.argmax(P))] -= 0.05
    est = divergence(_draw(rng, Q, 20000), P, num_tokens=3)
    assert est.over_emitted[0].token == 17 and est.over_emitted[0].z > 10
    assert est.under_emitted[0].token == int(np.argmax(P))
    assert est.tv_lower > 0.03 and est.tv_upper > 0.05


def test_bad_input_names_the_argument():
    P = np.array([0.5, 0.5])
    with pytest.raises(InvalidArgument, match="tokens"):
        divergence(np.array([0, 2]), P)
    with pytest.raises(InvalidArgument, match="level"):
        divergence(np.array([0, 1]), P, level=1.5)
    with pytest.raises(InvalidArgument, match="contexts"):
        divergence(np.array([0, 1]), P, contexts=np.array([0, 3]))
    with pytest.raises(InvalidArgument, match="probs"):
        divergence(np.array([0, 1]), np.array([0.5, -0.5]))
