"""Calibration meta-tests: under exact sampling from the null law every p-value is uniform
(or super-uniform for discrete / conservative tests) and the false-alarm rate at alpha = 0.01
lies within binomial bounds at meta-alpha 1e-6.  The default run uses a few hundred seeded null
runs per test; the @slow variants use thousands.

Null laws: flat, Zipf over 32k tokens, one dominant token, many exact zeros (svstats_helpers).
Sampling: numpy Generator(seed).multinomial for counts, specverify.core.sampling.sample for tokens.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy import stats as sps
from svstats_helpers import META_ALPHA, NULL_SHAPES, multinomial, rate_bounds

from specverify import stats
from specverify.core.sampling import sample

ALPHA = 0.01
REPS = [200, pytest.param(4000, marks=pytest.mark.slow, id="slow")]
GOF_N = {"flat": 2000, "zipf32k": 20000, "dominant": 5000, "zeros": 3000}


def check_calibration(pvals, what, *, exact_uniform=True, conservative=False):
    """Rejections at ALPHA within binomial bounds; KS of the p-values (two-sided for continuous
    p-values, one-sided against anti-conservative ones for discrete or conservative tests)."""
    pvals = np.asarray(pvals)
    reps = pvals.size
    rejections = int(np.sum(pvals <= ALPHA))
    lo, hi = rate_bounds(reps, ALPHA)
    assert rejections <= hi, f"{what}: {rejections}/{reps} null rejections at alpha={ALPHA}, bound {hi}"
    if not conservative:
        assert rejections >= lo, f"{what}: only {rejections}/{reps} null rejections at alpha={ALPHA}, bound {lo}"
    alt = "two-sided" if exact_uniform and not conservative else "greater"
    ks = sps.kstest(pvals, "uniform", alternative=alt)
    assert ks.pvalue > META_ALPHA, (
        f"{what}: p-values not uniform (KS {alt} D={ks.statistic:.4f}, p={ks.pvalue:.2e}, reps={reps})"
    )


@pytest.mark.parametrize("reps", REPS)
@pytest.mark.parametrize("shape", sorted(NULL_SHAPES))
def test_gof_calibration(shape, reps):
    p = NULL_SHAPES[shape]()
    n = GOF_N[shape]
    rng = np.random.default_rng(1000 + reps)
    pv = [stats.gof_test(rng.multinomial(n, p), p).pvalue for _ in range(reps)]
    assert stats.gof_test(rng.multinomial(n, p), p).bins >= 3
    check_calibration(pv, f"gof/{shape} N={n}")


@pytest.mark.parametrize("reps", REPS)
def test_gof_mixture_of_contexts_is_conservative(reps):
    """expected_probs = sum of per-context laws (counts pooled over contexts): valid, conservative."""
    rng = np.random.default_rng(7)
    laws = rng.dirichlet(np.full(100, 0.5), size=5)  # (contexts, V)
    sizes = np.array([300, 600, 200, 900, 500])
    expected = (sizes[:, None] * laws).sum(0)
    pv = []
    for _ in range(reps):
        counts = sum(rng.multinomial(m, law) for m, law in zip(sizes, laws))
        pv.append(stats.gof_test(counts, expected).pvalue)
    check_calibration(pv, "gof/mixture of contexts", conservative=True)


@pytest.mark.parametrize("reps", REPS)
@pytest.mark.parametrize("shape", ["flat", "zipf32k", "zeros"])
def test_two_sample_calibration(shape, reps):
    p = NULL_SHAPES[shape]()
    n = GOF_N[shape] // 2
    rng = np.random.default_rng(2000 + reps)
    pv = [stats.two_sample_test(rng.multinomial(n, p), rng.multinomial(4 * n, p)).pvalue for _ in range(reps)]
    check_calibration(pv, f"two_sample/{shape} n={n} m={4 * n}")


def _context_rows(rng, V, N):
    """N rows from 4 different laws (context-dependent target) with a draft law per row."""
    laws = rng.dirichlet(np.full(V, 0.4), size=4)
    laws[1, : V // 3] = 0  # exact zeros in one context
    laws /= laws.sum(1, keepdims=True)
    which = rng.integers(0, 4, N)
    target = laws[which]  # (N, V)
    draft = rng.dirichlet(np.full(V, 0.4), size=4)[which]  # (N, V)
    return target, draft


@pytest.mark.parametrize("reps", [100, pytest.param(3000, marks=pytest.mark.slow, id="slow")])
def test_directed_calibration(reps):
    rng = np.random.default_rng(3000 + reps)
    gen = torch.Generator().manual_seed(3000 + reps)
    V, N = 120, 400
    target, draft = _context_rows(rng, V, N)
    tt = torch.from_numpy(target)
    out: dict[str, list] = {name: [] for name in ("pit_p", "pit_ratio", "entropy", "ratio")}
    out |= {"entropy_guarded": [], "ratio_guarded": []}
    for _ in range(reps):
        tokens = sample(tt, generator=gen).numpy()
        out["pit_p"].append(stats.pit_test(stats.randomised_pit(target, tokens, generator=gen)).pvalue)
        out["pit_ratio"].append(
            stats.pit_test(stats.randomised_pit(target, tokens, generator=gen, order="ratio", draft_probs=draft)).pvalue
        )
        for name, (scores, variances, bound) in (
            ("entropy", stats.entropy_scores(target, tokens)),
            ("ratio", stats.ratio_scores(target, draft, tokens)),
        ):
            out[name].append(stats.score_test(scores, variances).pvalue)  # the normal tail alone: exact
            # what the batteries run: the normal tail unless one score could dominate, then
            # Bernstein-Freedman (conservative: these laws' rare tokens trigger it at N = 400)
            out[name + "_guarded"].append(stats.score_test(scores, variances, bound).pvalue)
    for name, pv in out.items():
        check_calibration(pv, f"directed/{name} N={N}", conservative=name.endswith("_guarded"))


@pytest.mark.parametrize("reps", REPS)
def test_acceptance_calibration(reps):
    rng = np.random.default_rng(4000 + reps)
    varied = rng.uniform(0.05, 0.95, 600)
    equal = np.full(600, 0.37)
    with_sure = np.concatenate([varied[:300], np.ones(50), np.zeros(50)])
    for what, probs in (("varied", varied), ("equal", equal), ("with 0/1", with_sure)):
        pv = [stats.acceptance_test(int((rng.random(probs.size) < probs).sum()), probs).pvalue for _ in range(reps)]
        check_calibration(pv, f"acceptance/{what}", exact_uniform=False)


@pytest.mark.parametrize("reps", REPS)
def test_set_mass_calibration(reps):
    rng = np.random.default_rng(4100 + reps)
    probs = np.concatenate([rng.uniform(0.0, 0.1, 500), np.zeros(50)])  # tails of 0-10%, some sets empty
    pv = [stats.set_mass_test(rng.random(probs.size) < probs, probs, label="tail").pvalue for _ in range(reps)]
    check_calibration(pv, "set_mass/tails", exact_uniform=False)


@pytest.mark.parametrize("reps", REPS)
@pytest.mark.parametrize("shape", ["flat", "zipf32k", "dominant"])
def test_collision_calibration(shape, reps):
    p = NULL_SHAPES[shape]()
    n_batches, n = {"flat": (100, 16), "zipf32k": (50, 64), "dominant": (200, 4)}[shape]
    rng = np.random.default_rng(5000 + reps)
    pv = [stats.collision_test(rng.choice(p.size, size=(n_batches, n), p=p), p).pvalue for _ in range(reps)]
    check_calibration(pv, f"collisions/{shape} batches={n_batches}x{n}", exact_uniform=False)


@pytest.mark.parametrize("reps", [120, pytest.param(3000, marks=pytest.mark.slow, id="slow")])
@pytest.mark.parametrize("shape", ["flat", "zipf32k", "zeros"])
def test_eprocess_false_alarm_rate(shape, reps):
    """Ville: P(sup_t E_t >= 1/alpha) <= alpha; checked at every batch of 20 x 250 tokens."""
    p = NULL_SHAPES[shape]()
    rng = np.random.default_rng(6000 + reps)
    alpha = 0.05
    crossed = 0
    for _ in range(reps):
        e = stats.CategoricalEProcess(p)
        for _ in range(20):
            e.update(multinomial(rng, 250, p))
        crossed += e.rejects(alpha)
    hi = rate_bounds(reps, alpha)[1]
    assert crossed <= hi, f"e-process/{shape}: {crossed}/{reps} null runs reached 1/alpha={1 / alpha:g}, bound {hi}"
