"""Exact output laws of tree verification, in float64, by dynamic programming over the tree.

The laws model the walk step by step -- at each reached node, siblings verified in order
by a pluggable :class:`~specverify.verifier.tree.sibling_rules.SiblingRule`, descend into the
accepted child, else emit the final token -- so that equality with the target is a real
check of the losslessness theorems (Miao et al. 2023; Jeon et al. 2024, arXiv 2402.14160;
SafeAILab/EAGLE #171) and a wrong rule gives a measurably different law.

* :func:`conditional_round_law` -- for a FIXED tree of tokens (a validated tree batch), the
  joint law of (node where the walk stops, final token), the probability of reaching each
  node and the law of the next emitted token there.  For the topk and target-only rules
  this already equals the target row at every reached node; for iid / wor it does not:
  those rules are lossless only on average over the drafting of the siblings.
* :func:`node_law` -- at one node with rows p, q and k children drawn by ``drafting``
  ("iid", "wor" or "topk" = the k most likely tokens of q, ties to the lower id),
  ``P(child i has token x and is accepted)`` and ``P(all rejected, final y)``, averaged over
  the draws by exact enumeration (identical verifier states are merged, so the canonical
  i.i.d. rule, whose residual does not depend on the rejected token, costs V per child).
* :func:`round_law` -- the same on a tree *shape* over table models
  (:mod:`specverify.core.tables`): children of every expanded node drawn from the drafter's
  row at that node's context; one entry per (node, path tokens) *visit*.
* :func:`multi_round_law` -- the joint law of the first L tokens when rounds with a fixed
  shape are repeated; :func:`sequence_law` -- the target's own joint law.

Size limits (InvalidArgument beyond): :data:`MAX_NODE_STATES` enumerated draws at one node
(about V ** k for wor drafting and for rules that remember the rejected tokens),
:data:`MAX_VISITS` visits per round law, ``V ** L <=`` :data:`MAX_SEQUENCE_CELLS`.

Shapes: B batch, N nodes, V vocabulary, D maximum depth, M visits, k children of a node.
"""

from __future__ import annotations

from collections import defaultdict

import torch

from specverify.core.errors import InvalidArgument
from specverify.core.tables import TableModel
from specverify.core.validation import check_int, check_probs
from specverify.protocols.tree import PAD, check_parents, check_tree_inputs, children_table, node_depths
from specverify.verifier.tree.sibling_rules import sibling_rule
from specverify.verifier.tree.treelaw import TreeLaw

__all__ = [
    "TreeLaw",
    "conditional_round_law",
    "node_law",
    "round_law",
    "multi_round_law",
    "sequence_law",
    "DRAFTINGS",
    "MAX_NODE_STATES",
    "MAX_VISITS",
    "MAX_SEQUENCE_CELLS",
]

#: How the children of a node can be drawn in :func:`node_law` / :func:`round_law`.
DRAFTINGS = ("iid", "wor", "topk")
#: Largest number of (verifier state, drawn token) pairs enumerated at one node.
MAX_NODE_STATES = 1 << 16
#: Largest number of (node, path tokens) visits of one round law.
MAX_VISITS = 1 << 16
#: Largest joint law V ** L of :func:`multi_round_law` / :func:`sequence_law`.
MAX_SEQUENCE_CELLS = 1 << 16


def _normalise_or(weights: torch.Tensor, fallback: torch.Tensor) -> torch.Tensor:
    total = weights.sum(-1, keepdim=True)
    return torch.where(total > 0, weights / torch.where(total > 0, total, 1.0), fallback)


def _probs64(name: str, probs) -> torch.Tensor:
    probs = torch.as_tensor(probs)
    check_probs(name, probs)
    probs = probs.to(device="cpu", dtype=torch.float64)
    return probs / probs.sum(-1, keepdim=True)


# --------------------------------------------------------------------------- fixed trees


def conditional_round_law(target_probs, draft_probs, tokens, parents, *, mode: str, rule=None) -> TreeLaw:
    """Exact law of one tree walk for FIXED node tokens, per row (batched).

    Parameters
    ----------
    target_probs : Tensor, shape (B, N+1, V)
    draft_probs : Tensor, shape (B, N+1, V) or None (modes "topk", "any")
    tokens, parents : Tensor, shape (B, N), integer
        As in the tree-verifier protocol (:mod:`specverify.protocols.tree`).
    mode : {"iid", "wor", "topk", "any"}
        Selects the lossless rule of that mode unless ``rule`` is given.
    rule : str or SiblingRule, optional
        The sibling rule to model (e.g. a deliberately wrong one).

    Returns
    -------
    TreeLaw
        With leading dimension B and M = N+1 slots; ``stop`` is the joint law of (path end
        node, final token).  Padding slots have reach 0.
    """
    B, N, V = check_tree_inputs(target_probs, draft_probs, tokens, parents, mode)
    rule = sibling_rule(rule, mode)
    p_all = _probs64("target_probs", target_probs)  # (B, N+1, V)
    q_all = p_all if draft_probs is None else _probs64("draft_probs", draft_probs)  # (B, N+1, V)
    parents = parents.long().cpu()
    tokens = torch.where(parents == PAD, 0, tokens.long().cpu())  # (B, N)
    children = children_table(parents)  # (B, N+1, S)
    S = children.shape[-1]
    rows = torch.arange(B)
    reach = torch.zeros(B, N + 1, dtype=torch.float64)  # (B, N+1)
    reach[:, 0] = 1.0
    stop = torch.zeros(B, N + 1, V, dtype=torch.float64)  # (B, N+1, V)
    next_law = torch.zeros(B, N + 1, V, dtype=torch.float64)  # (B, N+1, V)
    for m in range(N + 1):  # slots in topological order: a parent's reach is final before its children
        p, q = p_all[:, m], q_all[:, m]  # (B, V)
        r, qv = p.clone(), q.clone()
        live = torch.ones(B, dtype=torch.float64)  # (B,) P(every earlier sibling rejected | reach m)
        kids = children[:, m]  # (B, S)
        kid_tokens = tokens.gather(1, kids.clamp(min=0)) if S else kids  # (B, S)
        for s in range(S):
            child, x = kids[:, s], kid_tokens[:, s]  # (B,)
            used = child >= 0
            if rule.skip_duplicates:
                used &= ~((kid_tokens[:, :s] == x[:, None]) & (kids[:, :s] >= 0)).any(-1)
            a = torch.where(used, rule.accept(p, r, qv, x).clamp(0.0, 1.0), 0.0)  # (B,)
            go = live * a  # (B,) P(descend into this child | reach m)
            hit = used.nonzero().squeeze(-1)
            reach[hit, child[hit] + 1] = reach[hit, m] * go[hit]
            next_law[rows, m, x] += torch.where(used, reach[:, m] * go, 0.0)
            r = torch.where(used[:, None], rule.reject(p, r, qv, x), r)
            qv = torch.where(used[:, None], rule.update_view(qv, x), qv)
            live = live * (1.0 - a)
        final = _normalise_or(rule.final(p, r, qv), p)  # (B, V)
        stop[:, m] = (reach[:, m] * live)[:, None] * final
        next_law[:, m] += stop[:, m]
    depth = torch.cat([torch.zeros(B, 1, dtype=torch.long), node_depths(parents)], 1)  # (B, N+1)
    D = int(depth.max())
    prefix = _slot_prefixes(parents, tokens, D)  # (B, N+1, D)
    slot = torch.arange(N + 1).expand(B, N + 1)
    return TreeLaw(reach, stop, next_law, p_all, depth, prefix, slot)


def _slot_prefixes(parents: torch.Tensor, tokens: torch.Tensor, D: int) -> torch.Tensor:
    """Path tokens of every slot, (B, N+1, D), -1 padded (padding slots all -1)."""
    B, N = parents.shape
    prefix = torch.full((B, N + 1, D), -1, dtype=torch.long)
    depth = node_depths(parents)
    for n in range(N):
        par = parents[:, n]
        real = (par != PAD).nonzero().squeeze(-1)
        if real.numel():
            prefix[real, n + 1] = prefix[real, par[real] + 1]
            prefix[real, n + 1, depth[real, n] - 1] = tokens[real, n]
    return prefix


# --------------------------------------------------------------------------- averaged over drafts


def _check_drafting(drafting) -> str:
    if drafting not in DRAFTINGS:
        raise InvalidArgument(f"drafting must be one of {DRAFTINGS}, got {drafting!r}")
    return drafting


def node_law(target_row, draft_row, num_children: int, *, drafting: str, rule=None):
    """Law at one node averaged over the drafting of its children.

    Parameters
    ----------
    target_row, draft_row : Tensor, shape (V,)
        The target's and the drafter's law at the node.
    num_children : int >= 0
        k, the number of children the tree shape gives the node.
    drafting : {"iid", "wor", "topk"}
        i.i.d. from q; without replacement (a sibling whose q mass is exhausted is absent);
        the k most likely tokens of q (ties to the lower id; fewer if k > V).
    rule : str or SiblingRule, optional
        Default: the lossless rule of ``drafting`` (SpecInfer, RRSw, top-k).

    Returns
    -------
    accept : Tensor, shape (k, V), float64
        ``accept[i, x]`` = P(child i is drawn as x and accepted).
    final : Tensor, shape (V,), float64
        P(every child rejected and the final token is y).
    """
    p = _probs64("target_row", target_row)
    q = _probs64("draft_row", draft_row)
    if p.ndim != 1 or q.shape != p.shape:
        raise InvalidArgument(f"target_row and draft_row must be (V,) rows, got {tuple(p.shape)} and {tuple(q.shape)}")
    k = check_int("num_children", num_children, minimum=0)
    drafting = _check_drafting(drafting)
    rule = sibling_rule(rule, drafting)
    V = p.shape[0]
    accept = torch.zeros(k, V, dtype=torch.float64)
    track_drawn = rule.skip_duplicates and drafting == "iid"  # duplicates are impossible otherwise
    w = torch.ones(1, dtype=torch.float64)  # (S,) P(reach this sibling in this state)
    r, qv, qt = p[None].clone(), q[None].clone(), q[None].clone()  # (S, V): rule's r, rule's q, drafting's q
    drawn = torch.zeros(1, V, dtype=torch.float64)  # (S, V) tokens drawn so far (when tracked)
    order = torch.sort(q, descending=True, stable=True).indices  # topk drafting: children in this order
    for i in range(k):
        if drafting == "topk":
            if i >= V:
                break
            idx = torch.arange(w.shape[0])
            x = torch.full_like(idx, int(order[i]))
            wx = w
            carried = torch.zeros(0, dtype=torch.long)
        else:
            if w.shape[0] * V > MAX_NODE_STATES:
                raise InvalidArgument(
                    f"node_law: {w.shape[0]} verifier states x V={V} draws at sibling {i + 1} of num_children={k} "
                    f"exceed MAX_NODE_STATES={MAX_NODE_STATES}; use a smaller V or fewer children"
                )
            weights = w[:, None] * qt  # (S, V)
            idx, x = (weights > 0).nonzero(as_tuple=True)  # (S',)
            wx = weights[idx, x]
            carried = (qt.sum(-1) <= 0).nonzero().squeeze(-1)  # exhausted (wor): the sibling is absent
        dup = drawn[idx, x] > 0 if track_drawn else torch.zeros_like(x, dtype=torch.bool)  # (S',)
        rr, qq, pp = r[idx], qv[idx], p.expand(idx.shape[0], V)  # (S', V)
        a = torch.where(dup, 0.0, rule.accept(pp, rr, qq, x).clamp(0.0, 1.0))  # (S',)
        accept[i].index_add_(0, x, wx * a)
        keep = ~dup[:, None]
        new_r = torch.where(keep, rule.reject(pp, rr, qq, x), rr)
        new_qv = torch.where(keep, rule.update_view(qq, x), qq)
        new_qt = qt[idx]
        if drafting == "wor":
            new_qt = _normalise_or(new_qt.scatter(-1, x[:, None], 0.0), new_qt * 0.0)
        new_drawn = drawn[idx].scatter(-1, x[:, None], 1.0) if track_drawn else drawn[idx]
        state = torch.cat(
            [
                torch.cat([new_r, new_qv, new_qt, new_drawn], -1),
                torch.cat([r[carried], qv[carried], qt[carried], drawn[carried]], -1),
            ]
        )  # (S'', 4V)
        weight = torch.cat([wx * (1.0 - a), w[carried]])  # (S'',)
        state, inverse = torch.unique(state, dim=0, return_inverse=True)  # merge identical verifier states
        w = torch.zeros(state.shape[0], dtype=torch.float64).index_add_(0, inverse, weight)
        alive = w > 0
        w, state = w[alive], state[alive]
        r, qv, qt, drawn = state[:, :V], state[:, V : 2 * V], state[:, 2 * V : 3 * V], state[:, 3 * V :]
    pp = p.expand_as(r)  # (S, V)
    final = (w[:, None] * _normalise_or(rule.final(pp, r, qv), pp)).sum(0)  # (V,)
    return accept, final


def _check_models(target, drafter):
    for name, model in (("target", target), ("drafter", drafter)):
        if not isinstance(model, TableModel):
            raise InvalidArgument(f"{name} must be a specverify.core.tables.TableModel, got {type(model).__name__}")
    if target.vocab_size != drafter.vocab_size:
        raise InvalidArgument(f"target and drafter vocabularies differ: V={target.vocab_size} vs {drafter.vocab_size}")


def _shape(parents) -> torch.Tensor:
    parents = torch.as_tensor(parents)
    if parents.ndim != 1:
        raise InvalidArgument(f"parents must be a tree shape of shape (N,), got {tuple(parents.shape)}")
    return check_parents(parents[None]).long()[0]


def round_law(
    parents,
    target: TableModel,
    drafter: TableModel,
    *,
    mode: str,
    rule=None,
    drafting: str | None = None,
    target_context: int | None = None,
    draft_context: int | None = None,
) -> TreeLaw:
    """Exact law of one tree round over table models, averaged over the drafting of the tokens.

    Every expanded node's children (as many as the shape gives it) are drawn by ``drafting``
    from the drafter's row at the node's context; the walk verifies them with ``rule``.

    Parameters
    ----------
    parents : Tensor, shape (N,)
        The tree shape (parent node per node; -1 root, -2 padding).
    target, drafter : TableModel
        Table models over one vocabulary (:mod:`specverify.core.tables`).
    mode : {"iid", "wor", "topk", "any"}
        Chooses the lossless rule and, unless given, the drafting (``"any"`` drafts i.i.d.).
    rule : str or SiblingRule, optional
        The sibling rule to model instead of the mode's (e.g. a deliberately wrong one).
    drafting : {"iid", "wor", "topk"}, optional
    target_context, draft_context : int, optional
        Contexts the round starts from (default: the models' initial contexts).

    Returns
    -------
    TreeLaw
        One entry per visit (node, path tokens) with positive reach, in breadth-first order.
    """
    parents = _shape(parents)
    _check_models(target, drafter)
    if mode not in ("iid", "wor", "topk", "any"):
        raise InvalidArgument(f"mode must be one of ('iid', 'wor', 'topk', 'any'), got {mode!r}")
    rule = sibling_rule(rule, mode)
    drafting = _check_drafting(drafting if drafting is not None else ("iid" if mode == "any" else mode))
    tc0 = target.initial_context if target_context is None else target_context
    dc0 = drafter.initial_context if draft_context is None else draft_context
    tc0 = check_int("target_context", tc0, minimum=0, maximum=target.num_contexts - 1)
    dc0 = check_int("draft_context", dc0, minimum=0, maximum=drafter.num_contexts - 1)
    V, N = target.vocab_size, parents.shape[0]
    kids: list[list[int]] = [[] for _ in range(N + 1)]
    for n in range(N):
        if int(parents[n]) != PAD:
            kids[int(parents[n]) + 1].append(n)
    depth_of = torch.cat([torch.zeros(1, dtype=torch.long), node_depths(parents[None])[0]])  # (N+1,)
    D = int(depth_of.max())
    all_tokens = torch.arange(V)
    visits: list[tuple[int, tuple[int, ...], int, int, float]] = [(0, (), tc0, dc0, 1.0)]
    stops, nexts, targets = [], [], []
    cache: dict = {}
    i = 0
    while i < len(visits):
        slot, prefix, tc, dc, reach = visits[i]
        i += 1
        key = (tc, dc, len(kids[slot]))
        if key not in cache:
            cache[key] = node_law(target.table[tc], drafter.table[dc], len(kids[slot]), drafting=drafting, rule=rule)
        accept, final = cache[key]
        stops.append(reach * final)
        nexts.append(reach * (final + accept.sum(0)))
        targets.append(target.table[tc] / target.table[tc].sum())
        if not kids[slot]:
            continue
        t_next = target.next_context(torch.full((V,), tc), all_tokens)  # (V,)
        d_next = drafter.next_context(torch.full((V,), dc), all_tokens)  # (V,)
        for j, child in enumerate(kids[slot]):
            if j >= accept.shape[0]:
                break
            for x in accept[j].nonzero().flatten().tolist():
                visits.append((child + 1, prefix + (x,), int(t_next[x]), int(d_next[x]), reach * float(accept[j, x])))
        if len(visits) > MAX_VISITS:
            raise InvalidArgument(
                f"round_law: more than MAX_VISITS={MAX_VISITS} (node, path) visits; use a smaller V or tree"
            )
    M = len(visits)
    prefixes = torch.full((M, D), -1, dtype=torch.long)  # (M, D)
    for m, visit in enumerate(visits):
        if visit[1]:
            prefixes[m, : len(visit[1])] = torch.tensor(visit[1])
    slots = torch.tensor([v[0] for v in visits])  # (M,)
    return TreeLaw(
        reach=torch.tensor([v[4] for v in visits], dtype=torch.float64),
        stop=torch.stack(stops),
        next_law=torch.stack(nexts),
        target=torch.stack(targets),
        depth=depth_of[slots],
        prefix=prefixes,
        slot=slots,
    )


# --------------------------------------------------------------------------- many rounds


def _check_cells(V: int, L: int):
    if V**L > MAX_SEQUENCE_CELLS:
        raise InvalidArgument(f"L={L} is too large for V={V}: V**L = {V**L} cells (max {MAX_SEQUENCE_CELLS})")


def _fold(model: TableModel, context: int, tokens) -> int:
    for t in tokens:
        context = int(model.next_context(torch.tensor([context]), torch.tensor([t]))[0])
    return context


def sequence_law(model: TableModel, L: int) -> torch.Tensor:
    """Joint law (V,) * L of the first L tokens sampled from ``model`` (float64)."""
    if not isinstance(model, TableModel):
        raise InvalidArgument(f"model must be a TableModel, got {type(model).__name__}")
    L = check_int("L", L, minimum=1)
    V = model.vocab_size
    _check_cells(V, L)
    law = torch.ones(1, dtype=torch.float64)  # (V**n,)
    ctx = torch.full((1,), model.initial_context, dtype=torch.long)  # (V**n,)
    for _ in range(L):
        law = (law[:, None] * model.table[ctx]).reshape(-1)  # (V**(n+1),)
        ctx = model.next_context(ctx[:, None].expand(-1, V), torch.arange(V).expand(ctx.shape[0], V)).reshape(-1)
    return law.reshape((V,) * L)


def multi_round_law(
    parents, target: TableModel, drafter: TableModel, *, mode: str, L: int, rule=None, drafting: str | None = None
) -> torch.Tensor:
    """Joint law (V,) * L of the first L tokens of tree speculative decoding with a fixed shape.

    Each round starts from the contexts after everything emitted so far, draws a tree of
    the given shape, walks it (:func:`round_law`) and appends the accepted tokens and the
    final token.  Equal to :func:`sequence_law` of the target for a lossless rule.

    Parameters
    ----------
    parents : Tensor, shape (N,)
    target, drafter : TableModel
    mode, rule, drafting
        As in :func:`round_law`.
    L : int >= 1
        Number of emitted tokens whose joint law is returned (V ** L <= MAX_SEQUENCE_CELLS).
    """
    parents = _shape(parents)
    _check_models(target, drafter)
    L = check_int("L", L, minimum=1)
    V = target.vocab_size
    _check_cells(V, L)
    out = torch.zeros(V**L, dtype=torch.float64)
    weights = V ** torch.arange(L - 1, -1, -1)  # (L,) flat index of a sequence
    rounds = {}
    frontier: dict[tuple[int, ...], float] = {(): 1.0}
    while frontier:
        following: defaultdict[tuple[int, ...], float] = defaultdict(float)
        for prefix, mass in frontier.items():
            key = (_fold(target, target.initial_context, prefix), _fold(drafter, drafter.initial_context, prefix))
            if key not in rounds:
                law = round_law(
                    parents,
                    target,
                    drafter,
                    mode=mode,
                    rule=rule,
                    drafting=drafting,
                    target_context=key[0],
                    draft_context=key[1],
                )
                rounds[key] = law.sequences()
            for emitted, prob in rounds[key].items():
                sequence = prefix + emitted
                if len(sequence) >= L:
                    out[int((torch.tensor(sequence[:L]) * weights).sum())] += mass * prob
                else:
                    following[sequence] += mass * prob
        frontier = following
    return out.reshape((V,) * L)
