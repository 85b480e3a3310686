"""A cheap sufficient test that a probability tensor is valid: :func:`check_probs`' fast path.

:func:`~specverify.core.validation.check_probs` sums every row in float64.  For contiguous
float32/float64 input of a moderate vocabulary, two cheaper passes decide almost all valid
input: the smallest entry, and row sums taken in the input dtype (in blocks of at most
``_SUM_BLOCK`` entries whose sums are added in float64).  Summation in any order errs by at
most ``gamma_n`` times the sum (Higham), so when every input-dtype sum is within
``atol - margin`` of 1 (:func:`sum_margin`), every float64 sum is within ``atol``: the full
check would accept too.  Whatever this test does not accept -- all invalid input among it --
goes to the full check, which names the first offending entry.

On a CPU with several intra-op threads the passes run in serial chunks below ATen's parallel
grain size (``SERIAL_CHUNK_ELEMENTS``; :mod:`specverify.core.sampling` explains why many small
parallel regions are avoided).

References: N. J. Higham, *Accuracy and Stability of Numerical Algorithms*, 2nd ed. (2002), eq. 4.4.
"""

from __future__ import annotations

import torch

__all__ = ["plainly_normalised", "within_margin", "sum_margin", "sum_block", "SERIAL_CHUNK_ELEMENTS"]

#: Largest element count of an ATen elementwise op or reduction that runs serially (below its
#: parallel grain size of 32768); the CPU chunk of row-wise work with several intra-op threads.
SERIAL_CHUNK_ELEMENTS = (1 << 15) - 1
#: Dtypes whose row sums are taken in the input dtype, with their unit roundoff.
_FAST_SUM_DTYPES = {torch.float32: 2.0**-24, torch.float64: 2.0**-53}
#: Longest block summed in the input dtype; longer rows are summed in blocks (a divisor of V).
_SUM_BLOCK = 256


def _gamma(n: int, u: float) -> float:
    """Higham's ``gamma_n = n u / (1 - n u)``: any order of summing n + 1 terms errs by at most ``gamma_n sum|x|``."""
    return n * u / (1.0 - n * u) if n * u < 0.5 else float("inf")


def sum_block(V: int) -> int | None:
    """Block length m of the input-dtype partial sums of a row of V entries (m divides V), or None."""
    if V <= _SUM_BLOCK:
        return V
    return next((m for m in range(_SUM_BLOCK, 31, -1) if V % m == 0), None)


def sum_margin(dtype: torch.dtype, V: int) -> float:
    """Bound on ``|fl(s) - fl64(s)|`` for a row sum s <= 2 of V non-negative entries.

    Blocks of m entries are summed in the input dtype (unit roundoff u) and the V/m block
    sums in float64; the full check sums the row in float64.  The two differ by at most
    ``(gamma_m(u) + gamma_{V/m}(2^-53) (1 + gamma_m(u)) + gamma_V(2^-53)) s``; a small
    absolute term covers flushed subnormals.  Infinite when V has no usable block or the
    dtype is not summed here.
    """
    m = sum_block(V)
    if m is None or dtype not in _FAST_SUM_DTYPES:
        return float("inf")
    u, u64 = _FAST_SUM_DTYPES[dtype], 2.0**-53
    within = _gamma(m - 1, u)
    return 2.0 * (within + _gamma(V // m, u64) * (1.0 + within) + _gamma(V, u64)) + 2.0**-60


def _min_and_block_sums(parts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Smallest entry and per-row sums of ``parts`` (n, m), in its dtype.

    Whole-tensor reductions, except on a CPU with several intra-op threads: there in serial
    chunks below ATen's parallel grain size, since a parallel region costs ~1 ms instead of
    ~10 us when a thread of it is descheduled.
    """
    n, m = parts.shape
    if parts.device.type != "cpu" or torch.get_num_threads() == 1 or parts.numel() <= SERIAL_CHUNK_ELEMENTS:
        return torch.amin(parts), parts.sum(-1)
    step = max(1, min(n, SERIAL_CHUNK_ELEMENTS // m))  # rows per serial chunk
    sums = torch.empty(n, dtype=parts.dtype)  # (n,)
    mins = torch.empty((n + step - 1) // step, dtype=parts.dtype)  # one per chunk
    for i, start in enumerate(range(0, n, step)):
        chunk = parts[start : start + step]  # (step, m)
        torch.amin(chunk, out=mins[i])
        torch.sum(chunk, -1, out=sums[start : start + step])
    return torch.amin(mins), sums


def plainly_normalised(probs: torch.Tensor, atol: float) -> bool:
    """True when ``probs`` (..., V) certainly has entries >= 0 and float64 row sums within ``atol`` of 1.

    Two passes and one host sync; False says nothing (other dtypes and layouts, vocabularies
    whose margin exceeds ``atol / 2``, and all invalid input): the caller runs the full check.
    A NaN fails the entry test, an infinity the sum test.
    """
    if probs.dtype not in _FAST_SUM_DTYPES or not probs.is_contiguous() or probs.numel() == 0:
        return False
    V = probs.shape[-1]
    margin = sum_margin(probs.dtype, V)
    if margin > atol / 2:
        return False
    m = sum_block(V)
    assert m is not None  # the margin is finite
    min_entry, block_sums = _min_and_block_sums(probs.view(-1, m))  # (), (N*V/m,) in the input dtype
    row_sums = block_sums if m == V else block_sums.view(-1, V // m).sum(-1, dtype=torch.float64)  # (N,)
    low_sum, high_sum = torch.aminmax(row_sums)
    low_entry, low, high = torch.stack([min_entry.double(), low_sum.double(), high_sum.double()]).tolist()
    return within_margin(low_entry, low, high, margin, atol)


def within_margin(min_entry: float, low_sum: float, high_sum: float, margin: float, atol: float) -> bool:
    """The fast test's verdict from a tensor's smallest entry and its smallest and largest input-dtype row sums.

    ``margin`` is :func:`sum_margin` of the tensor's dtype and vocabulary.  NaN fails every comparison.
    """
    bound = atol - margin
    return min_entry >= 0 and 1.0 - low_sum <= bound and high_sum - 1.0 <= bound
