"""sparse_test (specverify.stats.sparse): calibration under exact sampling, power on sparse moves.

Calibration: the rejection rate at alpha is at most alpha (exact binomial bound at
META_ALPHA = 1e-6) on flat, Zipf, dominant and many-zeros laws, and for pooled contexts.
Power: a 0.01 point-mass move on Zipf(V=1000), which the chi-square needs ~8x the
likelihood-ratio limit to see, is caught by chi-square + sparse under one budget
(alpha/2 each) at ~2x the limit, while smooth deviations keep the chi-square's power;
``gof_pair`` is that pair as the batteries run it.
"""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats
from svstats_helpers import META_ALPHA, dominant, flat, many_zeros, min_successes, mixture, move_mass, zipf

from specverify.core.errors import InvalidArgument
from specverify.stats import gof_test
from specverify.stats.sparse import gof_pair, sparse_test, token_tail_pvalues

ALPHA = 1e-3


def _max_rejections(reps, rate):
    return int(stats.binom.isf(META_ALPHA, reps, rate))


def _rates(pvalues, levels=(0.01, 0.05)):
    return {a: int((np.asarray(pvalues) <= a).sum()) for a in levels}


SHAPES = {
    "flat64": (flat(64), 2000, 1000),
    "zipf1000": (zipf(1000), 3000, 1000),
    "dominant": (dominant(), 500, 1000),
    "zeros": (many_zeros(), 2000, 1000),
    "zipf32k_small_n": (zipf(32000), 1000, 200),
}


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_calibrated_under_exact_sampling(shape):
    p, n, reps = SHAPES[shape]
    rng = np.random.default_rng(11)
    pvalues = [sparse_test(rng.multinomial(n, p), p).pvalue for _ in range(reps)]
    for level, count in _rates(pvalues).items():
        assert count <= _max_rejections(reps, level), f"{shape}: {count}/{reps} p-values <= {level}"


def test_calibrated_for_pooled_contexts():
    rng = np.random.default_rng(12)
    rows = np.array([zipf(200, s) for s in (0.8, 1.1, 1.5)])  # (3, V)
    sizes = np.array([300, 700, 1000])
    expected = (sizes[:, None] * rows).sum(0)  # sum of per-sample conditionals
    pvalues = [
        sparse_test(sum(rng.multinomial(m, r) for m, r in zip(sizes, rows)), expected).pvalue for _ in range(1000)
    ]
    for level, count in _rates(pvalues).items():
        assert count <= _max_rejections(1000, level), f"pooled: {count}/1000 p-values <= {level}"


def _power(p, q, n, reps, rng, *, combined):
    hits = 0
    for _ in range(reps):
        counts = rng.multinomial(n, q)
        if combined:  # chi-square and sparse under one budget: alpha/2 each (Holm's first step)
            hits += min(gof_test(counts, p).pvalue, sparse_test(counts, p).pvalue) <= ALPHA / 2
        else:
            hits += gof_test(counts, p).pvalue <= ALPHA
    return hits


def test_point_mass_move_is_caught_where_chi_square_is_not():
    p = zipf(1000)
    q = move_mass(p, 0.01)  # 0.01 from the top token to the 4th; LR limit 6471 samples
    rng = np.random.default_rng(13)
    reps, n = 100, 20000
    both = _power(p, q, n, reps, rng, combined=True)
    chi2 = _power(p, q, n, reps, rng, combined=False)
    assert both >= min_successes(reps, 0.9), f"chi-square + sparse caught {both}/{reps} at n={n}"
    assert chi2 <= reps // 2, f"chi-square alone caught {chi2}/{reps} at n={n} (expected ~0.3)"


def test_smooth_deviation_keeps_chi_square_power():
    p = zipf(1000)
    q = mixture(p, 0.1)
    rng = np.random.default_rng(14)
    reps, n = 200, 700  # the chi-square alone needs ~575 for power 0.9, the combination ~625
    both = _power(p, q, n, reps, rng, combined=True)
    assert both >= min_successes(reps, 0.9), f"chi-square + sparse caught {both}/{reps} at n={n}"


def test_rare_token_point_mass_is_decisive():
    p = zipf(32000)
    q = p.copy()
    q[0] -= 0.003
    q[20000] += 0.003  # p ~ 1e-6 there
    counts = np.random.default_rng(15).multinomial(5000, q)
    r = sparse_test(counts, p)
    assert r.pvalue < 1e-20 and r.details["token"] == 20000 and r.details["side"] == "over"
    assert gof_test(counts, p).pvalue > r.pvalue


def test_tails_are_exact_binomial():
    p = np.array([0.5, 0.3, 0.15, 0.05])
    counts = np.array([40.0, 35.0, 20.0, 5.0])
    upper, lower = token_tail_pvalues(counts, p, 100)
    assert upper[1] == pytest.approx(stats.binom.sf(34, 100, 0.3))
    assert lower[0] == pytest.approx(stats.binom.cdf(40, 100, 0.5))
    assert upper[0] == 1.0 and lower[1] == 1.0  # the one-unit margin: no tail on the other side
    assert upper[3] == 1.0 and lower[3] == 1.0  # |o - np| < 1


def test_degenerate_and_bad_input():
    assert sparse_test([0, 0], [0.5, 0.5]).pvalue == 1.0
    assert sparse_test([5, 3], [1.0, 0.0]).pvalue == 1.0  # zeros are the support test's job
    with pytest.raises(InvalidArgument, match="counts"):
        sparse_test([1, -1], [0.5, 0.5])
    with pytest.raises(InvalidArgument, match="shape"):
        sparse_test([1, 1, 1], [0.5, 0.5])
    with pytest.raises(InvalidArgument, match="alpha"):
        sparse_test([1, 1], [0.5, 0.5], alpha=2.0)
    with pytest.raises(InvalidArgument, match="tilt"):
        sparse_test([1, 1], [0.5, 0.5], tilt=-1)


@pytest.mark.parametrize(("p", "n"), [([0.6, 0.3, 0.1], 12), ([0.4, 0.3, 0.2, 0.1], 9), ([0.9, 0.05, 0.05], 30)])
def test_pvalue_super_uniform_by_enumeration(p, n):
    """Exact: P(pvalue <= a) <= a for every attainable a, summing over every count vector."""
    p = np.asarray(p)
    V = p.size

    def vectors(total, parts):
        if parts == 1:
            yield (total,)
            return
        for first in range(total + 1):
            for rest in vectors(total - first, parts - 1):
                yield (first, *rest)

    table = [(sparse_test(np.array(c), p).pvalue, stats.multinomial.pmf(c, n, p)) for c in vectors(n, V)]
    pvalues = np.array([t[0] for t in table])
    probs = np.array([t[1] for t in table])
    order = np.argsort(pvalues, kind="stable")
    cumulative = np.cumsum(probs[order])
    # at each distinct p-value a, the mass of {pvalue <= a}
    last = np.r_[pvalues[order][1:] != pvalues[order][:-1], True]
    assert np.all(cumulative[last] <= pvalues[order][last] + 1e-12), "P(pvalue <= a) > a somewhere"


def test_likely_tokens_get_more_weight_and_that_is_what_catches_a_top_token_move():
    """Weights proportional to p on the frequent tokens (tilt 1) see a 0.003 move off the top token of
    Zipf(1000) that equal weights (tilt 0) miss at the same n, in paired seeded samples."""
    p = zipf(1000)
    q = move_mass(p, 0.003)
    rng = np.random.default_rng(16)
    tilted = equal = 0
    for _ in range(100):
        counts = rng.multinomial(130000, q)
        tilted += sparse_test(counts, p, alpha=ALPHA / 2).pvalue <= ALPHA / 2
        equal += sparse_test(counts, p, alpha=ALPHA / 2, tilt=0.0).pvalue <= ALPHA / 2
    assert tilted >= min_successes(100, 0.8) and tilted > equal + 10, (tilted, equal)


def test_gof_pair_runs_both_tests_in_one_family():
    p = zipf(200)
    counts = np.random.default_rng(17).multinomial(3000, p)
    chi2, sparse = gof_pair(counts, p, alpha=1e-4, position="abs=1", scenario="s")
    assert (chi2.name, sparse.name) == ("gof", "sparse") and chi2.family == sparse.family == "gof"
    assert chi2.pvalue == gof_test(counts, p, alpha=1e-4).pvalue and sparse.pvalue == sparse_test(counts, p).pvalue
    assert (sparse.scenario, sparse.position) == ("s", "abs=1")
    named = gof_pair(counts, p, name="declared_gof", family="consistency")
    assert [r.name for r in named] == ["declared_gof", "declared_sparse"] and named[1].family == "consistency"


def test_a_token_of_probability_one_in_float64_has_no_nan_statistic():
    # 1 - p rounds to 0 for the top token: its z is 0 / 0; the statistic stays finite (no warning)
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        result = sparse_test(np.array([100, 0]), np.array([1.0, 1e-300]))
    assert np.isfinite(result.statistic) and result.pvalue == 1.0


def test_grading_recomputes_the_detectable_point_mass_at_the_share():
    """grade() sets each result's alpha to its share w_i * alpha; the sparse test's mde_point_mass must be the
    detectable point mass at that share (larger than at the nominal alpha), not at the alpha it was run at."""
    from specverify.stats.budget import grade
    from specverify.stats.sparse import point_mass_mde

    p = zipf(50)
    counts = np.round(p * 4000).astype(np.int64)
    results = gof_pair(counts, p, alpha=1e-3, position="abs=0") + gof_pair(counts, p, alpha=1e-3, position="abs=1")
    ungraded = results[1]
    d = ungraded.details
    assert d["mde_point_mass"] == pytest.approx(
        point_mass_mde(d["mde_n"], d["mde_top_prob"], d["mde_top_weight"], 1e-3, 0.9)
    )
    graded = grade(results, alpha=1e-3)
    sparse = [r for r in graded if r.name == "sparse"]
    assert len(sparse) == 2
    for r in sparse:
        assert r.alpha == pytest.approx(1e-3 / 4)  # one family, four tests
        want = point_mass_mde(r.details["mde_n"], r.details["mde_top_prob"], r.details["mde_top_weight"], r.alpha, 0.9)
        assert r.details["mde_point_mass"] == pytest.approx(want, rel=1e-12)
        assert r.details["mde_point_mass"] > d["mde_point_mass"] * 1.01  # a smaller level needs a larger move
    assert graded[0].details == results[0].details  # the chi-square's details are left alone
