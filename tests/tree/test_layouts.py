"""Layout converters: SGLang's retrive_* linked lists and EAGLE's retrieve_indices, both ways.

Round trips (parents -> layout -> parents) over random trees with padding; known layouts
written out by hand from the engines' conventions; the SGLang kernel adapter driven end to
end through ``uniforms_in`` with a Python model of the target-only kernel's documented
behaviour (``speculative_sampling.cuh``), checked against the exact law.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from _strategies import pooled_chisquare
from _trees import FIXED_TREES, fixed_rows, tree_shapes
from hypothesis import given, settings
from hypothesis import strategies as st

from specverify.adapters.layouts import (
    eagle_candidates,
    from_eagle,
    from_eagle_outputs,
    from_sglang,
    from_sglang_outputs,
    sglang_candidates,
    sglang_target_only_kernel,
    to_eagle,
    to_sglang,
)
from specverify.core.errors import InvalidArgument
from specverify.protocols.tree import PAD, TreeBatch, check_tree_output, uniforms_in
from specverify.verifier.tree.laws import conditional_round_law
from specverify_reference.tree_rules import verify_tree

ALPHA = 1e-6


@st.composite
def batches_of_shapes(draw, max_nodes=8):
    N = draw(st.integers(0, max_nodes))
    B = draw(st.integers(1, 3))
    return (
        torch.stack([draw(tree_shapes(min_nodes=N, max_nodes=N)) for _ in range(B)]) if N else torch.zeros(B, 0).long()
    )


@settings(max_examples=80, deadline=None)
@given(parents=batches_of_shapes())
def test_sglang_round_trip(parents):
    layout = to_sglang(parents)
    B, N = parents.shape
    assert layout.retrive_index.tolist() == torch.arange(B * (N + 1)).view(B, N + 1).tolist()
    assert torch.equal(from_sglang(layout.retrive_next_token, layout.retrive_next_sibling), parents)


@settings(max_examples=80, deadline=None)
@given(parents=batches_of_shapes())
def test_eagle_round_trip(parents):
    B, N = parents.shape
    ri = to_eagle(parents)
    assert torch.equal(from_eagle(ri, num_nodes=N), parents)
    for b in range(B):
        rows = [r for r in ri[b].tolist() if r[0] == 0]
        key = [[i if i >= 0 else 10**6 for i in r] for r in rows]
        assert key == sorted(key)  # generate_tree_buffers' order


def test_sglang_known_layout():
    # root -> nodes 0, 1; node 0 -> nodes 2, 3; node 1 -> node 4; node 5 padding.
    layout = to_sglang(FIXED_TREES[0][None])
    assert layout.retrive_next_token.tolist() == [[1, 3, 5, -1, -1, -1, -1]]
    assert layout.retrive_next_sibling.tolist() == [[-1, 2, -1, 4, -1, -1, -1]]
    tokens = torch.tensor([[7, 8, 9, 10, 11, -1]])
    assert sglang_candidates(tokens, FIXED_TREES[0][None], torch.tensor([3])).tolist() == [[3, 7, 8, 9, 10, 11, 0]]


def test_eagle_known_layout():
    ri = to_eagle(FIXED_TREES[0][None])
    assert ri.tolist() == [[[0, 1, 3], [0, 1, 4], [0, 2, 5]]]
    tokens = torch.tensor([[7, 8, 9, 10, 11, 12]])
    assert eagle_candidates(tokens, ri, torch.tensor([3])).tolist() == [[[3, 7, 9], [3, 7, 10], [3, 8, 11]]]
    ragged = to_eagle(torch.stack([FIXED_TREES[0], torch.tensor([-1, -2, -2, -2, -2, -2])]))
    assert ragged[1].tolist() == [[0, 1, -1], [-1, -1, -1], [-1, -1, -1]]  # padded with all -1 rows
    # an EAGLE-1 style buffer whose paths end at different depths
    assert from_eagle(torch.tensor([[0, 1, 3, 5], [0, 1, 4, -1], [0, 2, -1, -1]])).tolist() == [[-1, -1, 0, 0, 2]]


@pytest.mark.parametrize(
    "next_token, next_sibling, message",
    [
        ([[1, -1, -1]], [[-1, 1, -1]], "reached twice"),
        ([[2, -1, -1]], [[-1, -1, 1]], "increasing slot order"),
        ([[1, -1, 4]], [[-1, -1, -1]], "links must be -1 or a slot"),
        ([[2, -1, 1]], [[-1, -1, -1]], "children must come after their parent"),
    ],
)
def test_from_sglang_rejects_bad_links(next_token, next_sibling, message):
    with pytest.raises(InvalidArgument, match=message):
        from_sglang(torch.tensor(next_token), torch.tensor(next_sibling))


@pytest.mark.parametrize(
    "ri, message",
    [
        ([[1, 2]], "not the root position 0"),
        ([[0, -1, 2]], "is not \\[0, positions"),
        ([[0, 2, 1]], "children must come after their parent"),
        ([[0, 1, 3], [0, 2, 3]], "two different parents"),
    ],
)
def test_from_eagle_rejects_bad_paths(ri, message):
    with pytest.raises(InvalidArgument, match=message):
        from_eagle(torch.tensor(ri))


def test_outputs_convert_to_the_protocol():
    parents = torch.stack([FIXED_TREES[0], FIXED_TREES[0]])  # N = 6, D = 2
    tokens = torch.tensor([[7, 8, 9, 10, 11, 0], [7, 8, 9, 10, 11, 0]])
    target = fixed_rows(14, 12, seed=0).view(2, 7, 12)
    batch = TreeBatch(target, None, tokens, parents, "any")
    # row 0 accepted node 1 (slot 2) then node 4 (slot 5), then emitted 6; row 1 accepted nothing, emitted 2.
    predicts = torch.zeros(14, dtype=torch.int32)
    predicts[0], predicts[2], predicts[5] = 8, 11, 6
    predicts[7] = 2
    accept_index = torch.tensor([[0, 2, 5], [7, -1, -1]], dtype=torch.int32)
    out = from_sglang_outputs(predicts, accept_index, torch.tensor([2, 0]), num_nodes=6, max_depth=2)
    checked = check_tree_output(out, batch)
    assert checked.path.tolist() == [[1, 4], [-1, -1]] and checked.num_emitted.tolist() == [3, 1]
    assert checked.emitted[0].tolist() == [8, 11, 6] and checked.emitted[1, 0] == 2
    ri = to_eagle(parents)
    out = from_eagle_outputs(ri, torch.tensor([2, 0]), torch.tensor([2, 0]), torch.tensor([6, 2]), tokens)
    checked = check_tree_output(out, batch)
    assert checked.path.tolist() == [[1, 4], [-1, -1]] and checked.emitted[0].tolist() == [8, 11, 6]


# --------------------------------------------------------------------------- the SGLang adapter end to end


def model_of_sglang_target_only(
    predicts,
    accept_index,
    accept_token_num,
    candidates,
    retrive_index,
    retrive_next_token,
    retrive_next_sibling,
    uniform_samples,
    uniform_samples_for_final_sampling,
    target_probs,
    *,
    threshold_single,
    threshold_acc,
    deterministic,
):
    """A slow Python model of the documented kernel behaviour (one coin per expanded slot,
    accept sibling i iff coin <= cumulative p of the siblings tried so far, final draw from p
    minus the rejected siblings' mass), written for this test from the kernel's description."""
    B, N1 = candidates.shape
    steps = accept_index.shape[1]
    for b in range(B):
        slot, coin, acc, count = 0, float(uniform_samples[b, 0]), 0.0, 0
        last = int(retrive_index[b, 0])
        accept_index[b, 0] = last
        rejected = torch.zeros(target_probs.shape[-1], dtype=torch.float64)
        for _ in range(1, steps):
            child = int(retrive_next_token[b, slot])
            while child != -1:
                x = int(candidates[b, child])
                px = float(target_probs[b, slot, x])
                acc += px
                if coin <= acc / threshold_acc or px >= threshold_single:
                    predicts[last] = x
                    count += 1
                    last = int(retrive_index[b, child])
                    accept_index[b, count] = last
                    slot, coin, acc = child, float(uniform_samples[b, child]), 0.0
                    rejected.zero_()
                    break
                rejected[x] = px
                child = int(retrive_next_sibling[b, child])
            if child == -1:
                break
        accept_token_num[b] = count
        weights = (target_probs[b, slot].double() - rejected).clamp_min(0.0)
        cdf = weights.cumsum(0)
        u = float(uniform_samples_for_final_sampling[b]) * float(cdf[-1])
        predicts[last] = int((cdf <= u).sum().clamp(max=weights.shape[0] - 1))


def test_sglang_adapter_end_to_end_matches_the_exact_target_only_law():
    V, B, seed = 5, 12_000, 2024
    parents = FIXED_TREES[1]  # padding in the middle, depth 3
    tokens = torch.tensor([0, 0, 1, 2, 2, 3])  # distinct siblings (required by this kernel's rule)
    target = fixed_rows(7, V, seed=seed)
    verify = uniforms_in(sglang_target_only_kernel(model_of_sglang_target_only, prob_dtype=torch.float64))
    batch = TreeBatch(target.expand(B, 7, V), None, tokens.expand(B, 6), parents.expand(B, 6), "any")
    out = check_tree_output(
        verify(
            batch.target_probs,
            None,
            batch.tokens,
            batch.parents,
            mode="any",
            generator=torch.Generator().manual_seed(seed),
        ),
        batch,
    )
    law = conditional_round_law(target[None], None, tokens[None], parents[None], mode="any").stop[0]  # (N+1, V)
    end = torch.where(
        out.num_emitted > 1, out.path.gather(1, (out.num_emitted - 2).clamp(min=0)[:, None]).squeeze(1) + 1, 0
    )
    final = out.emitted.gather(1, (out.num_emitted - 1)[:, None]).squeeze(1)
    counts = np.bincount((end * V + final).numpy(), minlength=7 * V)
    expected = law.flatten().numpy()
    assert not (counts[expected == 0] > 0).any(), "the kernel emitted a (node, token) pair of probability 0"
    _, pvalue, bins = pooled_chisquare(counts, expected, e_min=20.0)
    assert bins >= 4 and pvalue > ALPHA, f"SGLang-adapter joint law differs: p={pvalue:.3g}, bins={bins}, seed={seed}"
    # the reference sample-and-match has the same law (different coins, so different draws)
    ref = verify_tree(
        target.expand(B, 7, V),
        None,
        tokens.expand(B, 6),
        parents.expand(B, 6),
        mode="any",
        generator=torch.Generator().manual_seed(seed),
    )
    assert ref[1].float().mean().sub(out.num_emitted.float().mean()).abs() < 0.05
    assert (parents == PAD).any()
