"""Reference tree / multi-draft verification rules, batched, with an explicit generator.

The walk starts at the root; at every reached slot the children are verified in index
order (``r`` the running target-side law, starting at the slot's target row ``p``; ``q``
the law the children were drawn from; ``u`` the child's own coin):

* ``mode="iid"`` -- SpecInfer multi-round rejection (Miao et al. 2023, arXiv 2305.09781):
  accept child x iff ``u q(x) < r(x)`` (probability min(1, r/q), no division); on
  rejection ``r <- norm((r - q)+)``;
* ``mode="wor"`` -- recursive rejection sampling without replacement, RRSw (Jeon et al.
  2024, arXiv 2402.14160): the same test against ``q_i``, the draft law with the earlier
  siblings removed and renormalised; on rejection ``r <- norm((r - q_i)+)``;
* ``mode="topk"`` -- deterministic distinct children (EAGLE-2/3, q a point mass; SafeAILab/EAGLE
  ``evaluate_posterior``): accept x iff ``u < r(x)``; on rejection ``r(x) <- 0`` and
  renormalise; a sibling repeating an earlier sibling's token is skipped;
* ``mode="any"`` -- target-only sample-and-match: draw ``y ~ p`` with the slot's coin and
  descend into the first child whose token is y, else emit y (lossless for any tree).

When every child of a slot is rejected (or it has none) the walk emits one token from
``r`` (the target row itself after no rejection: the bonus) with the row's final coin and
stops.  A residual of mass 0 (only reachable through a dishonest draft or float rounding)
leaves ``r`` unchanged, as :mod:`reference.rules` falls back to p.

:func:`verify_tree_coins` is the uniforms-in kernel (``coins (B, N+1)``: coin of slot m;
``final_coins (B,)``); :func:`verify_tree` draws those uniforms from a generator with
:func:`specverify.protocols.tree.draw_uniforms` and calls it.  Sampling is exact
inverse-CDF in float64 (:func:`specverify.core.sampling.inverse_cdf`).  Rows are processed
together, in cache-sized chunks on the CPU, and only the rows still walking (only the
rejecting ones for a residual update); the loops run over depth and sibling slots only.
The top-k rule keeps ``r`` unnormalised with its running total (a rejection is O(1) per
row); its accept test ``u * total < r(x)`` has the normalised law's probability.

Shapes: B batch, N nodes, V vocabulary, D maximum depth, S maximum number of children.
"""

from __future__ import annotations

import torch

from specverify.core.errors import InvalidArgument
from specverify.core.sampling import inverse_cdf
from specverify.core.validation import check_generator, check_shape
from specverify.protocols.tree import (
    PAD,
    check_tree_inputs,
    children_table,
    draw_uniforms,
    node_depths,
)

__all__ = ["verify_tree", "verify_tree_coins", "canonical_residual", "drop_token", "ratio_accept"]

#: On the CPU rows are walked in chunks of about this many float64 entries (rows x V), at
#: least MIN_CHUNK_ROWS rows: each chunk's working rows stay in cache, and the per-op Python
#: overhead is paid once per chunk.  Rows are independent, so chunking changes no result.
CHUNK_ELEMENTS = 1 << 17
MIN_CHUNK_ROWS = 1024


def _gather(rows: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """``rows[b, index[b]]`` for rows (B, V) and index (B,): (B,)."""
    return rows.gather(1, index[:, None]).squeeze(1)


def _normalise_or_keep(weights: torch.Tensor, fallback: torch.Tensor) -> torch.Tensor:
    """``weights`` (a fresh tensor, changed in place) normalised per row, ``fallback`` where a row has mass 0."""
    total = weights.sum(-1, keepdim=True)  # (B, 1)
    empty = (total <= 0).squeeze(-1)  # (B,)
    weights.div_(total.clamp_min_(torch.finfo(weights.dtype).tiny))
    if bool(empty.any()):  # rare: a dishonest draft or rounding
        weights[empty] = fallback[empty]
    return weights


def canonical_residual(r: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """``norm((r - q)+)`` per row (B, V), or ``r`` where that residual has mass 0."""
    return _normalise_or_keep((r - q).clamp_min_(0.0), r)


def drop_token(r: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """``r`` with token ``x[b]`` zeroed and renormalised per row (``r`` itself if nothing is left)."""
    return _normalise_or_keep(r.scatter(1, x[:, None], 0.0), r)


def _topk_step(r: torch.Tensor, mass: torch.Tensor, rows: torch.Tensor, x: torch.Tensor, u: torch.Tensor):
    """One top-k sibling test on ``rows``: accept iff ``u * mass < r(x)`` with r kept unnormalised.

    ``r`` (A, V) holds the running law up to the factor ``mass`` (A,), so a rejection zeroes
    one entry and subtracts it from the mass (O(1) per row instead of a renormalisation);
    the probability of acceptance is ``r(x) / mass``, the normalised law's.  Returns the
    accept mask (L,); ``r`` and ``mass`` are updated in place on the rejected rows.
    """
    r_x = r[rows, x]  # (L,)
    accept = u * mass[rows] < r_x  # (L,)
    rejected, dropped = rows[~accept], x[~accept]
    r[rejected, dropped] = 0.0
    mass[rejected] = (mass[rejected] - r_x[~accept]).clamp_min(0.0)
    return accept


def ratio_accept(u: torch.Tensor, r_x: torch.Tensor, q_x: torch.Tensor) -> torch.Tensor:
    """The accept test ``u q(x) < r(x)``: probability min(1, r/q); q(x) = 0 accepts iff r(x) > 0."""
    return u * q_x < r_x


def _verify_children(mode, r, q, kids, kid_tokens, coins):
    """Verify the children ``kids`` (A, S) of the current slots of the A walking rows.

    ``r`` (A, V) is the running target-side law (updated in place on the rows that reject;
    for topk kept unnormalised), ``q`` (A, V) the draft law (None for topk), ``coins``
    (A, N+1) the rows' coins.  Returns the accepted child (A,), -1 where every child was
    rejected, and ``r`` (the weights of the final draw; the sampler normalises them).
    """
    A, S = kids.shape
    accepted = torch.full((A,), -1, dtype=torch.long, device=kids.device)  # (A,)
    mass = r.sum(-1) if mode == "topk" else None  # (A,) total of the unnormalised r (topk)
    for s in range(S):
        child = kids[:, s]  # (A,)
        live = (child >= 0) & (accepted < 0)  # (A,)
        if mode == "topk":  # a sibling repeating an earlier sibling's token is skipped
            live &= ~((kid_tokens[:, :s] == kid_tokens[:, s : s + 1]) & (kids[:, :s] >= 0)).any(-1)
        rows = live.nonzero().squeeze(-1)  # (L,)
        if rows.numel() == 0:
            continue
        x = kid_tokens[rows, s]  # (L,)
        u = coins[rows, child[rows] + 1]  # (L,) the child's own coin
        if mode == "topk":
            accepted[rows] = torch.where(_topk_step(r, mass, rows, x, u), child[rows], -1)
            continue
        accept = ratio_accept(u, r[rows, x], q[rows, x])  # (L,)
        accepted[rows] = torch.where(accept, child[rows], -1)
        rejected = rows[~accept]  # (R,)
        if rejected.numel() == 0:
            continue
        r[rejected] = canonical_residual(r[rejected], q[rejected])
        if mode == "wor":  # the next sibling was drawn from q without the tokens drawn so far
            dropped = q[rejected].scatter(1, x[~accept][:, None], 0.0)  # (R, V)
            q[rejected] = _normalise_or_keep(dropped, dropped)
    return accepted, r


class _RowReader:
    """Rows ``probs[b, slot[b]]`` of probs (B, N+1, V) as float64, by one ``index_select`` when contiguous."""

    def __init__(self, probs: torch.Tensor):
        B, N1, V = probs.shape
        self.probs, self.N1 = probs, N1
        self.flat = probs.reshape(B * N1, V) if probs.is_contiguous() else None

    def rows(self, batch_rows: torch.Tensor, slot: torch.Tensor) -> torch.Tensor:
        if self.flat is not None:
            return self.flat.index_select(0, batch_rows * self.N1 + slot).double()  # (A, V)
        return self.probs[batch_rows, slot].double()  # (A, V)


def _chunk(B: int, V: int, device) -> int:
    """Rows per chunk: whole batches off the CPU; on the CPU about CHUNK_ELEMENTS float64 entries."""
    if torch.device(device).type != "cpu":
        return max(1, B)
    return max(1, min(B, max(MIN_CHUNK_ROWS, CHUNK_ELEMENTS // max(1, V))))


def _draw(weights: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Exact inverse-CDF draws (A,) from non-negative rows (A, V) with uniforms (A,)."""
    return inverse_cdf(weights, u[:, None])[0]


def _walk(mode, target_rows, draft_rows, children, tokens, coins, final_coins, path, final, start, stop, D):
    """Walk rows start..stop-1 down their trees; write their ``path`` and ``final`` entries."""
    device = tokens.device
    walking = torch.arange(start, stop, device=device)  # (A,) rows still walking
    slot = torch.zeros(stop - start, dtype=torch.long, device=device)  # (A,) their current slot
    for d in range(D + 1):
        kids = children[walking, slot]  # (A, S)
        kid_tokens = tokens[walking[:, None], kids.clamp(min=0)]  # (A, S)
        p = target_rows.rows(walking, slot)  # (A, V)
        if mode == "any":
            y = _draw(p, coins[walking, slot])  # (A,) y ~ p with the slot's coin
            match = (kids >= 0) & (kid_tokens == y[:, None])  # (A, S)
            child = torch.full_like(y, -1)
            if kids.shape[1]:
                first = kids.gather(1, match.long().argmax(-1, keepdim=True)).squeeze(1)  # (A,)
                child = torch.where(match.any(-1), first, -1)
            ended = child < 0
            final[walking[ended]] = y[ended]
        else:
            q = None if mode == "topk" or draft_rows is None else draft_rows.rows(walking, slot)  # (A, V)
            child, r = _verify_children(mode, p, q, kids, kid_tokens, coins[walking])
            ended = child < 0  # (A,)
            if bool(ended.any()):
                weights = r[ended]  # (E, V)
                empty = weights.sum(-1) <= 0  # (E,) only through rounding: fall back to p
                if bool(empty.any()):  # (p itself was updated in place as r: read it again)
                    weights[empty] = target_rows.rows(walking[ended][empty], slot[ended][empty])
                final[walking[ended]] = _draw(weights, final_coins[walking[ended]])
        moved = ~ended
        walking, child = walking[moved], child[moved]
        if walking.numel() == 0:
            break
        path[walking, d] = child
        slot = child + 1


def verify_tree_coins(
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor | None,
    tokens: torch.Tensor,
    parents: torch.Tensor,
    *,
    mode: str,
    coins: torch.Tensor,
    final_coins: torch.Tensor,
    check: bool = True,
):
    """Uniforms-in tree verification: the reference rules driven by given uniforms.

    Parameters
    ----------
    target_probs : Tensor, shape (B, N+1, V)
        Target law at the root (slot 0) and after each node n (slot n+1).
    draft_probs : Tensor, shape (B, N+1, V), or None for modes "topk" and "any"
        The law the children of each slot were drawn from.
    tokens, parents : Tensor, shape (B, N), integer
        Node tokens and parent nodes (-1 root, -2 padding), topologically ordered.
    mode : {"iid", "wor", "topk", "any"}
        The rule (see the module docstring).
    coins : Tensor, shape (B, N+1), float64 in [0, 1)
        ``coins[b, n+1]`` is node n's accept coin (iid, wor, topk); ``coins[b, m]`` is the
        draw of y at slot m (any).
    final_coins : Tensor, shape (B,), float64 in [0, 1)
        The coin of the final (correction or bonus) draw.
    check : bool
        Validate the inputs.

    Returns
    -------
    emitted : Tensor, shape (B, D+1), long
        The accepted path's tokens, then the final token; 0 past ``num_emitted``.
    num_emitted : Tensor, shape (B,), long
        Accepted depth + 1.
    path : Tensor, shape (B, D), long
        The accepted nodes, root down, -1 padded.
    """
    if check:
        B, N, V = check_tree_inputs(target_probs, draft_probs, tokens, parents, mode)
        check_shape("coins", coins, (B, N + 1))
        check_shape("final_coins", final_coins, (B,))
        if not (coins.is_floating_point() and final_coins.is_floating_point()):
            raise InvalidArgument(f"coins and final_coins must be floating, got {coins.dtype} and {final_coins.dtype}")
    B, N1, V = target_probs.shape
    device = target_probs.device
    parents = parents.long()
    tokens = torch.where(parents == PAD, 0, tokens.long())  # (B, N) padding tokens are never read
    coins, final_coins = coins.double(), final_coins.double()
    depths = node_depths(parents)  # (B, N)
    D = int(depths.max()) if depths.numel() else 0
    children = children_table(parents)  # (B, N+1, S)
    path = torch.full((B, D), -1, dtype=torch.long, device=device)  # (B, D)
    final = torch.zeros(B, dtype=torch.long, device=device)  # (B,)
    target_rows, draft_rows = _RowReader(target_probs), None if draft_probs is None else _RowReader(draft_probs)
    step = _chunk(B, V, device)
    for start in range(0, B, step):  # rows are independent: cache-sized chunks give the same result
        stop = min(start + step, B)
        _walk(mode, target_rows, draft_rows, children, tokens, coins, final_coins, path, final, start, stop, D)
    accepted = (path >= 0).sum(1)  # (B,)
    emitted = torch.zeros(B, D + 1, dtype=torch.long, device=device)  # (B, D+1)
    if D:
        emitted[:, :D] = torch.where(path >= 0, tokens.gather(1, path.clamp(min=0)), 0)
    emitted.scatter_(1, accepted[:, None], final[:, None])
    return emitted, accepted + 1, path


def verify_tree(
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor | None,
    tokens: torch.Tensor,
    parents: torch.Tensor,
    *,
    mode: str,
    generator: torch.Generator,
    check: bool = True,
):
    """Reference tree verification (the tree-verifier protocol), dispatching on ``mode``.

    Draws ``coins (B, N+1)`` then ``final_coins (B,)`` from ``generator``
    (:func:`~specverify.protocols.tree.draw_uniforms`) and runs
    :func:`verify_tree_coins`; see there for the parameters and returns.
    """
    if check:
        check_generator("generator", generator)
        check_tree_inputs(target_probs, draft_probs, tokens, parents, mode)
    B, N1 = target_probs.shape[:2]
    coins, final_coins = draw_uniforms(B, N1 - 1, generator=generator, device=target_probs.device)
    return verify_tree_coins(
        target_probs, draft_probs, tokens, parents, mode=mode, coins=coins, final_coins=final_coins, check=False
    )
