"""Shared helpers of the statistics package: input conversion, validation, Cressie-Read.

Every public statistic accepts numpy arrays, torch tensors or sequences and computes
in float64.  Bad input raises :class:`specverify.core.errors.InvalidArgument` naming the
argument and the offending value.

References: N. Cressie and T. R. C. Read, "Multinomial goodness-of-fit tests",
JRSS B 46 (1984) 440-464 (the power-divergence family; lambda = 2/3 is their
recommended compromise between Pearson's X^2 and the likelihood-ratio G^2).
"""

from __future__ import annotations

import math

import numpy as np

from specverify.core.errors import InvalidArgument
from specverify.core.validation import check_alpha

__all__ = [
    "as_float_array",
    "as_counts",
    "as_probs",
    "check_alpha",
    "packed_support",
    "check_e_min",
    "cressie_read",
    "CR_LAMBDA",
]

#: Cressie-Read power-divergence exponent used by every binned test.
CR_LAMBDA = 2.0 / 3.0


def _to_numpy(name: str, value) -> np.ndarray:
    if hasattr(value, "detach") and hasattr(value, "cpu"):  # torch tensor
        value = value.detach().cpu().numpy()
    try:
        arr = np.asarray(value)
    except Exception as exc:  # pragma: no cover - exotic inputs
        raise InvalidArgument(f"{name} must be array-like, got {type(value).__name__}") from exc
    if arr.dtype == object:
        raise InvalidArgument(f"{name} must be a numeric array, got {value!r:.80}")
    return arr


def _where(index: tuple) -> str:
    return ", ".join(str(int(i)) for i in index)


def as_float_array(name: str, value, *, ndim: int | None = None, nonneg: bool = False) -> np.ndarray:
    """``value`` as a finite float64 array (optionally of ``ndim`` dimensions, >= 0)."""
    arr = _to_numpy(name, value)
    if arr.dtype == bool or not (np.issubdtype(arr.dtype, np.floating) or np.issubdtype(arr.dtype, np.integer)):
        raise InvalidArgument(f"{name} must have a real numeric dtype, got {arr.dtype}")
    arr = arr.astype(np.float64, copy=False)
    if ndim is not None and arr.ndim != ndim:
        raise InvalidArgument(f"{name} must have {ndim} dimension(s), got shape {arr.shape}")
    bad = ~np.isfinite(arr)
    if bad.any():
        i = np.unravel_index(int(np.flatnonzero(bad)[0]), arr.shape)
        raise InvalidArgument(f"{name}[{_where(i)}] is {arr[i]} (must be finite)")
    if nonneg:
        neg = arr < 0
        if neg.any():
            i = np.unravel_index(int(np.flatnonzero(neg)[0]), arr.shape)
            raise InvalidArgument(f"{name}[{_where(i)}] is {arr[i]} (must be >= 0)")
    return arr


def as_counts(name: str, value, *, ndim: int = 1) -> np.ndarray:
    """Non-negative integer counts as an int64 array (integer-valued floats are accepted)."""
    arr = as_float_array(name, value, ndim=ndim, nonneg=True)
    frac = arr != np.floor(arr)
    if frac.any():
        i = np.unravel_index(int(np.flatnonzero(frac)[0]), arr.shape)
        raise InvalidArgument(f"{name}[{_where(i)}] is {arr[i]} (counts must be integers)")
    return arr.astype(np.int64)


def as_probs(name: str, value, *, ndim: int = 1, size: int | None = None) -> np.ndarray:
    """Non-negative float64 weights with positive row sums, renormalised over the last axis."""
    arr = as_float_array(name, value, ndim=ndim, nonneg=True)
    if arr.shape[-1] < 1:
        raise InvalidArgument(f"{name} must have a non-empty last (vocabulary) dimension, got shape {arr.shape}")
    if size is not None and arr.shape[-1] != size:
        raise InvalidArgument(f"{name} must have {size} entries in its last dimension, got shape {arr.shape}")
    sums = arr.sum(axis=-1, keepdims=True)
    zero = sums[..., 0] <= 0
    if np.any(zero):
        i = np.unravel_index(int(np.flatnonzero(zero)[0]), zero.shape) if zero.ndim else ()
        raise InvalidArgument(f"{name}[{_where(i)}] sums to 0 (expected a positive sum)")
    return arr / sums


#: Rows are packed to their support when the widest support holds at most this share of V.
PACK_SHARE = 0.25


def packed_support(laws: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """The nonzero entries of each row of ``laws`` (n, V), packed left in token order.

    Returns ``(values, ids)``, both (n, m) with m the widest row's support, padded with value
    0 and id V; None when m exceeds :data:`PACK_SHARE` x V (dense rows are then cheaper).  A
    law under top-k or a padded head is supported on a few tokens of a large vocabulary: sums
    over its support skip the full-vocabulary logarithms and products (same terms, so the
    same value to float64 rounding).
    """
    n, V = laws.shape
    present = laws != 0  # (n, V) bool: numpy's nonzero runs several times faster on it than on floats
    nnz = np.count_nonzero(present, axis=1)  # (n,)
    m = int(nnz.max()) if n else 0
    if m > PACK_SHARE * V:
        return None
    rows, cols = np.divmod(np.flatnonzero(present), V)  # (nnz,), row-major: token order within a row
    slot = np.arange(rows.size) - (np.cumsum(nnz) - nnz)[rows]  # (nnz,) place within the row
    values = np.zeros((n, m))  # (n, m)
    ids = np.full((n, m), V, dtype=np.int64)  # (n, m)
    values[rows, slot] = laws[rows, cols]
    ids[rows, slot] = cols
    return values, ids


def check_e_min(value) -> float:
    """Minimum expected count per bin: a finite number > 0."""
    try:
        value = float(value)
    except (TypeError, ValueError):
        raise InvalidArgument(f"e_min must be a positive number, got {value!r}") from None
    if not (math.isfinite(value) and value > 0):
        raise InvalidArgument(f"e_min must be a positive finite number, got {value!r}")
    return value


def cressie_read_terms(observed: np.ndarray, expected: np.ndarray, lambda_: float = CR_LAMBDA) -> np.ndarray:
    """The non-negative cell terms ``2/(l(l+1)) [O((O/E)^l - 1) - l (O - E)]`` of :func:`cressie_read`.

    The added ``- l (O - E)`` sums to zero when the totals agree, so no cancellation between
    cells.  Each cell's ``log`` and ``expm1`` are the C library's scalar functions (bins are
    few), not numpy's vector kernels, whose last bits depend on the CPU: the terms are the same
    on every machine (docs/reproducibility.md).
    """
    observed = np.asarray(observed, dtype=np.float64)
    expected = np.asarray(expected, dtype=np.float64)
    terms = lambda_ * (expected - observed)  # the O = 0 cells contribute l E
    for i in np.flatnonzero(observed > 0):
        o, e = float(observed[i]), float(expected[i])
        terms[i] += o * math.expm1(lambda_ * math.log(o / e))
    return np.maximum(terms, 0.0) * (2.0 / (lambda_ * (lambda_ + 1.0)))


def cressie_read(observed: np.ndarray, expected: np.ndarray, lambda_: float = CR_LAMBDA) -> float:
    """Cressie-Read power divergence 2/(l(l+1)) sum O((O/E)^l - 1) for sum O == sum E.

    The correctly rounded sum (``math.fsum``) of :func:`cressie_read_terms`; equals
    ``scipy.stats.power_divergence(O, E, lambda_="cressie-read")`` for equal totals.
    """
    return math.fsum(cressie_read_terms(observed, expected, lambda_).tolist())


def result_options(name: str, scenario: str, position: str) -> dict:
    """Validate the common keyword options of every test."""
    for key, value in (("name", name), ("scenario", scenario), ("position", position)):
        if not isinstance(value, str):
            raise InvalidArgument(f"{key} must be a str, got {value!r}")
    return {"name": name, "scenario": scenario, "position": position}
