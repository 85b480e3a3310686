"""Exact categorical sampling with an explicit generator.

Inverse-CDF sampling: a float64 cumulative sum of each row, one float64 uniform
per row scaled by the row's own total, and ``searchsorted``.  Scaling by the
row total (instead of assuming it is 1) means a float32 row that sums to
0.99999 loses no tail, and searching with ``right=True`` means a token whose
probability is exactly zero can never be returned (its CDF value equals its
predecessor's).  On CPU the rows are processed in cache-sized chunks whose ops
run serially (see ``CPU_CHUNK_ELEMENTS``): ~5-8 M draws/s per core at V=32 on a
loaded shared machine, 5-10x ``torch.multinomial`` (benchmarks/bench_rules.py).
The chunking changes no result: the uniforms are drawn for all rows first.

References: L. Devroye, *Non-Uniform Random Variate Generation* (1986), ch. III.2.
"""

from __future__ import annotations

import torch

from specverify.core.errors import InvalidArgument
from specverify.core.rowsums import SERIAL_CHUNK_ELEMENTS
from specverify.core.validation import check_generator, check_probs

__all__ = ["sample", "uniform", "inverse_cdf", "search_cdf", "chunk_rows"]

#: Row-wise work on CPU runs in chunks of at most this many elements: each chunk's float64
#: CDF stays in cache (256 KiB), and every elementwise op and reduction on a chunk is below
#: ATen's parallel grain size (32768 elements), so it runs serially.  Many small *parallel*
#: regions are disastrous on a loaded machine (each waits for a descheduled OpenMP thread:
#: ~1 ms instead of ~10 us); few large ones over the whole tensor are 3x slower than cached
#: serial chunks at V=32.  Other devices process all rows at once.
CPU_CHUNK_ELEMENTS = SERIAL_CHUNK_ELEMENTS
#: Rows whose float64 total is below this (only float64 weights reach it) have cumulative sums in
#: or near the subnormal range, where ``u * total`` is rounded to a grid of 2^-1074: a coarse grid
#: relative to the total, so the draw is no longer exact.  With ``check=True`` such rows are drawn
#: again from their weights times ``TINY_RESCALE`` (a power of two: exact), with the same uniforms.
TINY_TOTAL = 2.0**-969
TINY_RESCALE = 2.0**1000
#: Longest CPU row for which :func:`search_cdf` counts instead of searching (one thread).
COUNT_MAX_VOCAB = 128
#: With a single intra-op thread no op can start a parallel region, and chunks this many
#: times larger (still cache-resident) halve the per-op overhead.
SINGLE_THREAD_CHUNK_FACTOR = 4


def uniform(shape, *, generator: torch.Generator, device=None) -> torch.Tensor:
    """Float64 uniforms on [0, 1) of the given shape from ``generator``."""
    return torch.rand(shape, generator=generator, dtype=torch.float64, device=device)


def chunk_rows(num_rows: int, vocab_size: int, device) -> int:
    """Rows per chunk for row-wise work on ``device`` (all rows off the CPU)."""
    if torch.device(device).type != "cpu":
        return max(1, num_rows)
    elements = (
        CPU_CHUNK_ELEMENTS if torch.get_num_threads() > 1 else (CPU_CHUNK_ELEMENTS + 1) * SINGLE_THREAD_CHUNK_FACTOR
    )
    return max(1, min(num_rows, elements // max(1, vocab_size)))


def search_cdf(cdf: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """``#{j : cdf[n, j] <= x[n]}`` per row of a non-decreasing ``cdf`` (N, V), x (N, 1): (N,) long.

    That is ``searchsorted(cdf, x, right=True)``.  On CPU, for more than 128 rows, it is
    computed as the count when ``searchsorted`` could start a parallel region (several
    intra-op threads; its grain is 200 rows) or when rows are short (``COUNT_MAX_VOCAB``):
    a branch-free count over a cache-sized chunk then beats the binary search, whose
    branches on fresh rows are unpredictable (one thread, fresh float64 rows: 21 vs 30 ns
    per row at V = 32, 36 vs 61 at V = 64, 70 vs 82 at V = 128, 153 vs 67 at V = 256).
    """
    if cdf.device.type == "cpu" and cdf.shape[0] > 128:
        if torch.get_num_threads() > 1 or cdf.shape[-1] <= COUNT_MAX_VOCAB:
            return (cdf <= x).sum(-1)  # (N,)
    return torch.searchsorted(cdf, x, right=True).squeeze(-1)  # (N,)


def inverse_cdf(weights: torch.Tensor, u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Inverse-CDF draw per row of ``weights`` (N, V) with uniforms ``u`` (N, 1) float64.

    The token is the first index whose float64 cumulative weight exceeds
    ``u * total`` (capped below ``total``), so a weight-0 token is never returned.
    Returns the token ids (N,) and the float64 row totals (N, 1); a row of total 0
    returns V (callers guarantee positive totals).
    """
    cdf = torch.cumsum(weights, dim=-1, dtype=torch.float64)  # (N, V)
    total = cdf[:, -1:]  # (N, 1)
    # u * total < total except when the product rounds up; capping at the largest float64
    # below total keeps the search inside the support without a host sync.
    x = torch.minimum(u * total, torch.nextafter(total, torch.zeros_like(total)))  # (N, 1)
    return search_cdf(cdf, x), total  # (N,), (N, 1)


def sample(probs: torch.Tensor, *, generator: torch.Generator, check: bool = True) -> torch.Tensor:
    """Draw one token per row of ``probs`` (shape ``(..., V)``), exactly.

    Parameters
    ----------
    probs : Tensor, shape (..., V)
        Non-negative, finite weights per row with a positive, finite float64 sum;
        rows need not be normalised: each row is sampled in proportion to its weights.
    generator : torch.Generator
        The only source of randomness; one float64 uniform is drawn per row.
    check : bool
        Validate the arguments (finite, non-negative weights, positive finite row
        sums), and draw rows whose float64 sum is below ``TINY_TOTAL`` (float64 weights
        in the subnormal range) from their weights rescaled by a power of two, so that
        they too are drawn exactly.  ``check=False`` skips every host-device
        synchronisation for hot loops; the caller then guarantees valid rows, with sums
        of at least ``TINY_TOTAL`` (true of any float32, bfloat16 or float16 row).

    Returns
    -------
    Tensor, shape (...), dtype long
        Token ids; a token with weight exactly 0 is never returned.

    Raises
    ------
    InvalidArgument
        With ``check=True``, for invalid weights (the row sums are checked after the
        uniforms are drawn, so the generator has advanced when that check fails).
    """
    if check:
        check_generator("generator", generator)
        check_probs("probs", probs, normalised=False, row_sums=False)  # sums: CDF totals below
    lead = probs.shape[:-1]
    V = probs.shape[-1]
    flat = probs.reshape(-1, V)  # (N, V)
    N = flat.shape[0]
    u = uniform((N, 1), generator=generator, device=probs.device)  # (N, 1)
    step = chunk_rows(N, V, probs.device)
    if step >= N:
        idx, totals = inverse_cdf(flat, u)  # (N,), (N, 1)
    else:
        idx = torch.empty(N, dtype=torch.long, device=probs.device)  # (N,)
        totals = torch.empty(N, 1, dtype=torch.float64, device=probs.device)  # (N, 1), filled only if check
        for start in range(0, N, step):
            stop = min(start + step, N)
            chunk_idx, chunk_totals = inverse_cdf(flat[start:stop], u[start:stop])
            idx[start:stop] = chunk_idx
            if check:
                totals[start:stop] = chunk_totals
    if check and N:
        bad = ~((totals > 0) & (totals < float("inf"))).squeeze(-1)  # (N,)
        tiny = (totals < TINY_TOTAL).squeeze(-1)  # (N,) the bad rows with total 0 too
        if bool((bad | tiny).any()):  # one host sync for both
            if bool(bad.any()):
                i = int(bad.nonzero()[0])
                where = ", ".join(str(int(j)) for j in torch.unravel_index(torch.tensor(i), lead)) if lead else ""
                raise InvalidArgument(
                    f"probs[{where}] sums to {totals[i, 0].item():.6g} (expected a positive, finite sum)"
                )
            rows = tiny.nonzero().squeeze(-1)  # (T,)
            idx[rows] = inverse_cdf(flat[rows].double() * TINY_RESCALE, u[rows])[0]
    return idx.reshape(lead)
