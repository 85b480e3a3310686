"""Trees at small effect sizes (issue 30): varying layouts, and mutants that touch only some trees.

The new drafting options draw their layout per row and per round; the issue's mutants are
exact (the reference's output, coin for coin) on every tree that lacks their trigger, so a
kill is due to the trigger: a third sibling, padding after a sibling run, a row shaped
unlike the first, a second level of siblings.  Seeds are fixed.
"""

from __future__ import annotations

import pytest
import torch

from specverify import mutants
from specverify.core.errors import InvalidArgument
from specverify.mutants.tree import ghost_parents
from specverify.protocols.tree import PAD, ROOT, check_parents, draw_uniforms
from specverify.verifier.tree.drafting import TreeDrafting, draft_trees
from specverify.verifier.tree.scenarios import get_tree_scenarios
from specverify_reference.tree_rules import verify_tree_coins


def _trees(spec: TreeDrafting, b: int = 256, seed: int = 0):
    (scenario,) = get_tree_scenarios(["markov12_iid_overlap_6x1"])
    target, drafter = scenario.build()
    tctx = torch.arange(b) % target.num_contexts  # (b,)
    dctx = torch.arange(b) % drafter.num_contexts  # (b,)
    trees = draft_trees(target, drafter, spec, tctx, dctx, generator=torch.Generator().manual_seed(seed))
    slot_t = torch.cat([tctx[:, None], trees.target_contexts], 1)  # (b, N+1)
    slot_d = torch.cat([dctx[:, None], trees.draft_contexts], 1)  # (b, N+1)
    return trees, target.table32[slot_t], drafter.table32[slot_d]


def _compact(parents: torch.Tensor) -> list[int]:
    """One row's tree without its padding, nodes renumbered in order."""
    real = (parents != PAD).nonzero().flatten().tolist()
    new = {old: i for i, old in enumerate(real)}
    return [ROOT if int(parents[n]) == ROOT else new[int(parents[n])] for n in real]


def test_random_padding_moves_per_row_and_keeps_the_shape():
    spec = TreeDrafting("iid", (3, 2), pad_random=4)
    trees, _, _ = _trees(spec)
    check_parents(trees.parents)
    assert trees.parents.shape[1] == spec.num_nodes == 9 + 4
    assert ((trees.parents == PAD).sum(1) == 4).all()
    layouts = {tuple((p == PAD).tolist()) for p in trees.parents}
    assert len(layouts) > 100  # the layout is drawn per row
    template = spec.template_parents().tolist()
    assert all(_compact(p) == template for p in trees.parents)  # the real tree is the template
    again, _, _ = _trees(spec, seed=1)
    assert not torch.equal(again.parents, trees.parents)  # and per round (another draw of the generator)


def test_pruned_trees_differ_per_row_and_leave_padding_in_place():
    spec = TreeDrafting("iid", (3, 2), prune=0.3)
    trees, _, _ = _trees(spec)
    check_parents(trees.parents)
    template = TreeDrafting("iid", (3, 2)).template_parents()
    real = trees.parents != PAD
    assert torch.equal(trees.parents[real], template.expand_as(trees.parents)[real])  # padding in place
    assert len({tuple(p.tolist()) for p in trees.parents}) > 10
    assert 0.2 < float((~real[:, :3]).double().mean()) < 0.4  # root children pruned with probability 0.3
    assert spec.template_parents() is None  # no one shape: the accepted-depth law is not modelled
    assert (trees.tokens[~real] == 0).all() and (trees.target_contexts[~real] == 0).all()


def test_new_drafting_options_are_checked():
    with pytest.raises(InvalidArgument, match="pad_random"):
        TreeDrafting("iid", pad_random=-1)
    with pytest.raises(InvalidArgument, match="prune"):
        TreeDrafting("iid", prune=1.0)
    with pytest.raises(InvalidArgument, match="prune"):
        TreeDrafting("topk", dynamic=(2, 2, 2, 3), prune=0.5)
    assert "random places" in TreeDrafting("iid", pad_random=2).describe()
    assert "pruned" in TreeDrafting("iid", prune=0.5).describe()


def test_ghost_parents_borrow_the_parent_of_the_real_node_before():
    parents = torch.tensor([[PAD, ROOT, ROOT, PAD, 1, PAD, PAD]])
    assert ghost_parents(parents).tolist() == [[PAD, ROOT, ROOT, ROOT, 1, 1, 1]]


def _same_as_reference(name: str, spec: TreeDrafting, seed: int = 0) -> bool:
    trees, target_probs, draft_probs = _trees(spec, seed=seed)
    B, N = trees.parents.shape
    coins, final = draw_uniforms(B, N, generator=torch.Generator().manual_seed(seed))
    args = (target_probs, draft_probs, trees.tokens, trees.parents)
    got = mutants.by_name(name).fn.kernel(*args, mode="iid", coins=coins, final_coins=final)
    want = verify_tree_coins(*args, mode="iid", coins=coins, final_coins=final)
    return all(torch.equal(a, b) for a, b in zip(got, want))


@pytest.mark.parametrize(
    "name, untouched, touched",
    [
        ("late_residual_unnormalised", TreeDrafting("iid", (2, 2)), TreeDrafting("iid", (6,))),
        ("padding_counted_as_sibling", TreeDrafting("iid", (3, 2)), TreeDrafting("iid", (3, 2), prune=0.3)),
        ("first_row_sibling_loop", TreeDrafting("iid", (3, 2), pad_every=2), TreeDrafting("iid", (3, 2), prune=0.3)),
        ("coin_per_sibling_rank", TreeDrafting("iid", (6,)), TreeDrafting("iid", (3, 2))),
    ],
)
def test_issue_30_mutants_touch_only_their_trigger(name, untouched, touched):
    """Coin for coin the reference's output without the trigger; not with it."""
    assert _same_as_reference(name, untouched)
    assert not _same_as_reference(name, touched)
