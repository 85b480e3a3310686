"""reference.tree_rules: the batched rules' empirical (path end, final token) law matches the exact law.

For fixed trees of tokens the joint law of (node where the walk stops, final token) under
each rule is ``specverify.verifier.tree.laws.conditional_round_law``; a ragged batch of
three trees (padding in different places) is verified many times and each tree's counts go
through a chi-square with bins of expected count >= 20 at alpha 1e-6 (12 p-values per run:
family-wise false alarms below 1.2e-5).  Any (node, token) pair of exact probability 0 that
is emitted is a support failure.  A planted wrong law is rejected by the same check.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from _strategies import pooled_chisquare
from _trees import FIXED_TREES, batch_of, fixed_rows, tree_shapes
from hypothesis import given, settings
from hypothesis import strategies as st

from specverify.core.errors import InvalidArgument
from specverify.protocols.tree import TreeBatch, check_tree_output
from specverify.verifier.tree.laws import conditional_round_law
from specverify_reference.tree_rules import verify_tree

ALPHA = 1e-6
V = 4


def fixed_trees(mode: str, seed: int):
    """Three trees of N = 6 nodes, rows with zeros; siblings carry the parent's most likely draft
    tokens in order (as a drafter would propose them), plus one duplicate sibling except under wor."""
    trees = []
    for t, parents in enumerate(FIXED_TREES):
        target = fixed_rows(7, V, seed=100 * seed + t)
        draft = fixed_rows(7, V, seed=100 * seed + t + 50)
        order = torch.sort(draft, dim=-1, descending=True, stable=True).indices  # (7, V)
        rank = [sum(1 for j in range(n) if parents[j] == parents[n]) for n in range(6)]
        tokens = torch.tensor(
            [int(order[int(parents[n]) + 1, rank[n] % V]) if parents[n] != -2 else 0 for n in range(6)]
        )
        if t == 2 and mode != "wor":
            tokens[1] = tokens[0]  # root children 0, 1, 2 with a repeated token
        trees.append((target, None if mode in ("topk", "any") else draft, tokens, parents))
    return trees


def joint_counts(out, num_slots: int) -> np.ndarray:
    """Counts of (end slot, final token) per row: (num_slots * V,)."""
    depth = out.num_emitted - 1  # (B,)
    if out.path.shape[1] == 0:  # no real node in the batch
        end = torch.zeros_like(depth)
    else:
        end = torch.where(depth > 0, out.path.gather(1, (depth - 1).clamp(min=0)[:, None]).squeeze(1) + 1, 0)  # (B,)
    final = out.emitted.gather(1, depth[:, None]).squeeze(1)  # (B,)
    return np.bincount((end * V + final).numpy(), minlength=num_slots * V).astype(np.float64)


def joint_pvalues(verifier, mode, trees, *, B, seed, rule=None):
    """Run ``verifier`` on a ragged batch of ``trees``; per tree (p-value, support failures)."""
    target, draft, tokens, parents, which = batch_of(B, *trees)
    batch = TreeBatch(target, draft, tokens, parents, mode)
    out = check_tree_output(
        verifier(target, draft, tokens, parents, mode=mode, generator=torch.Generator().manual_seed(seed)), batch
    )
    results = []
    for t, (tt, dd, tok, par) in enumerate(trees):
        rows = (which == t).nonzero().squeeze(-1)
        sub = type(out)(out.emitted[rows], out.num_emitted[rows], out.path[rows])
        counts = joint_counts(sub, tt.shape[0])
        law = (
            conditional_round_law(
                tt[None], None if dd is None else dd[None], tok[None], par[None], mode=mode, rule=rule
            )
            .stop[0]
            .flatten()
            .numpy()
        )
        failures = np.flatnonzero((law == 0) & (counts > 0)).tolist()
        _, pvalue, bins = pooled_chisquare(counts, law, e_min=20.0)
        results.append((pvalue, failures, bins))
    return results


@pytest.mark.parametrize("mode", ["iid", "wor", "topk", "any"])
def test_reference_rules_match_the_exact_conditional_law(mode):
    seed = 17
    results = joint_pvalues(verify_tree, mode, fixed_trees(mode, seed=1), B=60_000, seed=seed)
    for t, (pvalue, failures, bins) in enumerate(results):
        assert not failures, (
            f"{mode}, tree {t}: emitted (slot * V + token) cells of probability 0: {failures}; seed={seed}"
        )
        assert bins >= 2, f"{mode}, tree {t}: only {bins} bins"
        assert pvalue > ALPHA, (
            f"{mode}, tree {t}: joint (end node, final token) law differs from conditional_round_law: "
            f"p={pvalue:.3g}, bins={bins}, N=20000, seed={seed}"
        )


@pytest.mark.parametrize("rule", ["residual_not_carried", "residual_zero_only_rejected"])
def test_a_planted_wrong_law_is_rejected(rule):
    """The check has power: the reference iid rule is far from a wrong rule's law on these trees."""
    results = joint_pvalues(verify_tree, "iid", fixed_trees("iid", seed=1), B=60_000, seed=5, rule=rule)
    assert min(p for p, _, _ in results) < ALPHA, results


@settings(max_examples=8, deadline=None)
@given(
    parents=tree_shapes(min_nodes=1, max_nodes=6), mode=st.sampled_from(["iid", "wor", "topk", "any"]), data=st.data()
)
def test_random_trees_match_the_exact_law(parents, mode, data):
    seed = data.draw(st.integers(0, 2**32 - 1), label="seed")
    rng = np.random.default_rng(seed)
    N = parents.shape[0]
    target = fixed_rows(N + 1, V, seed=seed)
    draft = fixed_rows(N + 1, V, seed=seed + 1)
    tokens = torch.as_tensor(rng.integers(0, V, N))
    ((pvalue, failures, bins),) = joint_pvalues(
        verify_tree, mode, [(target, draft, tokens, parents)], B=20_000, seed=seed
    )
    assert not failures and pvalue > ALPHA, (pvalue, failures, bins, seed, parents.tolist())


# --------------------------------------------------------------------------- corners


def test_equal_laws_accept_the_first_child_and_point_masses():
    target = torch.tensor([[[0.0, 1.0, 0.0], [0.2, 0.3, 0.5], [0.2, 0.3, 0.5]]], dtype=torch.float64)  # (1, 3, 3)
    tokens, parents = torch.tensor([[2, 1]]), torch.tensor([[-1, -1]])
    gen = torch.Generator().manual_seed(0)
    for mode in ("iid", "wor", "topk", "any"):
        emitted, num, path = verify_tree(
            target.expand(50, 3, 3),
            target.expand(50, 3, 3),
            tokens.expand(50, 2),
            parents.expand(50, 2),
            mode=mode,
            generator=gen,
        )
        # p = q is a point mass on token 1: child 0 (token 2) always rejected, child 1 always accepted
        assert (path[:, 0] == 1).all() and (emitted[:, 0] == 1).all() and (num == 2).all()


def test_draft_on_target_zeros_is_never_accepted():
    target = torch.tensor([[0.5, 0.5, 0.0]] * 3, dtype=torch.float64)[None].expand(2000, 3, 3)
    draft = torch.tensor([[0.0, 0.0, 1.0]] * 3, dtype=torch.float64)[None].expand(2000, 3, 3)
    tokens, parents = torch.tensor([[2, 2]]).expand(2000, 2), torch.tensor([[-1, -1]]).expand(2000, 2)
    for mode in ("iid", "wor", "topk", "any"):
        emitted, num, _ = verify_tree(
            target, draft, tokens, parents, mode=mode, generator=torch.Generator().manual_seed(1)
        )
        assert (num == 1).all() and (emitted[:, 0] != 2).all()


def test_same_seed_same_output_and_bad_input():
    trees = fixed_trees("wor", seed=2)
    target, draft, tokens, parents, _ = batch_of(30, *trees)
    a = verify_tree(target, draft, tokens, parents, mode="wor", generator=torch.Generator().manual_seed(9))
    b = verify_tree(target, draft, tokens, parents, mode="wor", generator=torch.Generator().manual_seed(9))
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    batch = TreeBatch(target.float(), draft.float(), tokens.int(), parents.int(), "wor")  # float32 / int32 inputs
    out = verify_tree(
        batch.target_probs,
        batch.draft_probs,
        batch.tokens,
        batch.parents,
        mode="wor",
        generator=torch.Generator().manual_seed(9),
    )
    check_tree_output(out, batch)
    with pytest.raises(InvalidArgument, match="draft_probs is None"):
        verify_tree(target, None, tokens, parents, mode="iid", generator=torch.Generator())
    with pytest.raises(InvalidArgument, match="generator must be a torch.Generator"):
        verify_tree(target, draft, tokens, parents, mode="iid", generator=None)


@pytest.mark.parametrize("mode", ["iid", "wor"])
def test_residual_of_mass_zero_falls_back_to_r(mode):
    """p == q and a (dishonest) child outside both supports: rejected, (r - q)+ = 0, the final draw uses r."""
    row = torch.tensor([0.5, 0.3, 0.2, 0.0], dtype=torch.float64)
    target = row.expand(3, V).clone()
    tree = (target, target.clone(), torch.tensor([3, 3]), torch.tensor([-1, -1]))
    ((pvalue, failures, bins),) = joint_pvalues(verify_tree, mode, [tree], B=20_000, seed=8)
    assert not failures and bins >= 2 and pvalue > ALPHA, (pvalue, failures, bins)
