"""The tree-verifier protocol: input validation, depths and children, output validation, uniforms-in."""

from __future__ import annotations

import pytest
import torch
from _trees import FIXED_TREES, fixed_rows, tree_shapes
from hypothesis import given, settings

from specverify.core.errors import ImplementationError, InvalidArgument
from specverify.protocols.tree import (
    PAD,
    TreeBatch,
    call_tree_verifier,
    check_tree_output,
    children_table,
    draw_uniforms,
    node_depths,
    uniforms_in,
)
from specverify_reference.tree_rules import verify_tree, verify_tree_coins

V = 4


def make_batch(parents=None, mode="iid", B=2, seed=0) -> TreeBatch:
    parents = FIXED_TREES[0] if parents is None else parents
    N = parents.shape[0]
    target = fixed_rows(B * (N + 1), V, seed=seed).view(B, N + 1, V)
    draft = fixed_rows(B * (N + 1), V, seed=seed + 1).view(B, N + 1, V)
    tokens = torch.randint(0, V, (B, N), generator=torch.Generator().manual_seed(seed))
    return TreeBatch(target, draft, tokens, parents.expand(B, N), mode)


# --------------------------------------------------------------------------- inputs


def test_tree_batch_shape_depths_children():
    batch = make_batch()
    assert batch.shape == (2, 6, V)
    assert batch.depths()[0].tolist() == [1, 1, 2, 2, 2, 0]
    assert batch.max_depth() == 2
    children = batch.children()[0]  # (N+1, S)
    assert children[0].tolist()[:2] == [0, 1] and children[1].tolist()[:2] == [2, 3] and children[2, 0] == 4
    assert (children[3:] == -1).all()


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda a: a.update(mode="greedy"), "mode must be one of"),
        (lambda a: a.update(draft_probs=None), "draft_probs is None"),
        (lambda a: a.update(target_probs=a["target_probs"][:, :3]), "draft_probs must have shape (2, 3, 4)"),
        (lambda a: a.update(target_probs=a["target_probs"] * 2), "target_probs[0, 0] sums to 2"),
        (lambda a: a.update(draft_probs=a["draft_probs"][..., :3]), "draft_probs must have shape (2, 7, 4)"),
        (lambda a: a.update(tokens=a["tokens"].double()), "tokens must have an integer dtype"),
        (lambda a: a.update(tokens=a["tokens"] + 10), "outside the vocabulary [0, 4)"),
        (lambda a: a.update(parents=torch.tensor([[-1, 1, 0, 0, 1, -2]] * 2)), "parents[0, 1] is 1"),
        (lambda a: a.update(parents=torch.tensor([[-1, -1, 0, -2, 3, -2]] * 2)), "a padding node"),
        (lambda a: a.update(parents=torch.tensor([[-3, -1, 0, 0, 1, -2]] * 2)), "parents[0, 0] is -3"),
    ],
)
def test_bad_inputs_raise_naming_the_argument(change, message):
    good = make_batch()
    args = dict(
        target_probs=good.target_probs,
        draft_probs=good.draft_probs,
        tokens=good.tokens,
        parents=good.parents,
        mode=good.mode,
    )
    change(args)
    with pytest.raises(InvalidArgument) as info:
        TreeBatch(**args)
    assert message in str(info.value), str(info.value)


def test_padding_tokens_are_not_checked_and_draft_optional_for_target_only():
    batch = make_batch()
    tokens = batch.tokens.clone()
    tokens[:, 5] = -1  # node 5 is padding
    TreeBatch(batch.target_probs, None, tokens, batch.parents, "topk")
    TreeBatch(batch.target_probs, None, tokens, batch.parents, "any")


@settings(max_examples=60, deadline=None)
@given(parents=tree_shapes(max_nodes=9))
def test_depths_and_children_agree_with_a_walk(parents):
    N = parents.shape[0]
    depth = node_depths(parents[None])[0].tolist()
    children = children_table(parents[None])[0]  # (N+1, S)
    for n in range(N):
        if parents[n] == PAD:
            assert depth[n] == 0 and not (children == n).any()
            continue
        d, node = 0, n
        while node != -1:
            d, node = d + 1, int(parents[node])
        assert depth[n] == d
        siblings = [j for j in range(N) if parents[j] == parents[n]]
        assert children[int(parents[n]) + 1, : len(siblings)].tolist() == siblings


# --------------------------------------------------------------------------- outputs


def good_output(batch):
    return verify_tree(
        batch.target_probs,
        batch.draft_probs,
        batch.tokens,
        batch.parents,
        mode=batch.mode,
        generator=torch.Generator().manual_seed(3),
    )


@pytest.mark.parametrize(
    "corrupt, message",
    [
        (lambda e, n, p: (e, n), "must return (emitted, num_emitted, path)"),
        (lambda e, n, p: (e.double(), n, p), "dtype torch.float64"),
        (lambda e, n, p: (e[:, :-1], n, p), "emitted of shape"),
        (lambda e, n, p: (e, n * 0, p), "num_emitted = 0 outside"),
        (lambda e, n, p: (e, n.clamp(max=1), p.clone().fill_(1)), "must be -1"),
        (lambda e, n, p: (e, torch.full_like(n, 2), torch.tensor([[2, -1], [2, -1]])), "is not a child of the root"),
        (lambda e, n, p: (e, torch.full_like(n, 2), torch.tensor([[5, -1], [5, -1]])), "is not a child of the root"),
        (lambda e, n, p: (e, torch.full_like(n, 3), torch.tensor([[0, 4], [0, 4]])), "its parent is node 1"),
        (lambda e, n, p: (e, torch.full_like(n, 2), torch.tensor([[7, -1], [7, -1]])), "not a node index"),
        (lambda e, n, p: (e.clone().fill_(V), torch.ones_like(n), p.clone().fill_(-1)), "outside the vocabulary"),
    ],
)
def test_output_violations_are_implementation_errors(corrupt, message):
    batch = make_batch()
    emitted, num_emitted, path = good_output(batch)
    check_tree_output((emitted, num_emitted, path), batch)
    with pytest.raises(ImplementationError) as info:
        check_tree_output(corrupt(emitted, num_emitted, path), batch)
    assert message in str(info.value), str(info.value)


def test_emitted_tokens_must_be_the_path_tokens():
    batch = make_batch()
    emitted = torch.zeros(2, 3, dtype=torch.long)
    emitted[:, 0] = batch.tokens[:, 0] + 1
    with pytest.raises(ImplementationError, match="differs from the token"):
        check_tree_output((emitted, torch.full((2,), 2), torch.tensor([[0, -1], [0, -1]])), batch)


def test_call_tree_verifier_wraps_exceptions_and_leaves_inputs_alone():
    batch = make_batch(mode="wor")
    draft_before = batch.draft_probs.clone()

    def scribbles(target_probs, draft_probs, tokens, parents, *, mode, generator):
        draft_probs.zero_()  # as SGLang's kernels write into draft_probs
        return good_output(batch)

    out = call_tree_verifier(scribbles, batch, generator=torch.Generator().manual_seed(0))
    assert torch.equal(batch.draft_probs, draft_before) and out.path.shape == (2, 2)

    def broken(*args, **kwargs):
        raise RuntimeError("CUDA error: device-side assert")

    with pytest.raises(ImplementationError, match="raised RuntimeError: CUDA error"):
        call_tree_verifier(broken, batch, generator=torch.Generator().manual_seed(0))


# --------------------------------------------------------------------------- uniforms in


@pytest.mark.parametrize("mode", ["iid", "wor", "topk", "any"])
def test_uniforms_in_reproduces_the_reference(mode):
    batch = make_batch(FIXED_TREES[1], mode=mode, B=64, seed=5)
    args = (batch.target_probs, batch.draft_probs, batch.tokens, batch.parents)
    wrapped = uniforms_in(verify_tree_coins)
    a = wrapped(*args, mode=mode, generator=torch.Generator().manual_seed(11))
    b = verify_tree(*args, mode=mode, generator=torch.Generator().manual_seed(11))
    c = wrapped(*args, mode=mode, generator=torch.Generator().manual_seed(11))
    for x, y, z in zip(a, b, c):
        assert torch.equal(x, y) and torch.equal(x, z)
    assert wrapped.kernel is verify_tree_coins
    coins, final = draw_uniforms(64, 6, generator=torch.Generator().manual_seed(11))
    assert coins.shape == (64, 7) and final.shape == (64,) and coins.dtype == torch.float64


def test_uniforms_in_validates():
    with pytest.raises(InvalidArgument, match="kernel must be callable"):
        uniforms_in(3)
    batch = make_batch()
    with pytest.raises(InvalidArgument, match="generator must be a torch.Generator"):
        uniforms_in(verify_tree_coins)(
            batch.target_probs, batch.draft_probs, batch.tokens, batch.parents, mode="iid", generator=0
        )
