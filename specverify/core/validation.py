"""Argument checks shared by every public boundary (suite and reference).

Each check raises :class:`specverify.core.errors.InvalidArgument` with a message that
names the argument and the offending value, e.g.
``target_probs[3, 1] sums to 0.97 (expected 1 within 1e-04)``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from specverify.core.errors import InvalidArgument
from specverify.core.rowsums import plainly_normalised

__all__ = [
    "check_bool",
    "check_int",
    "check_float",
    "check_probs",
    "check_shape",
    "check_tokens",
    "check_generator",
    "check_alpha",
    "PROB_ATOL",
]

#: Tolerance on the row sums of probability tensors (float32 softmax rows sum to 1 +- ~1e-6).
PROB_ATOL = 1e-4
#: Row-sum tolerance of low-precision probability rows: rounding each entry to the dtype moves
#: a row's sum by at most the unit roundoff (bf16 2^-8, fp16 2^-11); twice that, for margin.
LOW_PRECISION_ATOL = {torch.bfloat16: 2.0**-7, torch.float16: 2.0**-10}


def _index(flat_index: int, shape: Sequence[int]) -> str:
    idx = []
    for size in reversed(shape):
        idx.append(flat_index % size)
        flat_index //= size
    return ", ".join(str(i) for i in reversed(idx))


def check_int(name: str, value, *, minimum: int | None = None, maximum: int | None = None) -> int:
    """Return ``value`` as an int, or raise if it is not an integer in [minimum, maximum]."""
    if (
        isinstance(value, bool)
        or not isinstance(value, (int,))
        and not (isinstance(value, torch.Tensor) and value.ndim == 0 and not value.is_floating_point())
    ):
        try:
            import numpy as np

            if isinstance(value, np.integer):
                value = int(value)
            else:
                raise TypeError
        except TypeError:
            raise InvalidArgument(f"{name} must be an integer, got {value!r}") from None
    value = int(value)
    if minimum is not None and value < minimum:
        raise InvalidArgument(f"{name} must be >= {minimum}, got {value}")
    if maximum is not None and value > maximum:
        raise InvalidArgument(f"{name} must be <= {maximum}, got {value}")
    return value


def check_bool(name: str, value) -> bool:
    """Return ``value`` if it is ``True`` or ``False`` (a ``bool``, not 0/1 or a string), else raise."""
    if not isinstance(value, bool):
        raise InvalidArgument(f"{name} must be True or False, got {value!r}")
    return value


def _float_range(minimum, maximum, exclusive_minimum: bool, exclusive_maximum: bool) -> str:
    """The accepted range in words: ``" > 0"``, ``" in (0, 1]"``, or ``""`` without bounds."""
    if minimum is not None and maximum is not None:
        left, right = "(" if exclusive_minimum else "[", ")" if exclusive_maximum else "]"
        return f" in {left}{minimum:g}, {maximum:g}{right}"
    if minimum is not None:
        return f" {'>' if exclusive_minimum else '>='} {minimum:g}"
    if maximum is not None:
        return f" {'<' if exclusive_maximum else '<='} {maximum:g}"
    return ""


def check_float(
    name: str,
    value,
    *,
    minimum: float | None = None,
    maximum: float | None = None,
    exclusive_minimum: bool = False,
    exclusive_maximum: bool = False,
) -> float:
    """Return ``float(value)``, or raise if it is not a finite number in the given range.

    Parameters
    ----------
    name : str
        The argument's name, for the message.
    value : object
        Anything ``float()`` converts (int, float, bool, numpy scalar, one-element tensor,
        numeric string); NaN and infinities are rejected.
    minimum, maximum : float, optional
        Bounds, inclusive unless ``exclusive_minimum`` / ``exclusive_maximum``.

    Raises
    ------
    InvalidArgument
        Naming the argument, the accepted range and the value, e.g.
        ``top_p must be a finite number in (0, 1], got 1.5``.
    """
    want = f"{name} must be a finite number{_float_range(minimum, maximum, exclusive_minimum, exclusive_maximum)}"
    try:
        number = float(value)
    except (TypeError, ValueError, OverflowError):
        raise InvalidArgument(f"{want}, got {value!r}") from None
    below = minimum is not None and (number <= minimum if exclusive_minimum else number < minimum)
    above = maximum is not None and (number >= maximum if exclusive_maximum else number > maximum)
    if not math.isfinite(number) or below or above:
        raise InvalidArgument(f"{want}, got {value!r}")
    return number


def check_alpha(name: str, value) -> float:
    """Return ``value`` as a float in (0, 1), or raise."""
    try:
        value = float(value)
    except (TypeError, ValueError):
        raise InvalidArgument(f"{name} must be a number in (0, 1), got {value!r}") from None
    if not 0.0 < value < 1.0:
        raise InvalidArgument(f"{name} must be in (0, 1), got {value!r}")
    return value


def check_generator(name: str, generator) -> torch.Generator:
    """Require an explicit ``torch.Generator`` (library code never uses global RNG state)."""
    if not isinstance(generator, torch.Generator):
        raise InvalidArgument(
            f"{name} must be a torch.Generator (randomness is an explicit argument), got {generator!r}"
        )
    return generator


def check_shape(name: str, tensor, shape: Sequence[int | None]) -> torch.Tensor:
    """Require a tensor of the given shape (``None`` matches any size)."""
    if not isinstance(tensor, torch.Tensor):
        raise InvalidArgument(f"{name} must be a torch.Tensor, got {type(tensor).__name__}")
    if tensor.ndim != len(shape) or any(want is not None and have != want for have, want in zip(tensor.shape, shape)):
        want = "(" + ", ".join("*" if s is None else str(s) for s in shape) + ")"
        raise InvalidArgument(f"{name} must have shape {want}, got {tuple(tensor.shape)}")
    return tensor


#: Float64 row sums of probability tensors on CPU are taken over chunks of about this many
#: elements: each chunk's float64 copy stays in cache (2-4x faster than one big sum), and
#: each op stays below ATen's parallel grain size (32768 elements), so it runs serially:
#: many small parallel regions are disastrous on a loaded machine.
SUM_CHUNK_ELEMENTS = 1 << 14


def _narrow_broadcast(tensor: torch.Tensor, *, keep_last: bool) -> torch.Tensor:
    """``tensor`` with its broadcast (stride-0) dimensions narrowed to size 1.

    An expanded tensor repeats the same values, so element checks on the narrowed
    view are equivalent (and the first offending entry has the same index: index 0
    along a repeated dimension comes first), and reductions over it never materialise
    the expansion.  ``keep_last`` keeps the last dimension, whose row sums depend on it.
    """
    last = tensor.ndim - 1
    for dim, (size, stride) in enumerate(zip(tensor.shape, tensor.stride())):
        if stride == 0 and size > 1 and not (keep_last and dim == last):
            tensor = tensor.narrow(dim, 0, 1)
    return tensor


def _chunk_elements() -> int:
    """Elements per chunk of CPU row sums (larger with one intra-op thread: no parallel regions)."""
    return SUM_CHUNK_ELEMENTS if torch.get_num_threads() > 1 else 4 * SUM_CHUNK_ELEMENTS


def _row_sums_ok(rows: torch.Tensor, *, atol: float, normalised: bool) -> bool:
    """Whether every float64 row sum of ``rows`` (..., V) is 1 within ``atol`` (or positive and finite).

    The sums are written chunk by chunk into one float64 buffer and judged from their
    extremes: ``fl(|s - 1|)`` is monotone on each side of 1, so its maximum over the rows
    is attained at the smallest or the largest sum, and the decision equals the per-row one.
    """
    V = rows.shape[-1]
    chunk = _chunk_elements()
    if rows.device.type != "cpu" or rows.numel() <= chunk:
        sums = rows.sum(-1, dtype=torch.float64)
    else:
        flat = rows.view(-1, V) if rows.is_contiguous() else rows  # (N, V) or (lead, ..., V)
        sums = torch.empty(flat.shape[:-1], dtype=torch.float64, device=rows.device)  # (N,) or (lead, ...)
        step = max(1, chunk // max(1, flat[0].numel()))
        for start in range(0, flat.shape[0], step):
            torch.sum(flat[start : start + step], -1, dtype=torch.float64, out=sums[start : start + step])
    low, high = torch.aminmax(sums)
    if normalised:
        return not bool(((low - 1.0).abs() > atol) | ((high - 1.0).abs() > atol))
    return bool((low > 0) & (high < float("inf")))


def check_probs(
    name: str, probs, *, atol: float = PROB_ATOL, normalised: bool = True, row_sums: bool = True
) -> torch.Tensor:
    """Require a floating tensor of probability rows over its last dimension.

    Rejects non-float dtypes, NaN/inf, negative entries and rows whose sum is
    not 1 within ``atol`` (computed in float64); with ``normalised=False`` rows
    only need a positive, finite sum.  ``row_sums=False`` checks the entries only
    (for a caller that checks the sums itself).

    Contiguous float32/float64 rows of a moderate vocabulary are first judged by
    :func:`~specverify.core.rowsums.plainly_normalised` (the smallest entry and input-dtype
    row sums with a proven rounding margin: it accepts only what the full check accepts).
    Otherwise valid input costs one ``aminmax`` pass (NaN fails both comparisons) and float64
    row sums in cache-sized chunks; broadcast (expanded) dimensions are checked once,
    without materialising them.  Only input that fails is scanned again, to name the
    first offending entry.
    """
    if not isinstance(probs, torch.Tensor):
        raise InvalidArgument(f"{name} must be a torch.Tensor, got {type(probs).__name__}")
    if not probs.is_floating_point():
        raise InvalidArgument(f"{name} must have a floating dtype, got {probs.dtype}")
    if probs.ndim < 1 or probs.shape[-1] < 1:
        raise InvalidArgument(
            f"{name} must have a non-empty last (vocabulary) dimension, got shape {tuple(probs.shape)}"
        )
    if probs.numel() == 0:
        return probs
    atol = max(atol, LOW_PRECISION_ATOL.get(probs.dtype, 0.0))
    if row_sums and normalised and plainly_normalised(probs, atol):
        return probs
    rows = _narrow_broadcast(probs, keep_last=True)  # (..., V) every distinct row at least once
    low, high = torch.aminmax(_narrow_broadcast(rows, keep_last=False))
    if bool((low >= 0) & (high < float("inf"))) and (
        not row_sums or _row_sums_ok(rows, atol=atol, normalised=normalised)
    ):
        return probs
    _raise_probs_error(name, rows, atol=atol, normalised=normalised, row_sums=row_sums)
    return probs


def _raise_probs_error(name: str, probs: torch.Tensor, *, atol: float, normalised: bool, row_sums: bool) -> None:
    """The detailed scan of :func:`check_probs`: raise naming the first offending entry or row."""
    values = _narrow_broadcast(probs, keep_last=False)
    bad = ~torch.isfinite(values)
    if bool(bad.any()):
        i = int(bad.flatten().nonzero()[0])
        raise InvalidArgument(f"{name}[{_index(i, values.shape)}] is {values.flatten()[i].item()} (must be finite)")
    neg = values < 0
    if bool(neg.any()):
        i = int(neg.flatten().nonzero()[0])
        raise InvalidArgument(f"{name}[{_index(i, values.shape)}] is {values.flatten()[i].item()} (must be >= 0)")
    if not row_sums:
        return
    sums = probs.sum(-1, dtype=torch.float64)
    if normalised:
        off = (sums - 1.0).abs() > atol
    else:
        off = ~((sums > 0) & (sums < float("inf")))
    if bool(off.any()):
        i = int(off.flatten().nonzero()[0])
        where = _index(i, sums.shape) if sums.ndim else ""
        total = sums.flatten()[i].item()
        if normalised:
            expected = f"(expected 1 within {atol:g})"
        else:
            expected = "(expected a positive sum)" if total <= 0 else "(expected a positive, finite sum)"
        raise InvalidArgument(f"{name}[{where}] sums to {total:.6g} {expected}")
    # Only reachable when a chunked row sum and the whole-tensor sum round differently at the
    # tolerance boundary: the whole-tensor sums (those of the scan) decide, so the input passes.


def check_tokens(name: str, tokens, vocab_size: int) -> torch.Tensor:
    """Require an integer tensor with every entry in [0, vocab_size)."""
    if not isinstance(tokens, torch.Tensor):
        raise InvalidArgument(f"{name} must be a torch.Tensor, got {type(tokens).__name__}")
    if tokens.is_floating_point() or tokens.is_complex() or tokens.dtype == torch.bool:
        raise InvalidArgument(f"{name} must have an integer dtype, got {tokens.dtype}")
    if tokens.numel():
        low, high = torch.aminmax(tokens)
        if bool((low >= 0) & (high < vocab_size)):
            return tokens
        bad = (tokens < 0) | (tokens >= vocab_size)
        if bool(bad.any()):
            i = int(bad.flatten().nonzero()[0])
            raise InvalidArgument(
                f"{name}[{_index(i, tokens.shape)}] is {int(tokens.flatten()[i])}, outside the vocabulary [0, {vocab_size})"
            )
    return tokens


def check_run_options(tier, tiers, seed, alpha, progress) -> tuple[int, float]:
    """Validate the options every audit entry point shares; return ``(seed, alpha)``.

    ``tier`` must be one of ``tiers``, ``seed`` an integer >= 0, ``alpha`` in (0, 1)
    and ``progress`` None or a ``progress(done, total, name)`` callable.
    """
    if tier not in tuple(tiers):
        raise InvalidArgument(f"tier must be one of {tuple(tiers)}, got {tier!r}")
    seed = check_int("seed", seed, minimum=0)
    alpha = check_alpha("alpha", alpha)
    if progress is not None and not callable(progress):
        raise InvalidArgument(f"progress must be callable(done, total, name) or None, got {progress!r}")
    return seed, alpha
