"""Uniforms-in chain kernels of the catalogue: a lossy one and the canonical one, behind the adapter.

Both are kernels ``kernel(target_probs, draft_probs, draft_tokens, *, uniforms (B, K+1))``
wrapped by :func:`specverify.protocols.uniforms.uniforms_in`, so the harness draws their
coins from its generator exactly as it would for a GPU kernel (FlashInfer, SGLang).

* ``uniforms_reuse_rejected`` (mutant): the final draw after a rejection at draft i uses
  coin i, the one the acceptance test just used, instead of the fresh coin K.  Given the
  rejection that coin is uniform on ``[p(x)/q(x), 1)`` only, so the residual inverse CDF
  is read on a shifted interval: tokens early in the residual's order are under-emitted.
  A uniforms-in kernel indexing its coin array by the rejected position makes it.
* ``uniforms_in_canonical`` (equivalent): :func:`reference.uniforms.chain_kernel`.
"""

from __future__ import annotations

from specverify.mutants.entry import CatalogueEntry
from specverify.protocols.uniforms import uniforms_in
from specverify_reference.rules import check_verifier_inputs
from specverify_reference.uniforms import _assemble, accept_with_uniforms, final_draw
from specverify_reference.uniforms import verify as canonical_uniforms

__all__ = ["ENTRIES", "reuse_rejected_kernel"]


def reuse_rejected_kernel(target_probs, draft_probs, draft_tokens, *, uniforms):
    """Canonical acceptance; the final draw uses coin ``num_accepted`` (the rejected draft's coin, or K)."""
    check_verifier_inputs(target_probs, draft_probs, draft_tokens)
    K = draft_tokens.shape[1]
    num_accepted = accept_with_uniforms(target_probs, draft_probs, draft_tokens, uniforms[:, :K])  # (B,)
    coin = uniforms.gather(1, num_accepted[:, None]).squeeze(1)  # (B,) coin i at a rejection at i
    return _assemble(draft_tokens, num_accepted, final_draw(target_probs, draft_probs, num_accepted, coin))


uniforms_reuse_rejected = uniforms_in(reuse_rejected_kernel)
uniforms_reuse_rejected.__name__ = uniforms_reuse_rejected.__qualname__ = "uniforms_reuse_rejected"

ENTRIES: tuple[CatalogueEntry, ...] = (
    CatalogueEntry(
        "uniforms_reuse_rejected",
        "verifier",
        uniforms_reuse_rejected,
        "uniforms-in kernel: after a rejection at draft i the residual is drawn with coin i, the coin the "
        "acceptance test conditioned (u >= p/q), instead of the fresh final coin",
        "specverify (RNG class, uniforms-in kernels: FlashInfer/SGLang uniform_samples layout)",
        "any rejection with a residual of >= 2 tokens",
    ),
    CatalogueEntry(
        "uniforms_in_canonical",
        "equivalent",
        canonical_uniforms,
        "the canonical rule as a uniforms-in kernel (coins (B, K+1): K acceptance coins, one final coin)",
        "reference.uniforms.chain_kernel",
    ),
)
