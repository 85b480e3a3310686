"""Statistics core: exact values against scipy and hand computations, binning rules, Holm, validation.

Sources of reference values are named in each test (scipy.stats.power_divergence,
chi2_contingency, ncx2, binomtest; brute-force enumeration).
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats as sps
from scipy.special import gammaln

from specverify import stats
from specverify.core.errors import InvalidArgument
from specverify.core.results import TestResult


# ----------------------------------------------------------------------------- binning
def test_make_bins_hand_example():
    p = np.array([0.03, 0.5, 0.1, 0.3, 0.05, 0.02])
    b = stats.make_bins(p, 100)  # expected 3, 50, 10, 30, 5, 2
    # singletons 1 (50), 3 (30); tail in p-order 2, 4, 0, 5 with 10+5+3+2 = 20 -> one bin
    assert b.token_to_bin.tolist() == [2, 0, 2, 1, 2, 2]
    assert b.tokens_per_bin.tolist() == [1, 1, 4]
    np.testing.assert_allclose(b.bin_probs, [0.5, 0.3, 0.2])
    assert b.multi_token_mass == pytest.approx(0.2)
    assert stats.make_bins(p, 200).tokens_per_bin.tolist() == [1, 1, 1, 3]  # token 2: 200*0.1 = 20 >= 20


def test_make_bins_tail_groups_and_leftover_merge():
    p = np.array([0.45, 0.12, 0.09, 0.11, 0.10, 0.03, 0.10])
    b = stats.make_bins(p, 100)  # tail in p-order: 1 (12), 3 (11), 4 (10), 6 (10), 2 (9), 5 (3)
    # greedy: {1, 3} = 23, {4, 6} = 20; the leftover {2, 5} = 12 < 20 joins the previous bin
    assert b.token_to_bin.tolist() == [0, 1, 2, 1, 2, 2, 2]
    assert b.tokens_per_bin.tolist() == [1, 2, 4]
    leftover = np.array([0.5, 0.15, 0.10, 0.08, 0.05, 0.12])  # n=100: singleton 50; tail 15, 12, 10, 8, 5
    b = stats.make_bins(leftover, 100)
    # p-order of tail: 1 (15), 5 (12) -> bin {1, 5} = 27; 2 (10), 3 (8), 4 (5) -> 23 -> bin
    assert b.token_to_bin.tolist() == [0, 1, 2, 2, 2, 1]
    left2 = np.array([0.6, 0.15, 0.12, 0.08, 0.05])  # tail 15, 12, 8, 5 -> {15, 12}=27, leftover 13 merged
    assert stats.make_bins(left2, 100).token_to_bin.tolist() == [0, 1, 1, 1, 1]


def test_make_bins_ties_by_token_id_and_zeros():
    p = np.array([0.0, 0.25, 0.25, 0.25, 0.25])
    b = stats.make_bins(p, 40)  # each expected 10: tail bins {1, 2}, {3, 4}
    assert b.token_to_bin.tolist() == [-1, 0, 0, 1, 1]
    assert stats.p_order(np.array([0.2, 0.4, 0.2, 0.2])).tolist() == [1, 0, 2, 3]


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), n=st.integers(0, 5000), V=st.integers(1, 300))
def test_make_bins_invariants(seed, n, V):
    rng = np.random.default_rng(seed)
    p = rng.dirichlet(np.full(V, 0.3))
    p[rng.random(V) < 0.2] = 0
    if p.sum() == 0:
        p[0] = 1
    p /= p.sum()
    b = stats.make_bins(p, n)
    assert np.array_equal(b.token_to_bin < 0, p == 0)
    assert b.bin_probs.sum() == pytest.approx(1.0)
    order = stats.p_order(p)
    order = order[p[order] > 0]
    seq = b.token_to_bin[order]
    assert np.all(np.diff(seq) >= 0) and np.all(np.diff(seq) <= 1), "bins are consecutive in p-order"
    single = order[n * p[order] >= 20]
    # N p_i >= e_min -> singleton, except that the last singleton absorbs a tail below e_min
    assert np.all(b.tokens_per_bin[b.token_to_bin[single[:-1]]] == 1), "N p_i >= e_min -> singleton"
    if single.size and n * p[p < p[single[-1]]].sum() >= 20:
        assert b.tokens_per_bin[b.token_to_bin[single[-1]]] == 1
    if n * 1.0 >= 20:
        assert np.all(n * b.bin_probs >= 20 * (1 - 1e-9)), "every bin has expected >= e_min"
    else:
        assert b.num_bins == 1


# ----------------------------------------------------------------------------- gof / support
def test_cressie_read_matches_scipy_power_divergence():
    rng = np.random.default_rng(0)
    for _ in range(20):
        e = rng.dirichlet(np.ones(12)) * 500
        o = rng.multinomial(500, e / e.sum()).astype(float)
        ref = sps.power_divergence(o, e, lambda_="cressie-read")  # source: scipy.stats.power_divergence
        assert stats.cressie_read(o, e) == pytest.approx(ref.statistic, rel=1e-10, abs=1e-12)


def test_gof_matches_scipy_on_bins():
    rng = np.random.default_rng(1)
    p = rng.dirichlet(np.full(200, 0.5))
    counts = rng.multinomial(3000, p)
    r = stats.gof_test(counts, p)
    b = stats.make_bins(p, 3000)
    obs = stats.bin_counts(b, counts)
    ref = sps.power_divergence(obs, 3000 * b.bin_probs, lambda_="cressie-read")  # scipy reference
    assert r.statistic == pytest.approx(ref.statistic, rel=1e-10)
    assert r.pvalue == pytest.approx(ref.pvalue, rel=1e-9)
    assert r.df == b.num_bins - 1 and r.bins == b.num_bins and r.n == 3000
    assert r.multi_token_mass == pytest.approx(b.multi_token_mass)
    assert r.mde_tv == pytest.approx(stats.min_detectable_tv(3000, r.df, 1e-3))
    assert r.details["observed"] == obs.tolist()
    assert r.family == "gof" and isinstance(r, TestResult)


def test_gof_renormalises_unnormalised_weights_and_ignores_zero_tokens():
    rng = np.random.default_rng(2)
    p = rng.dirichlet(np.ones(50))
    p[:5] = 0
    counts = rng.multinomial(2000, p / p.sum())
    a = stats.gof_test(counts, p)
    b = stats.gof_test(counts, 37.5 * p)  # e.g. a sum of conditionals
    torch_r = stats.gof_test(torch.tensor(counts), torch.tensor(p, dtype=torch.float32))
    assert a.statistic == pytest.approx(b.statistic) and a.pvalue == pytest.approx(b.pvalue)
    assert torch_r.pvalue == pytest.approx(a.pvalue, rel=1e-4)
    counts[0] = 3  # a support failure is not gof's business
    c = stats.gof_test(counts, p)
    assert c.n == 2000 and c.details["dropped_zero_prob"] == 3 and c.statistic == pytest.approx(a.statistic)


def test_gof_single_bin_one_hot():
    p = np.zeros(10)
    p[4] = 1
    counts = np.zeros(10, int)
    counts[4] = 500
    r = stats.gof_test(counts, p)
    assert (r.statistic, r.pvalue, r.bins) == (0.0, 1.0, 1)
    assert "single bin" in r.method and "no power" in r.method and r.mde_tv == math.inf
    assert stats.gof_test(np.zeros(10, int), p).pvalue == 1.0


def test_gof_detects_gross_deviation_with_worst_bins():
    p = np.full(20, 0.05)
    counts = np.full(20, 100)
    counts[3] = 300
    counts[5] = 0
    r = stats.gof_test(counts, p)
    assert r.pvalue < 1e-30
    assert {w["bin"] for w in r.details["worst_bins"][:2]} == {3, 5}
    assert r.details["worst_bins"][0]["tokens"] in ([3], [5])


def test_support_test():
    p = np.array([0.5, 0.0, 0.5, 0.0])
    assert stats.support_test([10, 0, 10, 0], p).pvalue == 1.0
    r = stats.support_test([10, 2, 10, 1], p)
    assert r.pvalue == 0.0 and r.details["tokens"] == [1, 3] and r.statistic == 3.0 and r.family == "support"


# ----------------------------------------------------------------------------- two-sample
def test_two_sample_matches_scipy_chi2_contingency():
    rng = np.random.default_rng(3)
    p = rng.dirichlet(np.full(100, 0.7))
    a, b = rng.multinomial(2000, p), rng.multinomial(8000, p)
    r = stats.two_sample_test(a, b)
    bins = stats.make_bins(a + b, 2000)  # bins from pooled, label-free counts
    table = np.stack([stats.bin_counts(bins, a), stats.bin_counts(bins, b)])
    ref = sps.chi2_contingency(table, correction=False, lambda_="cressie-read")  # scipy reference
    assert r.statistic == pytest.approx(ref.statistic, rel=1e-9)
    assert r.pvalue == pytest.approx(ref.pvalue, rel=1e-8)
    assert r.df == ref.dof
    assert r.details["n_eff"] == pytest.approx(2000 * 8000 / 10000)
    assert r.mde_tv == pytest.approx(stats.min_detectable_tv(1600, r.df, 1e-3))
    assert np.min(ref.expected_freq[0]) >= 20 * (1 - 1e-9)


# ----------------------------------------------------------------------------- power
@pytest.mark.parametrize("df,alpha,n", [(1, 1e-3, 100), (10, 0.01, 5000), (300, 1e-5, 10**6)])
def test_min_detectable_tv_solves_ncx2(df, alpha, n):
    tv = stats.min_detectable_tv(n, df, alpha)
    lam = 4 * n * tv**2
    crit = sps.chi2.isf(alpha, df)  # source: scipy.stats.chi2 / ncx2
    assert sps.ncx2.sf(crit, df, lam) == pytest.approx(0.9, abs=1e-8)
    need = stats.samples_needed(tv, df, alpha)
    assert abs(need - n) <= 1
    assert stats.samples_needed(tv * 2, df, alpha) == pytest.approx(n / 4, abs=1)


# ----------------------------------------------------------------------------- directed
def test_randomised_pit_by_hand():
    p = np.array([[0.1, 0.6, 0.3]])
    g = torch.Generator().manual_seed(0)
    u = torch.rand((1,), generator=torch.Generator().manual_seed(0), dtype=torch.float64).item()
    # order by p: 1 (0.6), 2 (0.3), 0 (0.1); token 2 -> F(x-) = 0.6
    assert stats.randomised_pit(p, [2], generator=g)[0] == pytest.approx(0.6 + 0.3 * u)
    q = np.array([[0.5, 0.3, 0.2]])  # log(q/p): 0: 1.61, 1: -0.69, 2: -0.41 -> order 1, 2, 0
    g = torch.Generator().manual_seed(0)
    assert stats.randomised_pit(p, [0], generator=g, order="ratio", draft_probs=q)[0] == pytest.approx(0.9 + 0.1 * u)


def test_scores_by_hand():
    p = np.array([[0.5, 0.25, 0.25, 0.0]])
    s, v, _ = stats.entropy_scores(p, [1])
    H = 1.5 * math.log(2)
    assert s[0] == pytest.approx(math.log(0.25) + H)
    assert v[0] == pytest.approx(0.5 * math.log(2) ** 2 + 0.5 * (2 * math.log(2)) ** 2 - H**2)
    q = np.array([[0.25, 0.25, 0.25, 0.25]])
    s, v, _ = stats.ratio_scores(p, q, [0])
    assert s[0] == pytest.approx(0.5 - 0.75)
    assert v[0] == pytest.approx(0.0625 / 0.5 + 2 * 0.0625 / 0.25 - 0.75**2)
    assert stats.score_test([np.inf, 0.0], [1.0, 1.0]).pvalue == 0.0
    r = stats.score_test([1.0, 2.0, -0.5], [1.0, 2.0, 1.0])
    assert r.statistic == pytest.approx(2.5 / 2) and r.pvalue == pytest.approx(2 * sps.norm.sf(1.25))


def test_packed_support_by_hand():
    from specverify.stats._common import packed_support

    laws = np.array([[0.0, 0.5, 0.0, 0.0, 0.5, 0, 0, 0, 0], [0.2, 0, 0, 0, 0, 0, 0, 0, 0.8]])
    values, ids = packed_support(laws)
    assert values.tolist() == [[0.5, 0.5], [0.2, 0.8]] and ids.tolist() == [[1, 4], [0, 8]]
    ragged = np.array([[0.0, 1.0] + [0.0] * 10, [0.25, 0.25, 0.5] + [0.0] * 9])  # (2, 12)
    values, ids = packed_support(ragged)
    assert values.tolist() == [[1.0, 0.0, 0.0], [0.25, 0.25, 0.5]] and ids.tolist() == [[1, 12, 12], [0, 1, 2]]
    assert packed_support(np.full((2, 4), 0.25)) is None  # support wider than PACK_SHARE x V: dense


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), V=st.integers(8, 400), support=st.integers(1, 12))
def test_scores_and_pit_on_packed_support_equal_the_dense_computation(seed, V, support):
    """Laws supported on a few tokens (top-k, padded heads) are scored over their packed support;
    the scores, variances, bound and PIT values (both orders) are the whole vocabulary's, to
    float64 rounding.  The dense computation is forced by a packing share of 0."""
    from specverify.stats import _common

    rng = np.random.default_rng(seed)
    n = 9
    laws = np.zeros((n, V))
    for i in range(n):
        ids = rng.choice(V, size=min(support, V), replace=False)
        laws[i, ids] = rng.dirichlet(np.ones(ids.size))
    draft = rng.dirichlet(np.ones(V), size=n)
    draft[:, :3] = 0.0  # tokens the drafter never proposes: q/p keys of 0
    tokens = np.array([rng.choice(V, p=row) for row in laws])
    tokens[0] = int(np.flatnonzero(laws[0] == 0)[0]) if (laws[0] == 0).any() else tokens[0]  # a p = 0 token

    def run():
        return (
            stats.entropy_scores(laws, tokens),
            stats.randomised_pit(laws, tokens, generator=torch.Generator().manual_seed(seed % 1000)),
            stats.randomised_pit(
                laws, tokens, generator=torch.Generator().manual_seed(seed % 1000), order="ratio", draft_probs=draft
            ),
        )

    (s, v, b), pit_p, pit_r = run()
    saved = _common.PACK_SHARE
    try:
        _common.PACK_SHARE = 0.0
        (s0, v0, b0), pit_p0, pit_r0 = run()
    finally:
        _common.PACK_SHARE = saved
    np.testing.assert_allclose(s, s0, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(v, v0, rtol=1e-12, atol=1e-12)
    assert b == pytest.approx(b0, rel=1e-12, abs=1e-12)
    np.testing.assert_allclose(pit_p, pit_p0, rtol=0, atol=1e-12)
    np.testing.assert_allclose(pit_r, pit_r0, rtol=0, atol=1e-12)


def test_score_bounds_by_hand():
    p = np.array([[0.5, 0.25, 0.25, 0.0]])
    H = 1.5 * math.log(2)
    *_, bound = stats.entropy_scores(p, [1])
    assert bound == pytest.approx(math.log(2) * 2 - H)  # |log 0.25 + H|; the p = 0 token is not in the support
    *_, bound = stats.ratio_scores(p, np.array([[0.25, 0.25, 0.25, 0.25]]), [0])
    assert bound == pytest.approx(0.25)  # ratios 0.5, 1, 1 around their p-mean 0.75


def test_score_test_does_not_trust_the_normal_tail_when_one_rare_token_dominates():
    # Found by hypothesis (tests/test_harness.py): a law (0.499975, 0.499975, 5e-5) sampled 512
    # times; the one hit of the rare token (probability 2.5% over the run) gave z = -6 under the
    # normal tail.  Its score is 6 standard deviations of the whole sum, so the CLT cannot hold.
    law = np.array([[0.499975, 0.499975, 0.00005]])
    probs = np.repeat(law, 512, axis=0)
    tokens = np.zeros(512, dtype=np.int64)
    tokens[1::2] = 1
    tokens[7] = 2
    scores, variances, bound = stats.entropy_scores(probs, tokens)
    assert bound > 5 * math.sqrt(variances.sum())
    normal = stats.score_test(scores, variances)  # the bound not passed: the normal tail
    guarded = stats.score_test(scores, variances, bound=bound)
    assert normal.pvalue < 1e-8 and guarded.statistic == normal.statistic
    assert stats.score_test(*stats.entropy_scores(probs, tokens)) == guarded  # the default unpacking guards
    # the chance of at least one such hit is 1 - (1 - 5e-5)^512 = 0.025: no evidence at all
    assert guarded.pvalue > 0.4 and "Bernstein" in guarded.method


def test_score_bound_changes_nothing_when_no_score_dominates():
    gen = np.random.default_rng(3)
    law = np.array([0.4, 0.3, 0.2, 0.1])
    tokens = gen.choice(4, size=4000, p=law)
    probs = np.repeat(law[None], 4000, axis=0)
    scores, variances, bound = stats.entropy_scores(probs, tokens)
    assert bound < stats.directed.LINDEBERG_SHARE * math.sqrt(variances.sum())
    assert stats.score_test(scores, variances, bound=bound) == stats.score_test(scores, variances)
    # power kept: a planted shift of 3% of the mass from the top token to the last is still caught
    shifted = gen.choice(4, size=4000, p=[0.37, 0.3, 0.2, 0.13])
    scores, variances, bound = stats.entropy_scores(probs, shifted)
    assert stats.score_test(scores, variances, bound=bound).pvalue < 1e-3


def test_acceptance_exact_paths():
    # all equal -> scipy.stats.binomtest
    assert stats.acceptance_test(55, np.full(80, 0.6)).pvalue == pytest.approx(sps.binomtest(55, 80, 0.6).pvalue)
    # deterministic
    assert stats.acceptance_test(3, [1, 1, 1, 0]).pvalue == 1.0
    assert stats.acceptance_test(2, [1, 1, 1, 0]).pvalue == 0.0
    assert stats.acceptance_test(4, [1, 1, 1, 0.0]).pvalue == 0.0
    # Poisson-binomial minlike vs brute force enumeration
    probs = np.array([0.1, 0.5, 0.8, 0.3, 0.95, 0.6, 0.2])
    pmf = np.zeros(8)
    for bits in itertools.product([0, 1], repeat=7):
        b = np.array(bits)
        pmf[b.sum()] += np.prod(np.where(b, probs, 1 - probs))
    for k in range(8):
        want = pmf[pmf <= pmf[k] * (1 + 1e-7)].sum()
        assert stats.acceptance_test(k, probs).pvalue == pytest.approx(min(1, want), rel=1e-9)


def test_set_mass_is_the_count_law_of_its_flags():
    probs = np.array([0.1, 0.5, 0.8, 0.3, 0.95, 0.6, 0.2])
    for k in range(8):
        flags = np.arange(7) < k
        res = stats.set_mass_test(flags, probs, label="the tail")
        assert res.pvalue == stats.acceptance_test(k, probs).pvalue
        assert res.family == "directed" and res.details["set"] == "the tail" and res.n == 7
    # a token in a set of mass 0 is impossible under H0, whatever the other counts
    assert stats.set_mass_test(np.array([True, False]), [0.0, 0.5], label="s").pvalue == 0.0
    assert stats.set_mass_test(np.array([False, True]), [0.0, 0.5], label="s").pvalue == 1.0
    with pytest.raises(InvalidArgument, match="in_set"):
        stats.set_mass_test(np.array([1, 0]), [0.5, 0.5], label="s")
    with pytest.raises(InvalidArgument, match="in_set"):
        stats.set_mass_test(np.array([True]), [0.5, 0.5], label="s")
    with pytest.raises(InvalidArgument, match="set_probs"):
        stats.set_mass_test(np.array([True]), [1.5], label="s")


def test_set_mass_detectable_shift_is_regraded_at_its_share():
    probs = np.full(4000, 0.05)
    res = stats.set_mass_test(np.arange(4000) < 200, probs, label="s", alpha=1e-3)
    assert (
        res.mde_tv
        == res.details["mde_mass"]
        == pytest.approx((sps.norm.isf(5e-4) + sps.norm.isf(0.1)) * math.sqrt(4000 * 0.05 * 0.95) / 4000)
    )
    # two directed tests share the family's budget: each detects only a larger shift
    graded = stats.grade([res, res.replace(name="other")], alpha=1e-3)
    assert graded[0].alpha == pytest.approx(5e-4)
    assert graded[0].mde_tv == graded[0].details["mde_mass"] > res.mde_tv


def test_support_states_the_mass_on_zero_ids_it_sees():
    res = stats.support_test(np.array([500, 500, 0]), [0.5, 0.5, 0.0])
    assert res.details["mde_mass"] == pytest.approx(1 - 0.1 ** (1 / 1000))
    assert (1 - res.details["mde_mass"]) ** 1000 == pytest.approx(0.1)


def test_acceptance_binomial_where_scipy_overflows(monkeypatch):
    # Hypothesis found it: equal acceptance probabilities of 4.45e-308 (tables with near-underflow
    # entries) made scipy's binomtest raise OverflowError, so check_verifier crashed.
    tiny = np.full(95, 4.45e-308)
    assert stats.acceptance_test(0, tiny).pvalue == 1.0
    assert stats.acceptance_test(1, tiny).pvalue == pytest.approx(95 * 4.45e-308, rel=1e-9)
    assert stats.acceptance_test(2, tiny).pvalue < 1e-300
    # the fallback is the same sum as binomtest's where binomtest works
    cases = [(55, 80, 0.6), (3, 95, 1e-3), (1, 95, 1e-300), (200, 1000, 0.25), (0, 50, 0.3)]
    wanted = [sps.binomtest(k, n, p).pvalue for k, n, p in cases]

    def overflow(*args, **kwargs):
        raise OverflowError("boost")

    monkeypatch.setattr(stats.counts._st, "binomtest", overflow)
    for (k, n, p), want in zip(cases, wanted):
        assert stats.acceptance_test(k, np.full(n, p)).pvalue == pytest.approx(want, rel=1e-9)


def test_acceptance_normal_path_close_to_exact():
    rng = np.random.default_rng(4)
    probs = rng.uniform(0.2, 0.9, 30000)
    mu, sd = probs.sum(), math.sqrt((probs * (1 - probs)).sum())
    for dz in (-3.0, 0.5, 2.5):
        k = int(round(mu + dz * sd))
        r = stats.acceptance_test(k, probs)
        assert "refined normal" in r.details["method"]
        approx_ref = 2 * sps.norm.sf(abs(k - mu) - 0.5, scale=sd) if abs(k - mu) > 0.5 else 1.0
        assert r.pvalue == pytest.approx(approx_ref, rel=0.05)


def test_collision_moments_brute_force():
    p = np.array([0.5, 0.3, 0.2])
    n = 4
    mean = var2 = 0.0
    for xs in itertools.product(range(3), repeat=n):
        w = np.prod(p[list(xs)])
        c = sum(xs[i] == xs[j] for i in range(n) for j in range(i + 1, n))
        mean += w * c
        var2 += w * c * c
    m, v = stats.collision_moments(p, n)
    assert m == pytest.approx(mean) and v == pytest.approx(var2 - mean**2)


def test_collision_test_counts():
    tokens = np.array([[1, 1, 1, 2], [0, 3, 0, 3]])  # 3 + 2 collisions
    r = stats.collision_test(tokens, np.full(4, 0.25))
    assert r.details["observed"] == 5
    assert r.details["expected"] == pytest.approx(2 * 6 * 0.25)
    same = stats.collision_test(np.zeros((200, 8), int), np.full(4, 0.25))
    assert same.pvalue < 1e-100  # shared randomness across rows


# ----------------------------------------------------------------------------- e-process
def test_eprocess_closed_form_equals_sequential_predictive_product():
    p = np.array([0.5, 0.3, 0.2, 0.0])
    seq = [0, 0, 1, 2, 0, 1, 1, 0]
    e = stats.CategoricalEProcess(p, log10_c=(0.5,))
    for x in seq:
        e.update(np.bincount([x], minlength=4))
    c = 10**0.5
    logE, counts = 0.0, np.zeros(4)
    for x in seq:  # Dirichlet-multinomial predictive (c p_x + n_x) / (c + n) over p_x
        logE += math.log((c * p[x] + counts[x]) / (c + counts.sum()) / p[x])
        counts[x] += 1
    assert e.log_e == pytest.approx(logE)
    assert e.log_e_per_c()[0] == pytest.approx(
        gammaln(c)
        - gammaln(c + 8)
        + sum(gammaln(c * p[i] + counts[i]) - gammaln(c * p[i]) for i in range(3))
        - sum(counts[i] * math.log(p[i]) for i in range(3))
    )
    e.update([0, 0, 0, 1])
    assert e.log_e == math.inf and e.rejects(1e-9) and e.pvalue == 0.0


def test_sequential_gof_stops_and_reports():
    p = np.full(10, 0.1)
    q = p.copy()
    q[0] += 0.2
    q[1:] -= 0.2 / 9
    rng = np.random.default_rng(5)
    pulled = []

    def batches():
        for i in range(1000):
            pulled.append(i)
            yield rng.multinomial(100, q)

    r = stats.sequential_gof(batches(), p, alpha=1e-3)
    assert r.details["rejected"] and r.pvalue <= 1e-3 and r.details["stopped_at"] == 100 * len(pulled) < 100000
    r = stats.sequential_gof((rng.multinomial(100, p) for _ in range(20)), p, alpha=1e-3, max_samples=1000)
    assert r.details["stopped_at"] == 1000 and not r.details["rejected"] and r.pvalue > 1e-3


# ----------------------------------------------------------------------------- grading
def test_weighted_holm_hand_example():
    mk = lambda fam, p: TestResult(statistic=0.0, pvalue=p, name=fam, family=fam, method="", n=1)  # noqa: E731
    # (the rule-conformance family "acceptance" has a budget of its own: tests/stats/test_conformance_budget.py)
    res = [mk("gof", 4e-4), mk("directed", 2e-4), mk("independence", 0.01), mk("independence", 0.9)]
    g = stats.grade(res, alpha=1e-3, family_weights={"gof": 2, "directed": 1, "independence": 1})
    # weights 0.5, 0.25, 0.125, 0.125; p/w = 8e-4, 8e-4, 0.08, 7.2 (tie -> input order)
    # adjusted: 4e-4*1/0.5 = 8e-4; 2e-4*0.5/0.25 = 4e-4 -> 8e-4; 0.01*0.25/0.125 = 0.02; 0.9*1 -> 0.9
    assert [r.adjusted_pvalue for r in g] == pytest.approx([8e-4, 8e-4, 0.02, 0.9])
    assert [r.grade for r in g] == ["fail", "fail", "suspicious", "pass"]
    assert [r.alpha for r in g] == pytest.approx([5e-4, 2.5e-4, 1.25e-4, 1.25e-4])
    assert stats.verdict(g) == "fail" and stats.verdict(g[2:]) == "suspicious" and stats.verdict(g[3:]) == "pass"
    # plain Holm (equal weights): 0.01, 0.04, 0.03 -> 0.03, 0.06, 0.06
    assert stats.holm_adjust([0.01, 0.04, 0.03], [1, 1, 1]) == pytest.approx([0.03, 0.06, 0.06])


@settings(max_examples=100, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), m=st.integers(1, 12), alpha=st.floats(1e-4, 0.5))
def test_weighted_holm_equals_step_down_procedure(seed, m, alpha):
    rng = np.random.default_rng(seed)
    p = rng.uniform(0, 1, m) ** 4
    w = rng.uniform(0.1, 1, m)
    w /= w.sum()
    adj = stats.holm_adjust(p, w)
    # Holm (1979): step j rejects if p_(j) <= alpha w_(j) / sum_{l >= j} w_(l); stop at the first non-rejection
    order = np.lexsort((np.arange(m), p / w))
    rejected = np.zeros(m, bool)
    remaining = 1.0
    for i in order:
        if p[i] <= alpha * w[i] / remaining * (1 + 1e-12):
            rejected[i] = True
            remaining -= w[i]
        else:
            break
    assert np.array_equal(adj <= alpha * (1 + 1e-12), rejected) or np.allclose(adj[rejected != (adj <= alpha)], alpha)


def test_grade_support_failure_always_fails_and_is_deterministic():
    res = [TestResult(statistic=1.0, pvalue=0.0, name="support", family="support", method="", n=5)] + [
        TestResult(statistic=0.0, pvalue=0.5, name=f"g{i}", family="gof", method="", n=5) for i in range(1000)
    ]
    g1 = stats.grade(res)
    assert g1[0].grade == "fail" and stats.verdict(g1) == "fail"
    assert stats.grade(res) == g1


def test_grade_recomputes_mde_at_allocated_alpha():
    rng = np.random.default_rng(6)
    p = rng.dirichlet(np.ones(40))
    r = stats.gof_test(rng.multinomial(5000, p), p)
    (g,) = stats.grade([r, stats.support_test(rng.multinomial(10, p), p)])[:1]
    assert g.alpha == pytest.approx(1e-3 * 0.30 / 0.34)
    assert g.mde_tv == pytest.approx(stats.min_detectable_tv(5000, r.df, g.alpha))


# ----------------------------------------------------------------------------- validation
@pytest.mark.parametrize(
    "call,match",
    [
        (lambda: stats.gof_test([1, 2], [0.5, np.nan]), r"expected_probs\[1\]"),
        (lambda: stats.gof_test([1, 2], [0.5, -0.1]), r"expected_probs\[1\]"),
        (lambda: stats.gof_test([1, 2, 3], [0.5, 0.5]), "same shape"),
        (lambda: stats.gof_test([1.5, 2], [0.5, 0.5]), r"counts\[0\]"),
        (lambda: stats.gof_test([1, 2], [0.5, 0.5], alpha=2), "alpha"),
        (lambda: stats.gof_test([1, 2], [0, 0]), "positive sum"),
        (lambda: stats.make_bins([0.5, 0.5], -1), "n must"),
        (lambda: stats.randomised_pit([[0.5, 0.5]], [2], generator=torch.Generator()), r"tokens\[0\]"),
        (lambda: stats.randomised_pit([[0.5, 0.5]], [1], generator=None), "generator"),
        (lambda: stats.randomised_pit([[0.5, 0.5]], [1], generator=torch.Generator(), order="ratio"), "draft_probs"),
        (lambda: stats.acceptance_test(5, [0.5, 0.5]), "num_accepted"),
        (lambda: stats.acceptance_test(1, [0.5, 1.5]), r"accept_probs\[1\]"),
        (lambda: stats.min_detectable_tv(10, 0, 0.01), "df"),
        (lambda: stats.samples_needed(0, 3, 0.01), "tv"),
        (lambda: stats.grade([object()]), r"results\[0\]"),
        (lambda: stats.grade([TestResult(0.0, 0.5, "x", "new", "", 1)], family_weights={"gof": 1}), "new"),
        (lambda: stats.verdict([TestResult(0.0, 0.5, "x", "gof", "", 1)]), "not graded"),
        (lambda: stats.CategoricalEProcess([0.5, 0.5]).update([1, 2, 3]), "counts"),
        (lambda: stats.collision_test([[0, 5]], [0.5, 0.5]), r"tokens\[0, 1\]"),
    ],
)
def test_invalid_arguments_name_the_argument(call, match):
    with pytest.raises(InvalidArgument, match=match):
        call()
