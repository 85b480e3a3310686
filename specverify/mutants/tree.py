"""Tree-verifier mutants: the tree bugs of ``docs/bugs.md`` as deliberately wrong verifiers.

Every entry is a uniforms-in kernel ``kernel(target_probs, draft_probs, tokens, parents, *,
mode, coins, final_coins)`` wrapped by
:func:`~specverify.protocols.tree.uniforms_in` into the tree-verifier protocol, so
the harness can also hand it edge-case coins.  Two walkers cover them:

* :func:`sibling_walk` -- the sibling-by-sibling rules (SpecInfer, RRSw, top-k) with one
  step swapped: the accept test, the rejection update of ``r``, whether ``q`` loses the
  drawn siblings (without replacement), whether duplicate siblings are skipped, which
  node's ``q`` is used, the order siblings are verified in, whether the residual is
  renormalised after late rejections, which coin a sibling is tested with, whether padding
  nodes and the first row's tree shape leak into the residual update;
* :func:`coin_walk` -- SGLang's coin-based target-only kernel
  (``tree_speculative_sampling_target_only``: one coin per node, ``S_i`` the cumulative
  target mass of the siblings so far, accept sibling i iff ``p(x_i) > 0`` and
  ``u < S_i / threshold_acc`` or ``p(x_i) >= threshold_single``; the final token from
  ``norm((p - p_rejected)+)``) with its thresholds, its comparison and its final sampler
  as parameters; plus greedy verification of sampled requests.

``requires`` names the tree scenarios on which an entry's *base* rule is lossless with the
mode's acceptance law (the coin rule: top-k and target-only trees), so a kill there is due
to the planted bug.  Entries with ``kind="tree_verifier"`` must be caught; ``kind="tree_equivalent"`` are
correct rules written differently (siblings in reverse order under i.i.d. drafts, where
they are exchangeable; sample-and-match on every tree; SGLang's kernel with thresholds 1)
and must pass the verdict, which judges the output law.  ``sample_and_match_any_mode`` runs
target-only sample-and-match whatever mode the tree was drafted in: its law is exact on
every tree, but on a tree of stochastic drafts it accepts less than the declared mode's rule,
so its rule conformance fails (:mod:`specverify.core.conformance`).

Shapes: B batch, N nodes, V vocabulary, S children of one slot.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specverify.core.sampling import inverse_cdf
from specverify.protocols.tree import PAD, children_table, node_depths, uniforms_in
from specverify_reference.tree_rules import canonical_residual, drop_token

__all__ = ["ENTRIES", "IID_OR_TOPK", "TOPK_OR_ANY", "SiblingSteps", "coin_walk", "sibling_walk", "target_only"]


@dataclass(frozen=True)
class SiblingSteps:
    """The swappable steps of a sibling-by-sibling walk (defaults: the lossless rules)."""

    reject: str = "residual"  # "residual": r <- norm((r - q)+) (topk: drop x); "drop": zero x; "keep": r unchanged
    wor_update: bool = True  # mode "wor": later siblings' q loses the drawn tokens
    skip_duplicates: bool = True  # mode "topk": a repeated token gets no second chance
    q_from_root: bool = False  # every slot verified with the root's draft row
    reverse: bool = False  # siblings verified last to first
    unnormalised_from: int = 0  # from this many rejections at a slot on, r <- (r - q)+ is not renormalised (0: never)
    rank_coin: bool = False  # a sibling tested with the coin of its rank among its siblings (reused across depths)
    padding_rejects: bool = False  # a padding node counts as a rejected sibling of the real node before it
    first_row_loop: bool = False  # the sibling loop runs over the first row's children; r updated unmasked


def ghost_parents(parents: torch.Tensor) -> torch.Tensor:
    """``parents`` (B, N) with every padding node given the parent of the nearest real node before it.

    A fixed-width sibling block's unused entries, as a kernel that stores trees that way sees
    them; padding before the first real node stays padding.
    """
    B, N = parents.shape
    real = parents != PAD  # (B, N)
    position = torch.arange(N).expand(B, N)
    last_real = torch.where(real, position, -1).cummax(-1).values  # (B, N) nearest real node at or before n
    borrowed = parents.gather(1, last_real.clamp(min=0))  # (B, N)
    return torch.where(real | (last_real < 0), parents, borrowed)


def _first_row_counts(children: torch.Tensor) -> torch.Tensor:
    """Children of every slot in the FIRST row (N+1,), broadcast to every row: (B, N+1)."""
    return (children[:1] >= 0).sum(-1).expand(children.shape[0], -1)


def _walk(target_probs, tokens, parents, step):
    """The common walk: at each reached slot ``step(d, cur, kids, kid_tokens, p) -> (child, final)``."""
    B = target_probs.shape[0]
    parents = parents.long()
    tokens = torch.where(parents == PAD, 0, tokens.long())  # (B, N)
    depths = node_depths(parents)  # (B, N)
    D = int(depths.max()) if depths.numel() else 0
    children = children_table(parents)  # (B, N+1, S)
    rows = torch.arange(B)
    cur = torch.zeros(B, dtype=torch.long)  # (B,) current slot
    active = torch.ones(B, dtype=torch.bool)
    path = torch.full((B, D), -1, dtype=torch.long)  # (B, D)
    final = torch.zeros(B, dtype=torch.long)  # (B,)
    for d in range(D + 1):
        kids = children[rows, cur]  # (B, S)
        kid_tokens = tokens.gather(1, kids.clamp(min=0)) if kids.shape[1] else kids  # (B, S)
        child, drawn = step(cur, kids, kid_tokens, target_probs[rows, cur].double(), active)
        stop = active & (child < 0)
        final = torch.where(stop, drawn, final)
        moved = active & (child >= 0)
        if d < D:
            path[:, d] = torch.where(moved, child, -1)
        cur = torch.where(moved, child + 1, cur)
        active = moved
        if not bool(active.any()):
            break
    accepted = (path >= 0).sum(1)  # (B,)
    emitted = torch.zeros(B, D + 1, dtype=torch.long)  # (B, D+1)
    if D:
        emitted[:, :D] = torch.where(path >= 0, tokens.gather(1, path.clamp(min=0)), 0)
    emitted.scatter_(1, accepted[:, None], final[:, None])
    return emitted, accepted + 1, path


def _gather(rows: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    return rows.gather(1, index[:, None]).squeeze(1)


def sibling_walk(steps: SiblingSteps):
    """A uniforms-in kernel running the sibling-by-sibling rule of each mode with ``steps``."""

    def kernel(target_probs, draft_probs, tokens, parents, *, mode, coins, final_coins):
        B = target_probs.shape[0]
        rows = torch.arange(B)
        real_parents = parents.long()
        ghost = (real_parents == PAD) if steps.padding_rejects else None  # (B, N) padding nodes
        loop_parents = ghost_parents(real_parents) if steps.padding_rejects else real_parents
        first_counts = _first_row_counts(children_table(real_parents)) if steps.first_row_loop else None

        def step(cur, kids, kid_tokens, p, active):
            r = p.clone()  # (B, V)
            q = None
            if mode in ("iid", "wor"):
                q = draft_probs[rows, torch.zeros_like(cur) if steps.q_from_root else cur].double()  # (B, V)
            child = torch.full((B,), -1, dtype=torch.long)
            rejections = torch.zeros(B, dtype=torch.long)  # (B,) rejected siblings at this slot so far
            order = range(kids.shape[1] - 1, -1, -1) if steps.reverse else range(kids.shape[1])
            for s in order:
                kid, x = kids[:, s], kid_tokens[:, s]  # (B,)
                live = active & (kid >= 0) & (child < 0)
                if mode == "topk" and steps.skip_duplicates and s:
                    live &= ~((kid_tokens[:, :s] == x[:, None]) & (kids[:, :s] >= 0)).any(-1)
                looped = live.clone()  # (B,) rows whose loop reaches this sibling (the residual is updated there)
                if ghost is not None:  # a padding entry of the block: never accepted, r updated as if rejected
                    live = live & ~((kid >= 0) & _gather(ghost, kid.clamp(min=0)))
                if first_counts is not None:  # the loop bound is the first row's; the update is not masked
                    looped = active & (child < 0) & (s < _gather(first_counts, cur))
                    live = live & looped
                coin = torch.full_like(cur, s + 1) if steps.rank_coin else kid + 1  # (B,) rank s's coin, or its own
                u = _gather(coins.double(), coin.clamp(min=0))  # (B,)
                if mode == "any":  # sample-and-match is handled below
                    break
                r_x = _gather(r, x)
                accept = live & ((u < r_x) if mode == "topk" else (u * _gather(q, x) < r_x))
                reject = (looped & ~accept)[:, None]
                rejections = rejections + reject[:, 0].long()
                if steps.reject == "drop" or (mode == "topk" and steps.reject == "residual"):
                    new_r = drop_token(r, x)
                elif steps.reject == "residual":
                    new_r = canonical_residual(r, q)
                else:
                    new_r = r
                if steps.unnormalised_from and mode != "topk":
                    raw = (r - q).clamp_min(0.0)  # (B, V)
                    late = (rejections >= steps.unnormalised_from) & (raw.sum(-1) > 0)  # (B,)
                    new_r = torch.where(late[:, None], raw, new_r)
                r = torch.where(reject, new_r, r)
                if mode == "wor" and steps.wor_update:
                    kept = q.scatter(1, x[:, None], 0.0)
                    q = torch.where(reject, kept / kept.sum(-1, keepdim=True).clamp_min(1e-300), q)
                child = torch.where(accept, kid, child)
            if mode == "any":  # y ~ p with the slot's coin; descend into the first child holding y
                y = inverse_cdf(p, _gather(coins.double(), cur)[:, None])[0]  # (B,)
                match = (kids >= 0) & (kid_tokens == y[:, None])  # (B, S)
                if ghost is not None:  # padding is never descended into
                    match &= ~ghost.gather(1, kids.clamp(min=0))
                first = kids.gather(1, match.long().argmax(-1, keepdim=True)).squeeze(1) if kids.shape[1] else y * 0
                return torch.where(match.any(-1), first, -1), y
            return child, inverse_cdf(r, final_coins.double()[:, None])[0]

        return _walk(target_probs, tokens, loop_parents, step)

    return kernel


def coin_walk(*, threshold_single: float = 1.0, threshold_acc: float = 1.0, less_equal: bool = False,
              frozen_cumsum: bool = False, greedy: bool = False, skip_duplicates: bool = True):  # fmt: skip
    """SGLang's coin-based target-only kernel with its knobs (defaults: the lossless setting).

    ``skip_duplicates=False`` is the kernel as shipped: it assumes distinct children, so a
    repeated token adds its mass to the running sum twice.
    """

    def kernel(target_probs, draft_probs, tokens, parents, *, mode, coins, final_coins):
        B = target_probs.shape[0]

        def step(cur, kids, kid_tokens, p, active):
            if greedy:  # sampled requests verified greedily: descend while the child is argmax p
                y = p.argmax(-1)  # (B,)
                match = (kids >= 0) & (kid_tokens == y[:, None])
                first = kids.gather(1, match.long().argmax(-1, keepdim=True)).squeeze(1) if kids.shape[1] else y * 0
                return torch.where(match.any(-1), first, -1), y
            u = _gather(coins.double(), cur)  # (B,) one coin per expanded slot
            child = torch.full((B,), -1, dtype=torch.long)
            cum = torch.zeros(B, dtype=torch.float64)
            residual = p.clone()  # (B, V)
            for s in range(kids.shape[1]):
                kid, x = kids[:, s], kid_tokens[:, s]
                live = active & (kid >= 0) & (child < 0)
                if skip_duplicates and s:
                    live &= ~((kid_tokens[:, :s] == x[:, None]) & (kids[:, :s] >= 0)).any(-1)
                p_x = _gather(p, x)
                cum = cum + torch.where(live, p_x, 0.0)
                coin_ok = (u <= cum / threshold_acc) if less_equal else (u < cum / threshold_acc)
                accept = live & (coin_ok | (p_x >= threshold_single))
                if not less_equal:
                    accept &= p_x > 0
                residual = torch.where((live & ~accept)[:, None], residual.scatter(1, x[:, None], 0.0), residual)
                child = torch.where(accept, kid, child)
            weights = residual / residual.sum(-1, keepdim=True).clamp_min(1e-300)  # (B, V)
            if frozen_cumsum:  # the running sum is never updated: the first token always "covers" the coin
                return child, torch.zeros(B, dtype=torch.long)
            return child, inverse_cdf(weights, final_coins.double()[:, None])[0]

        return _walk(target_probs, tokens, parents, step)

    kernel.target_only = True  # type: ignore[attr-defined]  # a target-only rule: no draft law read
    return kernel


def target_only(kernel):
    """``kernel`` run as target-only sample-and-match (``mode="any"``) whatever mode the tree was drafted in."""

    def forced(target_probs, draft_probs, tokens, parents, *, mode, coins, final_coins):
        return kernel(target_probs, draft_probs, tokens, parents, mode="any", coins=coins, final_coins=final_coins)

    return forced


def _entry(name, kind, kernel, description, provenance, needs="", requires=""):
    """A catalogue entry; ``requires`` (equivalents) lists the tree scenarios where the variant is correct."""
    from specverify.mutants.entry import CatalogueEntry

    fn = uniforms_in(kernel)
    fn.__name__ = fn.__qualname__ = name
    return CatalogueEntry(name, kind, fn, description, provenance, needs=needs, requires=requires)


#: Where a rule is lossless *and* has the mode's acceptance law: i.i.d. and top-k trees (siblings are
#: exchangeable under i.i.d. drafts; any order works for deterministic ones), and where the coin
#: rule's acceptance (sum of p over distinct children) is the mode's: top-k and target-only trees.
IID_OR_TOPK = (
    "markov8_iid_2x2,markov8_topk_3x2,markov8_dynamic_eagle2,markov8_any_2x2,markov8_iid_padded,"
    "pos32_disjoint_iid_wide,markov4_deep_narrow_iid,markov8_topk_duplicates,pos32_disjoint_edge_coins,"
    "markov12_iid_overlap_6x1,ngram3_iid_ragged"
)
TOPK_OR_ANY = (
    "markov8_topk_3x2,markov8_dynamic_eagle2,markov8_any_2x2,markov8_topk_duplicates,pos32_disjoint_edge_coins"
)


M, E = "tree_verifier", "tree_equivalent"
# fmt: off
ENTRIES = (
    _entry("residual_zero_only_rejected", M, sibling_walk(SiblingSteps(reject="drop")),
           "on a rejected sampled sibling, zero its token in r instead of r <- norm((r - q)+)",
           "SafeAILab/EAGLE #20", "iid or wor siblings from a stochastic q"),
    _entry("wor_verified_as_iid", M, sibling_walk(SiblingSteps(wor_update=False)),
           "siblings drawn without replacement verified with the i.i.d. (SpecInfer) rule",
           "llama.cpp PR #5625 discussion", "wor siblings, >= 2 per node"),
    _entry("residual_not_carried", M, sibling_walk(SiblingSteps(reject="keep")),
           "every sibling tested against the original p, not the residual left by earlier siblings",
           "classic", ">= 2 stochastic siblings"),
    _entry("q_wrong_node", M, sibling_walk(SiblingSteps(q_from_root=True)),
           "every node's children verified with the root's draft law", "TensorRT-LLM PR #12588 review",
           "depth >= 2, context-dependent q"),
    _entry("duplicate_siblings", M, coin_walk(skip_duplicates=False),
           "SGLang's coin rule on a tree with a repeated sibling token: its mass is counted twice",
           "EAGLE evaluate_posterior skips them; SGLang's kernel assumes distinct children",
           "duplicate siblings (top-k duplicates, i.i.d. trees)", requires=TOPK_OR_ANY),
    _entry("coin_le_accepts_zero", M, coin_walk(less_equal=True),
           "coin <= cumulative p (and no p > 0 check): a zero-probability child is accepted when the coin is 0",
           "sgl-project/sglang #35771", "children on p's zeros and an exact 0 coin (edge-coin scenario)", requires=TOPK_OR_ANY),
    _entry("thresholds_below_one", M, coin_walk(threshold_single=0.5, threshold_acc=0.7),
           "threshold_single 0.5, threshold_acc 0.7 (lossy by design)", "SGLang spec options, PR #8068", "any", requires=TOPK_OR_ANY),
    _entry("greedy_fallback", M, coin_walk(greedy=True),
           "sampled requests verified greedily (argmax match, argmax correction)",
           "SGLang _verify_uses_greedy (CPU/XPU)", "any", requires=TOPK_OR_ANY),
    _entry("cumsum_never_updated", M, coin_walk(frozen_cumsum=True),
           "the final sample's running sum is never updated: the correction is always token 0",
           "sglang-jax reference kernel", "any", requires=TOPK_OR_ANY),
    _entry("late_residual_unnormalised", M, sibling_walk(SiblingSteps(unnormalised_from=2)),
           "from the second rejected sibling of a slot on, r <- (r - q)+ is not renormalised: the third and later "
           "siblings are tested against a residual of mass < 1",
           "specverify (issue 30: residual-normalisation bugs that only a third sibling sees)",
           ">= 3 i.i.d. siblings whose residual after two rejections is not dominated by q"),
    _entry("padding_counted_as_sibling", M, sibling_walk(SiblingSteps(padding_rejects=True)),
           "a padding node is masked out of the accept test but not out of the residual update: it counts as one "
           "more rejected sibling of the real node before it (an unused entry of a fixed-width sibling block)",
           "specverify (issue 30: faults on the padded slots of ragged trees)",
           "ragged trees with padding after a sibling run and stochastic siblings"),
    _entry("first_row_sibling_loop", M, sibling_walk(SiblingSteps(first_row_loop=True)),
           "the sibling loop of every slot runs as many times as the first row's slot has children; the accept test "
           "is masked per row, the residual update is not: rows whose tree differs from the first row's draw the "
           "correction from a residual updated for absent siblings",
           "specverify (issue 30: faults on rows whose tree shape differs from another row's)",
           "rows of one call with different tree shapes, stochastic siblings"),
    _entry("coin_per_sibling_rank", M, sibling_walk(SiblingSteps(rank_coin=True)),
           "a sibling is tested with the coin of its rank among its siblings (coins[b, s+1]) instead of its own: "
           "the coin that accepted a first child is reused to test that child's first child",
           "specverify (issue 30: one coin reused for two sibling tests)",
           "depth >= 2, stochastic siblings"),
    _entry("reversed_siblings", E, sibling_walk(SiblingSteps(reverse=True)),
           "siblings verified last to first: exchangeable under i.i.d. drafts, any order for top-k",
           "specverify", requires=IID_OR_TOPK),
    _entry("sglang_target_only", E, coin_walk(),
           "SGLang's coin-based target-only kernel with thresholds 1 (lossless for distinct children)",
           "sgl-project/sglang tree_speculative_sampling_target_only", requires=TOPK_OR_ANY),
    _entry("sample_and_match_any_mode", E, target_only(sibling_walk(SiblingSteps())),
           "target-only sample-and-match (y ~ p per slot, descend into a child holding y) whatever the drafting "
           "mode: the output law is exact on every tree; on stochastic drafts acceptance is below the declared "
           "mode's rule, so the law verdict passes and rule conformance fails", "specverify"),
)
# fmt: on
