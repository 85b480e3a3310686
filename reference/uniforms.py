"""The canonical chain rule written as a uniforms-in kernel, as GPU kernels take their coins.

``chain_kernel(target_probs (B, K+1, V), draft_probs (B, K, V), draft_tokens (B, K), *,
uniforms (B, K+1))``: the coin layout of :mod:`specverify.protocols.uniforms` (FlashInfer's
``uniform_samples``): draft i is accepted iff ``uniforms[b, i] * q_i(x_i) < p_i(x_i)``;
the first rejected position emits a residual ``(p_i - q_i)+`` draw and the all-accepted
row a bonus draw from ``p_{K+1}``, both by float64 inverse CDF with the last coin
``uniforms[b, K]``, which no acceptance test has seen.  A residual of mass 0 (a drafted
token outside q's support, or rounding) falls back to p, as :func:`reference.rules.verify`
does.  The law is that of :func:`reference.rules.verify`; the coins are drawn in another
order, so the tokens are not the same for a given generator.

``verify`` is the protocol verifier (coins drawn from the generator by
:func:`specverify.protocols.uniforms.uniforms_in`); ``verify_seed_offset`` the same rule
behind :func:`~specverify.protocols.uniforms.seed_offset_in` (its coins come from a CPU or
device generator seeded from the pair), the form of FlashInfer >= 0.2.6.

Shapes: B batch, K draft length, V vocabulary.
"""

from __future__ import annotations

import torch

from specverify.core.errors import InvalidArgument
from specverify.core.sampling import inverse_cdf
from specverify.protocols.uniforms import seed_offset_in, uniforms_in
from specverify_reference.rules import check_verifier_inputs

__all__ = ["accept_with_uniforms", "final_draw", "chain_kernel", "verify", "seed_offset_kernel", "verify_seed_offset"]


def accept_with_uniforms(target_probs, draft_probs, draft_tokens, coins) -> torch.Tensor:
    """Accepted drafts per row, ``(B,)`` long: the first i with ``coins[b, i] q_i(x_i) >= p_i(x_i)``."""
    K = draft_tokens.shape[1]
    tokens = draft_tokens.long()[..., None]  # (B, K, 1)
    p = target_probs[:, :K].gather(-1, tokens).squeeze(-1).double()  # (B, K)
    q = draft_probs.gather(-1, tokens).squeeze(-1).double()  # (B, K)
    accepted = coins.double() * q < p  # (B, K)
    return accepted.long().cumprod(-1).sum(-1)  # (B,)


def final_draw(target_probs, draft_probs, num_accepted, coin) -> torch.Tensor:
    """The token after the accepted prefix: residual at the rejection, else the bonus; ``(B,)`` long.

    ``coin`` (B,) is the uniform of the draw; float64 inverse CDF of ``(p - q)+`` (or of p
    on all-accepted rows and where the residual has mass 0).
    """
    B, K1, V = target_probs.shape
    K = K1 - 1
    rows = torch.arange(B, device=target_probs.device)  # (B,)
    p_row = target_probs[rows, num_accepted].double()  # (B, V)
    q_row = draft_probs[rows, num_accepted.clamp(max=K - 1)].double()  # (B, V)
    rejected = (num_accepted < K)[:, None]  # (B, 1)
    weights = torch.where(rejected, (p_row - q_row).clamp_min(0.0), p_row)  # (B, V)
    weights = torch.where(weights.sum(-1, keepdim=True) > 0, weights, p_row)  # (B, V) mass 0 -> p
    return inverse_cdf(weights, coin.double()[:, None])[0]  # (B,)


def _assemble(draft_tokens, num_accepted, last):
    """Tokens (B, K+1): the accepted drafts, then ``last``, zeros past the block; num_emitted (B,)."""
    B, K = draft_tokens.shape
    positions = torch.arange(K + 1, device=draft_tokens.device)  # (K+1,)
    tokens = torch.cat([draft_tokens.long(), torch.zeros_like(draft_tokens[:, :1]).long()], dim=1)  # (B, K+1)
    tokens = torch.where(positions[None] < num_accepted[:, None], tokens, 0)  # (B, K+1)
    tokens.scatter_(1, num_accepted[:, None], last[:, None])
    return tokens, num_accepted + 1


def chain_kernel(target_probs, draft_probs, draft_tokens, *, uniforms, check: bool = True):
    """Canonical chain verification with the coins given: see the module docstring.

    Parameters
    ----------
    target_probs : Tensor, shape (B, K+1, V)
    draft_probs : Tensor, shape (B, K, V)
    draft_tokens : Tensor, shape (B, K), integer
    uniforms : Tensor, shape (B, K+1), floating, in [0, 1)
        Acceptance coins of the K drafts, then the coin of the final draw.
    check : bool
        Validate the inputs.

    Returns
    -------
    tokens : Tensor (B, K+1) long
    num_emitted : Tensor (B,) long
    """
    if check:
        B, K, _ = check_verifier_inputs(target_probs, draft_probs, draft_tokens)
        if not isinstance(uniforms, torch.Tensor) or tuple(uniforms.shape) != (B, K + 1):
            raise InvalidArgument(f"uniforms must be a tensor of shape {(B, K + 1)}, got {uniforms!r}")
        if not uniforms.is_floating_point() or bool(((uniforms < 0) | (uniforms >= 1)).any()):
            raise InvalidArgument("uniforms must be floating point in [0, 1)")
    K = draft_tokens.shape[1]
    num_accepted = accept_with_uniforms(target_probs, draft_probs, draft_tokens, uniforms[:, :K])  # (B,)
    last = final_draw(target_probs, draft_probs, num_accepted, uniforms[:, K])  # (B,)
    return _assemble(draft_tokens, num_accepted, last)


def seed_offset_kernel(target_probs, draft_probs, draft_tokens, *, seed: int, offset: int):
    """:func:`chain_kernel` whose coins come from a generator of the inputs' device seeded by ``(seed, offset)``."""
    B, K1 = target_probs.shape[:2]
    gen = torch.Generator(device=target_probs.device).manual_seed((int(seed) * 1_000_003 + int(offset)) % 2**63)
    uniforms = torch.rand((B, K1), generator=gen, dtype=torch.float64, device=target_probs.device)  # (B, K+1)
    return chain_kernel(target_probs, draft_probs, draft_tokens, uniforms=uniforms)


#: The canonical rule as a protocol verifier, through the uniforms-in adapter.
verify = uniforms_in(chain_kernel)
verify.__name__ = verify.__qualname__ = "verify"
#: The canonical rule as a protocol verifier, through the seed/offset adapter.
verify_seed_offset = seed_offset_in(seed_offset_kernel)
verify_seed_offset.__name__ = verify_seed_offset.__qualname__ = "verify_seed_offset"
