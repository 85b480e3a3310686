"""Argument checks shared by every public boundary (suite and reference).

Each check raises :class:`specverify.errors.InvalidArgument` with a message that
names the argument and the offending value, e.g.
``target_probs[3, 1] sums to 0.97 (expected 1 within 1e-04)``.
"""

from __future__ import annotations

from typing import Sequence

import torch

from specverify.errors import InvalidArgument

__all__ = [
    "check_int",
    "check_probs",
    "check_shape",
    "check_tokens",
    "check_generator",
    "check_alpha",
    "PROB_ATOL",
]

#: Tolerance on the row sums of probability tensors (float32 softmax rows sum to 1 +- ~1e-6).
PROB_ATOL = 1e-4


def _index(flat_index: int, shape: Sequence[int]) -> str:
    idx = []
    for size in reversed(shape):
        idx.append(flat_index % size)
        flat_index //= size
    return ", ".join(str(i) for i in reversed(idx))


def check_int(name: str, value, *, minimum: int | None = None, maximum: int | None = None) -> int:
    """Return ``value`` as an int, or raise if it is not an integer in [minimum, maximum]."""
    if isinstance(value, bool) or not isinstance(value, (int,)) and not (
        isinstance(value, torch.Tensor) and value.ndim == 0 and not value.is_floating_point()
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
    if tensor.ndim != len(shape) or any(
        want is not None and have != want for have, want in zip(tensor.shape, shape)
    ):
        want = "(" + ", ".join("*" if s is None else str(s) for s in shape) + ")"
        raise InvalidArgument(f"{name} must have shape {want}, got {tuple(tensor.shape)}")
    return tensor


def check_probs(name: str, probs, *, atol: float = PROB_ATOL, normalised: bool = True) -> torch.Tensor:
    """Require a floating tensor of probability rows over its last dimension.

    Rejects non-float dtypes, NaN/inf, negative entries and rows whose sum is
    not 1 within ``atol`` (computed in float64); with ``normalised=False`` rows
    only need a positive sum.
    """
    if not isinstance(probs, torch.Tensor):
        raise InvalidArgument(f"{name} must be a torch.Tensor, got {type(probs).__name__}")
    if not probs.is_floating_point():
        raise InvalidArgument(f"{name} must have a floating dtype, got {probs.dtype}")
    if probs.ndim < 1 or probs.shape[-1] < 1:
        raise InvalidArgument(f"{name} must have a non-empty last (vocabulary) dimension, got shape {tuple(probs.shape)}")
    if probs.numel() == 0:
        return probs
    bad = ~torch.isfinite(probs)
    if bool(bad.any()):
        i = int(bad.flatten().nonzero()[0])
        raise InvalidArgument(f"{name}[{_index(i, probs.shape)}] is {probs.flatten()[i].item()} (must be finite)")
    neg = probs < 0
    if bool(neg.any()):
        i = int(neg.flatten().nonzero()[0])
        raise InvalidArgument(f"{name}[{_index(i, probs.shape)}] is {probs.flatten()[i].item()} (must be >= 0)")
    sums = probs.sum(-1, dtype=torch.float64)
    off = (sums - 1.0).abs() > atol if normalised else sums <= 0
    if bool(off.any()):
        i = int(off.flatten().nonzero()[0])
        where = _index(i, sums.shape) if sums.ndim else ""
        raise InvalidArgument(
            f"{name}[{where}] sums to {sums.flatten()[i].item():.6g} "
            + (f"(expected 1 within {atol:g})" if normalised else "(expected a positive sum)")
        )
    return probs


def check_tokens(name: str, tokens, vocab_size: int) -> torch.Tensor:
    """Require an integer tensor with every entry in [0, vocab_size)."""
    if not isinstance(tokens, torch.Tensor):
        raise InvalidArgument(f"{name} must be a torch.Tensor, got {type(tokens).__name__}")
    if tokens.is_floating_point() or tokens.is_complex() or tokens.dtype == torch.bool:
        raise InvalidArgument(f"{name} must have an integer dtype, got {tokens.dtype}")
    if tokens.numel():
        bad = (tokens < 0) | (tokens >= vocab_size)
        if bool(bad.any()):
            i = int(bad.flatten().nonzero()[0])
            raise InvalidArgument(
                f"{name}[{_index(i, tokens.shape)}] is {int(tokens.flatten()[i])}, outside the vocabulary [0, {vocab_size})"
            )
    return tokens
