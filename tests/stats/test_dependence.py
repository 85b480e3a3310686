"""Pair tests of dependence between rows (``specverify.stats.dependence``).

Exact laws: the pair score has mean 0 and the stated variance under independence, and
the shared-uniform shift is the exact mean under the comonotone coupling (enumerated).
Calibration: 400 seeded null replicates give a rejection count at alpha = 0.01 within the
binomial 1e-6 tail.  Power: a planted fraction of pairs sharing one uniform, 1.25 times
the reported detectable fraction, is detected in at least 34 of 40 seeded replicates
(power >= 0.9 claimed at 1.0 times, so >= 0.97 here; P(Bin(40, 0.97) < 34) < 1e-4).
Antithetic rows give a negative z.  Every random draw is seeded inside the test or the
hypothesis example.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats as sps

from specverify import stats
from specverify.core.errors import InvalidArgument
from specverify.stats.dependence import pair_scores


def _laws(rng: np.random.Generator, m: int, v: int, zeros: bool = True) -> np.ndarray:
    laws = rng.dirichlet(np.full(v, 0.6), size=m)
    if zeros and v > 2:
        laws[0, rng.integers(v)] = 0.0
    return laws / laws.sum(1, keepdims=True)


def _icdf(laws: np.ndarray, which: np.ndarray, u: np.ndarray) -> np.ndarray:
    cdf = np.cumsum(laws[which], axis=1)
    return np.minimum((u[:, None] >= cdf).sum(1), laws.shape[1] - 1)


@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_pair_score_is_centred_with_its_stated_variance_and_shared_shift(data):
    seed = data.draw(st.integers(0, 2**32 - 1))
    v = data.draw(st.integers(1, 7))
    rng = np.random.default_rng(seed)
    laws = _laws(rng, 3, v)
    a, b = (int(x) for x in rng.integers(0, 3, size=2))
    grid = np.array([(x, y) for x in range(v) for y in range(v)])
    f, var, shared = pair_scores(laws, np.full(len(grid), a), grid[:, 0], np.full(len(grid), b), grid[:, 1])
    weight = laws[a][grid[:, 0]] * laws[b][grid[:, 1]]
    assert abs(np.sum(weight * f)) < 1e-12
    assert np.sum(weight * f * f) == pytest.approx(var[0], rel=1e-9, abs=1e-15)
    # comonotone coupling, enumerated: both tokens from one u, interval by interval
    cuts = np.unique(np.concatenate([[0.0], np.cumsum(laws[a]), np.cumsum(laws[b]), [1.0]]).clip(0, 1))
    mids = (cuts[:-1] + cuts[1:]) / 2
    ta, tb = _icdf(laws, np.full(mids.size, a), mids), _icdf(laws, np.full(mids.size, b), mids)
    fc, _, _ = pair_scores(laws, np.full(mids.size, a), ta, np.full(mids.size, b), tb)
    assert np.sum(np.diff(cuts) * fc) == pytest.approx(shared[0], abs=1e-9)


def _pairs(seed: int, n: int, shared_fraction: float = 0.0, antithetic: bool = False):
    rng = np.random.default_rng(seed)
    laws = _laws(rng, 4, 6)
    la, lb = rng.integers(0, 4, n), rng.integers(0, 4, n)
    ua, ub = rng.random(n), rng.random(n)
    share = rng.random(n) < shared_fraction
    ub = np.where(share, ua, ub)
    if antithetic:
        ub = 1.0 - ua
    return laws, la, _icdf(laws, la, ua), lb, _icdf(laws, lb, ub)


def test_null_rejection_rate_is_at_most_alpha():
    rejections = sum(stats.pair_dependence_test(*_pairs(seed, 300), alpha=0.01).pvalue <= 0.01 for seed in range(400))
    assert rejections <= sps.binom.isf(1e-6, 400, 0.01), rejections


def test_planted_shared_uniforms_are_detected_at_the_stated_fraction():
    laws, la, ta, lb, tb = _pairs(0, 4000)
    mde = stats.pair_dependence_test(laws, la, ta, lb, tb, alpha=0.01).details["mde_shared_fraction"]
    assert 0 < mde < 0.5
    hits = sum(
        stats.pair_dependence_test(*_pairs(seed, 4000, shared_fraction=1.25 * mde), alpha=0.01).pvalue <= 0.01
        for seed in range(100, 140)
    )
    assert hits >= 34, (hits, mde)


def test_antithetic_rows_give_a_negative_statistic():
    res = stats.pair_dependence_test(*_pairs(5, 3000, antithetic=True), alpha=1e-6)
    assert res.statistic < 0 and res.pvalue < 1e-6


def test_graded_share_recomputes_the_detectable_fraction():
    res = stats.pair_dependence_test(*_pairs(1, 2000), alpha=1e-3)
    other = res.replace(family="gof", name="other", pvalue=0.5)
    graded = stats.grade([res, other], alpha=1e-3)[0]
    assert graded.alpha < 1e-3
    assert graded.details["mde_shared_fraction"] > res.details["mde_shared_fraction"]


def test_bad_input_is_named():
    laws = np.array([[0.5, 0.5]])
    with pytest.raises(InvalidArgument, match="tokens_b"):
        stats.pair_dependence_test(laws, [0], [1], [0], [2])
    with pytest.raises(InvalidArgument, match="law_a"):
        stats.pair_dependence_test(laws, [1], [0], [0], [0])
    with pytest.raises(InvalidArgument, match="one shape"):
        stats.pair_dependence_test(laws, [0, 0], [0, 1], [0], [0])
    with pytest.raises(InvalidArgument, match="at least one pair"):
        stats.pair_dependence_test(laws, [], [], [], [])
    with pytest.raises(InvalidArgument, match="mid values"):
        stats.midrank_pair_test([0.7], [0.1], [0.0], [0.1])


@pytest.mark.parametrize("b", [2, 3, 63, 64, 65, 127, 128, 129, 300])
def test_call_pairs_are_disjoint_and_cover_the_tile_edges(b):
    pairs = stats.call_pairs(b, block_size=96, generator=torch.Generator().manual_seed(b))
    for name, (a, c) in pairs.items():
        both = np.concatenate([a, c])
        assert both.size == np.unique(both).size, name
        assert both.min() >= 0 and both.max() < b, name
    assert pairs["first_last"] == (pytest.approx([0]), pytest.approx([b - 1]))
    edges = {int(x) for x in pairs.get("boundary", (np.array([]), np.array([])))[1]}
    assert edges == {t for t in (32, 64, 96, 128, 256) if t < b}
    for lag in (32, 64, 96, 128, 256):
        assert (f"lag{lag}" in pairs) == (lag < b)
        if lag < b:
            a, c = pairs[f"lag{lag}"]
            assert np.all(c - a == lag)
    assert pairs["random"][0].size == b // 2


def test_midrank_pair_test_sees_comonotone_rows():
    rng = np.random.default_rng(3)
    laws = _laws(rng, 1, 8, zeros=False)
    u = rng.random(5000)
    shared = np.where(rng.random(5000) < 0.2, u, rng.random(5000))
    mid = stats.mid_distribution(laws)[0]
    var = float(np.sum(laws[0] * mid * mid))
    ta, tb = _icdf(laws, np.zeros(5000, int), u), _icdf(laws, np.zeros(5000, int), shared)
    res = stats.midrank_pair_test(mid[ta], np.full(5000, var), mid[tb], np.full(5000, var), alpha=1e-6)
    assert res.statistic > 0 and res.pvalue < 1e-6
    assert 0 < res.details["mde_correlation"] < 0.2
