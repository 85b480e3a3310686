"""Sibling-verification rules as the exact tree laws model them (pluggable, like core.chain_laws' chain rules).

At one expanded tree node the target row is ``p``, the draft row ``q``; the children
x_1..x_k are verified in order against a running state ``(r, q_view)``: ``r`` the
target-side law (starts at p), ``q_view`` the draft law the *verifier* believes sibling
i was drawn from (starts at q).  A :class:`SiblingRule` says

* ``accept(p, r, q_view, x)`` -- the probability of accepting a sibling with token x;
* ``reject(p, r, q_view, x)`` -- r after rejecting it;
* ``q_view`` -- how the verifier's q changes after a sibling: ``"iid"`` (unchanged),
  ``"wor"`` (x removed, renormalised) or ``"none"`` (q unused);
* ``skip_duplicates`` -- a sibling repeating an earlier sibling's token is skipped;
* ``final(p, r, q_view)`` -- weights of the token emitted when every sibling is rejected
  (normalised by the caller; mass 0 falls back to p).

How the siblings were *drawn* is separate (the ``drafting`` of
:func:`specverify.verifier.tree.laws.round_law`), so a rule can be paired with the wrong
drafting: the without-replacement siblings verified with the i.i.d. rule of llama.cpp PR
#5625's discussion is ``drafting="wor"`` with :data:`SPECINFER`.

Lossless rules: :data:`SPECINFER` (Miao et al. 2023), :data:`RRSW` (Jeon et al. 2024,
arXiv 2402.14160), :data:`TOPK` (EAGLE-2/3, SafeAILab/EAGLE #171) and
:data:`SAMPLE_AND_MATCH` (target-only; by the chain rule of a categorical,
P(y = x_i | y not in {x_1..x_{i-1}}) = r_i(x_i) with r_i = p without the earlier siblings
renormalised, so its law is the TOPK rule's).  Wrong ones (``docs/bugs.md``):
:data:`RESIDUAL_NOT_CARRIED`, :data:`RESIDUAL_ZERO_ONLY_REJECTED` (SafeAILab/EAGLE #20).

Every function acts on rows (..., V) in float64 with tokens x (...,) long.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from specverify.core.errors import InvalidArgument

__all__ = [
    "SiblingRule",
    "SPECINFER",
    "RRSW",
    "TOPK",
    "SAMPLE_AND_MATCH",
    "RESIDUAL_NOT_CARRIED",
    "RESIDUAL_ZERO_ONLY_REJECTED",
    "SIBLING_RULES",
    "MODE_RULES",
    "sibling_rule",
]


def _at(rows: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    return rows.gather(-1, x[..., None]).squeeze(-1)


def _normalise_or(weights: torch.Tensor, fallback: torch.Tensor) -> torch.Tensor:
    total = weights.sum(-1, keepdim=True)
    return torch.where(total > 0, weights / torch.where(total > 0, total, 1.0), fallback)


def ratio_accept(p, r, q, x):
    """min(1, r(x)/q(x)); where q(x) = 0 the test ``u q < r`` accepts iff r(x) > 0."""
    r_x, q_x = _at(r, x), _at(q, x)
    safe = torch.where(q_x > 0, q_x, 1.0)
    return torch.where(q_x > 0, (r_x / safe).clamp(max=1.0), (r_x > 0).to(r.dtype))


def target_ratio_accept(p, r, q, x):
    """min(1, p(x)/q(x)): the ratio against the node's own target row, ignoring the running r."""
    return ratio_accept(p, p, q, x)


def point_accept(p, r, q, x):
    """r(x): the accept probability of a point-mass draft (u < r(x))."""
    return _at(r, x)


def residual_reject(p, r, q, x):
    """norm((r - q)+), r where that has mass 0."""
    return _normalise_or((r - q).clamp_min(0.0), r)


def target_residual_reject(p, r, q, x):
    """norm((p - q)+) from the node's own row p: the residual is never carried."""
    return _normalise_or((p - q).clamp_min(0.0), p)


def drop_reject(p, r, q, x):
    """r with x zeroed and renormalised (r where nothing is left)."""
    return _normalise_or(r.scatter(-1, x[..., None], 0.0), r)


def running_final(p, r, q):
    return r


@dataclass(frozen=True)
class SiblingRule:
    """One sibling-verification rule (see the module docstring)."""

    name: str
    accept: Callable
    reject: Callable
    q_view: str = "iid"
    skip_duplicates: bool = False
    final: Callable = running_final

    def __post_init__(self):
        if self.q_view not in ("iid", "wor", "none"):
            raise InvalidArgument(f"q_view must be 'iid', 'wor' or 'none', got {self.q_view!r}")

    def update_view(self, q: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """The verifier's q for the next sibling after sibling x."""
        if self.q_view != "wor":
            return q
        return _normalise_or(q.scatter(-1, x[..., None], 0.0), q * 0.0)


SPECINFER = SiblingRule("specinfer", ratio_accept, residual_reject, "iid")
RRSW = SiblingRule("rrsw", ratio_accept, residual_reject, "wor")
TOPK = SiblingRule("topk", point_accept, drop_reject, "none", skip_duplicates=True)
SAMPLE_AND_MATCH = SiblingRule("sample_and_match", point_accept, drop_reject, "none", skip_duplicates=True)
RESIDUAL_NOT_CARRIED = SiblingRule("residual_not_carried", target_ratio_accept, target_residual_reject, "iid")
RESIDUAL_ZERO_ONLY_REJECTED = SiblingRule("residual_zero_only_rejected", ratio_accept, drop_reject, "iid")

#: Rules by name; ``rule=`` arguments accept a name or a :class:`SiblingRule`.
SIBLING_RULES = {
    r.name: r for r in (SPECINFER, RRSW, TOPK, SAMPLE_AND_MATCH, RESIDUAL_NOT_CARRIED, RESIDUAL_ZERO_ONLY_REJECTED)
}
#: The lossless rule of each protocol mode.
MODE_RULES = {"iid": SPECINFER, "wor": RRSW, "topk": TOPK, "any": SAMPLE_AND_MATCH}


def sibling_rule(rule, mode: str | None = None) -> SiblingRule:
    """Resolve ``rule`` (None: the mode's lossless rule; a name; a SiblingRule)."""
    if rule is None:
        if mode not in MODE_RULES:
            raise InvalidArgument(f"mode must be one of {tuple(MODE_RULES)}, got {mode!r}")
        return MODE_RULES[mode]
    if isinstance(rule, SiblingRule):
        return rule
    if isinstance(rule, str) and rule in SIBLING_RULES:
        return SIBLING_RULES[rule]
    raise InvalidArgument(f"rule must be a SiblingRule or one of {sorted(SIBLING_RULES)}, got {rule!r}")
