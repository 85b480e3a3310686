"""EAGLE's tree verification (``eagle.model.utils`` of ``eagle-llm`` 1.2.1) behind the tree-verifier protocol.

Engine-free tests (always run) check the adapter's argument validation, the drafter's
without-replacement conditionals, the ``p_indices`` / ``b_indices`` it builds, the seeding of
the global random streams and the plumbing with a stand-in for EAGLE's module.  The tests
marked ``needs_eagle`` drive the real package (``pip install --no-deps eagle-llm==1.2.1``)
and skip cleanly without it: layouts against ``generate_tree_buffers``, the output law on
small trees, the known raw-logits final token, greedy, and (slow) the tree battery.
"""

from __future__ import annotations

import random
import sys
from types import SimpleNamespace

import pytest
import torch
from _adapter_trees import TREE
from _strategies import pooled_chisquare

from specverify.adapters.eagle import tree as adapter
from specverify.adapters.layouts import from_eagle, to_eagle
from specverify.core.errors import InvalidArgument
from specverify.protocols.tree import TreeBatch, check_tree_output

try:
    import eagle.model.utils  # noqa: F401

    HAVE_EAGLE = True
except ImportError:
    HAVE_EAGLE = False

needs_eagle = pytest.mark.skipif(not HAVE_EAGLE, reason=f"eagle-llm not installed ({adapter.INSTALL})")
ALPHA = 1e-6


# --------------------------------------------------------------------------- engine-free


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(temperature=-1), "temperature"),
        (dict(temperature="hot"), "temperature"),
        (dict(temperature=float("inf")), "temperature"),
        (dict(top_p=1.5), "top_p"),
        (dict(top_k=-1), "top_k"),
        (dict(top_k=2.5), "top_k"),
        (dict(patch_final="yes"), "patch_final"),
        (dict(check_processor=1), "check_processor"),
        (dict(num_threads=0), "num_threads"),
    ],
)
def test_bad_arguments_name_the_argument(kwargs, match):
    with pytest.raises(InvalidArgument, match=match):
        adapter.EagleTreeVerifier(**kwargs)


def test_missing_package_names_the_install_line(monkeypatch):
    for name in ("eagle", "eagle.model", "eagle.model.utils"):
        monkeypatch.setitem(sys.modules, name, None)
    with pytest.raises(ImportError, match="pip install --no-deps eagle-llm==1.2.1"):
        adapter.EagleTreeVerifier()


def test_wor_conditionals_follow_eagles_sample_formula():
    V = 4
    q = torch.zeros(1, 8, V)
    q[0, 0] = torch.tensor([0.5, 0.3, 0.2, 0.0])  # root: children 0, 1, 2 with tokens 0, 1, 2
    q[0, 1] = torch.tensor([0.1, 0.1, 0.4, 0.4])  # node 0: children 3, 4 with tokens 3, 2
    q[0, 2] = torch.tensor([1.0, 0.0, 0.0, 0.0])  # node 1: child 5 with token 0
    tokens = torch.tensor([[0, 1, 2, 3, 2, 0, 1]])
    got = adapter.wor_conditionals(q, tokens, TREE[None])
    want = [1.0, 0.5, 0.3 / 0.5, 0.2 / 0.2, 0.4, 0.4 / 0.6, 1.0, 1.0]  # the last: padding
    assert got[0].tolist() == pytest.approx(want, abs=1e-6)


def test_wor_conditionals_clamp_like_eagle():
    q = torch.zeros(1, 3, 2)
    q[0, 0] = torch.tensor([1.0, 0.0])  # the second child's remaining mass is 0: 0/0 -> -1 -> 0
    got = adapter.wor_conditionals(q, torch.tensor([[0, 1]]), torch.tensor([[-1, -1]]))
    assert got.tolist() == [[1.0, 1.0, 0.0]]


def test_row_structure_indexes_parents_and_earlier_siblings():
    ri = to_eagle(TREE[None])[0]  # (P, D+1)
    assert ri.tolist() == [[0, 1, 4], [0, 1, 5], [0, 2, 6], [0, 3, -1]]
    p_indices, b_indices = adapter._row_structure(TREE.tolist(), ri)
    assert p_indices == [[-1, 0, 1], [-1, 0, 1], [-1, 0, 2], [-1, 0, 0]]
    as_lists = [[b.tolist() if isinstance(b, torch.Tensor) else b for b in row] for row in b_indices]
    assert as_lists == [[[], [], []], [[], [], [4]], [[], [1], []], [[], [1, 2], []]]


def test_seeded_global_rngs_seed_and_restore():
    random.seed(123)
    torch.manual_seed(123)
    before = (random.random(), float(torch.rand(())))
    random.seed(123)
    torch.manual_seed(123)
    with adapter.seeded_global_rngs(7):
        first = (random.random(), float(torch.rand(())))
    with adapter.seeded_global_rngs(7):
        assert (random.random(), float(torch.rand(()))) == first
    assert (random.random(), float(torch.rand(()))) == before  # the caller's streams are untouched


def _stand_in(calls):
    """A stand-in for ``eagle.model.utils``: accept the first path fully; final token = argmax of sample_p."""

    def evaluate_posterior(logits, candidates, processor, cart_prob, op, p_indices, tree_candidates, b_indices):
        calls.append((tuple(logits.shape), tuple(candidates.shape), len(p_indices), len(b_indices)))
        assert candidates.shape == logits.shape[:2] and tree_candidates.shape[0] == 1
        length = int((candidates[0, 1:] >= 0).sum())
        return torch.tensor(0), length, torch.softmax(logits[0, length], -1)

    def update_inference_inputs(*args):
        sample_p = args[-1]
        return None, None, 0, None, sample_p.argmax()[None, None]

    def prepare_logits_processor(temperature=0.0, repetition_penalty=0.0, top_p=0.0, top_k=0):
        if temperature <= 1e-5:
            return None
        return lambda ids, scores: (
            scores / temperature if top_k == 0 else scores.masked_fill(scores < scores.max(), -1e9)
        )

    return SimpleNamespace(
        evaluate_posterior=evaluate_posterior,
        update_inference_inputs=update_inference_inputs,
        prepare_logits_processor=prepare_logits_processor,
    )


def _batch(B=2, V=5, seed=0):
    g = torch.Generator().manual_seed(seed)
    N = TREE.shape[0]
    target = torch.rand(B, N + 1, V, generator=g).softmax(-1)  # (B, N+1, V)
    draft = torch.rand(B, N + 1, V, generator=g).softmax(-1)  # (B, N+1, V)
    tokens = torch.tensor([[0, 1, 2, 3, 2, 0, 0]]).expand(B, -1).clone()
    return target, draft, tokens, TREE.expand(B, -1).clone()


def test_plumbing_with_a_stand_in(monkeypatch):
    calls = []
    monkeypatch.setattr(adapter, "_load_utils", lambda: _stand_in(calls))
    verifier = adapter.EagleTreeVerifier(temperature=0.8)
    target, draft, tokens, parents = _batch()
    out = verifier(target, draft, tokens, parents, mode="wor", generator=torch.Generator().manual_seed(0))
    checked = check_tree_output(out, TreeBatch(target, draft, tokens, parents, "wor"))
    assert checked.path.tolist() == [[0, 3], [0, 3]]  # the first path row: node 0 then node 3
    assert checked.num_emitted.tolist() == [3, 3]
    assert checked.emitted[:, 2].tolist() == target[:, 4].argmax(-1).tolist()  # bonus after node 3 (slot 4)
    assert calls and calls[0] == ((4, 3, 5), (4, 3), 4, 4)


def test_sampling_needs_mode_wor(monkeypatch):
    monkeypatch.setattr(adapter, "_load_utils", lambda: _stand_in([]))
    target, draft, tokens, parents = _batch()
    with pytest.raises(InvalidArgument, match="mode must be 'wor'.*'iid'"):
        adapter.EagleTreeVerifier()(target, draft, tokens, parents, mode="iid", generator=torch.Generator())


def test_processor_that_cuts_the_target_is_refused(monkeypatch):
    monkeypatch.setattr(adapter, "_load_utils", lambda: _stand_in([]))
    target, draft, tokens, parents = _batch()
    with pytest.raises(InvalidArgument, match="top_k=1.*total variation"):
        adapter.EagleTreeVerifier(top_k=1)(target, draft, tokens, parents, mode="wor", generator=torch.Generator())


# --------------------------------------------------------------------------- the real package


def _choices_to_parents(choices):
    """Parent array (N,) of EAGLE ``tree_choices``, nodes in ``generate_tree_buffers``' order."""
    ordered = sorted(choices, key=lambda c: (len(c), c))
    index = {tuple(c): n for n, c in enumerate(ordered)}
    return torch.tensor([index[tuple(c[:-1])] if len(c) > 1 else -1 for c in ordered])


@needs_eagle
def test_layouts_match_generate_tree_buffers():
    from eagle.model.choices import mc_sim_7b_63
    from eagle.model.utils import generate_tree_buffers

    buffers = generate_tree_buffers(mc_sim_7b_63, device="cpu")
    parents = _choices_to_parents(mc_sim_7b_63)
    ri = to_eagle(parents[None])[0]
    assert ri.tolist() == buffers["retrieve_indices"].tolist()
    assert torch.equal(from_eagle(buffers["retrieve_indices"], num_nodes=len(mc_sim_7b_63))[0], parents)
    _, b_indices = adapter._row_structure(parents.tolist(), ri)
    mine = [[b.tolist() if isinstance(b, torch.Tensor) else b for b in row] for row in b_indices]
    theirs = [[b.tolist() if isinstance(b, torch.Tensor) else b for b in row] for row in buffers["b_indices"]]
    assert mine == theirs


def _one_level_rows(B, p_root, q_root, p_children, k, seed):
    """B rows of a one-level tree: k children drawn without replacement from q_root."""
    g = torch.Generator().manual_seed(seed)
    V = p_root.shape[0]
    tokens = torch.multinomial(q_root.expand(B, V), k, replacement=False, generator=g)  # (B, k)
    target = torch.cat([p_root.expand(B, 1, V), p_children[tokens]], 1)  # (B, k+1, V)
    draft = q_root.expand(B, k + 1, V).clone()  # (B, k+1, V)
    return target, draft, tokens, torch.full((B, k), -1)


def _first_tokens(verifier, target, draft, tokens, parents, seed=1):
    out = verifier(target, draft, tokens, parents, mode="wor", generator=torch.Generator().manual_seed(seed))
    return out[0][:, 0], out


@needs_eagle
def test_real_eagle_is_deterministic_and_leaves_global_rngs_alone():
    p = torch.tensor([0.4, 0.3, 0.2, 0.1])
    target, draft, tokens, parents = _one_level_rows(64, p, p.flip(0), torch.eye(4) * 0.6 + 0.1, 2, seed=0)
    verifier = adapter.EagleTreeVerifier()
    random.seed(5)
    state = (random.getstate(), torch.get_rng_state())
    a = _first_tokens(verifier, target, draft, tokens, parents)[1]
    b = _first_tokens(verifier, target, draft, tokens, parents)[1]
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    assert random.getstate() == state[0] and torch.equal(torch.get_rng_state(), state[1])


@needs_eagle
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_real_eagle_first_token_follows_the_target(temperature):
    # Siblings accept or reject through the residual: the first emitted token's law is p_root.
    p = torch.tensor([0.35, 0.25, 0.2, 0.1, 0.1])
    q = torch.tensor([0.05, 0.1, 0.15, 0.3, 0.4])
    children = torch.full((5, 5), 0.2)
    target, draft, tokens, parents = _one_level_rows(3000, p, q, children, 3, seed=0)
    first, _ = _first_tokens(adapter.EagleTreeVerifier(temperature=temperature), target, draft, tokens, parents)
    _, pvalue, _ = pooled_chisquare(torch.bincount(first, minlength=5), p, e_min=5.0, support=True)
    assert pvalue > ALPHA, f"first emitted token vs p_root: p={pvalue:.3g}, N=3000, T={temperature}, seed 0"


@needs_eagle
@pytest.mark.parametrize("patch_final, follows_target", [(False, False), (True, True)])
def test_real_eagle_bonus_token_is_drawn_from_raw_logits(patch_final, follows_target):
    # One child, always accepted (q = p = point mass at the root): the bonus token's law should be
    # p_child; EAGLE draws it from softmax(logits) = p_child^T / Z (reports/eagle repro).
    B, T = 3000, 0.5
    p_child = torch.tensor([0.5, 0.3, 0.15, 0.05])
    point = torch.tensor([1.0, 0.0, 0.0, 0.0])
    target = torch.stack([point, p_child]).expand(B, 2, 4).clone()
    draft = point.expand(B, 2, 4).clone()
    verifier = adapter.EagleTreeVerifier(temperature=T, patch_final=patch_final)
    out = verifier(target, draft, torch.zeros(B, 1, dtype=torch.long), torch.full((B, 1), -1), mode="wor",
                   generator=torch.Generator().manual_seed(0))  # fmt: skip
    assert out[1].tolist() == [2] * B
    counts = torch.bincount(out[0][:, 1], minlength=4)
    raw = p_child**T / (p_child**T).sum()
    p_target = pooled_chisquare(counts, p_child, e_min=5.0, support=True)[1]
    p_raw = pooled_chisquare(counts, raw, e_min=5.0, support=True)[1]
    if follows_target:
        assert p_target > ALPHA, f"patched bonus vs p: p={p_target:.3g}, counts {counts.tolist()}"
    else:
        assert p_target < ALPHA < p_raw, (
            f"EAGLE's bonus token: p={p_target:.3g} vs target, p={p_raw:.3g} vs raw softmax; counts {counts.tolist()}"
            " (if EAGLE fixed its final draw, update reports/eagle)"
        )


def _greedy_reference(target, tokens, parents):
    """Longest path matching the target's argmax (siblings distinct), then the argmax after it."""
    emitted, path, slot = [], [], 0
    while True:
        want = int(target[slot].argmax())
        kids = [n for n in range(len(parents)) if int(parents[n]) == slot - 1 and int(tokens[n]) == want]
        if not kids:
            return emitted + [want], path
        emitted.append(want)
        path.append(kids[0])
        slot = kids[0] + 1


@needs_eagle
def test_real_eagle_greedy_matches_the_greedy_tree_rule():
    g = torch.Generator().manual_seed(0)
    B, V = 200, 3
    parents = TREE.expand(B, -1).clone()
    target = torch.rand(B, TREE.shape[0] + 1, V, generator=g).pow(4).softmax(-1)  # (B, N+1, V)
    tokens = torch.stack([torch.randperm(V, generator=g) for _ in range(B)])  # root's children distinct
    tokens = torch.cat([tokens, torch.stack([torch.randperm(V, generator=g)[:2] for _ in range(B)]),
                        torch.randint(0, V, (B, 2), generator=g)], 1)  # fmt: skip
    emitted, num, path = adapter.greedy_tree_verifier(
        target, None, tokens, parents, mode="topk", generator=torch.Generator().manual_seed(0)
    )
    for b in range(B):
        want_emitted, want_path = _greedy_reference(target[b], tokens[b], parents[b])
        assert emitted[b, : int(num[b])].tolist() == want_emitted, f"row {b}"
        assert path[b, : len(want_path)].tolist() == want_path, f"row {b}"


@needs_eagle
@pytest.mark.slow
def test_real_eagle_passes_the_wor_battery_at_temperature_one():
    from specverify.verifier.tree.battery import check_tree_verifier

    report = check_tree_verifier(adapter.sampling_tree_verifier, scenarios=["markov8_wor_3x2"], tier="smoke", seed=0)
    assert report.passed, report.verdict
