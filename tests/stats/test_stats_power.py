"""Power meta-tests: at the detectable effect each test reports (mde_tv for binned tests,
mde_kolmogorov for PIT, mde_mean_shift for scores, mde_rate for acceptance, the relative
excess for collisions) planted deviations are rejected at alpha = 1e-3 with probability
>= 0.9, within binomial slack at meta-alpha 1e-6.

Deviations (svstats_helpers): mixture 0.9 p + 0.1 q-style, temperature < 1, top-k
truncation (mixed in), one token's mass moved to another, and the least favourable
deviation (q - p proportional to +-p), each scaled so its binned TV equals mde_tv.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy import optimize
from svstats_helpers import (
    DEVIATIONS,
    binned_tv,
    deviation_at_tv,
    flat,
    least_favourable,
    min_successes,
    multinomial,
    temperature,
    zipf,
)

from specverify import stats

ALPHA = 1e-3
REPS = [60, pytest.param(1000, marks=pytest.mark.slow, id="slow")]
LAWS = {"flat64": (flat, 2000), "zipf32k": (zipf, 20000)}


def _assert_power(rejections, reps, what):
    need = min_successes(reps, 0.9)
    assert rejections >= need, f"{what}: power {rejections}/{reps} at the reported detectable effect, need >= {need}"


@pytest.mark.parametrize("reps", REPS)
@pytest.mark.parametrize("law", sorted(LAWS))
@pytest.mark.parametrize("deviation", sorted(DEVIATIONS))
def test_gof_power_at_reported_mde(law, deviation, reps):
    _gof_power(law, deviation, reps)


@pytest.mark.parametrize("reps", REPS)
def test_gof_power_least_favourable_is_tight_on_singletons(reps):
    """On singleton bins (no tail pooling) the least favourable deviation has power ~0.9 at mde_tv."""
    _gof_power("flat64", "least_favourable", reps)


@pytest.mark.xfail(
    strict=True,
    reason=(
        "known limitation of the ncx2 power statement: with hundreds of tail bins, a deviation that removes small "
        "relative mass from many low-count bins lowers the statistic's mean by ~sum_b delta_b (Pearson/CR tests are "
        "biased), so power at mde_tv drops to ~0.7 (zipf32k, N=20000, df~900)"
    ),
)
def test_gof_power_least_favourable_many_tail_bins():
    _gof_power("zipf32k", "least_favourable", 100)


def _gof_power(law, deviation, reps):
    make, n = LAWS[law]
    p = make()
    rng = np.random.default_rng(11)
    probe = stats.gof_test(multinomial(rng, n, p), p, alpha=ALPHA)
    bins = stats.make_bins(p, n)
    family = least_favourable if deviation == "least_favourable" else DEVIATIONS[deviation]
    q = deviation_at_tv(family, p, bins, probe.mde_tv)
    if q is None:
        pytest.skip(f"{deviation} cannot reach binned TV {probe.mde_tv:.3g} on {law}")
    assert binned_tv(bins, q) == pytest.approx(probe.mde_tv, rel=1e-6)
    rejected = sum(stats.gof_test(multinomial(rng, n, q), p, alpha=ALPHA).pvalue <= ALPHA for _ in range(reps))
    _assert_power(rejected, reps, f"gof/{law}/{deviation} N={n} TV={probe.mde_tv:.4f}")


@pytest.mark.parametrize("reps", REPS)
@pytest.mark.parametrize("deviation", ["mixture", "temperature"])
def test_two_sample_power_at_reported_mde(deviation, reps):
    p = np.random.default_rng(2).dirichlet(np.full(64, 1.0))
    n, m = 2000, 8000
    rng = np.random.default_rng(12)
    probe = stats.two_sample_test(rng.multinomial(n, p), rng.multinomial(m, p), alpha=ALPHA)
    bins = stats.make_bins(p, n)
    q = deviation_at_tv(DEVIATIONS[deviation], p, bins, probe.mde_tv)
    rejected = sum(
        stats.two_sample_test(rng.multinomial(n, q), rng.multinomial(m, p), alpha=ALPHA).pvalue <= ALPHA
        for _ in range(reps)
    )
    _assert_power(rejected, reps, f"two_sample/{deviation} n={n} m={m} TV={probe.mde_tv:.4f}")


def _kolmogorov(p, q, order):
    return float(np.max(np.abs(np.cumsum(q[order]) - np.cumsum(p[order]))))


@pytest.mark.parametrize("reps", REPS)
@pytest.mark.parametrize("order", ["p", "ratio"])
def test_pit_power_at_reported_mde(order, reps):
    rng = np.random.default_rng(13)
    gen = torch.Generator().manual_seed(13)
    V, N = 200, 2000
    p = rng.dirichlet(np.full(V, 0.5))
    draft = rng.dirichlet(np.full(V, 0.5))
    mde = stats.pit_test(rng.random(N), alpha=ALPHA).details["mde_kolmogorov"]
    if order == "p":
        key = stats.p_order(p)
        fam = lambda e: temperature(p, e)  # noqa: E731
    else:
        key = np.lexsort((np.arange(V), np.log(draft) - np.log(p)))
        fam = lambda e: (1 - e) * p + e * draft  # noqa: E731  always-accept-like: output drifts towards q
    eps = optimize.brentq(lambda e: _kolmogorov(p, fam(e), key) - mde, 0, 0.99)
    q = fam(eps)
    P, D = np.tile(p, (N, 1)), np.tile(draft, (N, 1))
    rejected = 0
    for _ in range(reps):
        tokens = np.minimum(np.searchsorted(np.cumsum(q), rng.random(N) * q.sum(), side="right"), V - 1)
        u = stats.randomised_pit(P, tokens, generator=gen, order=order, draft_probs=D if order == "ratio" else None)
        rejected += stats.pit_test(u, alpha=ALPHA).pvalue <= ALPHA
    _assert_power(rejected, reps, f"pit/{order} N={N} Kolmogorov distance={mde:.4f}")


@pytest.mark.parametrize("reps", REPS)
@pytest.mark.parametrize("score", ["entropy", "ratio"])
def test_score_power_at_reported_mde(score, reps):
    rng = np.random.default_rng(14)
    V, N = 100, 3000
    p = rng.dirichlet(np.full(V, 0.5))
    draft = rng.dirichlet(np.full(V, 0.5))
    P, D = np.tile(p, (N, 1)), np.tile(draft, (N, 1))

    def scores(tokens):
        return stats.entropy_scores(P, tokens) if score == "entropy" else stats.ratio_scores(P, D, tokens)

    s_null, v, bound = scores(rng.integers(0, V, N))
    shift = stats.score_test(s_null, v, bound, alpha=ALPHA).details["mde_mean_shift"]
    one = np.arange(V)  # the score of each token, from single-row inputs
    per_token = (
        stats.entropy_scores(p[None].repeat(V, 0), one)[0]
        if score == "entropy"
        else stats.ratio_scores(p[None].repeat(V, 0), draft[None].repeat(V, 0), one)[0]
    )
    fam = (lambda e: temperature(p, e)) if score == "entropy" else (lambda e: (1 - e) * p + e * draft)
    eps = optimize.brentq(lambda e: abs(float(fam(e) @ per_token)) - shift, 1e-9, 0.9)
    q = fam(eps)
    rejected = 0
    for _ in range(reps):
        tokens = np.minimum(np.searchsorted(np.cumsum(q), rng.random(N) * q.sum(), side="right"), V - 1)
        rejected += stats.score_test(*scores(tokens), alpha=ALPHA).pvalue <= ALPHA
    _assert_power(rejected, reps, f"score/{score} N={N} mean shift={shift:.4f}")


@pytest.mark.parametrize("reps", REPS)
def test_acceptance_power_at_reported_mde(reps):
    rng = np.random.default_rng(15)
    probs = rng.uniform(0.2, 0.8, 3000)
    delta = stats.acceptance_test(int(probs.sum()), probs, alpha=ALPHA).details["mde_rate"]
    rejected = sum(
        stats.acceptance_test(int((rng.random(probs.size) < probs - delta).sum()), probs, alpha=ALPHA).pvalue <= ALPHA
        for _ in range(reps)
    )
    _assert_power(rejected, reps, f"acceptance shift -{delta:.4f}")


@pytest.mark.parametrize("reps", REPS)
def test_set_mass_power_at_reported_mde(reps):
    """Mass moved out of a set (a tail of 2-8% per token) by the reported shift is caught with power 0.9."""
    rng = np.random.default_rng(17)
    probs = rng.uniform(0.02, 0.08, 3000)
    delta = stats.set_mass_test(np.zeros(probs.size, bool), probs, label="tail", alpha=ALPHA).details["mde_mass"]
    rejected = sum(
        stats.set_mass_test(rng.random(probs.size) < probs - delta, probs, label="tail", alpha=ALPHA).pvalue <= ALPHA
        for _ in range(reps)
    )
    _assert_power(rejected, reps, f"set mass shift -{delta:.4f}")


@pytest.mark.parametrize("reps", REPS)
def test_collision_power_at_reported_mde(reps):
    rng = np.random.default_rng(16)
    p = rng.dirichlet(np.full(64, 1.0))
    shape = (300, 16)
    excess = stats.collision_test(rng.choice(64, size=shape, p=p), p, alpha=ALPHA).details["mde_relative_excess"]
    s2 = float(p @ p)
    eps = optimize.brentq(lambda e: float(temperature(p, e) @ temperature(p, e)) / s2 - 1 - excess, 0, 0.9)
    q = temperature(p, eps)
    rejected = sum(
        stats.collision_test(rng.choice(64, size=shape, p=q), p, alpha=ALPHA).pvalue <= ALPHA for _ in range(reps)
    )
    # the alternative's collision variance exceeds the null's, so the power is a little under 0.9
    _assert_power(rejected, reps, f"collisions relative excess {excess:.3f}")


def test_eprocess_power_and_stopping():
    p = flat(64)
    rng = np.random.default_rng(17)
    q = 0.8 * p + 0.2 * np.eye(64)[0]  # 20% of the mass moved onto token 0
    stops = []
    for _ in range(20):
        r = stats.sequential_gof((multinomial(rng, 200, q) for _ in range(200)), p, alpha=ALPHA)
        assert r.details["rejected"], r.details
        stops.append(r.details["stopped_at"])
    # a fixed-N gof at its reported mde: the e-process pays a bounded premium for stopping anytime
    need = stats.samples_needed(binned_tv(stats.make_bins(p, np.median(stops)), q), 63, ALPHA)
    assert np.median(stops) <= 20 * need, (np.median(stops), need)
