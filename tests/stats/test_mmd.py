"""The MMD peer (Hamming kernel): the count formula equals the kernel's U-statistic, the test is calibrated and has power."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from specverify.core.errors import InvalidArgument
from specverify.stats.mmd import _counts, mmd_hamming, mmd_hamming_test


def _brute_force(x: np.ndarray, y: np.ndarray) -> float:
    L = x.shape[1]

    def k(a, b):
        return (a[:, None, :] == b[None, :, :]).sum(-1) / L

    kxx, kyy, kxy = k(x, x), k(y, y), k(x, y)
    n, m = len(x), len(y)
    return (kxx.sum() - np.trace(kxx)) / (n * (n - 1)) + (kyy.sum() - np.trace(kyy)) / (m * (m - 1)) - 2 * kxy.mean()


@pytest.mark.parametrize("seed", range(5))
def test_the_count_formula_is_the_kernel_u_statistic(seed):
    rng = np.random.default_rng(seed)
    x, y = rng.integers(0, 5, (30, 4)), rng.integers(0, 5, (41, 4))
    got = mmd_hamming(_counts(x, 5), _counts(y, 5), 30, 41)
    assert got == pytest.approx(_brute_force(x, y), rel=1e-12, abs=1e-15)


def _sample(law: np.ndarray, n: int, L: int, generator: torch.Generator) -> np.ndarray:
    return torch.multinomial(torch.as_tensor(law), n * L, replacement=True, generator=generator).reshape(n, L).numpy()


def test_false_alarms_under_equal_laws_are_at_most_alpha():
    """40 seeded null runs at alpha 0.1: rejections within the binomial(40, 0.1) 0.999 quantile (11)."""
    law = np.full(8, 1 / 8)
    rejected = 0
    for seed in range(40):
        g = torch.Generator().manual_seed(seed)
        x, y = _sample(law, 200, 3, g), _sample(law, 200, 3, g)
        rejected += mmd_hamming_test([x], [y], vocab_size=8, permutations=99, alpha=0.1, generator=g).details[
            "rejected"
        ]
    assert rejected <= 11


def test_a_planted_deviation_is_detected():
    g = torch.Generator().manual_seed(1)
    p = np.full(8, 1 / 8)
    q = p.copy()
    q[0], q[1] = q[0] + 0.1, q[1] - 0.1  # TV 0.1 at every position
    result = mmd_hamming_test([_sample(p, 2000, 3, g)], [_sample(q, 2000, 3, g)], vocab_size=8, permutations=199,
                              alpha=0.01, generator=g)  # fmt: skip
    assert result.details["rejected"] and result.pvalue == pytest.approx(1 / 200)


def test_bad_input_is_refused():
    g = torch.Generator()
    with pytest.raises(InvalidArgument, match="token ids"):
        mmd_hamming_test([np.zeros((3, 2), int) + 9], [np.zeros((3, 2), int)], vocab_size=8, generator=g)
    with pytest.raises(InvalidArgument, match="generator"):
        mmd_hamming_test([np.zeros((3, 2), int)], [np.zeros((3, 2), int)], vocab_size=8, generator=None)
