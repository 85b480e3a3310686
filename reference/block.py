"""Block verification of a draft chain (Sun, Mendlovic, Leviathan, Aharoni, Ro, Beirami & Suresh,
"Block Verification Accelerates Speculative Decoding", ICLR 2025, arXiv 2403.10444, Algorithm 2).

Drafts X_1..X_K with laws q_i (``draft_probs[:, i-1]``), target laws p_i
(``target_probs[:, i-1]``, p_{K+1} the bonus row).  With ``w_0 = 1``:

* ``w_i = min(1, w_{i-1} p_i(X_i) / q_i(X_i))`` (q_i(X_i) = 0: 1 if w_{i-1} p_i(X_i) > 0, else 0);
* ``rho_i = sum_x (w_i p_{i+1}(x) - q_{i+1}(x))+`` -- the residual mass of the *next*
  position given the block so far;
* ``h_i = rho_i / (rho_i + 1 - w_i)`` for i < K (1 when w_i = 1), ``h_K = w_K``;
* independent ``eta_i ~ U[0, 1)``, ``tau = max{i : eta_i < h_i}`` (0 if none);
* emit X_1..X_tau, then a token from ``p_{K+1}`` if tau = K, else from
  ``norm((w_tau p_{tau+1} - q_{tau+1})+)`` (p_{tau+1} itself if that has mass 0, only
  reachable through rounding or a dishonest draft).

The tests compute its exact law by enumerating draft blocks: lossless, and its expected
accepted length is at least token-wise verification's (strictly more on the paper's
example: 11/9 against 10/9).  ``eta_i < h_i`` (not ``<=``) keeps a zero threshold from
accepting on a zero coin.  The chain-verifier protocol, as :func:`reference.rules.verify`.

Shapes: B batch, K draft tokens, V vocabulary.
"""

from __future__ import annotations

import torch

from specverify.core.sampling import inverse_cdf, uniform
from specverify.core.validation import check_generator
from specverify_reference.rules import check_verifier_inputs

__all__ = ["verify", "block_weights", "block_thresholds"]


def block_weights(target_probs: torch.Tensor, draft_probs: torch.Tensor, draft_tokens: torch.Tensor) -> torch.Tensor:
    """``w_0..w_K`` (B, K+1) float64: the running weights of Algorithm 2."""
    B, K = draft_tokens.shape
    index = draft_tokens.long()[..., None]  # (B, K, 1)
    p_x = target_probs[:, :K].gather(-1, index).squeeze(-1).double()  # (B, K)
    q_x = draft_probs.gather(-1, index).squeeze(-1).double()  # (B, K)
    w = [torch.ones(B, dtype=torch.float64, device=target_probs.device)]
    for i in range(K):
        num = w[-1] * p_x[:, i]  # (B,)
        safe = torch.where(q_x[:, i] > 0, q_x[:, i], 1.0)
        w.append(torch.where(q_x[:, i] > 0, (num / safe).clamp(max=1.0), (num > 0).double()))
    return torch.stack(w, 1)  # (B, K+1)


def _residual(w: torch.Tensor, target_row: torch.Tensor, draft_row: torch.Tensor) -> torch.Tensor:
    """Unnormalised ``(w p - q)+`` per row: w (B,), rows (B, V) -> (B, V) float64."""
    return (w[:, None] * target_row.double() - draft_row.double()).clamp_min(0.0)


def block_thresholds(target_probs: torch.Tensor, draft_probs: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """``h_1..h_K`` (B, K) float64 from the weights ``w`` (B, K+1)."""
    K = draft_probs.shape[1]
    h = []
    for i in range(1, K):
        rho = _residual(w[:, i], target_probs[:, i], draft_probs[:, i]).sum(-1)  # (B,)
        denominator = rho + (1.0 - w[:, i])
        h.append(torch.where(denominator > 0, rho / torch.where(denominator > 0, denominator, 1.0), 1.0))
    h.append(w[:, K])
    return torch.stack(h, 1)  # (B, K)


def verify(
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor,
    draft_tokens: torch.Tensor,
    *,
    generator: torch.Generator,
    check: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Block verification of one draft block per row (the chain-verifier protocol).

    Parameters
    ----------
    target_probs : Tensor, shape (B, K+1, V)
    draft_probs : Tensor, shape (B, K, V)
    draft_tokens : Tensor, shape (B, K), integer
    generator : torch.Generator
        K uniforms per row (eta), then one uniform per row for the last token.
    check : bool
        Validate the inputs.

    Returns
    -------
    tokens : Tensor, shape (B, K+1), long
        X_1..X_tau then the residual or bonus token; 0 past ``num_emitted``.
    num_emitted : Tensor, shape (B,), long
        tau + 1.
    """
    if check:
        check_verifier_inputs(target_probs, draft_probs, draft_tokens)
        check_generator("generator", generator)
    B, K1, V = target_probs.shape
    K = K1 - 1
    device = target_probs.device
    draft_tokens = draft_tokens.long()
    w = block_weights(target_probs, draft_probs, draft_tokens)  # (B, K+1)
    h = block_thresholds(target_probs, draft_probs, w)  # (B, K)
    eta = uniform((B, K), generator=generator, device=device)  # (B, K)
    positions = torch.arange(1, K + 1, device=device)  # (K,)
    tau = torch.where(eta < h, positions, 0).amax(-1)  # (B,) the last position whose test passes
    rows = torch.arange(B, device=device)
    w_tau = w[rows, tau]  # (B,)
    target_row = target_probs[rows, tau].double()  # (B, V) p_{tau+1}
    draft_row = draft_probs[rows, tau.clamp(max=K - 1)].double()  # (B, V) q_{tau+1} (unused when tau = K)
    full = (tau == K)[:, None]  # (B, 1)
    weights = torch.where(full, target_row, _residual(w_tau, target_row, draft_row))  # (B, V)
    weights = torch.where(weights.sum(-1, keepdim=True) > 0, weights, target_row)  # mass 0 -> p_{tau+1}
    last = inverse_cdf(weights, uniform((B, 1), generator=generator, device=device))[0]  # (B,)
    tokens = torch.where(positions[None] <= tau[:, None], draft_tokens, 0)  # (B, K)
    tokens = torch.cat([tokens, torch.zeros_like(tokens[:, :1])], 1)  # (B, K+1)
    tokens.scatter_(1, tau[:, None], last[:, None])
    return tokens, tau + 1
