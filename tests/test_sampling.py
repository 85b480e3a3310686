"""specverify.core.sampling: exact inverse-CDF sampling (chi-square at alpha 1e-7 with pooled tails),
no zero-probability token ever, unnormalised rows, float32 rows, determinism, the u -> 1 edge.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from _strategies import pooled_chisquare, prob_rows, weight_rows
from hypothesis import given, settings
from hypothesis import strategies as st

import specverify.core.sampling as sampling
from specverify.core.sampling import sample

ALPHA = 1e-7


def counts_of(tokens: torch.Tensor, V: int) -> np.ndarray:
    return np.bincount(tokens.reshape(-1).numpy(), minlength=V).astype(np.float64)


def assert_exact(probs: torch.Tensor, N: int, seed: int, *, e_min: float = 5.0):
    """N draws from the row ``probs`` (V,) match it: support and pooled chi-square."""
    V = probs.shape[-1]
    tokens = sample(probs.expand(N, V), generator=torch.Generator().manual_seed(seed))  # (N,)
    assert tokens.shape == (N,) and tokens.dtype == torch.long
    assert int(tokens.min()) >= 0 and int(tokens.max()) < V
    counts = counts_of(tokens, V)
    weights = probs.double().numpy()
    zero_hits = np.flatnonzero((weights == 0) & (counts > 0))
    assert zero_hits.size == 0, f"zero-probability tokens {zero_hits.tolist()} drawn (seed={seed})"
    statistic, pvalue, bins = pooled_chisquare(counts, weights, e_min=e_min)
    assert pvalue > ALPHA, f"chi2={statistic:.1f} over {bins} bins, p={pvalue:.3g}, N={N}, V={V}, seed={seed}"
    return counts


@settings(max_examples=40, deadline=None)
@given(probs=prob_rows(max_V=4096), seed=st.integers(0, 2**32 - 1))
def test_sample_matches_probs(probs, seed):
    assert_exact(probs, 20_000, seed)


@settings(max_examples=30, deadline=None)
@given(V=st.integers(1, 16), data=st.data())
def test_unnormalised_weights(V, data):
    weights = data.draw(weight_rows(V))
    seed = data.draw(st.integers(0, 2**32 - 1))
    scale = data.draw(st.sampled_from([1e-200, 1e-6, 3.0, 1e200]))
    if not weights.sum() > 0:
        weights[0] = 1.0
    row = torch.as_tensor(weights * scale)
    if not torch.isfinite(row.sum()) or not row.sum() > 0:
        return
    assert_exact(row, 10_000, seed)


def test_subnormal_weights_are_drawn_exactly():
    """Hypothesis found it: weights of 3 x 2^-1074 each put u * total on a grid of 2^-1074, so
    token 0 came out with probability 5/12, not 1/2 (chi-square p = 1e-65 at N = 10,000)."""
    tiny = 5e-324  # 2^-1074, the smallest subnormal
    assert_exact(torch.tensor([3 * tiny, 3 * tiny], dtype=torch.float64), 10_000, seed=0)
    assert_exact(torch.tensor([tiny, 0.0, 2 * tiny, 7 * tiny], dtype=torch.float64), 10_000, seed=1)
    row = torch.tensor([1e-300, 2e-300], dtype=torch.float64)  # normal but tiny: drawn the plain way
    assert row.sum() < sampling.TINY_TOTAL and torch.equal(
        sample(row.expand(4, 2), generator=torch.Generator().manual_seed(0)),
        sample(row.expand(4, 2) * sampling.TINY_RESCALE, generator=torch.Generator().manual_seed(0)),
    )


def test_zipf_32k_long_tail():
    V = 32_768
    probs = 1.0 / torch.arange(1, V + 1, dtype=torch.float64) ** 1.1
    probs = probs[torch.randperm(V, generator=torch.Generator().manual_seed(0))]
    assert_exact((probs / probs.sum()).float(), 20_000, seed=1)


def test_one_hot_rows():
    for V, hot in [(1, 0), (2, 1), (50, 0), (50, 49), (4096, 1234)]:
        row = torch.zeros(V)
        row[hot] = 1.0
        tokens = sample(row.expand(1000, V), generator=torch.Generator().manual_seed(V))
        assert (tokens == hot).all()


def test_never_zero_probability_tokens_near_degenerate():
    for dtype in (torch.float32, torch.float64):
        row = torch.tensor([0.0, 1e-30, 0.0, 1.0 - 1e-30], dtype=dtype)
        tokens = sample(row.expand(200_000, 4), generator=torch.Generator().manual_seed(2))
        assert set(tokens.unique().tolist()) <= {1, 3}
    row = torch.tensor([1e-300, 0.0, 5e-324, 0.0], dtype=torch.float64)
    tokens = sample(row.expand(100_000, 4), generator=torch.Generator().manual_seed(3))
    assert set(tokens.unique().tolist()) <= {0, 2}


def test_float32_rows_not_summing_to_one():
    """Rows summing to 1 - 1e-6 in float32: the last token keeps its full share (scaled by the total)."""
    V = 8
    row = torch.full((V,), (1.0 - 1e-6) / V, dtype=torch.float32)
    row[-1] = 0.5
    row[:-1] = (0.5 - 1e-6) / (V - 1)
    assert abs(row.double().sum().item() - (1 - 1e-6)) < 1e-6
    counts = assert_exact(row, 200_000, seed=4)
    assert counts[-1] > 0
    # trailing zeros after a short row sum: never drawn even for u close to 1
    row = torch.tensor([0.3, 0.3, 0.3999999, 0.0, 0.0], dtype=torch.float32)
    assert_exact(row, 100_000, seed=5)


def test_extreme_uniforms(monkeypatch):
    """u = 0 and u = 1 - 2**-53 (the largest float64 below 1) stay inside the support."""
    rows = torch.tensor(
        [[0.0, 0.5, 0.5, 0.0], [0.25, 0.25, 0.5, 0.0], [0.0, 0.0, 0.0, 1.0], [1e-30, 0.0, 1.0, 0.0]],
        dtype=torch.float32,
    )
    for u_value, expected in [(0.0, [1, 0, 3, 0]), (1.0 - 2**-53, [2, 2, 3, 2])]:
        monkeypatch.setattr(
            sampling,
            "uniform",
            lambda shape, *, generator, device=None, u_value=u_value: torch.full(shape, u_value, dtype=torch.float64),
        )
        for chunk in (1, 1 << 14):  # serial chunks of one row, and one chunk
            monkeypatch.setattr(sampling, "CPU_CHUNK_ELEMENTS", chunk)
            assert sample(rows, generator=torch.Generator()).tolist() == expected
            assert sample(rows.double(), generator=torch.Generator(), check=False).tolist() == expected


def test_determinism_shapes_and_chunking(monkeypatch):
    generator = torch.Generator().manual_seed(6)
    probs = torch.softmax(torch.randn(3, 700, 9, generator=generator), -1)  # (3, 700, 9)
    a = sample(probs, generator=torch.Generator().manual_seed(1))
    b = sample(probs, generator=torch.Generator().manual_seed(1))
    assert a.shape == (3, 700) and torch.equal(a, b)
    assert not torch.equal(a, sample(probs, generator=torch.Generator().manual_seed(2)))
    monkeypatch.setattr(sampling, "CPU_CHUNK_ELEMENTS", 50)  # many small chunks, same draws
    assert torch.equal(a, sample(probs, generator=torch.Generator().manual_seed(1)))
    single = sample(probs[0, 0], generator=torch.Generator().manual_seed(1))
    assert single.shape == () and single.dtype == torch.long
    assert sample(torch.ones(0, 4), generator=generator).shape == (0,)
    g1, g2 = torch.Generator().manual_seed(3), torch.Generator().manual_seed(3)
    sample(probs, generator=g1)
    torch.rand((3 * 700, 1), generator=g2, dtype=torch.float64)  # one float64 uniform per row
    assert torch.equal(g1.get_state(), g2.get_state())


@pytest.mark.slow
@settings(max_examples=50, deadline=None)
@given(probs=prob_rows(max_V=4096), seed=st.integers(0, 2**32 - 1))
def test_sample_matches_probs_large(probs, seed):
    assert_exact(probs, 200_000, seed)


def test_planted_float32_cumsum_bias_is_caught():
    """Power: the classic biased sampler (float32 cumsum, u not scaled by the total) is rejected."""
    V, N = 1000, 200_000
    probs = torch.full((V,), 1.0 / V, dtype=torch.float32)
    probs[-1] = 0.02  # row sums to ~1.019: the unscaled sampler never reaches the tail

    def biased(p, generator):
        cdf = torch.cumsum(p, -1)
        u = torch.rand(p.shape[:-1] + (1,), generator=generator)
        return torch.searchsorted(cdf, u, right=True).clamp(max=V - 1).squeeze(-1)

    tokens = biased(probs.expand(N, V), torch.Generator().manual_seed(0))
    _, pvalue, _ = pooled_chisquare(counts_of(tokens, V), probs.double().numpy())
    assert pvalue < ALPHA
