"""Tree drafters over table models: how the draft tree of every round is grown.

A :class:`TreeDrafting` says how the children of each expanded node are drawn from the
drafter's row at that node's context, and which nodes are expanded:

* fixed shapes -- ``branching = (k_1, ..., k_D)``: the root has ``k_1`` children, each of
  them ``k_2``, ...; nodes are numbered level by level (breadth first), so parents precede
  children and siblings sit together;
* ``mode`` -- ``"iid"`` (i.i.d. from q, with replacement: SpecInfer), ``"wor"`` (without
  replacement: RRSw; a slot whose remaining q mass is 0 gets padding instead), ``"topk"``
  (the k most likely tokens of q, ties to the lower id: EAGLE-2/3's deterministic
  candidates), ``"any"`` (drawn i.i.d. from q but handed to the verifier as an arbitrary
  tree without draft laws: target-only rules);
* ``dynamic = (depth, top_k, frontier, nodes)`` -- EAGLE-2's dynamic tree: at every depth
  the ``frontier`` nodes of largest cumulative draft probability are expanded with their
  ``top_k`` tokens, and the ``nodes`` candidates of largest cumulative probability (over
  all depths) are kept, so the shape differs from row to row; mode ``"topk"``;
* adversarial variants -- ``duplicate=True`` repeats the first child's token in the second
  child of every expanded node (a lossless verifier must skip it: EAGLE's
  ``evaluate_posterior`` does); ``pad_every = m`` inserts a padding node after every m-th
  node (padding anywhere in the node list, one fixed layout);
* varying layouts -- ``pad_random = m`` inserts m padding nodes at uniformly random places,
  drawn per row and per round (between siblings too; the real tree keeps its shape);
  ``prune = f`` drops every node of a fixed shape (with its subtree) with probability f,
  per row and per round, leaving padding in its place (the unused entries of fixed-width
  sibling blocks), so rows of one round have different shapes.

:func:`draft_trees` grows one batch of trees from the root contexts of its rows and returns
the protocol's ``parents``/``tokens`` together with the target and drafter context of every
node, so the harness can gather exact rows.  Sampling is exact (float64 inverse CDF).

Shapes: b rows, N nodes, V vocabulary, S children of one node, D depth.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specverify.core.errors import InvalidArgument
from specverify.core.sampling import sample
from specverify.core.tables import TableModel
from specverify.protocols.tree import MODES, PAD, ROOT

__all__ = ["DraftedTrees", "TreeDrafting", "draft_trees", "top_tokens"]


@dataclass(frozen=True)
class TreeDrafting:
    """How the draft tree of a round is grown (see the module docstring)."""

    mode: str = "iid"
    branching: tuple[int, ...] = (2, 2)
    dynamic: tuple[int, int, int, int] | None = None  # (depth, top_k, frontier, nodes)
    duplicate: bool = False
    pad_every: int = 0
    pad_random: int = 0
    prune: float = 0.0

    def __post_init__(self):
        if self.mode not in MODES:
            raise InvalidArgument(f"mode must be one of {MODES}, got {self.mode!r}")
        if self.dynamic is not None:
            if self.mode != "topk" or len(self.dynamic) != 4 or min(self.dynamic) < 1:
                raise InvalidArgument(
                    f"dynamic must be (depth, top_k, frontier, nodes) >= 1 with mode 'topk', got {self}"
                )
        elif not self.branching or min(self.branching) < 1:
            raise InvalidArgument(f"branching must be a non-empty tuple of positive ints, got {self.branching!r}")
        if self.duplicate and self.mode != "topk":
            raise InvalidArgument(f"duplicate siblings are an adversarial case of mode 'topk', got mode {self.mode!r}")
        if self.pad_every < 0 or self.pad_random < 0:
            raise InvalidArgument(f"pad_every and pad_random must be >= 0, got {self.pad_every!r}, {self.pad_random!r}")
        if not 0.0 <= self.prune < 1.0 or (self.prune and self.dynamic is not None):
            raise InvalidArgument(f"prune must be in [0, 1), and 0 for dynamic trees, got {self.prune!r}")

    @property
    def num_real_nodes(self) -> int:
        """Nodes per tree before padding (the largest number, for dynamic trees)."""
        if self.dynamic is not None:
            return self.dynamic[3]
        total, width = 0, 1
        for k in self.branching:
            width *= k
            total += width
        return total

    @property
    def num_nodes(self) -> int:
        """N: nodes per tree handed to the verifier, padding included."""
        n = self.num_real_nodes
        return n + (n // self.pad_every if self.pad_every else 0) + self.pad_random

    @property
    def max_depth(self) -> int:
        return self.dynamic[0] if self.dynamic is not None else len(self.branching)

    def template_parents(self):
        """The parents (N,) every row's tree has (fixed shapes; None for dynamic or pruned trees).

        With ``pad_random`` the layout varies per row: the template is then the tree without
        that padding (the same real shape, so the same exact law).
        """
        if self.dynamic is not None or self.prune:
            return None
        parents, ids, first = [], [ROOT], 0
        for k in self.branching:
            parents += [p for p in ids for _ in range(k)]
            ids = list(range(first, first + len(ids) * k))
            first += len(ids)
        par = torch.tensor(parents, dtype=torch.long)  # (N,)
        if not self.pad_every:
            return par
        trees = DraftedTrees(par[None], par[None] * 0, par[None] * 0, par[None] * 0)
        return _pad(trees, self.pad_every).parents[0]

    def describe(self) -> str:
        if self.dynamic is not None:
            d, k, m, n = self.dynamic
            shape = f"dynamic EAGLE-2 tree (depth {d}, top-{k}, frontier {m}, {n} nodes)"
        else:
            shape = "branching " + "x".join(str(k) for k in self.branching)
        extras = [
            x
            for x, on in (
                ("duplicate siblings", self.duplicate),
                (f"padding every {self.pad_every}", self.pad_every),
                (f"{self.pad_random} padding nodes at random places", self.pad_random),
                (f"nodes pruned with probability {self.prune}", self.prune),
            )
            if on
        ]
        return f"{self.mode} children, {shape}" + ("".join(", " + x for x in extras))


@dataclass(frozen=True)
class DraftedTrees:
    """One batch of draft trees: protocol tensors plus every node's model contexts."""

    parents: torch.Tensor  # (b, N) long: parent node, ROOT or PAD
    tokens: torch.Tensor  # (b, N) long: 0 at padding
    target_contexts: torch.Tensor  # (b, N) long: target context after the node's path (0 at padding)
    draft_contexts: torch.Tensor  # (b, N) long: drafter context after the node's path (0 at padding)


def top_tokens(rows: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The k largest entries of each row (n, V), ties to the lower id, largest first: ``(values, ids)`` (n, k).

    Equal to a stable descending sort's first k columns, without sorting V entries: the
    k-th largest value t is found by ``topk``; every entry above t is taken, and the lowest
    ids among the entries equal to t fill the rest.
    """
    n, V = rows.shape
    threshold = torch.topk(rows, k, dim=-1).values[:, -1:]  # (n, 1) the k-th largest value
    above = rows > threshold  # (n, V)
    tied = rows == threshold  # (n, V)
    room = k - above.sum(-1, keepdim=True)  # (n, 1) how many tied entries are taken
    chosen = above | tied  # (n, V) exactly k per row where no tie is cut
    cut = (tied.sum(-1, keepdim=True) > room).squeeze(-1)  # (n,) rows whose ties at t exceed the room
    if bool(cut.any()):  # the lowest tied ids only (a scan over V for these rows alone)
        ties = tied[cut]  # (n', V)
        chosen[cut] = above[cut] | (ties & (ties.cumsum(-1) <= room[cut]))
    ids = chosen.nonzero()[:, 1].view(n, k)  # (n, k) in id order
    values = rows.gather(1, ids)  # (n, k)
    order = torch.sort(values, dim=-1, descending=True, stable=True).indices  # (n, k) ties keep id order
    return values.gather(1, order), ids.gather(1, order)


def _draw_children(rows: torch.Tensor, k: int, mode: str, generator: torch.Generator):
    """k children per row of ``rows`` (n, V) float64; ``(tokens (n, k), real (n, k) bool)``."""
    n, V = rows.shape
    if mode == "topk":
        if k > V:
            raise InvalidArgument(f"top-{k} children need k <= V = {V}")
        return top_tokens(rows, k)[1], torch.ones(n, k, dtype=torch.bool)  # (n, k) ties -> lower id
    if mode in ("iid", "any"):
        draws = sample(rows.repeat_interleave(k, 0), generator=generator, check=False)  # (n*k,)
        return draws.view(n, k), torch.ones(n, k, dtype=torch.bool)
    tokens = torch.zeros(n, k, dtype=torch.long)  # (n, k) without replacement
    real = torch.zeros(n, k, dtype=torch.bool)
    weights = rows.clone()  # (n, V)
    for s in range(k):
        live = weights.sum(-1) > 0  # (n,)
        if bool(live.any()):
            x = sample(weights[live], generator=generator, check=False)  # (n',)
            tokens[live, s] = x
            real[live, s] = True
            weights[live] = weights[live].scatter(1, x[:, None], 0.0)
    return tokens, real


def _fixed_trees(target, drafter, spec: TreeDrafting, tctx, dctx, generator) -> DraftedTrees:
    """Trees of a fixed branching, grown level by level."""
    b = tctx.numel()
    parents, tokens, tcs, dcs = [], [], [], []
    slot_t, slot_d = tctx[:, None], dctx[:, None]  # (b, P) contexts of the current level's slots
    slot_real = torch.ones(b, 1, dtype=torch.bool)  # (b, P)
    slot_ids = torch.full((b, 1), ROOT, dtype=torch.long)  # (b, P) node index of each slot (ROOT first)
    first = 0
    for k in spec.branching:
        P = slot_t.shape[1]
        rows = drafter.table[slot_d.reshape(-1)]  # (b*P, V)
        kid_tok, kid_real = _draw_children(rows, k, spec.mode, generator)  # (b*P, k)
        kid_tok, kid_real = kid_tok.reshape(b, P * k), kid_real.reshape(b, P * k)
        if spec.duplicate and k >= 2:
            kid_tok.view(b, P, k)[:, :, 1] = kid_tok.view(b, P, k)[:, :, 0]
        parent = slot_ids.repeat_interleave(k, 1)  # (b, P*k)
        real = kid_real & slot_real.repeat_interleave(k, 1)
        kid_t = target.next_context(slot_t.repeat_interleave(k, 1), kid_tok)  # (b, P*k)
        kid_d = drafter.next_context(slot_d.repeat_interleave(k, 1), kid_tok)  # (b, P*k)
        parents.append(torch.where(real, parent, PAD))
        tokens.append(torch.where(real, kid_tok, 0))
        tcs.append(torch.where(real, kid_t, 0))
        dcs.append(torch.where(real, kid_d, 0))
        slot_t, slot_d, slot_real = kid_t, kid_d, real
        slot_ids = torch.arange(first, first + P * k).expand(b, -1)  # (b, P*k)
        first += P * k
    return DraftedTrees(torch.cat(parents, 1), torch.cat(tokens, 1), torch.cat(tcs, 1), torch.cat(dcs, 1))


def _dynamic_trees(target, drafter, spec: TreeDrafting, tctx, dctx) -> DraftedTrees:
    """EAGLE-2 dynamic trees: expand the frontier by cumulative draft probability, keep the best nodes."""
    depth, top_k, frontier, keep = spec.dynamic
    b = tctx.numel()
    cand_parent, cand_tok, cand_t, cand_d, cand_cum, cand_depth = [], [], [], [], [], []
    slot_t, slot_d = tctx[:, None], dctx[:, None]  # (b, P)
    slot_cum = torch.ones(b, 1, dtype=torch.float64)  # (b, P)
    slot_ids = torch.full((b, 1), ROOT, dtype=torch.long)  # (b, P) candidate index of each slot
    count = 0
    for d in range(depth):
        P = slot_t.shape[1]
        rows = drafter.table[slot_d.reshape(-1)]  # (b*P, V)
        k = min(top_k, rows.shape[1])
        q_top, x_top = top_tokens(rows, k)  # (b*P, k)
        x = x_top.reshape(b, P * k)  # (b, P*k)
        cum = slot_cum.repeat_interleave(k, 1) * q_top.reshape(b, P * k)  # (b, P*k)
        cand_parent.append(slot_ids.repeat_interleave(k, 1))
        cand_tok.append(x)
        cand_t.append(target.next_context(slot_t.repeat_interleave(k, 1), x))
        cand_d.append(drafter.next_context(slot_d.repeat_interleave(k, 1), x))
        cand_cum.append(cum)
        cand_depth.append(torch.full((b, P * k), d, dtype=torch.long))
        ids = torch.arange(count, count + P * k).expand(b, -1)  # (b, P*k)
        count += P * k
        m = min(frontier, P * k)
        best = torch.sort(cum, dim=1, descending=True, stable=True).indices[:, :m]  # (b, m)
        slot_t, slot_d = cand_t[-1].gather(1, best), cand_d[-1].gather(1, best)
        slot_cum, slot_ids = cum.gather(1, best), ids.gather(1, best)
    parent, tok, tc, dc, cum, dep = (
        torch.cat(x, 1) for x in (cand_parent, cand_tok, cand_t, cand_d, cand_cum, cand_depth)
    )
    n = min(keep, parent.shape[1])
    # Rank by cumulative probability, ties to the shallower (a parent before its child), then by index.
    key = torch.sort(dep, dim=1, stable=True).indices  # (b, M) depth order
    rank = torch.sort(cum.gather(1, key), dim=1, descending=True, stable=True).indices  # (b, M)
    chosen = key.gather(1, rank)[:, :n]  # (b, n) candidate ids kept
    chosen = torch.sort(chosen, dim=1).values  # (b, n) topological: candidates are numbered level by level
    new_id = torch.full_like(parent, PAD)  # (b, M) candidate id -> node index
    new_id.scatter_(1, chosen, torch.arange(n).expand(b, -1))
    par = parent.gather(1, chosen)  # (b, n) candidate id of the parent, or ROOT
    par = torch.where(par >= 0, new_id.gather(1, par.clamp(min=0)), ROOT)
    return DraftedTrees(par, tok.gather(1, chosen), tc.gather(1, chosen), dc.gather(1, chosen))


def _pad(trees: DraftedTrees, every: int) -> DraftedTrees:
    """Insert a padding node after every ``every``-th node (parents renumbered)."""
    b, N = trees.parents.shape
    new_index = torch.arange(N) + torch.arange(N) // every  # (N,) where node n goes
    M = N + N // every
    out = [torch.zeros(b, M, dtype=torch.long) for _ in range(4)]
    out[0].fill_(PAD)
    par = trees.parents
    par = torch.where(par >= 0, new_index[par.clamp(min=0)], par)  # (b, N)
    for dst, src in zip(out, (par, trees.tokens, trees.target_contexts, trees.draft_contexts)):
        dst[:, new_index] = src
    return DraftedTrees(*out)


def _pad_randomly(trees: DraftedTrees, count: int, generator: torch.Generator) -> DraftedTrees:
    """Insert ``count`` padding nodes at uniformly random places of every row (parents renumbered)."""
    b, N = trees.parents.shape
    M = N + count
    keys = torch.rand(b, M, generator=generator, dtype=torch.float64)  # (b, M)
    pad = torch.zeros(b, M, dtype=torch.bool).scatter_(1, keys.topk(count, dim=1).indices, True)  # (b, M)
    new_index = (~pad).nonzero()[:, 1].view(b, N)  # (b, N) where node n goes, in order
    par = trees.parents
    par = torch.where(par >= 0, new_index.gather(1, par.clamp(min=0)), par)  # (b, N)
    out = [torch.zeros(b, M, dtype=torch.long) for _ in range(4)]
    out[0].fill_(PAD)
    for dst, src in zip(out, (par, trees.tokens, trees.target_contexts, trees.draft_contexts)):
        dst.scatter_(1, new_index, src)
    return DraftedTrees(*out)


def _prune(trees: DraftedTrees, fraction: float, generator: torch.Generator) -> DraftedTrees:
    """Drop every node with probability ``fraction`` (and its subtree); dropped nodes become padding in place."""
    b, N = trees.parents.shape
    dropped = torch.rand(b, N, generator=generator, dtype=torch.float64) < fraction  # (b, N)
    parents = trees.parents.clone()
    for n in range(N):  # parents precede children: a dropped parent's node is padding by now
        par = parents[:, n]  # (b,)
        above = parents.gather(1, par.clamp(min=0)[:, None]).squeeze(1)  # (b,) the parent's own parent
        gone = dropped[:, n] | ((par >= 0) & (above == PAD))
        parents[:, n] = torch.where(gone, PAD, par)
    real = parents != PAD
    return DraftedTrees(
        parents, *(torch.where(real, t, 0) for t in (trees.tokens, trees.target_contexts, trees.draft_contexts))
    )


def draft_trees(
    target: TableModel,
    drafter: TableModel,
    spec: TreeDrafting,
    target_contexts: torch.Tensor,
    draft_contexts: torch.Tensor,
    *,
    generator: torch.Generator,
) -> DraftedTrees:
    """Grow one draft tree per row from the rows' root contexts (b,), exactly from the drafter's table."""
    if spec.dynamic is not None:
        trees = _dynamic_trees(target, drafter, spec, target_contexts, draft_contexts)
    else:
        trees = _fixed_trees(target, drafter, spec, target_contexts, draft_contexts, generator)
    if spec.prune:
        trees = _prune(trees, spec.prune, generator)
    if spec.pad_every:
        trees = _pad(trees, spec.pad_every)
    return _pad_randomly(trees, spec.pad_random, generator) if spec.pad_random else trees
