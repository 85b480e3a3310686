"""Chain kernels that take their randomness as an input: uniforms tensors or a seed/offset pair.

GPU verification kernels rarely take a ``torch.Generator``.  FlashInfer's
``chain_speculative_sampling`` took ``uniform_samples (B, K+1)`` up to v0.2 and takes
``seed``/``offset`` (a Philox stream) since; SGLang's chain and tree kernels take
``uniform_samples`` and ``uniform_samples_for_final_sampling``.  The adapters here turn
such a kernel into a protocol verifier
``verify(target_probs (B, K+1, V), draft_probs (B, K, V), draft_tokens (B, K), *, generator)``:
the harness's generator draws the kernel's coins (or its seed and offset), so the same
seed gives the same coins and the same verdict, and every battery, the plugin and the
CLI run the kernel unchanged.

Layout of the uniforms (:func:`draw_chain_uniforms`): ``uniforms[b, i]`` for i < K is the
coin of the acceptance test of draft i (accept iff ``u q(x) < p(x)``); ``uniforms[b, K]``
is the coin of the final draw (the residual after a rejection, or the bonus token).  A
kernel with another layout reorders inside its own adapter.  A lossless kernel must
never use one coin twice: the acceptance test conditions the coin it used, so
reusing it for the final draw biases the residual (the catalogue's
``uniforms_reuse_rejected`` mutant).

Shapes: B batch, K draft length, V vocabulary.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from specverify.core.errors import InvalidArgument
from specverify.core.validation import check_generator

__all__ = ["UNIFORM_DTYPES", "draw_chain_uniforms", "draw_seed_offset", "uniforms_in", "seed_offset_in"]

#: dtypes a uniforms-in kernel may ask for (``torch.rand`` of these is in [0, 1)).
UNIFORM_DTYPES = (torch.float64, torch.float32)


def draw_chain_uniforms(
    B: int, K: int, *, generator: torch.Generator, dtype: torch.dtype = torch.float64, device=None
) -> torch.Tensor:
    """The coins of a uniforms-in chain kernel: ``(B, K+1)`` uniforms in [0, 1) from ``generator``.

    Parameters
    ----------
    B, K : int
        Batch rows and draft length.
    generator : torch.Generator
        The only source of randomness; its device must be ``device``.
    dtype : torch.dtype
        float64 (default) or float32.  Drawn directly in that dtype, never rounded from
        float64 (a float64 uniform just below 1 rounds to 1.0 in float32).
    device : torch.device or str, optional
        Where the uniforms live (the device of the kernel's inputs).

    Returns
    -------
    Tensor, shape (B, K+1)
        Column i < K: acceptance coin of draft i; column K: coin of the final draw.
    """
    if dtype not in UNIFORM_DTYPES:
        raise InvalidArgument(f"dtype must be one of {UNIFORM_DTYPES}, got {dtype!r}")
    return torch.rand((B, K + 1), generator=generator, dtype=dtype, device=device)  # (B, K+1)


def draw_seed_offset(*, generator: torch.Generator) -> tuple[int, int]:
    """A Philox ``(seed, offset)`` pair for a seed/offset kernel, drawn from ``generator``.

    ``seed`` in [0, 2**63), ``offset`` a multiple of 4 in [0, 2**32) (Philox counters step
    by 4 uniforms), both fixed by the generator's state.
    """
    pair = torch.randint(0, 2**62, (2,), generator=generator, device=generator.device).tolist()
    return int(pair[0]), int(pair[1] % 2**30) * 4


def _name(kernel, default: str) -> str:
    return getattr(kernel, "__name__", None) or type(kernel).__name__ or default


def uniforms_in(kernel: Callable, *, dtype: torch.dtype = torch.float64) -> Callable:
    """Make a protocol chain verifier from a kernel that takes its coins as a tensor.

    Parameters
    ----------
    kernel : callable
        ``kernel(target_probs (B, K+1, V), draft_probs (B, K, V), draft_tokens (B, K), *,
        uniforms (B, K+1)) -> (tokens (B, K+1), num_emitted (B,))`` with the coin layout of
        the module docstring.
    dtype : torch.dtype
        dtype of the uniforms handed to the kernel: float64 or float32.

    Returns
    -------
    callable
        ``verify(target_probs, draft_probs, draft_tokens, *, generator)`` drawing the coins
        with :func:`draw_chain_uniforms` on the inputs' device; ``verify.kernel`` is the
        kernel.
    """
    if not callable(kernel):
        raise InvalidArgument(f"kernel must be callable, got {kernel!r}")
    if dtype not in UNIFORM_DTYPES:
        raise InvalidArgument(f"dtype must be one of {UNIFORM_DTYPES}, got {dtype!r}")

    def verify(target_probs, draft_probs, draft_tokens, *, generator):
        check_generator("generator", generator)
        B, K1 = target_probs.shape[:2]
        uniforms = draw_chain_uniforms(B, K1 - 1, generator=generator, dtype=dtype, device=target_probs.device)
        return kernel(target_probs, draft_probs, draft_tokens, uniforms=uniforms)

    verify.kernel = kernel  # type: ignore[attr-defined]
    verify.__name__ = verify.__qualname__ = _name(kernel, "verify")
    verify.__doc__ = f"Uniforms-in adapter of {verify.__name__} (see specverify.protocols.uniforms)."
    return verify


def seed_offset_in(kernel: Callable) -> Callable:
    """Make a protocol chain verifier from a kernel that takes a Philox ``seed`` and ``offset``.

    Parameters
    ----------
    kernel : callable
        ``kernel(target_probs, draft_probs, draft_tokens, *, seed: int, offset: int)
        -> (tokens (B, K+1), num_emitted (B,))``.

    Returns
    -------
    callable
        ``verify(target_probs, draft_probs, draft_tokens, *, generator)`` drawing
        ``(seed, offset)`` with :func:`draw_seed_offset` (same generator state, same pair,
        so a deterministic kernel gives the same output); ``verify.kernel`` is the kernel.
    """
    if not callable(kernel):
        raise InvalidArgument(f"kernel must be callable, got {kernel!r}")

    def verify(target_probs, draft_probs, draft_tokens, *, generator):
        check_generator("generator", generator)
        seed, offset = draw_seed_offset(generator=generator)
        return kernel(target_probs, draft_probs, draft_tokens, seed=seed, offset=offset)

    verify.kernel = kernel  # type: ignore[attr-defined]
    verify.__name__ = verify.__qualname__ = _name(kernel, "verify")
    verify.__doc__ = f"Seed/offset adapter of {verify.__name__} (see specverify.protocols.uniforms)."
    return verify
