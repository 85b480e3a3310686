"""Medusa's ``evaluate_posterior`` (sampling branch, medusa-llm 0.1) restated: the engine-free stand-in.

Shared by the chain adapter's tests (one path) and the tree adapter's (several paths).
"""

from __future__ import annotations

import torch


def medusa_formula(logits, candidates, temperature, posterior_threshold, posterior_alpha):
    """``(best candidate, accepted length)`` for logits (P, D+1, V') and candidates (P, D+1), as Medusa computes them."""
    probs = torch.softmax(logits[:, :-1] / temperature, dim=-1)  # (P, D, V')
    cand = probs.gather(-1, candidates[:, 1:, None]).squeeze(-1)  # (P, D)
    entropy = -(probs * torch.log(probs + 1e-5)).sum(-1)  # (P, D)
    thr = torch.minimum(torch.full_like(entropy, posterior_threshold), torch.exp(-entropy) * posterior_alpha)
    lengths = torch.cumprod((cand > thr).int(), dim=1).sum(1)  # (P,)
    length = lengths.max()
    if length == 0:
        return torch.tensor(0), length
    best = torch.where(lengths == length)[0]
    return best[torch.log(cand[best, :length]).sum(-1).argmax()], length
