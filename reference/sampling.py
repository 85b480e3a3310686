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

from specverify.errors import InvalidArgument
from specverify.validation import PROB_ATOL, check_generator, check_probs

__all__ = ["sample", "uniform", "inverse_cdf", "chunk_rows", "fast_check_probs"]

#: Row-wise work on CPU runs in chunks of about this many elements: each chunk's float64
#: CDF stays in cache, and every op on a chunk is below ATen's parallel grain sizes
#: (cumsum: 32768 elements, searchsorted: 200 rows), so it runs serially.  Many small
#: *parallel* regions are disastrous on a loaded machine (each waits for a descheduled
#: OpenMP thread); few large ones over the whole tensor are 3x slower than cached
#: serial chunks at V=32.  Other devices process all rows at once.
CPU_CHUNK_ELEMENTS = 1 << 14


def uniform(shape, *, generator: torch.Generator, device=None) -> torch.Tensor:
    """Float64 uniforms on [0, 1) of the given shape from ``generator``."""
    return torch.rand(shape, generator=generator, dtype=torch.float64, device=device)


def chunk_rows(num_rows: int, vocab_size: int, device) -> int:
    """Rows per chunk for row-wise work on ``device`` (all rows off the CPU)."""
    if torch.device(device).type != "cpu":
        return max(1, num_rows)
    return max(1, min(num_rows, CPU_CHUNK_ELEMENTS // max(1, vocab_size)))


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
    if weights.device.type == "cpu" and weights.shape[0] > 128:
        # Counting CDF values <= x is searchsorted(right=True) on a non-decreasing row, and
        # stays serial on small chunks where searchsorted would start a parallel region.
        return (cdf <= x).sum(-1), total  # (N,), (N, 1)
    return torch.searchsorted(cdf, x, right=True).squeeze(-1), total  # (N,), (N, 1)


def _unexpanded(tensor: torch.Tensor) -> torch.Tensor:
    """The tensor with every broadcast (stride-0) dimension narrowed to size 1.

    An expanded tensor repeats the same values, so checks on this view are equivalent,
    and reductions over it never materialise the expansion (``aminmax`` would copy).
    """
    for dim, (size, stride) in enumerate(zip(tensor.shape, tensor.stride())):
        if stride == 0 and size > 1:
            tensor = tensor.narrow(dim, 0, 1)
    return tensor


def fast_check_probs(
    name: str, probs, *, normalised: bool = True, atol: float = PROB_ATOL, row_sums: bool = True
) -> None:
    """``specverify.validation.check_probs`` with a fast path for valid input.

    One ``aminmax`` pass proves "finite and non-negative" (NaN fails both
    comparisons) and, when ``normalised``, the float64 row sums are computed in
    cache-sized chunks (4x faster than one ``sum(dtype=float64)`` on CPU).  Only
    input that fails is handed to ``check_probs``, which names the offending entry,
    so the accepted inputs and the error messages are those of ``check_probs``.
    ``row_sums=False`` skips the row sums (a caller that checks them itself).
    """
    if not (
        isinstance(probs, torch.Tensor)
        and probs.is_floating_point()
        and probs.ndim >= 1
        and probs.shape[-1] >= 1
        and probs.numel() > 0
    ):
        check_probs(name, probs, atol=atol, normalised=normalised)
        return
    probs = _unexpanded(probs)
    low, high = torch.aminmax(probs)
    ok = bool(low >= 0) and bool(high < float("inf"))
    if ok and row_sums:
        lead = probs.shape[0] if probs.ndim >= 2 else 1
        rows = probs if probs.ndim >= 2 else probs[None]  # (lead, ..., V)
        step = chunk_rows(lead, probs.numel() // lead, probs.device)
        for start in range(0, lead, step):
            sums = rows[start : start + step].sum(-1, dtype=torch.float64)  # (step, ...)
            bad = (sums - 1.0).abs() > atol if normalised else ~(sums > 0)
            if bool(bad.any()):
                ok = False
                break
    if not ok:
        check_probs(name, probs, atol=atol, normalised=normalised)


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
        sums).  ``check=False`` skips every host-device synchronisation for hot
        loops; the caller then guarantees valid rows.

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
        fast_check_probs("probs", probs, normalised=False, row_sums=False)  # sums: CDF totals below
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
        totals = torch.empty(N, 1, dtype=torch.float64, device=probs.device) if check else None  # (N, 1)
        for start in range(0, N, step):
            stop = min(start + step, N)
            chunk_idx, chunk_totals = inverse_cdf(flat[start:stop], u[start:stop])
            idx[start:stop] = chunk_idx
            if check:
                totals[start:stop] = chunk_totals
    if check and N:
        bad = ~((totals > 0) & (totals < float("inf"))).squeeze(-1)  # (N,)
        if bool(bad.any()):
            i = int(bad.nonzero()[0])
            where = ", ".join(str(int(j)) for j in torch.unravel_index(torch.tensor(i), lead)) if lead else ""
            raise InvalidArgument(
                f"probs[{where}] sums to {totals[i, 0].item():.6g} (expected a positive, finite sum)"
            )
    return idx.reshape(lead)
