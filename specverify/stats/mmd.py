"""The MMD two-sample test of Model Equality Testing with the Hamming kernel: a peer to compare power with.

Gao, Liang & Guestrin, "Model Equality Testing: Which model is this API serving?" (ICLR 2025,
arXiv 2410.20247) test whether two sources of completions have the same law with the maximum
mean discrepancy and a permutation test.  With their Hamming kernel on completions of length L,
``k(x, y) = (1/L) sum_i 1[x_i = y_i]``, the kernel is a sum over positions of the kernel
``1[x_i = y_i]`` whose feature map is the one-hot vector of token ``x_i``; so the unbiased MMD^2 is

    MMD^2 = (1/L) sum_i [ sum_v a_iv (a_iv - 1) / (n (n-1)) + sum_v b_iv (b_iv - 1) / (m (m-1))
                           - 2 sum_v a_iv b_iv / (n m) ]

with ``a_iv``, ``b_iv`` the counts of token v at position i in the two samples: O((n + m) L)
per evaluation instead of O((n + m)^2 L), which makes a permutation test on tens of thousands of
completions cheap.  It also shows what the kernel sees: the per-position marginal laws, not how
positions depend on each other.

Several prompts: the statistic is the sum of the per-prompt MMD^2 (the paper's kernel on
(prompt, completion) pairs is 0 across prompts) and labels are permuted within each prompt.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from specverify.core.errors import InvalidArgument
from specverify.core.results import TestResult

from ._common import check_alpha, result_options

__all__ = ["mmd_hamming", "mmd_hamming_test"]


def _counts(tokens: np.ndarray, vocab_size: int) -> np.ndarray:
    """Per-position token counts of (N, L) tokens: (L, V) int64."""
    N, L = tokens.shape
    flat = tokens + vocab_size * np.arange(L)[None, :]  # (N, L) offset per position
    return np.bincount(flat.ravel(), minlength=L * vocab_size).reshape(L, vocab_size)


def mmd_hamming(a_counts: np.ndarray, b_counts: np.ndarray, n: int, m: int) -> float:
    """Unbiased MMD^2 with the Hamming kernel from per-position counts (L, V) of n and m completions."""
    L = a_counts.shape[0]
    a = a_counts.astype(np.float64)
    b = b_counts.astype(np.float64)
    within_a = math.fsum((a * (a - 1)).ravel().tolist()) / (n * (n - 1))
    within_b = math.fsum((b * (b - 1)).ravel().tolist()) / (m * (m - 1))
    across = math.fsum((a * b).ravel().tolist()) / (n * m)
    return (within_a + within_b - 2.0 * across) / L


def mmd_hamming_test(
    samples_a,
    samples_b,
    *,
    vocab_size: int,
    permutations: int = 1000,
    alpha: float = 1e-3,
    generator: torch.Generator,
    scenario: str = "",
) -> TestResult:
    """Permutation test of equal laws of two sets of completions per prompt (MMD, Hamming kernel).

    Parameters
    ----------
    samples_a, samples_b : sequence of arrays (n_j, L) and (m_j, L)
        Completions (token ids) of the two sources for each prompt j (same L within a prompt).
    vocab_size : int
    permutations : int
        Label permutations (within each prompt); the p-value is ``(1 + #{T* >= T}) / (1 + B)``.
    alpha : float
        Level recorded with the result (``details['rejected']``).
    generator : torch.Generator
        Draws the permutations (the test is a function of the samples and this generator).

    Returns
    -------
    TestResult
        ``family="mmd"``, ``method="mmd_hamming"``; statistic the summed MMD^2; ``details["rejected"]``
        whether ``pvalue <= alpha``.
    """
    alpha = check_alpha("alpha", alpha)
    if not isinstance(generator, torch.Generator):
        raise InvalidArgument(f"generator must be a torch.Generator, got {type(generator).__name__}")
    if isinstance(permutations, bool) or not isinstance(permutations, int) or permutations < 1:
        raise InvalidArgument(f"permutations must be an integer >= 1, got {permutations!r}")
    if len(samples_a) != len(samples_b) or not len(samples_a):
        raise InvalidArgument("samples_a and samples_b must hold the same number (>= 1) of prompts")
    pools, sizes = [], []
    for j, (x, y) in enumerate(zip(samples_a, samples_b)):
        x, y = np.asarray(x, dtype=np.int64), np.asarray(y, dtype=np.int64)
        if x.ndim != 2 or y.ndim != 2 or x.shape[1] != y.shape[1] or len(x) < 2 or len(y) < 2:
            raise InvalidArgument(f"prompt {j}: samples must be (n >= 2, L) and (m >= 2, L), got {x.shape}, {y.shape}")
        if min(x.min(), y.min()) < 0 or max(x.max(), y.max()) >= vocab_size:
            raise InvalidArgument(f"prompt {j}: token ids must be in [0, {vocab_size})")
        pools.append(np.concatenate([x, y]))
        sizes.append((len(x), len(y)))

    def statistic(orders) -> float:
        total = 0.0
        for pool, (n, m), order in zip(pools, sizes, orders):
            shuffled = pool if order is None else pool[order]
            total += mmd_hamming(_counts(shuffled[:n], vocab_size), _counts(shuffled[n:], vocab_size), n, m)
        return total

    observed = statistic([None] * len(pools))
    exceed = 0
    for _ in range(permutations):
        orders = [torch.randperm(n + m, generator=generator).numpy() for n, m in sizes]
        exceed += statistic(orders) >= observed
    pvalue = (1 + exceed) / (1 + permutations)
    n_total = sum(n for n, _ in sizes)
    return TestResult(
        statistic=observed,
        pvalue=pvalue,
        family="mmd",
        method="mmd_hamming",
        n=n_total,
        alpha=alpha,
        details={"permutations": permutations, "prompts": len(pools), "sizes": sizes, "rejected": pvalue <= alpha},
        **result_options("mmd_hamming", scenario, "all"),
    )
