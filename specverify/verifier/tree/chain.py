"""A chain is a tree: drive a tree verifier through the chain-verifier protocol.

A draft block of K tokens is the tree of one path (node n's parent is node n-1), with
slot m's draft row the law the next draft was drawn from (``q_{m+1}``).  With mode
``"iid"`` a lossless tree rule then reduces to the canonical chain rule, with ``"any"`` to
sample-and-match, so the chain battery and the peers' chain tests run on tree verifiers.

Shapes: B batch, K draft length, V vocabulary.
"""

from __future__ import annotations

import torch

from specverify.core.errors import InvalidArgument
from specverify.protocols.tree import MODES

__all__ = ["as_chain_verifier"]


def as_chain_verifier(verify_tree, *, mode: str = "iid"):
    """``verify(target_probs (B,K+1,V), draft_probs (B,K,V), draft_tokens (B,K), *, generator)`` of a tree verifier."""
    if mode not in MODES:
        raise InvalidArgument(f"mode must be one of {MODES}, got {mode!r}")

    def verify(target_probs, draft_probs, draft_tokens, *, generator):
        B, K = draft_tokens.shape
        parents = torch.arange(-1, K - 1, device=draft_tokens.device).expand(B, K)  # (B, K) one path
        tree_draft = None
        if mode != "any":
            tree_draft = torch.cat([draft_probs, draft_probs[:, -1:]], 1)  # (B, K+1, V): slot K has no child
        emitted, num_emitted, _ = verify_tree(
            target_probs, tree_draft, draft_tokens, parents, mode=mode, generator=generator
        )
        return emitted, num_emitted

    verify.__name__ = verify.__qualname__ = f"chain({getattr(verify_tree, '__name__', 'verify_tree')}, mode={mode})"
    return verify
