"""Reference implementations of lossy-by-design verification rules, with their exact laws.

Three speed knobs engines ship, written in the chain verifier protocol
``verify(target_probs (B,K+1,V), draft_probs (B,K,V), draft_tokens (B,K), *, generator)
-> (tokens (B,K+1), num_emitted (B,))``, so that the suite can tell "lossy as documented"
from "lossy and also buggy" (``docs/trees-and-lossy.md``, "Lossy rules"):

* :func:`ensemble_verify` -- HF ``assistant_ensemble_weight = w``: accept x with probability
  ``min(1, 1 - w + w p/q)``, residual ``norm((p - q)+)``, bonus from p.  Per position the
  output law is ``w p + (1 - w) q``, so ``TV = (1 - w) TV(p, q)``.
* :func:`typical_verify` -- Medusa typical acceptance (``medusa.model.utils``): accept x iff
  ``p(x) > min(eps, delta exp(-H(p)))`` (no coin); the next token (after a rejection or
  after K acceptances) is drawn from p truncated to ``p >= threshold``
  (``get_typical_one_token``), so even the first token is lossy.
* :func:`threshold_verify` -- SGLang's ``threshold_acc = t`` / ``threshold_single = s`` in a
  chain (one candidate per level): accept x iff ``p(x) >= s`` or ``u < p(x)/t``; on rejection
  draw from p with x removed; bonus from p.  :func:`threshold_level_law` is the one-level
  law for k distinct candidates: candidates get ``p(x_i)/t`` (when ``S_k <= t``), the rest is
  scaled by ``(1 - S_k/t)/(1 - S_k)``, ``TV = S_k (1/t - 1)``.

* :func:`typical_tree_verify` -- Medusa typical acceptance on a *tree* (tree-verifier protocol):
  the deterministic walk :func:`typical_tree_walk` (deepest node whose path passes the rule,
  ties by likelihood, then the first path) and one draw from the truncated law of its end,
  so the law of a round is known exactly: the adapter's walk is compared with it row by row.

Exact laws: ``*_position_laws`` give P(position i emitted and equals y) for one call
(shape (..., K+1, V)), ``*_declared_law(target, draft)`` the law at one position given it
is reached (``draft=None`` at the bonus position) -- what
:func:`specverify.measure.chain.measure_divergence` checks samples against.  The
factories :func:`ensemble`, :func:`typical`, :func:`threshold` return a verify callable
carrying its ``declared_law`` (for ``specverify measure --verifier reference.lossy:ensemble
--verifier-option weight=0.5``).

Shapes: B batch, K draft length, V vocabulary, k candidates.
"""

from __future__ import annotations

import functools

import torch

from specverify.core.chain_laws import (
    acceptance_probability,
    chain_laws,
    ensemble_rule,
    one_step_law,
    typical_rule,
    typical_threshold,
)
from specverify.core.errors import InvalidArgument
from specverify.core.sampling import sample, uniform
from specverify.core.validation import check_generator
from specverify_reference.rules import check_verifier_inputs

__all__ = [
    "ensemble_verify",
    "typical_verify",
    "threshold_verify",
    "ensemble",
    "typical",
    "threshold",
    "ensemble_declared_law",
    "typical_declared_law",
    "threshold_declared_law",
    "ensemble_position_laws",
    "typical_position_laws",
    "threshold_position_laws",
    "threshold_level_law",
    "threshold_level_sample",
    "typical_truncate",
    "typical_tree_walk",
    "typical_tree_verify",
]


def _check_weight(weight) -> float:
    w = float(weight)
    if not 0.0 <= w <= 1.0:
        raise InvalidArgument(f"weight must be in [0, 1], got {weight!r}")
    return w


def _check_thresholds(threshold_acc, threshold_single) -> tuple[float, float]:
    t, s = float(threshold_acc), float(threshold_single)
    if not 0.0 < t <= 1.0:
        raise InvalidArgument(f"threshold_acc must be in (0, 1], got {threshold_acc!r}")
    if not 0.0 < s <= 1.0:
        raise InvalidArgument(f"threshold_single must be in (0, 1], got {threshold_single!r}")
    return t, s


def _prepare(target_probs, draft_probs, draft_tokens, generator):
    check_verifier_inputs(target_probs, draft_probs, draft_tokens)
    check_generator("generator", generator)
    p, q = target_probs, draft_probs  # (B, K+1, V), (B, K, V) in their own dtype; rows go to float64 when used
    x = draft_tokens.long()  # (B, K)
    p_x = p[:, :-1].gather(-1, x[..., None]).squeeze(-1).double()  # (B, K)
    q_x = q.gather(-1, x[..., None]).squeeze(-1).double()  # (B, K)
    return p, q, x, p_x, q_x


def _emit(x, accepted, last_rows, generator):
    """Accepted prefix, then one token drawn from ``last_rows(num_accepted)`` (B, V) weights."""
    B, K = x.shape
    num_accepted = accepted.long().cumprod(-1).sum(-1)  # (B,)
    weights = last_rows(num_accepted)  # (B, V) non-negative float64
    last = sample(weights, generator=generator)  # (B,)
    tokens = torch.cat([x, torch.zeros_like(x[:, :1])], 1)  # (B, K+1)
    tokens = torch.where(torch.arange(K + 1, device=x.device)[None] < num_accepted[:, None], tokens, 0)
    tokens.scatter_(1, num_accepted[:, None], last[:, None])
    return tokens, num_accepted + 1


def _rows(t: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """``t[b, index[b]]`` for t (B, R, V): (B, V) float64."""
    return t[torch.arange(t.shape[0], device=t.device), index].double()


def _fallback(weights: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Rows of mass 0 fall back to the target row (as ``reference.rules.verify``)."""
    return torch.where(weights.sum(-1, keepdim=True) > 0, weights, target)


# --------------------------------------------------------------------------- verifiers


def ensemble_verify(target_probs, draft_probs, draft_tokens, *, generator: torch.Generator, weight: float = 0.5):
    """HF ensemble rule: accept iff ``u q(x) < (1 - w) q(x) + w p(x)``; residual ``(p - q)+``; bonus p."""
    w = _check_weight(weight)
    p, q, x, p_x, q_x = _prepare(target_probs, draft_probs, draft_tokens, generator)
    B, K = x.shape
    u = uniform((B, K), generator=generator, device=p.device)  # (B, K)
    accepted = u * q_x < (1.0 - w) * q_x + w * p_x  # (B, K)

    def last_rows(j):
        target = _rows(p, j)  # (B, V)
        residual = (target - _rows(q, j.clamp(max=K - 1))).clamp_min(0.0)  # (B, V)
        return torch.where((j < K)[:, None], _fallback(residual, target), target)

    return _emit(x, accepted, last_rows, generator)


def typical_truncate(target_probs, *, eps: float = 0.09, delta: float = 0.3, entropy_offset: float = 0.0):
    """p restricted to ``p >= min(eps, delta exp(-H(p)))`` (unnormalised), shape of the input, float64."""
    p = target_probs.to(torch.float64)
    thr = typical_threshold(p, eps=eps, delta=delta, entropy_offset=entropy_offset)[..., None]
    return torch.where(p >= thr, p, torch.zeros_like(p))


def typical_verify(
    target_probs,
    draft_probs,
    draft_tokens,
    *,
    generator: torch.Generator,
    eps: float = 0.09,
    delta: float = 0.3,
    entropy_offset: float = 0.0,
):
    """Medusa typical acceptance on a chain: accept iff ``p(x) > min(eps, delta exp(-H(p)))``.

    The token after the accepted prefix is drawn from the truncated p of its row
    (bonus included).  ``entropy_offset=1e-5`` reproduces Medusa's ``log(p + 1e-5)``.
    """
    p, _, x, p_x, _ = _prepare(target_probs, draft_probs, draft_tokens, generator)
    p = p.double()  # (B, K+1, V) every row's entropy is needed
    thr = typical_threshold(p, eps=eps, delta=delta, entropy_offset=entropy_offset)  # (B, K+1)
    accepted = p_x > thr[:, :-1]  # (B, K)
    trunc = typical_truncate(p, eps=eps, delta=delta, entropy_offset=entropy_offset)  # (B, K+1, V)
    return _emit(x, accepted, lambda j: _rows(trunc, j), generator)


def threshold_verify(
    target_probs,
    draft_probs,
    draft_tokens,
    *,
    generator: torch.Generator,
    threshold_acc: float = 1.0,
    threshold_single: float = 1.0,
):
    """SGLang thresholds on a chain: accept iff ``p(x) >= s`` or ``u < p(x)/t``; reject -> p without x."""
    t, s = _check_thresholds(threshold_acc, threshold_single)
    p, _, x, p_x, _ = _prepare(target_probs, draft_probs, draft_tokens, generator)
    B, K = x.shape
    u = uniform((B, K), generator=generator, device=p.device)  # (B, K)
    accepted = (p_x >= s) | (u * t < p_x)  # (B, K)

    def last_rows(j):
        target = _rows(p, j)  # (B, V)
        removed = target.scatter(-1, x.gather(1, j.clamp(max=K - 1)[:, None]), 0.0)  # (B, V) p without x_j
        return torch.where((j < K)[:, None], _fallback(removed, target), target)

    return _emit(x, accepted, last_rows, generator)


def _factory(fn, declared, **options):
    verify = functools.partial(fn, **options)
    verify.declared_law = functools.partial(declared, **options)
    verify.__name__ = f"{fn.__name__}({', '.join(f'{k}={v}' for k, v in options.items())})"
    return verify


def ensemble(weight: float = 0.5):
    """Factory: :func:`ensemble_verify` at ``weight``, with ``.declared_law``."""
    return _factory(ensemble_verify, ensemble_declared_law, weight=_check_weight(weight))


def typical(eps: float = 0.09, delta: float = 0.3, entropy_offset: float = 0.0):
    """Factory: :func:`typical_verify`, with ``.declared_law``."""
    return _factory(typical_verify, typical_declared_law, eps=eps, delta=delta, entropy_offset=entropy_offset)


def threshold(threshold_acc: float = 1.0, threshold_single: float = 1.0):
    """Factory: :func:`threshold_verify`, with ``.declared_law``."""
    t, s = _check_thresholds(threshold_acc, threshold_single)
    return _factory(threshold_verify, threshold_declared_law, threshold_acc=t, threshold_single=s)


# --------------------------------------------------------------------------- exact laws


def _norm(v: torch.Tensor) -> torch.Tensor:
    return v / v.sum(-1, keepdim=True)


def ensemble_declared_law(target_probs, draft_probs=None, *, weight: float = 0.5) -> torch.Tensor:
    """``w p + (1 - w) q`` at a draft position, p at the bonus position (``draft_probs=None``); (..., V)."""
    w = _check_weight(weight)
    p = _norm(target_probs.to(torch.float64))
    if draft_probs is None:
        return p
    return one_step_law(p, _norm(draft_probs.to(torch.float64)), rule=ensemble_rule(w))


def ensemble_position_laws(target_probs, draft_probs, *, weight: float = 0.5) -> torch.Tensor:
    """Per in-block position law of one :func:`ensemble_verify` call; (..., K+1, V)."""
    from specverify.core.chain_laws import position_laws

    return position_laws(target_probs, draft_probs, rule=ensemble_rule(_check_weight(weight)))


def _typical_pieces(target, draft, eps, delta, entropy_offset):
    rule = typical_rule(eps, delta, entropy_offset=entropy_offset)
    return one_step_law(target, draft, rule=rule), acceptance_probability(target, draft, rule=rule)


def typical_declared_law(
    target_probs, draft_probs=None, *, eps: float = 0.09, delta: float = 0.3, entropy_offset: float = 0.0
) -> torch.Tensor:
    """Law of one Medusa-typical position: ``q 1[p > thr] + P_q(p <= thr) trunc(p)``; trunc(p) at the bonus."""
    p = _norm(target_probs.to(torch.float64))
    if draft_probs is None:
        return _norm(typical_truncate(p, eps=eps, delta=delta, entropy_offset=entropy_offset))
    return _typical_pieces(p, _norm(draft_probs.to(torch.float64)), eps, delta, entropy_offset)[0]


def typical_position_laws(
    target_probs, draft_probs, *, eps: float = 0.09, delta: float = 0.3, entropy_offset: float = 0.0
) -> torch.Tensor:
    """Per in-block position law of one :func:`typical_verify` call (truncated bonus); (..., K+1, V)."""
    p = _norm(target_probs.to(torch.float64))  # (..., K+1, V)
    q = _norm(draft_probs.to(torch.float64))  # (..., K, V)
    steps, cont = _typical_pieces(p[..., :-1, :], q, eps, delta, entropy_offset)  # (..., K, V), (..., K)
    bonus = _norm(typical_truncate(p[..., -1, :], eps=eps, delta=delta, entropy_offset=entropy_offset))
    return chain_laws(steps, cont, bonus)


def _threshold_accept(p, t, s):
    return torch.maximum((p / t).clamp(max=1.0), (p >= s).to(p.dtype))  # (..., V) P(accept | x)


def _threshold_pieces(p, q, t, s):
    """Step law ``q F + p (C - c)`` with ``c(x) = q(x)(1 - F(x))/(1 - p(x))``, and ``sum q F``."""
    accept = _threshold_accept(p, t, s)  # (..., V)
    rest = 1.0 - p  # (..., V)
    c = torch.where(rest > 0, q * (1.0 - accept) / torch.where(rest > 0, rest, 1.0), torch.zeros_like(p))
    step = q * accept + p * (c.sum(-1, keepdim=True) - c)  # (..., V)
    return step, (q * accept).sum(-1)


def threshold_declared_law(
    target_probs, draft_probs=None, *, threshold_acc: float = 1.0, threshold_single: float = 1.0
) -> torch.Tensor:
    """Law of one :func:`threshold_verify` position given it is reached (p at the bonus); (..., V)."""
    t, s = _check_thresholds(threshold_acc, threshold_single)
    p = _norm(target_probs.to(torch.float64))
    if draft_probs is None:
        return p
    return _threshold_pieces(p, _norm(draft_probs.to(torch.float64)), t, s)[0]


def threshold_position_laws(
    target_probs, draft_probs, *, threshold_acc: float = 1.0, threshold_single: float = 1.0
) -> torch.Tensor:
    """Per in-block position law of one :func:`threshold_verify` call; (..., K+1, V)."""
    t, s = _check_thresholds(threshold_acc, threshold_single)
    p = _norm(target_probs.to(torch.float64))  # (..., K+1, V)
    q = _norm(draft_probs.to(torch.float64))  # (..., K, V)
    steps, cont = _threshold_pieces(p[..., :-1, :], q, t, s)
    return chain_laws(steps, cont, p[..., -1, :])


def threshold_level_law(
    target_probs, candidates, *, threshold_acc: float = 1.0, threshold_single: float = 1.0
) -> torch.Tensor:
    """Exact law of the token SGLang's target-only tree kernel emits at one level; (..., V).

    One coin u; ``S_i = sum_{j <= i} p(x_j)``; the first candidate with ``u < S_i / t`` or
    ``p(x_i) >= s`` is emitted; if none, a draw from p with every candidate removed (p if
    that is empty).  ``P(first success <= i) = F_i = max(min(S_i/t, 1), 1[some j <= i has
    p(x_j) >= s])``.

    Parameters
    ----------
    target_probs : Tensor (..., V)
    candidates : Tensor (..., k) long
        The children's tokens, in verification order (duplicates count twice in S, as
        the kernel's running sum does).
    """
    t, s = _check_thresholds(threshold_acc, threshold_single)
    p = _norm(target_probs.to(torch.float64))  # (..., V)
    cand = candidates.long()  # (..., k)
    p_c = p.gather(-1, cand)  # (..., k)
    single = (p_c >= s).to(torch.float64).cummax(-1).values  # (..., k)
    F = torch.maximum((p_c.cumsum(-1) / t).clamp(max=1.0), single)  # (..., k)
    first = torch.diff(F, dim=-1, prepend=torch.zeros_like(F[..., :1]))  # (..., k) P(emit x_i)
    law = torch.zeros_like(p).scatter_add(-1, cand, first)  # (..., V)
    rest = _fallback(p.scatter(-1, cand, 0.0), p)  # (..., V)
    return law + (1.0 - F[..., -1:]) * _norm(rest)


def threshold_level_sample(
    target_probs, candidates, *, generator: torch.Generator, threshold_acc: float = 1.0, threshold_single: float = 1.0
) -> torch.Tensor:
    """Draw the token :func:`threshold_level_law` describes, one per row (the kernel's loop); (B,)."""
    t, s = _check_thresholds(threshold_acc, threshold_single)
    check_generator("generator", generator)
    p = target_probs.to(torch.float64)  # (B, V)
    cand = candidates.long()  # (B, k)
    u = uniform((p.shape[0], 1), generator=generator, device=p.device)  # (B, 1)
    p_c = p.gather(-1, cand)  # (B, k)
    hit = (u * t < p_c.cumsum(-1)) | (p_c >= s)  # (B, k)
    any_hit = hit.any(-1)  # (B,)
    chosen = cand.gather(1, hit.long().argmax(-1, keepdim=True)).squeeze(1)  # (B,)
    rest = sample(_fallback(p.scatter(-1, cand, 0.0), p), generator=generator)  # (B,)
    return torch.where(any_hit, chosen, rest)


# --------------------------------------------------------------------------- Medusa typical acceptance on a tree


def _same_inputs(rows, tokens, parents, paths) -> bool:
    """Whether the paths (node lists of one length) read equal values from bitwise-equal parent rows at every depth.

    Then any implementation that derives a token's probability from its parent's row alone
    (e.g. a softmax of that row) computes equal likelihoods for them.
    """
    first = paths[0]
    for other in paths[1:]:
        for a, c in zip(first, other):
            row_a, row_c = rows[int(parents[a]) + 1], rows[int(parents[c]) + 1]
            if not torch.equal(row_a, row_c) or float(row_a[int(tokens[a])]) != float(row_c[int(tokens[c])]):
                return False
    return True


def typical_tree_walk(target_probs, tokens, parents, *, eps: float = 0.09, delta: float = 0.3,
                      entropy_offset: float = 0.0, tolerance: float = 1e-5):  # fmt: skip
    """Medusa's tree walk (typical acceptance, longest accepted path, ties by likelihood), deterministic.

    Node n (slot n+1, parent slot ``parents[n] + 1``, 0 for the root) is *acceptable* iff
    ``p_parent(x_n) > min(eps, delta exp(-H(p_parent)))``; a node is *reached* iff it and all
    its ancestors are acceptable.  The walk ends at the reached node of largest depth, ties
    broken by the largest ``sum log p`` of its path's tokens, then by the lexicographically
    smallest path of node indices (the first path row of ``retrieve_indices``); the root
    (depth 0) when no child of the root is acceptable.  Padding nodes (``parents = -2``) are
    never reached.

    Parameters
    ----------
    target_probs : Tensor, shape (B, N+1, V)
    tokens, parents : Tensor, shape (B, N), integer
        The tree-verifier protocol's nodes (:mod:`specverify.protocols.tree`).
    eps, delta, entropy_offset : float
        The rule (``entropy_offset=1e-5`` is Medusa's ``log(p + 1e-5)``).
    tolerance : float
        Relative margin below which a decision (a threshold comparison, or the likelihood
        comparison that picks the end node) is flagged as ambiguous: an implementation in
        float32 may decide it either way.  A likelihood tie between deepest nodes within the
        margin is ambiguous too, and so is an exact float64 tie unless the tied paths'
        likelihoods come from identical inputs (equal values in bitwise-equal parent rows at
        every depth): an implementation that recomputes them in its own precision (Medusa:
        softmax of logits in float32) may break such a tie either way.

    Returns
    -------
    path : Tensor (B, D) long
        The reached path's nodes, -1 padded (D = the batch's maximum depth).
    depth : Tensor (B,) long
        Accepted depth (the number of emitted draft tokens).
    slot : Tensor (B,) long
        The slot whose law gives the next token (0 = root, n+1 = node n).
    ambiguous : Tensor (B,) bool
        Rows with a decision within ``tolerance`` of its boundary, or a likelihood tie that
        an implementation could break either way.
    """
    p = target_probs.to(torch.float64)  # (B, N+1, V)
    tokens, parents = tokens.long(), parents.long()
    B, N = tokens.shape
    thr = typical_threshold(p, eps=eps, delta=delta, entropy_offset=entropy_offset)  # (B, N+1)
    slot = (parents + 1).clamp(min=0)  # (B, N) parent slot; padding nodes read slot 0 and are masked
    p_x = p[torch.arange(B)[:, None], slot, tokens.clamp(min=0)]  # (B, N)
    thr_x = thr.gather(1, slot)  # (B, N)
    real = parents >= -1  # (B, N)
    ok = real & (p_x > thr_x)  # (B, N)
    close = real & ((p_x - thr_x).abs() <= tolerance * thr_x)  # (B, N)
    reached = torch.zeros(B, N, dtype=torch.bool)
    depth = torch.zeros(B, N, dtype=torch.long)
    loglik = torch.zeros(B, N, dtype=torch.float64)
    for n in range(N):
        par = parents[:, n].clamp(min=0)  # (B,)
        root = parents[:, n] == -1
        reached[:, n] = ok[:, n] & (root | reached[torch.arange(B), par])
        depth[:, n] = torch.where(root, 1, depth[torch.arange(B), par] + 1)
        above = torch.where(root, 0.0, loglik[torch.arange(B), par])
        loglik[:, n] = above + torch.log(p_x[:, n].clamp(min=1e-300))
    D = int(torch.where(real, depth, 0).max()) if N else 0
    out_path = torch.full((B, D), -1, dtype=torch.long)
    out_depth = torch.zeros(B, dtype=torch.long)
    out_slot = torch.zeros(B, dtype=torch.long)
    ambiguous = close.any(-1)  # (B,)
    for b in torch.nonzero(reached.any(-1)).flatten().tolist():
        nodes = torch.nonzero(reached[b]).flatten().tolist()
        deepest = max(int(depth[b, n]) for n in nodes)
        nodes = [n for n in nodes if int(depth[b, n]) == deepest]
        best_ll = max(float(loglik[b, n]) for n in nodes)
        near = [n for n in nodes if abs(float(loglik[b, n]) - best_ll) <= tolerance * max(1.0, abs(best_ll))]
        paths = {n: _root_path(parents[b], n) for n in near}
        if len(near) > 1:
            exact = [n for n in near if float(loglik[b, n]) == best_ll]
            same = _same_inputs(p[b], tokens[b], parents[b], [paths[n] for n in exact])
            ambiguous[b] |= len(exact) != len(near) or not same
            near = exact
        end = min(near, key=lambda n: paths[n])
        out_path[b, :deepest] = torch.tensor(paths[end])
        out_depth[b], out_slot[b] = deepest, end + 1
    return out_path, out_depth, out_slot, ambiguous


def _root_path(parents_row: torch.Tensor, node: int) -> list[int]:
    path = []
    while node >= 0:
        path.append(node)
        node = int(parents_row[node])
    return path[::-1]


def typical_tree_verify(target_probs, draft_probs, tokens, parents, *, mode: str, generator: torch.Generator,
                        eps: float = 0.09, delta: float = 0.3, entropy_offset: float = 0.0,
                        next_token: str = "typical", walk=None):  # fmt: skip
    """Medusa typical acceptance on a tree, in the tree-verifier protocol (reads no draft law; any mode).

    The walk is :func:`typical_tree_walk`; the token after it is drawn from the truncated law
    of its end slot (:func:`typical_truncate`, one uniform per row) or, with
    ``next_token="greedy"``, is that law's argmax.  Exact law of a round: the walk's tokens
    with probability 1, then the truncated (or greedy) law of the end slot.

    ``walk``, optional: what :func:`typical_tree_walk` returned for these inputs and the same
    ``eps``, ``delta``, ``entropy_offset`` (CPU tensors), for a caller that also needs its
    ``ambiguous`` flags; computed here when not given.

    Returns
    -------
    emitted : Tensor (B, D+1) long
    num_emitted : Tensor (B,) long
    path : Tensor (B, D) long
    """
    check_generator("generator", generator)
    if next_token not in ("typical", "greedy"):
        raise InvalidArgument(f"next_token must be 'typical' or 'greedy', got {next_token!r}")
    device = target_probs.device
    p, tokens = target_probs.cpu(), tokens.cpu().long()
    if walk is None:
        walk = typical_tree_walk(p, tokens, parents.cpu(), eps=eps, delta=delta, entropy_offset=entropy_offset)
    path, depth, slot, _ = walk
    B, D = path.shape
    rows = p[torch.arange(B), slot].to(torch.float64)  # (B, V)
    if next_token == "greedy":
        final = rows.argmax(-1)  # (B,)
    else:
        final = sample(typical_truncate(rows, eps=eps, delta=delta, entropy_offset=entropy_offset), generator=generator)
    emitted = torch.zeros(B, D + 1, dtype=torch.long)
    emitted[:, :D] = torch.where(path >= 0, tokens.gather(1, path.clamp(min=0)), 0)
    emitted.scatter_(1, depth[:, None], final[:, None])
    return emitted.to(device), (depth + 1).to(device), path.to(device)
