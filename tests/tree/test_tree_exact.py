"""Exact tree laws: every lossless rule reproduces the target at every reached node, wrong rules do not.

The lossless identity checked at every reached node n (a slot of a fixed tree, or a
(node, path tokens) visit of a round averaged over the drafts)::

    sum over children c with token y of P(accept c) + P(stop at n, final y) == P(reach n) p_n(y)

within 1e-12, for random shapes (padding included) and adversarial laws (q on p's zeros,
point masses, equal and disjoint rows).  Fixed trees: topk and target-only rules.  Averaged
over the drafting: all four (iid, wor, topk, target-only).  The i.i.d. enumeration is checked
against its closed form, the multi-round law against the target's sequence law, and
deliberately wrong rules (wor siblings verified as iid, residual not carried, residual
zeroing only the rejected token) are shown to differ by TV > 1e-3.
"""

from __future__ import annotations

import pytest
import torch
from _strategies import normalise, pq_pairs, weight_rows
from _trees import table_pairs, tree_shapes
from hypothesis import given, settings
from hypothesis import strategies as st

from specverify.core.errors import InvalidArgument
from specverify.core.tables import MarkovTable, markov, positional
from specverify.protocols.tree import PAD
from specverify.verifier.tree import laws
from specverify.verifier.tree.sibling_rules import SPECINFER, SiblingRule

ATOL = 1e-12


def fixed_tree(draw, parents, V, *, duplicates=True):
    """Random rows (N+1, V) for target and draft (adversarial pairs) and tokens (N,) for a shape."""
    N = parents.shape[0]
    pairs = [draw(pq_pairs(V)) for _ in range(N + 1)]
    target = torch.stack([p for p, _ in pairs])
    draft = torch.stack([q for _, q in pairs])
    tokens = torch.tensor([draw(st.integers(0, V - 1)) for _ in range(N)], dtype=torch.long)
    return target, draft, tokens


# --------------------------------------------------------------------------- fixed trees


@settings(max_examples=60, deadline=None)
@given(parents=tree_shapes(max_nodes=8), V=st.integers(1, 6), mode=st.sampled_from(["topk", "any"]), data=st.data())
def test_fixed_tree_laws_are_the_target_for_topk_and_target_only(parents, V, mode, data):
    target, draft, tokens = fixed_tree(data.draw, parents, V)
    law = laws.conditional_round_law(target[None], draft[None], tokens[None], parents[None], mode=mode)
    err = law.error()
    assert err <= ATOL, f"{mode}: max |next-token law - reach * p| = {err:.3g}, parents={parents.tolist()}"
    assert abs(float(law.stop.sum()) - 1.0) <= ATOL
    assert (law.reach[0, 1:][parents == PAD] == 0).all()
    lengths = law.accepted_length_law()[0]
    assert abs(float(lengths.sum()) - 1.0) <= ATOL
    assert (
        abs(float((lengths * torch.arange(lengths.shape[0])).sum()) - float(law.expected_accepted_length()[0])) <= ATOL
    )


def test_fixed_tree_iid_law_is_not_the_target():
    """For a fixed tree of tokens the i.i.d. rule is lossless only on average over the drafts."""
    target = torch.tensor([[0.5, 0.3, 0.2]] * 3, dtype=torch.float64)
    draft = torch.tensor([[0.2, 0.2, 0.6]] * 3, dtype=torch.float64)
    law = laws.conditional_round_law(
        target[None], draft[None], torch.tensor([[2, 2]]), torch.tensor([[-1, -1]]), mode="iid"
    )
    assert law.error() > 0.1


def test_conditional_law_batched_matches_rows():
    gen = torch.Generator().manual_seed(0)
    parents = torch.tensor([[-1, 0, 0, -2], [-1, -1, 1, 2]])
    target = torch.softmax(torch.randn(2, 5, 4, generator=gen, dtype=torch.float64), -1)
    draft = torch.softmax(torch.randn(2, 5, 4, generator=gen, dtype=torch.float64), -1)
    tokens = torch.randint(0, 4, (2, 4), generator=gen)
    both = laws.conditional_round_law(target, draft, tokens, parents, mode="wor")
    for b in range(2):
        one = laws.conditional_round_law(
            target[b : b + 1], draft[b : b + 1], tokens[b : b + 1], parents[b : b + 1], mode="wor"
        )
        assert torch.allclose(both.stop[b], one.stop[0], atol=0, rtol=0)
    assert both.prefix[1, 4].tolist() == tokens[1, [1, 2, 3]].tolist()


# --------------------------------------------------------------------------- averaged over drafts


@settings(max_examples=300, deadline=None)
@given(pq=pq_pairs(max_V=8), k=st.integers(0, 4))
def test_iid_enumeration_equals_the_closed_form(pq, k):
    """i.i.d. drafts, SpecInfer: the residual does not depend on the rejected token, so
    P(child i = x, accepted) = prod_{j<i} beta_j min(q, r_i)(x) with beta_j = 1 - sum min(q, r_j)."""
    p, q = pq
    accept, final = laws.node_law(p, q, k, drafting="iid")
    r, alive = p.clone(), 1.0
    for i in range(k):
        overlap = torch.minimum(q, r)
        assert torch.allclose(accept[i], alive * overlap, atol=ATOL, rtol=0)
        alive *= float((q - overlap).sum())  # 1 - sum min(q, r) without cancellation
        residual = (r - q).clamp_min(0.0)
        r = residual / residual.sum() if residual.sum() > 0 else r
    assert torch.allclose(final, alive * r, atol=ATOL, rtol=0)
    assert (accept.sum(0) + final - p).abs().max() <= ATOL


@settings(max_examples=200, deadline=None)
@given(pq=pq_pairs(max_V=5), k=st.integers(0, 4), drafting=st.sampled_from(["iid", "wor", "topk"]))
def test_node_laws_are_the_target(pq, k, drafting):
    p, q = pq
    for rule in (None, "sample_and_match"):
        accept, final = laws.node_law(p, q, k, drafting=drafting, rule=rule)
        err = float((accept.sum(0) + final - p).abs().max())
        assert err <= ATOL, f"drafting={drafting}, rule={rule}, k={k}: max |law - p| = {err:.3g}"


@settings(max_examples=40, deadline=None)
@given(
    parents=tree_shapes(max_nodes=5),
    V=st.integers(1, 3),
    mode=st.sampled_from(["iid", "wor", "topk", "any"]),
    data=st.data(),
)
def test_round_laws_on_tables_are_the_target(parents, V, mode, data):
    target, drafter = data.draw(table_pairs(V))
    law = laws.round_law(parents, target, drafter, mode=mode)
    err = law.error()
    assert err <= ATOL, f"{mode}: max |next-token law - reach * p| = {err:.3g} over {law.reach.numel()} visits"
    assert abs(float(law.stop.sum()) - 1.0) <= ATOL
    by_depth = law.reach_by_depth()
    assert abs(float(by_depth[0]) - 1.0) <= ATOL and (by_depth[1:] <= by_depth[:-1] + ATOL).all()


def test_round_law_positional_target_and_derived_quantities():
    target = positional(4, 4, seed=3)
    drafter = markov(4, seed=4)
    parents = torch.tensor([-1, -1, 0, 0, 2, -2, 1])
    for mode in ("iid", "wor", "topk", "any"):
        law = laws.round_law(parents, target, drafter, mode=mode)
        assert law.error() <= ATOL
        lengths = law.accepted_length_law()  # (D+1,)
        assert lengths.shape == (4,) and abs(float(lengths.sum()) - 1) <= ATOL
        acceptance = law.acceptance_by_depth()  # (D,)
        assert torch.allclose(torch.cumprod(acceptance, 0), law.reach_by_depth()[1:], atol=ATOL, rtol=0)
        assert abs(sum(law.sequences().values()) - 1.0) <= ATOL
        assert ((law.next_token_law() - law.target).abs()[law.reach > 0]).max() <= 1e-9
        for prefix, (mass, next_law) in law.by_prefix().items():
            context = target.context_ids(torch.tensor([list(prefix)], dtype=torch.long), torch.tensor([len(prefix)]))
            assert mass > 0 and (next_law - target.table[context[0]]).abs().max() <= 1e-9


@settings(max_examples=10, deadline=None)
@given(
    parents=tree_shapes(min_nodes=1, max_nodes=3, padding=False),
    mode=st.sampled_from(["iid", "wor", "topk", "any"]),
    data=st.data(),
)
def test_multi_round_law_is_the_target_sequence_law(parents, mode, data):
    target, drafter = data.draw(table_pairs(2))
    law = laws.multi_round_law(parents, target, drafter, mode=mode, L=3)
    err = float((law - laws.sequence_law(target, 3)).abs().max())
    assert err <= ATOL, f"{mode}: max |multi-round law - target law| = {err:.3g}"


# --------------------------------------------------------------------------- wrong rules


def tv_at_worst_visit(law) -> float:
    diff = (law.next_token_law() - law.target).abs().sum(-1) / 2  # (M,)
    return float(diff[law.reach > 0].max())


WRONG = [
    ("specinfer", "wor", "wor_verified_as_iid (llama.cpp PR #5625 discussion)"),
    ("residual_not_carried", "iid", "residual not carried across siblings"),
    ("residual_zero_only_rejected", "iid", "residual zeroes only the rejected token (SafeAILab/EAGLE #20)"),
    ("rrsw", "iid", "i.i.d. siblings verified as if drawn without replacement"),
]


@pytest.mark.parametrize("rule, drafting, what", WRONG)
def test_wrong_rules_differ_from_the_target(rule, drafting, what):
    target = MarkovTable(
        torch.tensor([0.5, 0.3, 0.2], dtype=torch.float64),
        torch.tensor([[0.6, 0.3, 0.1], [0.2, 0.2, 0.6], [0.3, 0.4, 0.3]], dtype=torch.float64),
    )
    drafter = MarkovTable(
        torch.tensor([0.2, 0.3, 0.5], dtype=torch.float64),
        torch.tensor([[0.2, 0.5, 0.3], [0.5, 0.3, 0.2], [0.1, 0.1, 0.8]], dtype=torch.float64),
    )
    parents = torch.tensor([-1, -1, -1, 0, 0])
    law = laws.round_law(parents, target, drafter, mode="iid", rule=rule, drafting=drafting)
    tv = tv_at_worst_visit(law)
    assert tv > 1e-3, f"{what}: TV to the target only {tv:.3g}"
    assert abs(float(law.stop.sum()) - 1.0) <= ATOL  # still a law, just the wrong one


def test_rules_are_pluggable():
    def half_accept(p, r, q, x):
        return 0.5 * SPECINFER.accept(p, r, q, x)

    lazy = SiblingRule("half_accept", half_accept, SPECINFER.reject)
    p = torch.tensor([0.7, 0.2, 0.1], dtype=torch.float64)
    q = torch.tensor([0.1, 0.2, 0.7], dtype=torch.float64)
    accept, final = laws.node_law(p, q, 2, drafting="iid", rule=lazy)
    assert float((accept.sum(0) + final - p).abs().max()) > 1e-2
    with pytest.raises(InvalidArgument, match="q_view"):
        SiblingRule("bad", half_accept, SPECINFER.reject, q_view="sometimes")
    with pytest.raises(InvalidArgument, match="rule must be"):
        laws.node_law(p, q, 2, drafting="iid", rule="no_such_rule")


# --------------------------------------------------------------------------- limits and bad input


def test_size_limits_and_bad_input():
    p = normalise(torch.ones(64).numpy())
    q = normalise((torch.arange(64.0) + 1).numpy())
    with pytest.raises(InvalidArgument, match="MAX_NODE_STATES"):
        laws.node_law(p, q, 4, drafting="wor")
    laws.node_law(p, q, 8, drafting="iid")  # merged states: V per child
    with pytest.raises(InvalidArgument, match="drafting must be one of"):
        laws.node_law(p, p, 2, drafting="beam")
    target = markov(2, seed=0)
    with pytest.raises(InvalidArgument, match="too large"):
        laws.sequence_law(target, 17)
    with pytest.raises(InvalidArgument, match="tree shape of shape"):
        laws.round_law(torch.tensor([[-1]]), target, target, mode="iid")
    with pytest.raises(InvalidArgument, match="vocabularies differ"):
        laws.round_law(torch.tensor([-1]), target, markov(3, seed=0), mode="iid")
    with pytest.raises(InvalidArgument, match="parents\\[0, 0\\] is 0"):
        laws.round_law(torch.tensor([0]), target, target, mode="iid")


@settings(max_examples=20, deadline=None)
@given(V=st.integers(1, 4), data=st.data())
def test_rows_with_zeros_never_emit_zero_probability_tokens(V, data):
    target = torch.stack([normalise(data.draw(weight_rows(V))) for _ in range(4)])
    draft = torch.stack([normalise(data.draw(weight_rows(V))) for _ in range(4)])
    parents = torch.tensor([[-1, -1, 0]])
    tokens = torch.tensor([[0, V - 1, 0]])
    for mode in ("iid", "wor", "topk", "any"):
        law = laws.conditional_round_law(target[None], draft[None], tokens, parents, mode=mode)
        assert (law.stop[0][target == 0] == 0).all()
