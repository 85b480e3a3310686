"""FlashInfer's ``chain_speculative_sampling`` behind the chain-verifier protocol (package ``flashinfer-python``).

``verify(target_probs (B, K+1, V), draft_probs (B, K, V), draft_tokens (B, K), *, generator)
-> (tokens (B, K+1) long, num_emitted (B,) long)`` on the device of the inputs; audit with
``specverify audit --verifier specverify.adapters.flashinfer:flashinfer_chain --device cuda:0``.
Up to v0.2.5 the kernel takes ``uniform_samples (B, K+1)`` float32
(``chain_speculative_sampling(draft_probs, draft_token_ids, uniform_samples, target_probs, ...)``):
the adapter is :func:`~specverify.protocols.uniforms.uniforms_in` with float32 coins drawn from the
harness's generator.  Later versions take a Philox ``seed`` and ``offset`` instead
(``chain_speculative_sampling(draft_probs, draft_token_ids, target_probs, ..., deterministic,
generator=None, seed=None, offset=None)``): the adapter is
:func:`~specverify.protocols.uniforms.seed_offset_in`, the pair drawn from the harness's generator.
The form is chosen from the installed signature.  The kernel returns ``output_token_ids (B, K+1)``
int32 with -1 past the emitted tokens (and, in later versions, the accepted and emitted counts as
well).  flashinfer is imported inside functions: this module imports without it and without a GPU.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable

import torch

from specverify.adapters.layouts import from_padded
from specverify.adapters.runtime import missing_package
from specverify.core.errors import ImplementationError
from specverify.core.validation import check_bool
from specverify.protocols.uniforms import seed_offset_in, uniforms_in
from specverify_reference.rules import check_verifier_inputs

__all__ = ["flashinfer_chain_verifier", "flashinfer_chain"]


def _flashinfer_kernel():
    try:
        from flashinfer.sampling import chain_speculative_sampling
    except ImportError as exc:
        raise ImportError(
            missing_package("the FlashInfer adapter needs flashinfer (pip install flashinfer-python)", exc)
        ) from exc
    return chain_speculative_sampling


def flashinfer_chain_verifier(*, deterministic: bool = True):
    """FlashInfer's ``chain_speculative_sampling`` as a protocol verifier (see the module docstring).

    Parameters
    ----------
    deterministic : bool
        FlashInfer's ``deterministic`` flag (its deterministic reduction order).

    Returns
    -------
    callable
        ``verify(target_probs, draft_probs, draft_tokens, *, generator)``; ``verify.form`` is
        ``"uniforms"`` or ``"seed_offset"``.
    """
    check_bool("deterministic", deterministic)
    fn = _flashinfer_kernel()
    params = inspect.signature(fn).parameters

    def inputs(target_probs, draft_probs, draft_tokens):
        check_verifier_inputs(target_probs, draft_probs, draft_tokens)
        return target_probs.float().contiguous(), draft_probs.float().contiguous(), draft_tokens.int().contiguous()

    if "uniform_samples" in params:

        def uniforms_kernel(target_probs, draft_probs, draft_tokens, *, uniforms):
            target, draft, ids = inputs(target_probs, draft_probs, draft_tokens)
            out = fn(draft, ids, uniforms.float().contiguous(), target, deterministic=deterministic)
            return from_padded(out, *draft_tokens.shape, "FlashInfer chain_speculative_sampling")

        verify = uniforms_in(uniforms_kernel, dtype=torch.float32)
        verify.form = "uniforms"  # type: ignore[attr-defined]
    elif "seed" in params and "offset" in params:

        def seed_offset_kernel(target_probs, draft_probs, draft_tokens, *, seed, offset):
            target, draft, ids = inputs(target_probs, draft_probs, draft_tokens)
            out = fn(draft, ids, target, deterministic=deterministic, seed=seed, offset=offset)
            return from_padded(out, *draft_tokens.shape, "FlashInfer chain_speculative_sampling")

        verify = seed_offset_in(seed_offset_kernel)
        verify.form = "seed_offset"  # type: ignore[attr-defined]
    else:
        raise ImplementationError(
            f"flashinfer.sampling.chain_speculative_sampling{inspect.signature(fn)} takes neither uniform_samples "
            "nor seed/offset: this adapter does not know that version"
        )
    verify.__name__ = verify.__qualname__ = "flashinfer_chain"
    return verify


_CACHE: dict[str, Callable] = {}


def flashinfer_chain(target_probs, draft_probs, draft_tokens, *, generator):
    """:func:`flashinfer_chain_verifier` with its defaults, built on first use (``--verifier ...:flashinfer_chain``)."""
    if "flashinfer" not in _CACHE:
        _CACHE["flashinfer"] = flashinfer_chain_verifier()
    return _CACHE["flashinfer"](target_probs, draft_probs, draft_tokens, generator=generator)
