"""Lossy reference rules (reference.lossy): samples follow their exact laws, closed forms hold.

The exact laws are checked against large seeded samples (chi-square per in-block
position, categories = tokens + "not emitted", alpha 1e-6 per position so the suite
never flakes) and against the closed forms of ``docs/trees-and-lossy.md``:
``TV = (1 - w) TV(p, q)`` for the HF ensemble rule, ``TV = S_k (1/t - 1)`` for SGLang's
one-level thresholds.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from _strategies import pq_pairs
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from specverify.core import chain_laws
from specverify.core.errors import InvalidArgument
from specverify.core.sampling import sample
from specverify_reference import lossy

META_ALPHA = 1e-6
N = 200_000


def _rows(seed: int, n: int, V: int, *, power: float = 2.0) -> torch.Tensor:
    w = np.random.default_rng(seed).random((n, V)) ** power + 1e-3
    return torch.as_tensor(w / w.sum(-1, keepdims=True))  # (n, V) float64


def _tv(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return 0.5 * (a - b).abs().sum(-1)


def _check_block_sample(verify, laws, p, q, *, seed):
    """Chi-square per in-block position of N calls of ``verify`` on fixed rows against ``laws`` (K+1, V)."""
    K, V = q.shape
    g = torch.Generator().manual_seed(seed)
    target, draft = p.expand(N, K + 1, V), q.expand(N, K, V)
    drafts = sample(draft, generator=g)  # (N, K)
    tokens, num_emitted = verify(target, draft, drafts, generator=g)
    for i in range(K + 1):
        cells = torch.where(num_emitted > i, tokens[:, i], V).numpy()  # V = not emitted
        observed = np.bincount(cells, minlength=V + 1)
        expected = np.append(laws[i].numpy(), 1.0 - float(laws[i].sum())) * N
        live = expected > 1e-9
        assert observed[~live].sum() == 0, f"position {i + 1}: tokens of exact probability 0 were emitted"
        if live.sum() == 1:  # a certain outcome
            continue
        pvalue = stats.chisquare(observed[live], expected[live] * observed[live].sum() / expected[live].sum()).pvalue
        assert pvalue > META_ALPHA / (K + 1), (
            f"position {i + 1}: observed {observed.tolist()} vs expected {np.round(expected, 1).tolist()}, "
            f"p={pvalue:.3g}, N={N}, seed={seed}"
        )


@pytest.mark.parametrize("weight", [0.0, 0.3, 0.8])
def test_ensemble_sample_matches_exact_law(weight):
    p, q = _rows(1, 4, 6), _rows(2, 3, 6)
    laws = lossy.ensemble_position_laws(p, q, weight=weight)  # (K+1, V)
    _check_block_sample(lambda *a, **k: lossy.ensemble_verify(*a, weight=weight, **k), laws, p, q, seed=11)


@pytest.mark.parametrize(("eps", "delta"), [(0.09, 0.3), (0.2, 0.6)])
def test_typical_sample_matches_exact_law(eps, delta):
    p, q = _rows(3, 4, 7, power=3.0), _rows(4, 3, 7)
    laws = lossy.typical_position_laws(p, q, eps=eps, delta=delta)
    _check_block_sample(lambda *a, **k: lossy.typical_verify(*a, eps=eps, delta=delta, **k), laws, p, q, seed=12)


@pytest.mark.parametrize(("t", "s"), [(0.5, 1.0), (0.7, 0.3), (1.0, 1.0)])
def test_threshold_sample_matches_exact_law(t, s):
    p, q = _rows(5, 4, 6, power=3.0), _rows(6, 3, 6)
    laws = lossy.threshold_position_laws(p, q, threshold_acc=t, threshold_single=s)
    verify = lambda *a, **k: lossy.threshold_verify(*a, threshold_acc=t, threshold_single=s, **k)  # noqa: E731
    _check_block_sample(verify, laws, p, q, seed=13)


def test_threshold_level_sample_matches_law():
    p = _rows(7, 1, 9, power=3.0)[0]
    cand = torch.tensor([3, 0, 5])
    law = lossy.threshold_level_law(p, cand, threshold_acc=0.8, threshold_single=0.25)
    g = torch.Generator().manual_seed(14)
    draws = lossy.threshold_level_sample(
        p.expand(N, -1), cand.expand(N, -1), generator=g, threshold_acc=0.8, threshold_single=0.25
    )
    observed = np.bincount(draws.numpy(), minlength=9)
    live = law.numpy() > 0
    assert observed[~live].sum() == 0
    pvalue = stats.chisquare(observed[live], law.numpy()[live] * N).pvalue
    assert pvalue > META_ALPHA, f"observed {observed.tolist()} vs {np.round(law.numpy() * N, 1).tolist()}"


# --------------------------------------------------------------------------- closed forms


@settings(max_examples=200, deadline=None)
@given(pq=pq_pairs(max_V=64), w=st.floats(0.0, 1.0))
def test_ensemble_tv_closed_form(pq, w):
    p, q = pq
    law = lossy.ensemble_declared_law(p, q, weight=w)
    assert torch.allclose(law, w * p + (1 - w) * q, atol=1e-12)
    assert abs(float(_tv(law, p)) - (1 - w) * float(_tv(p, q))) < 1e-12


@settings(max_examples=200, deadline=None)
@given(
    V=st.integers(2, 40),
    seed=st.integers(0, 2**31),
    k=st.integers(1, 5),
    t=st.floats(0.05, 1.0),
)
def test_threshold_level_tv_closed_form(V, seed, k, t):
    p = _rows(seed, 1, V, power=3.0)[0]
    cand = torch.as_tensor(np.random.default_rng(seed + 1).permutation(V)[: min(k, V - 1)])
    S = float(p[cand].sum())
    law = lossy.threshold_level_law(p, cand, threshold_acc=t, threshold_single=1.0)
    assert abs(float(law.sum()) - 1.0) < 1e-12
    if S <= t:  # the closed form: candidates at p/t, the rest scaled by (1 - S/t)/(1 - S)
        assert torch.allclose(law[cand], p[cand] / t, atol=1e-12)
        rest = torch.ones(V, dtype=torch.bool)
        rest[cand] = False
        assert torch.allclose(law[rest], p[rest] * (1 - S / t) / (1 - S), atol=1e-12)
        assert abs(float(_tv(law, p)) - S * (1 / t - 1)) < 1e-12


def test_threshold_chain_one_hot_drafter_is_one_level_law():
    p = _rows(8, 2, 5)  # (K+1, V), K = 1
    q = torch.zeros(1, 5, dtype=torch.float64)
    q[0, 2] = 1.0  # deterministic candidate: token 2
    chain = lossy.threshold_position_laws(p, q, threshold_acc=0.6)[0]
    level = lossy.threshold_level_law(p[0], torch.tensor([2]), threshold_acc=0.6)
    assert torch.allclose(chain, level, atol=1e-12)


def test_lossless_corners_are_the_target():
    p, q = _rows(9, 4, 8), _rows(10, 3, 8)
    canonical = chain_laws.position_laws(p, q)
    assert torch.allclose(lossy.ensemble_position_laws(p, q, weight=1.0), canonical, atol=1e-12)
    # t = 1 thresholds are lossless for any drafter: every position is the target row
    laws = lossy.threshold_position_laws(p, q, threshold_acc=1.0)
    reach = laws.sum(-1, keepdim=True)
    assert torch.allclose(laws / reach, p, atol=1e-12)


def test_typical_rule_pieces():
    p = torch.tensor([0.6, 0.3, 0.05, 0.05], dtype=torch.float64)
    thr = float(chain_laws.typical_threshold(p, eps=0.09, delta=0.3))
    H = -float((p * p.log()).sum())
    assert thr == pytest.approx(min(0.09, 0.3 * np.exp(-H)))
    trunc = lossy.typical_declared_law(p, None)
    assert torch.allclose(trunc, torch.where(p >= thr, p, 0.0) / p[p >= thr].sum())
    q = torch.tensor([0.1, 0.1, 0.4, 0.4], dtype=torch.float64)
    law = lossy.typical_declared_law(p, q)
    accept = (p > thr).double()
    assert torch.allclose(law, q * accept + float((q * (1 - accept)).sum()) * trunc, atol=1e-12)


def test_factories_carry_declared_law():
    v = lossy.ensemble(0.25)
    p, q = _rows(11, 1, 5), _rows(12, 1, 5)
    assert torch.allclose(v.declared_law(p, q), 0.25 * p + 0.75 * q)
    assert torch.allclose(lossy.threshold(0.5).declared_law(p, None), p)
    assert callable(lossy.typical(0.1, 0.4))


@pytest.mark.parametrize(
    ("call", "needle"),
    [
        (lambda: lossy.ensemble(1.5), "weight"),
        (lambda: lossy.threshold(0.0), "threshold_acc"),
        (lambda: lossy.threshold(0.5, 1.2), "threshold_single"),
        (lambda: chain_laws.ensemble_rule(-0.1), "weight"),
        (lambda: chain_laws.typical_rule(0.0, 0.3), "eps"),
        (
            lambda: lossy.ensemble_verify(
                torch.ones(2, 3, 4) / 4, torch.ones(2, 2, 4) / 4, torch.zeros(2, 3), generator=torch.Generator()
            ),
            "draft_tokens",
        ),
    ],
)
def test_bad_input(call, needle):
    with pytest.raises(InvalidArgument, match=needle):
        call()
