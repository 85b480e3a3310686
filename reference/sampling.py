"""Exact categorical sampling with an explicit generator.

Inverse-CDF sampling: a float64 cumulative sum of each row, one float64 uniform
per row scaled by the row's own total, and ``searchsorted``.  Scaling by the
row total (instead of assuming it is 1) means a float32 row that sums to
0.99999 loses no tail, and searching with ``right=True`` means a token whose
probability is exactly zero can never be returned (its CDF value equals its
predecessor's).  On two CPU cores this draws ~10-20 M tokens/s at V=32, an
order of magnitude faster than ``torch.multinomial`` (benchmarks/bench_rules.py).

References: L. Devroye, *Non-Uniform Random Variate Generation* (1986), ch. III.2.
"""

from __future__ import annotations

import torch

from specverify.validation import check_generator, check_probs

__all__ = ["sample", "uniform"]


def uniform(shape, *, generator: torch.Generator, device=None) -> torch.Tensor:
    """Float64 uniforms on [0, 1) of the given shape from ``generator``."""
    return torch.rand(shape, generator=generator, dtype=torch.float64, device=device)


def sample(probs: torch.Tensor, *, generator: torch.Generator, check: bool = True) -> torch.Tensor:
    """Draw one token per row of ``probs`` (shape ``(..., V)``), exactly.

    Parameters
    ----------
    probs : Tensor, shape (..., V)
        Non-negative, finite weights per row with a positive sum; rows need not
        be normalised: each row is sampled in proportion to its weights.
    generator : torch.Generator
        The only source of randomness; one float64 uniform is drawn per row.
    check : bool
        Validate the arguments (finite, non-negative weights, positive row sums).
        ``check=False`` skips every host-device synchronisation for hot loops;
        the caller then guarantees valid rows.

    Returns
    -------
    Tensor, shape (...), dtype long
        Token ids; a token with weight exactly 0 is never returned.
    """
    if check:
        check_generator("generator", generator)
        check_probs("probs", probs, normalised=False)
    lead = probs.shape[:-1]
    V = probs.shape[-1]
    flat = probs.reshape(-1, V)  # (N, V)
    cdf = torch.cumsum(flat, dim=-1, dtype=torch.float64)  # (N, V)
    total = cdf[:, -1:]  # (N, 1)
    u = uniform((flat.shape[0], 1), generator=generator, device=probs.device)  # (N, 1)
    # u * total < total except when the product rounds up; capping at the largest float64
    # below total keeps the search inside the support without a host sync.
    x = torch.minimum(u * total, torch.nextafter(total, torch.zeros_like(total)))  # (N, 1)
    idx = torch.searchsorted(cdf, x, right=True).squeeze(-1)  # (N,)
    return idx.reshape(lead)
