"""Medusa's typical acceptance on a tree (``specverify.adapters.medusa.tree``) and its reference walk.

Engine-free tests (always run) check the adapter's validation and layout with a stand-in
``evaluate_posterior`` (Medusa's formula, written here), the reference walk
(``reference.lossy.typical_tree_walk``) on hand-built trees, and the tree sweep
(``specverify.measure.sweep.sweep(kind="tree")``).  The tests marked ``needs_medusa`` drive
the real package (``pip install --no-deps medusa-llm``) and skip cleanly without it: the
layout against ``generate_medusa_buffers``, exact agreement of the walk with the reference on
random trees, the final token's law, Medusa's sparse-tree padding, and (slow) the CLI.
"""

from __future__ import annotations

import functools

import pytest
import torch
from _adapter_trees import TREE
from _medusa import medusa_formula

from specverify.adapters.medusa import chain as chain_adapter
from specverify.adapters.medusa import tree as adapter
from specverify.core.errors import ImplementationError, InvalidArgument
from specverify.protocols.tree import PAD, TreeBatch, check_tree_output
from specverify_reference import lossy

try:
    import medusa.model.utils  # noqa: F401

    HAVE_MEDUSA = True
except ImportError:
    HAVE_MEDUSA = False

needs_medusa = pytest.mark.skipif(not HAVE_MEDUSA, reason=f"medusa-llm not installed ({adapter.INSTALL})")
ALPHA = 1e-6
OFFSET = adapter.ENTROPY_OFFSET


def _stand_in(monkeypatch, calls=None, fn=medusa_formula):
    def evaluate_posterior(logits, candidates, *args):
        if calls is not None:
            calls.append((logits.clone(), candidates.clone()))
        return fn(logits, candidates, *args)

    monkeypatch.setattr(adapter, "_load_evaluate_posterior", lambda: evaluate_posterior)


def _random_trees(B: int, N: int, V: int, seed: int, *, pad: float = 0.15):
    """Random parent arrays (B, N) with padding, sharp random target rows (B, N+1, V) float32, tokens (B, N)."""
    g = torch.Generator().manual_seed(seed)
    parents = torch.full((B, N), -1, dtype=torch.long)
    for n in range(1, N):
        parents[:, n] = torch.randint(-1, n, (B,), generator=g)
    padded = torch.rand(B, N, generator=g) < pad
    for n in range(N):
        parents[:, n] = torch.where(padded[:, n], PAD, parents[:, n])
        parents[:, n + 1 :] = torch.where((parents[:, n + 1 :] == n) & padded[:, n : n + 1], -1, parents[:, n + 1 :])
    target = torch.rand(B, N + 1, V, generator=g) ** 4
    target = (target / target.sum(-1, keepdim=True)).float()
    tokens = torch.randint(0, V, (B, N), generator=g)
    return target, tokens, parents


def _assert_agrees(v, target, tokens, parents, seed=7):
    """The adapter's outputs equal the reference's on every row whose decisions are not within 1e-5 of a boundary."""
    out = v.verify_tree(target, None, tokens, parents, mode="topk", generator=torch.Generator().manual_seed(seed))
    options = dict(eps=v.posterior_threshold, delta=v.posterior_alpha, entropy_offset=OFFSET)
    walk = lossy.typical_tree_walk(target, tokens, parents, **options)
    ref = lossy.typical_tree_verify(target, None, tokens, parents, mode="any", next_token=v.next_token, walk=walk,
                                    generator=torch.Generator().manual_seed(seed), **options)  # fmt: skip
    ambiguous = walk[3]
    check_tree_output(out, TreeBatch(target, None, tokens, parents, "topk"))
    width = torch.arange(out[0].shape[1])[None] < out[1][:, None]
    same = (out[1] == ref[1]) & (out[2] == ref[2]).all(-1) & ((out[0] == ref[0]) | ~width).all(-1)
    bad = ~same & ~ambiguous
    assert not bool(bad.any()), f"{int(bad.sum())} rows differ from the reference walk, first {int(bad.nonzero()[0])}"
    assert float(ambiguous.float().mean()) < 0.01
    return out


# --------------------------------------------------------------------------- engine-free


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(posterior_threshold=0), "posterior_threshold"),
        (dict(posterior_alpha="x"), "posterior_alpha"),
        (dict(temperature=float("inf")), "temperature"),
        (dict(next_token="nucleus"), "next_token"),
        (dict(padding="none"), "padding"),
        (dict(dtype="int64"), "dtype"),
        (dict(num_threads=0), "num_threads"),
    ],
)
def test_bad_options_name_the_argument(monkeypatch, kwargs, match):
    _stand_in(monkeypatch)
    with pytest.raises(InvalidArgument, match=match):
        adapter.MedusaTreeVerifier(**kwargs)


def test_the_package_serves_the_chain_and_tree_names():
    """``specverify.adapters.medusa:MedusaTreeVerifier`` (what the reports record) is the tree module's."""
    import specverify.adapters.medusa as package

    assert package.MedusaTreeVerifier is adapter.MedusaTreeVerifier
    assert package.typical_tree_verifier is adapter.typical_tree_verifier
    assert package.typical_verifier is chain_adapter.typical_verifier


def test_reference_walk_on_a_hand_built_tree():
    V = 4
    target = torch.full((1, 8, V), 0.25)
    target[0, 0] = torch.tensor([0.5, 0.4, 0.05, 0.05])  # root: nodes 0 (token 0) and 1 (token 1) pass, 2 fails
    target[0, 1] = torch.tensor([0.05, 0.05, 0.05, 0.85])  # node 0: node 3 (token 3) passes, node 4 (token 2) fails
    target[0, 2] = torch.tensor([0.9, 0.04, 0.03, 0.03])  # node 1: node 5 (token 0) passes
    tokens = torch.tensor([[0, 1, 2, 3, 2, 0, 1]])
    path, depth, slot, ambiguous = lossy.typical_tree_walk(target, tokens, TREE[None], entropy_offset=OFFSET)
    # depth 2 is reached by nodes 3 (log 0.5 + log 0.85) and 5 (log 0.4 + log 0.9): node 5 is less likely
    assert path.tolist() == [[0, 3]] and depth.tolist() == [2] and slot.tolist() == [4] and not bool(ambiguous)
    strict = lossy.typical_tree_walk(target, tokens, TREE[None], eps=0.6, delta=10.0, entropy_offset=OFFSET)
    assert strict[1].tolist() == [0] and strict[2].tolist() == [0] and strict[0].tolist() == [[-1, -1]]


def test_reference_walk_breaks_exact_ties_by_the_first_path():
    target = torch.full((1, 4, 2), 0.5)
    tokens = torch.tensor([[0, 0, 1]])  # nodes 0 and 1 carry the same token: equal likelihood
    parents = torch.tensor([[-1, -1, 1]])  # node 2 under node 1: the deeper path wins first
    path, _, _, ambiguous = lossy.typical_tree_walk(target, tokens, parents, eps=0.4)
    assert path.tolist() == [[1, 2]] and not ambiguous.any()  # no tie at the deepest level
    parents = torch.tensor([[-1, -1, PAD]])
    path, _, _, ambiguous = lossy.typical_tree_walk(target, tokens, parents, eps=0.4)
    assert path.tolist() == [[0]] and not ambiguous.any()  # equal values of one parent row


def test_reference_walk_flags_exact_ties_from_different_rows():
    # paths [0, 2] and [1, 3] tie exactly in float64, but their second tokens are read from two
    # parent rows that differ (elsewhere than at those tokens): an implementation recomputing the
    # likelihoods from each row (Medusa: softmax of logits in float32) may break the tie either way
    target = torch.tensor([[[0.5, 0.5, 0.0], [0.6, 0.2, 0.2], [0.6, 0.3, 0.1], [1 / 3] * 3, [1 / 3] * 3]])
    tokens = torch.tensor([[0, 1, 0, 0]])
    parents = torch.tensor([[-1, -1, 0, 1]])
    path, _, _, ambiguous = lossy.typical_tree_walk(target, tokens, parents, eps=0.05)
    assert path.tolist() == [[0, 2]] and ambiguous.tolist() == [True]
    target[0, 2] = target[0, 1]  # identical parent rows: every implementation computes the same tie
    path, _, _, ambiguous = lossy.typical_tree_walk(target, tokens, parents, eps=0.05)
    assert path.tolist() == [[0, 2]] and ambiguous.tolist() == [False]


@pytest.mark.parametrize("next_token", ["typical", "greedy"])
def test_reference_verify_reuses_a_given_walk(next_token):
    target, tokens, parents = _random_trees(200, 8, 6, seed=6)
    rule = dict(eps=0.05, delta=0.5, entropy_offset=OFFSET)
    walk = lossy.typical_tree_walk(target, tokens, parents, **rule)
    own = lossy.typical_tree_verify(target, None, tokens, parents, mode="any", next_token=next_token,
                                    generator=torch.Generator().manual_seed(1), **rule)  # fmt: skip
    given = lossy.typical_tree_verify(target, None, tokens, parents, mode="any", next_token=next_token, walk=walk,
                                      generator=torch.Generator().manual_seed(1), **rule)  # fmt: skip
    assert all(torch.equal(a, b) for a, b in zip(own, given))
    assert 0 < float(own[1].float().mean()) - 1 < 4  # both short and deep walks occur


@pytest.mark.parametrize("padding", adapter.PADDING)
def test_layout_with_a_stand_in(monkeypatch, padding):
    calls = []
    _stand_in(monkeypatch, calls, fn=lambda *args: (torch.tensor(0), torch.tensor(0)))  # the inputs are checked here
    v = adapter.MedusaTreeVerifier(padding=padding)
    target, tokens, _ = _random_trees(3, 7, 5, seed=1)
    # 4, 2 and 1 paths: the batch pads rows with fewer paths with all -1 rows, dropped per row
    parents = torch.stack([TREE, torch.tensor([-1, -1, 0, PAD, PAD, PAD, PAD]), torch.full((7,), PAD)])
    tokens[0] = torch.tensor([1, 2, 3, 4, 0, 1, 2])
    v.verify_tree(target, None, tokens, parents, mode="topk", generator=torch.Generator().manual_seed(0))
    logits, candidates = calls[0]
    assert candidates.shape == (4, 3) and logits.shape == (4, 3, 5 + (padding == "unreachable"))
    pad = 5 if padding == "unreachable" else 0
    assert candidates.tolist() == [[0, 1, 4], [0, 1, 0], [0, 2, 1], [0, 3, pad]]
    assert [c[1].shape[0] for c in calls] == [4, 2, 1]
    if padding == "unreachable":
        assert bool(torch.isinf(logits[..., -1]).all())
    slot = torch.tensor([[0, 1, 4], [0, 1, 5], [0, 2, 6], [0, 3, 7]])  # padded position -1 reads the last slot
    torch.testing.assert_close(logits[..., :5], target[0].log()[slot])


@pytest.mark.parametrize(
    "kwargs",
    [dict(), dict(posterior_threshold=0.3, posterior_alpha=0.9), dict(next_token="greedy", posterior_threshold=0.02)],
)
def test_stand_in_agrees_with_the_reference(monkeypatch, kwargs):
    _stand_in(monkeypatch)
    target, tokens, parents = _random_trees(400, 8, 6, seed=2)
    _assert_agrees(adapter.MedusaTreeVerifier(**kwargs), target, tokens, parents)


@pytest.mark.parametrize(
    "returned, match",
    [((torch.tensor(9), torch.tensor(1)), "best_candidate=9"), ((torch.tensor(0), torch.tensor(7)), "accept_length=7")],
)
def test_bad_outputs_are_implementation_errors(monkeypatch, returned, match):
    _stand_in(monkeypatch, fn=lambda *args: returned)
    v = adapter.MedusaTreeVerifier()
    target, tokens, _ = _random_trees(1, 7, 5, seed=3)
    with pytest.raises(ImplementationError, match=match):
        v.verify_tree(target, None, tokens, TREE[None], mode="any", generator=torch.Generator().manual_seed(0))


def test_raising_and_padding_overshoot_are_implementation_errors(monkeypatch):
    def boom(*args):
        raise RuntimeError("kaput")

    target, tokens, _ = _random_trees(1, 7, 5, seed=3)
    _stand_in(monkeypatch, fn=boom)
    with pytest.raises(ImplementationError, match="kaput"):
        adapter.MedusaTreeVerifier().verify_tree(target, None, tokens, TREE[None], mode="any",
                                                 generator=torch.Generator())  # fmt: skip
    _stand_in(monkeypatch, fn=lambda *args: (torch.tensor(3), torch.tensor(2)))  # path [0, 2, pad] has depth 1
    with pytest.raises(ImplementationError, match="padding token 0"):
        adapter.MedusaTreeVerifier(padding="medusa").verify_tree(target, None, tokens, TREE[None], mode="any",
                                                                 generator=torch.Generator())  # fmt: skip


def test_tree_sweep_with_the_reference_rule():
    from specverify.measure.sweep import sweep
    from specverify.report.sweep import render_sweep_markdown

    def make(eps):
        return functools.partial(lossy.typical_tree_verify, eps=eps, delta=0.3, entropy_offset=OFFSET)

    result = sweep(make, [0.01, 0.2], scenario="markov8_topk_3x2", kind="tree", batch_size=256, knob="eps")
    assert result.kind == "tree" and result.k == 2 and result.verdicts == (None, None)
    assert [s.stratum for s in result.points[0].measure.by_block] == ["depth=2", "depth=3"]  # depth 1 is abs=0
    assert result.points[0].measure.by_position[0].stratum == "abs=0"
    assert result.points[0].tokens_per_pass >= result.points[1].tokens_per_pass
    assert "max depth D=2" in render_sweep_markdown(result) and "D=2" in result.summary()
    with pytest.raises(InvalidArgument, match="kind"):
        sweep(make, [0.1], kind="forest")
    with pytest.raises(InvalidArgument, match="declared_law"):
        sweep(make, [0.1], kind="tree", declared_law=lambda value: None)


# --------------------------------------------------------------------------- with medusa-llm


@needs_medusa
def test_layout_matches_generate_medusa_buffers():
    from medusa.model.utils import generate_medusa_buffers

    from specverify.adapters.layouts import eagle_candidates, to_eagle

    buffers = generate_medusa_buffers([1, 2, 3], device="cpu")  # medusa-llm 0.1: a full 2 x 3 Cartesian tree
    mask = buffers["medusa_attn_mask"][0, 0]  # (N+1, N+1) position i attends to its ancestors
    N = mask.shape[0] - 1
    parents = torch.tensor([[int(mask[i, 1:i].nonzero().max()) if mask[i, 1:i].any() else -1 for i in range(1, N + 1)]])
    assert to_eagle(parents)[0].tolist() == buffers["retrieve_indices"].tolist()
    tree_candidates = torch.arange(100, 100 + N + 1)  # (N+1,) distinct stand-in tokens per position
    cart = eagle_candidates(tree_candidates[None, 1:], to_eagle(parents), root_tokens=tree_candidates[:1])
    assert cart[0].tolist() == tree_candidates[buffers["retrieve_indices"]].tolist()


@needs_medusa
@pytest.mark.parametrize(
    "kwargs",
    [
        dict(),
        dict(posterior_threshold=0.3, posterior_alpha=0.9),
        dict(posterior_threshold=0.01, posterior_alpha=0.05),
        dict(next_token="greedy"),
        dict(dtype="float64", temperature=0.7),
    ],
)
def test_medusa_walk_equals_the_reference(kwargs):
    target, tokens, parents = _random_trees(1500, 9, 8, seed=4)
    out = _assert_agrees(adapter.MedusaTreeVerifier(**kwargs), target, tokens, parents)
    assert 0 < float(out[1].float().mean()) - 1 < 4  # both short and deep walks occur


@needs_medusa
def test_final_token_law():
    from scipy import stats

    V, B = 6, 20000
    target, tokens, _ = _random_trees(1, 7, V, seed=5)
    v = adapter.MedusaTreeVerifier(posterior_threshold=0.05)
    expand = (target.expand(B, -1, -1), tokens.expand(B, -1), TREE[None].expand(B, -1))
    emitted, num, path = v.verify_tree(*expand[:1], None, *expand[1:], mode="topk",
                                       generator=torch.Generator().manual_seed(0))  # fmt: skip
    ref_path, depth, slot, _ = lossy.typical_tree_walk(target, tokens, TREE[None], eps=0.05, entropy_offset=OFFSET)
    assert bool((path == ref_path).all()) and bool((num == depth + 1).all())
    law = lossy.typical_truncate(target[0, int(slot)], eps=0.05, delta=0.3, entropy_offset=OFFSET)
    law = law / law.sum()
    final = emitted[torch.arange(B), num - 1]
    counts = torch.bincount(final, minlength=V).double()
    assert float(counts[law == 0].sum()) == 0
    keep = law > 0
    pvalue = stats.chisquare(counts[keep], law[keep] * B).pvalue
    assert pvalue > ALPHA, f"final token law: p = {pvalue:.3g}, counts {counts.tolist()} vs {(law * B).tolist()}"


@needs_medusa
def test_medusa_sparse_padding_accepts_token_zero_after_a_leaf():
    V = 4
    target = torch.full((1, 8, V), 0.25)
    target[0, 0] = torch.tensor([0.05, 0.05, 0.1, 0.8])  # only node 2 (token 3) passes at the root
    target[0, 3] = torch.tensor([0.97, 0.01, 0.01, 0.01])  # after leaf node 2, token 0 is nearly certain
    tokens = torch.tensor([[0, 1, 3, 0, 1, 2, 0]])
    generator = torch.Generator().manual_seed(0)
    out = adapter.MedusaTreeVerifier().verify_tree(target, None, tokens, TREE[None], mode="topk", generator=generator)
    assert out[2].tolist() == [[2, -1]] and out[1].tolist() == [2]
    with pytest.raises(ImplementationError, match="padding token 0"):
        adapter.MedusaTreeVerifier(padding="medusa").verify_tree(target, None, tokens, TREE[None], mode="topk",
                                                                 generator=generator)  # fmt: skip


@needs_medusa
def test_build_verifier_with_options():
    from specverify.cli.audit import build_verifier

    for name in ("specverify.adapters.medusa:typical_tree_verifier", "specverify.adapters.medusa:MedusaTreeVerifier"):
        verify_tree = build_verifier(name, {"posterior_threshold": 0.2}, role="tree_verifier")
        assert verify_tree.__self__.posterior_threshold == 0.2
    default = build_verifier("specverify.adapters.medusa:MedusaTreeVerifier", {}, role="tree_verifier")
    assert default.__self__.posterior_threshold == 0.09


@needs_medusa
@pytest.mark.slow
def test_cli_measure_tree_verifier(tmp_path, capsys):
    from specverify.cli.commands import main

    status = main([
        "measure", "--tree-verifier", "specverify.adapters.medusa:typical_tree_verifier",
        "--tree-verifier-option", "posterior_threshold=0.09", "--scenario", "markov8_dynamic_eagle2",
        "--out", str(tmp_path),
    ])  # fmt: skip
    assert status == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert "depth=2" in out and "abs=0" in out and "depth=1" not in out
