"""Exact output laws of speculative verification, in float64, without sampling.

The laws here model the algorithm step by step -- draft, accept with a
per-token probability, resample from a residual on rejection, a bonus token
after K acceptances -- instead of asserting its conclusion, so that equality
with the target's law is a genuine check of the theorem (Leviathan, Kalman &
Matias 2023, Theorem 3.5 / Appendix A.1; Chen et al. 2023, Theorem 1) and a
deliberately wrong rule (residual = p, bonus from the residual, ...) gives a
measurably different law.

* :func:`one_step_law` -- law of the first emitted token of one verification step,
  ``sum_x q(x) a(x) delta_x + P(reject) r`` with ``a = min(1, p/q)`` and
  ``r = (p - q)+ / sum (p - q)+`` under the canonical rule;
* :func:`acceptance_probability` -- ``sum_x q(x) a(x)`` (``sum min(p, q)`` canonically);
* :func:`position_laws`, :func:`num_emitted_law` -- the block emitted by one call of
  the verifier protocol (fixed rows p_1..p_{K+1}, q_1..q_K), per in-block position;
* :func:`markov_speculative_law` -- joint law of the first L tokens of full
  speculative decoding (repeated draft-K / verify rounds) when target and drafter
  are first-order Markov tables, by dynamic programming over the block structure;
  :func:`markov_chain_law` -- the target chain's own joint law, for comparison.

A rule is a :class:`VerificationRule` (acceptance probability, residual weights,
where the bonus token comes from); :data:`RULES` names the canonical rule and a
few catalogued wrong ones (``docs/bugs.md``).  Inputs are renormalised in
float64 (they are validated to sum to 1 within ``PROB_ATOL``); a residual of mass
0 falls back to the target row, as ``reference.rules.verify`` does.

Shapes: B batch, K draft length, V vocabulary, L sequence length.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from specverify.core.errors import InvalidArgument
from specverify.core.validation import check_int, check_probs, check_shape

__all__ = [
    "VerificationRule",
    "CANONICAL",
    "RESIDUAL_IS_TARGET",
    "BONUS_FROM_RESIDUAL",
    "ALWAYS_ACCEPT",
    "INVERTED_RATIO",
    "RULES",
    "acceptance_probability",
    "one_step_law",
    "position_laws",
    "num_emitted_law",
    "markov_speculative_law",
    "markov_chain_law",
    "MAX_JOINT_SIZE",
]

#: Largest number of cells (V ** L) a joint law may have.
MAX_JOINT_SIZE = 1 << 24


# --------------------------------------------------------------------------- rules


def _canonical_accept(target: torch.Tensor, draft: torch.Tensor) -> torch.Tensor:
    # min(1, p/q); where q == 0 the implementation's test ``u q < p`` accepts iff p > 0
    # (such a token is never drafted by an honest drafter, so this does not enter the laws).
    safe = torch.where(draft > 0, draft, torch.ones_like(draft))
    return torch.where(draft > 0, (target / safe).clamp(max=1.0), (target > 0).to(target.dtype))


def _inverted_accept(target: torch.Tensor, draft: torch.Tensor) -> torch.Tensor:
    return _canonical_accept(draft, target)


def _always_accept(target: torch.Tensor, draft: torch.Tensor) -> torch.Tensor:
    return torch.ones_like(target)


def _canonical_residual(target: torch.Tensor, draft: torch.Tensor) -> torch.Tensor:
    return (target - draft).clamp_min(0.0)


def _target_residual(target: torch.Tensor, draft: torch.Tensor) -> torch.Tensor:
    return target.clone()


@dataclass(frozen=True)
class VerificationRule:
    """One verification rule, as the exact laws model it.

    Parameters
    ----------
    name : str
    accept : callable ``(target (..., V), draft (..., V)) -> (..., V)``
        Probability of accepting a drafted token x (in [0, 1]), float64.
    residual : callable ``(target (..., V), draft (..., V)) -> (..., V)``
        Unnormalised weights of the token emitted at the first rejection; a row
        of mass 0 falls back to the target row.
    bonus : {"target", "residual"}
        After K acceptances the bonus token is drawn from the target's row
        p_{K+1} ("target", canonical) or from the residual of position K
        ("residual", the EAGLE PR #47 bug).
    """

    name: str
    accept: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    residual: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    bonus: str = "target"

    def __post_init__(self):
        if self.bonus not in ("target", "residual"):
            raise InvalidArgument(f"bonus must be 'target' or 'residual', got {self.bonus!r}")


CANONICAL = VerificationRule("canonical", _canonical_accept, _canonical_residual)
RESIDUAL_IS_TARGET = VerificationRule("residual_is_p", _canonical_accept, _target_residual)
BONUS_FROM_RESIDUAL = VerificationRule("bonus_from_residual", _canonical_accept, _canonical_residual, "residual")
ALWAYS_ACCEPT = VerificationRule("always_accept", _always_accept, _canonical_residual)
INVERTED_RATIO = VerificationRule("inverted_ratio", _inverted_accept, _canonical_residual)

#: Rules by name; ``rule=`` accepts a name or a :class:`VerificationRule`.
RULES = {r.name: r for r in (CANONICAL, RESIDUAL_IS_TARGET, BONUS_FROM_RESIDUAL, ALWAYS_ACCEPT, INVERTED_RATIO)}


def _rule(rule) -> VerificationRule:
    if isinstance(rule, VerificationRule):
        return rule
    if isinstance(rule, str) and rule in RULES:
        return RULES[rule]
    raise InvalidArgument(f"rule must be a VerificationRule or one of {sorted(RULES)}, got {rule!r}")


# --------------------------------------------------------------------------- helpers


def _probs64(name: str, probs) -> torch.Tensor:
    """Validate a probability tensor (torch or numpy) and return it renormalised in float64."""
    if isinstance(probs, np.ndarray):
        probs = torch.from_numpy(probs)
    check_probs(name, probs)
    probs = probs.to(torch.float64)
    return probs / probs.sum(-1, keepdim=True)


def _pieces(target: torch.Tensor, draft: torch.Tensor, rule: VerificationRule):
    """Accepted mass q a (..., V), rejection probability (...,) and normalised residual (..., V)."""
    accept = rule.accept(target, draft).to(torch.float64)  # (..., V)
    accepted_mass = draft * accept  # (..., V)
    reject = (draft * (1.0 - accept)).sum(-1)  # (...,) E_q[1 - a], without cancellation
    weights = rule.residual(target, draft).to(torch.float64)  # (..., V)
    total = weights.sum(-1, keepdim=True)  # (..., 1)
    weights = torch.where(total > 0, weights, target)  # residual of mass 0 falls back to p
    residual = weights / weights.sum(-1, keepdim=True)  # (..., V)
    return accepted_mass, reject, residual


def _pair(target_probs, draft_probs):
    target = _probs64("target_probs", target_probs)
    draft = _probs64("draft_probs", draft_probs)
    check_shape("draft_probs", draft, tuple(target.shape))
    return target, draft


# --------------------------------------------------------------------------- one step / one block


def acceptance_probability(target_probs, draft_probs, *, rule="canonical") -> torch.Tensor:
    """Probability that a token drafted from q is accepted: ``sum_x q(x) a(x)``.

    Under the canonical rule this is ``sum_x min(p(x), q(x)) = 1 - TV(p, q)``.

    Parameters
    ----------
    target_probs, draft_probs : Tensor, shape (..., V)
        Probability rows (renormalised in float64).
    rule : str or VerificationRule

    Returns
    -------
    Tensor, shape (...), float64
    """
    target, draft = _pair(target_probs, draft_probs)
    rule = _rule(rule)
    return (draft * rule.accept(target, draft).to(torch.float64)).sum(-1)


def one_step_law(target_probs, draft_probs, *, rule="canonical") -> torch.Tensor:
    """Exact law of the token emitted at one verification position.

    ``sum_x q(x) a(x) delta_x + P(reject) r`` where ``P(reject) = sum_x q(x)(1 - a(x))``
    and r is the normalised residual (the target row when the residual has mass 0).
    The canonical rule gives exactly ``target_probs`` (up to float64 rounding).

    Parameters
    ----------
    target_probs, draft_probs : Tensor, shape (..., V)
    rule : str or VerificationRule
        ``"canonical"`` or a deliberately wrong rule, e.g. ``"residual_is_p"``.

    Returns
    -------
    Tensor, shape (..., V), float64
    """
    target, draft = _pair(target_probs, draft_probs)
    accepted_mass, reject, residual = _pieces(target, draft, _rule(rule))
    return accepted_mass + reject[..., None] * residual  # (..., V)


def _block_pair(target_probs, draft_probs):
    target = _probs64("target_probs", target_probs)
    if target.ndim < 2 or target.shape[-2] < 2:
        raise InvalidArgument(f"target_probs must have shape (..., K+1, V) with K >= 1, got {tuple(target.shape)}")
    draft = _probs64("draft_probs", draft_probs)
    shape = tuple(target.shape)
    check_shape("draft_probs", draft, shape[:-2] + (shape[-2] - 1, shape[-1]))
    return target, draft


def _block_pieces(target, draft, rule):
    K = draft.shape[-2]
    accepted_mass, reject, residual = _pieces(target[..., :K, :], draft, rule)  # (..., K, V), (..., K), (..., K, V)
    alpha = accepted_mass.sum(-1)  # (..., K)
    ones = torch.ones_like(alpha[..., :1])  # (..., 1)
    reach = torch.cat([ones, alpha], -1).cumprod(-1)  # (..., K+1): P(position i is emitted)
    bonus = target[..., K, :] if rule.bonus == "target" else residual[..., K - 1, :]  # (..., V)
    return accepted_mass, reject, residual, reach, bonus


def position_laws(target_probs, draft_probs, *, rule="canonical") -> torch.Tensor:
    """Per in-block position, P(position i is emitted and equals y), for one verifier call.

    Models the verifier protocol with fixed rows: drafts ``x_i ~ q_i``, accepted
    with ``a(p_i, q_i)``; the first rejection emits a residual token; after K
    acceptances the bonus comes from ``p_{K+1}`` (or the rule's bonus source).

    Parameters
    ----------
    target_probs : Tensor, shape (..., K+1, V)
    draft_probs : Tensor, shape (..., K, V)
    rule : str or VerificationRule

    Returns
    -------
    Tensor, shape (..., K+1, V), float64
        Row i sums to P(num_emitted > i); under the canonical rule row i equals
        ``P(num_emitted > i) * target_probs[..., i, :]``.
    """
    target, draft = _block_pair(target_probs, draft_probs)
    accepted_mass, reject, residual, reach, bonus = _block_pieces(target, draft, _rule(rule))
    steps = accepted_mass + reject[..., None] * residual  # (..., K, V)
    laws = torch.cat([steps, bonus[..., None, :]], -2)  # (..., K+1, V)
    return reach[..., None] * laws


def num_emitted_law(target_probs, draft_probs, *, rule="canonical") -> torch.Tensor:
    """Exact law of ``num_emitted`` (1..K+1) for one verifier call; shape (..., K+1), float64.

    Entry m-1 is P(num_emitted = m): ``reach_m * P(reject at m)`` for m <= K and
    ``reach_{K+1}`` (all K accepted) for m = K+1.
    """
    target, draft = _block_pair(target_probs, draft_probs)
    _, reject, _, reach, _ = _block_pieces(target, draft, _rule(rule))
    return torch.cat([reach[..., :-1] * reject, reach[..., -1:]], -1)


# --------------------------------------------------------------------------- Markov tables


def _markov_tables(prefix: str, init, transition):
    init = _probs64(f"{prefix}_init", init)
    check_shape(f"{prefix}_init", init, (None,))
    V = init.shape[0]
    transition = _probs64(f"{prefix}_transition", transition)
    check_shape(f"{prefix}_transition", transition, (V, V))
    return init, transition


def _check_size(V: int, L: int):
    if V**L > MAX_JOINT_SIZE:
        raise InvalidArgument(
            f"L={L} is too large for V={V}: the joint law would have V**L = {V**L} cells (max {MAX_JOINT_SIZE})"
        )


def markov_chain_law(init, transition, *, L: int) -> torch.Tensor:
    """Joint law of the first L tokens of a first-order Markov chain.

    Parameters
    ----------
    init : Tensor, shape (V,)
        Law of the first token.
    transition : Tensor, shape (V, V)
        ``transition[a, b] = P(x_t = b | x_{t-1} = a)``.
    L : int >= 1

    Returns
    -------
    Tensor, shape (V,) * L, float64
    """
    init, transition = _markov_tables("target", init, transition)
    V = init.shape[0]
    L = check_int("L", L, minimum=1)
    _check_size(V, L)
    law = init  # (V,) * n, flattened as (V**(n-1), V) when extended
    for _ in range(L - 1):
        law = law.reshape(-1, V)[:, :, None] * transition[None]  # (V**(n-1), V, V)
    return law.reshape((V,) * L)


def markov_speculative_law(
    target_init,
    target_transition,
    draft_init,
    draft_transition,
    *,
    K: int,
    L: int,
    rule="canonical",
) -> torch.Tensor:
    """Exact joint law of the first L tokens emitted by speculative decoding on Markov tables.

    The algorithm modelled: from the emitted prefix, draft K tokens autoregressively
    from the drafter (each conditioned on the actual prefix including the previous
    drafts of the block); verify them in order, accepting draft i with ``a(p_i, q_i)``
    where ``p_i, q_i`` are the target's and drafter's conditionals given the token
    before it; at the first rejection emit a residual token and start a new block;
    after K acceptances emit a bonus token (from ``p(. | x_K)`` canonically) and
    start a new block.  Drafts after a rejection are discarded, so they marginalise
    out.  The first token of the sequence uses the ``*_init`` laws.

    Dynamic programming over (emitted prefix, drafts accepted in the current block):
    ``F[j]`` has shape (V,) * n and holds the probability of having emitted that prefix
    with j drafts of the current block accepted so far.

    Parameters
    ----------
    target_init, draft_init : Tensor, shape (V,)
    target_transition, draft_transition : Tensor, shape (V, V)
        ``transition[a, b] = P(next = b | previous = a)``.
    K : int >= 1
        Draft length.
    L : int >= 1
        Number of emitted tokens whose joint law is returned (V ** L <= 2**24).
    rule : str or VerificationRule

    Returns
    -------
    Tensor, shape (V,) * L, float64
        Equal to :func:`markov_chain_law` of the target under the canonical rule.
    """
    p_init, p_trans = _markov_tables("target", target_init, target_transition)
    q_init, q_trans = _markov_tables("draft", draft_init, draft_transition)
    V = p_init.shape[0]
    check_shape("draft_init", q_init, (V,))
    K = check_int("K", K, minimum=1)
    L = check_int("L", L, minimum=1)
    _check_size(V, L)
    rule = _rule(rule)

    # Conditionals per context c: rows 0..V-1 follow token c, row V is the start of the sequence.
    target_ctx = torch.cat([p_trans, p_init[None]], 0)  # (V+1, V)
    draft_ctx = torch.cat([q_trans, q_init[None]], 0)  # (V+1, V)
    accepted_mass, reject, residual = _pieces(target_ctx, draft_ctx, rule)  # (V+1, V), (V+1,), (V+1, V)
    step_reject = reject[:, None] * residual  # (V+1, V): reject the draft here, emit y from the residual
    # Bonus weights given (context of position K, x_K): (V+1, V, V).
    if rule.bonus == "target":
        bonus = target_ctx[:V][None].expand(V + 1, V, V)  # p(. | x_K)
    else:
        bonus = residual[:, None, :].expand(V + 1, V, V)  # residual at position K, ignores x_K

    def extend(law: torch.Tensor, n: int, weights: torch.Tensor) -> torch.Tensor:
        """law (V,)*n times weights[context of the last token] -> (V,)*(n+1), flattened."""
        if n == 0:
            return law * weights[V]  # (V,)
        return (law.reshape(-1, V)[:, :, None] * weights[:V][None]).reshape(-1)  # (V**(n+1),)

    def extend_bonus(law: torch.Tensor, n: int) -> torch.Tensor:
        """Bonus after K accepts: weights depend on the last two tokens (or start, x_K)."""
        if n == 1:
            return (law[:, None] * bonus[V]).reshape(-1)  # (V * V,)
        return (law.reshape(-1, V, V)[..., None] * bonus[:V][None]).reshape(-1)  # (V**(n+1),)

    zero = torch.zeros((), dtype=torch.float64)
    states: list[torch.Tensor | None] = [torch.ones((), dtype=torch.float64)] + [None] * K  # F[j] at n = 0
    for n in range(L):
        new: list[torch.Tensor | None] = [None] * (K + 1)
        for j, law in enumerate(states):
            if law is None:
                continue
            if j < K:
                accepted = extend(law, n, accepted_mass)
                prev = new[j + 1]
                new[j + 1] = accepted if prev is None else prev + accepted
                rejected = extend(law, n, step_reject)
            else:
                rejected = extend_bonus(law, n)
            prev = new[0]
            new[0] = rejected if prev is None else prev + rejected
        states = new
    total = sum((s for s in states if s is not None), zero)
    return total.reshape((V,) * L)


# --------------------------------------------------------------------------- lossy rules


def ensemble_rule(weight: float) -> VerificationRule:
    """HF ``assistant_ensemble_weight = w``: accept with ``min(1, 1 - w + w p/q)``, residual ``(p - q)+``.

    The step law is ``w p + (1 - w) q`` (so ``TV = (1 - w) TV(p, q)``); the bonus comes from p.
    ``w = 1`` is the canonical rule.
    """
    w = float(weight)
    if not 0.0 <= w <= 1.0:
        raise InvalidArgument(f"weight must be in [0, 1], got {weight!r}")

    def accept(target: torch.Tensor, draft: torch.Tensor) -> torch.Tensor:
        # (1 - w) + w p/q without dividing by q = 0 (such tokens are never drafted)
        safe = torch.where(draft > 0, draft, torch.ones_like(draft))
        ratio = torch.where(draft > 0, target / safe, (target > 0).to(target.dtype))
        return ((1.0 - w) + w * ratio).clamp(max=1.0)

    return VerificationRule(f"ensemble_w{w:g}", accept, _canonical_residual)


def typical_threshold(target_probs: torch.Tensor, *, eps: float, delta: float, entropy_offset: float = 0.0):
    """Medusa's typical-acceptance threshold ``min(eps, delta exp(-H(p)))`` per row, shape (...).

    ``H(p) = -sum p log(p + entropy_offset)`` (Medusa's code uses ``entropy_offset = 1e-5``).
    """
    p = target_probs.to(torch.float64)
    logs = torch.log(p + entropy_offset) if entropy_offset > 0 else torch.log(torch.where(p > 0, p, 1.0))
    entropy = -(p * logs).sum(-1)  # (...,)
    return torch.clamp(delta * torch.exp(-entropy), max=float(eps))


def typical_rule(eps: float = 0.09, delta: float = 0.3, *, entropy_offset: float = 0.0) -> VerificationRule:
    """Medusa typical acceptance as a chain rule: accept x iff ``p(x) > min(eps, delta exp(-H(p)))``.

    On rejection the next token is drawn from p truncated to ``p >= threshold``
    (``get_typical_one_token``).  The bonus of Medusa is truncated too, which a
    :class:`VerificationRule` cannot say: use :func:`chain_laws` with a truncated bonus row.
    """
    if not (float(eps) > 0 and float(delta) > 0):
        raise InvalidArgument(f"eps and delta must be > 0, got eps={eps!r}, delta={delta!r}")

    def threshold(target):
        return typical_threshold(target, eps=eps, delta=delta, entropy_offset=entropy_offset)[..., None]

    def accept(target: torch.Tensor, draft: torch.Tensor) -> torch.Tensor:
        return (target > threshold(target)).to(torch.float64)

    def residual(target: torch.Tensor, draft: torch.Tensor) -> torch.Tensor:
        return torch.where(target >= threshold(target), target, torch.zeros_like(target))

    return VerificationRule(f"typical_eps{eps:g}_delta{delta:g}", accept, residual)


def chain_laws(step_laws, continue_probs, bonus_law) -> torch.Tensor:
    """Compose per-position laws of one verifier call from per-step pieces.

    Parameters
    ----------
    step_laws : Tensor, shape (..., K, V)
        Law of the token emitted at draft position i given that position i is reached.
    continue_probs : Tensor, shape (..., K)
        Probability that the draft at position i is accepted (the block continues).
    bonus_law : Tensor, shape (..., V)
        Law of the token after K acceptances.

    Returns
    -------
    Tensor, shape (..., K+1, V), float64
        P(position i is emitted and equals y), as :func:`position_laws`.
    """
    steps = step_laws.to(torch.float64)
    cont = continue_probs.to(torch.float64)
    reach = torch.cat([torch.ones_like(cont[..., :1]), cont], -1).cumprod(-1)  # (..., K+1)
    laws = torch.cat([steps, bonus_law.to(torch.float64)[..., None, :]], -2)  # (..., K+1, V)
    return reach[..., None] * laws


__all__ += ["ensemble_rule", "typical_threshold", "typical_rule", "chain_laws"]
