"""Exact laws (specverify.core.chain_laws): the canonical rule reproduces the target exactly, wrong rules do not.

The Markov dynamic programme is also checked against a literal enumeration of the
algorithm (draft all K tokens, verify them one by one, residual / bonus), so a
wrong rule's law is validated independently of the theorem.
"""

from __future__ import annotations

import functools
import itertools
import time

import numpy as np
import pytest
import torch
from _strategies import markov_tables, normalise, pq_pairs, weight_rows
from hypothesis import given, settings
from hypothesis import strategies as st

from specverify.core import chain_laws

ATOL = 1e-12


def random_table(rng, *shape, power=3.0, zeros=0.0):
    """Random float64 probability rows with heavy variation (and optional zeros)."""
    w = rng.random(shape) ** power
    if zeros:
        w = w * (rng.random(shape) >= zeros)
        w[..., 0] += 1e-3  # keep every row positive
    return torch.as_tensor(w / w.sum(-1, keepdims=True))


# --------------------------------------------------------------------------- one step


@settings(max_examples=300, deadline=None)
@given(pq=pq_pairs())
def test_canonical_one_step_law_is_target(pq):
    target, draft = pq
    law = chain_laws.one_step_law(target, draft)
    assert law.dtype == torch.float64 and law.shape == target.shape
    err = (law - target).abs().max().item()
    assert err <= ATOL, f"max |law - p| = {err:.3g} for V={target.numel()}"
    assert (law >= 0).all()
    alpha = chain_laws.acceptance_probability(target, draft).item()
    assert abs(alpha - torch.minimum(target, draft).sum().item()) <= ATOL


@settings(max_examples=50, deadline=None)
@given(pq=pq_pairs(max_V=64), data=st.data())
def test_one_step_law_batched_and_float32(pq, data):
    target, draft = pq
    batch_t = torch.stack([target, draft, target])  # (3, V)
    batch_d = torch.stack([draft, target, target])  # (3, V)
    law = chain_laws.one_step_law(batch_t, batch_d)
    assert (law - batch_t).abs().max().item() <= ATOL
    t32 = target.float()
    if abs(t32.double().sum().item() - 1) < 1e-4:  # float32 rows renormalised in float64
        law32 = chain_laws.one_step_law(t32, draft.float())
        assert law32.dtype == torch.float64
        expected = t32.double() / t32.double().sum()
        assert (law32 - expected).abs().max().item() <= ATOL


@settings(max_examples=100, deadline=None)
@given(pq=pq_pairs(max_V=256))
def test_residual_is_p_law_is_the_wrong_mixture(pq):
    """residual = p gives sum min(p,q) delta + (1 - sum min) p, which differs from p iff r != p."""
    target, draft = pq
    law = chain_laws.one_step_law(target, draft, rule="residual_is_p")
    alpha = torch.minimum(target, draft).sum()
    expected = torch.minimum(target, draft) + (1 - alpha) * target
    assert (law - expected).abs().max().item() <= ATOL
    assert abs(law.sum().item() - 1) <= ATOL


def test_wrong_one_step_rules_differ_from_target():
    target = torch.tensor([0.7, 0.2, 0.1], dtype=torch.float64)
    draft = torch.tensor([0.1, 0.2, 0.7], dtype=torch.float64)
    assert (chain_laws.one_step_law(target, draft) - target).abs().max() <= ATOL
    # residual = p: 0.4 accepted mass + 0.6 p
    wrong = chain_laws.one_step_law(target, draft, rule="residual_is_p")
    assert torch.allclose(wrong, torch.tensor([0.52, 0.32, 0.16], dtype=torch.float64), atol=ATOL)
    assert torch.allclose(chain_laws.one_step_law(target, draft, rule="always_accept"), draft, atol=ATOL)
    inverted = chain_laws.one_step_law(target, draft, rule="inverted_ratio")
    assert (inverted - target).abs().max() > 0.1
    assert chain_laws.acceptance_probability(target, draft).item() == pytest.approx(0.4, abs=ATOL)


def test_residual_mass_zero_falls_back_to_target():
    target = torch.tensor([0.5, 0.5, 0.0], dtype=torch.float64)
    assert torch.equal(chain_laws.one_step_law(target, target), target)
    # a custom rule that always rejects with an empty residual: the law is the fallback p
    rule = chain_laws.VerificationRule("reject_all", lambda t, d: torch.zeros_like(t), lambda t, d: torch.zeros_like(t))
    draft = torch.tensor([0.2, 0.3, 0.5], dtype=torch.float64)
    assert torch.allclose(chain_laws.one_step_law(target, draft, rule=rule), target, atol=ATOL)
    assert chain_laws.acceptance_probability(target, draft, rule=rule).item() == 0.0


def test_one_step_law_edge_values():
    one = torch.ones(1, dtype=torch.float64)
    assert torch.equal(chain_laws.one_step_law(one, one), one)  # V = 1
    target = torch.tensor([0.0, 1e-30, 0.0, 1.0 - 1e-30], dtype=torch.float64)
    for draft in ([1.0, 0, 0, 0], [0, 0, 1.0, 0], [0.25] * 4, [0, 1.0, 0, 0]):
        d = torch.tensor(draft, dtype=torch.float64)
        law = chain_laws.one_step_law(target, d)
        assert (law - target).abs().max() <= ATOL
        assert law[0] == 0 and law[2] == 0  # zero-probability tokens get exactly 0


# --------------------------------------------------------------------------- one block (verifier protocol)


@settings(max_examples=100, deadline=None)
@given(K=st.integers(1, 4), V=st.integers(1, 16), data=st.data())
def test_position_laws_canonical(K, V, data):
    target = torch.stack([normalise(data.draw(weight_rows(V))) for _ in range(K + 1)])  # (K+1, V)
    draft = torch.stack([normalise(data.draw(weight_rows(V))) for _ in range(K)])  # (K, V)
    laws = chain_laws.position_laws(target, draft)  # (K+1, V)
    alpha = torch.minimum(target[:K], draft).sum(-1)  # (K,)
    reach = torch.cat([torch.ones(1, dtype=torch.float64), alpha.cumprod(0)])  # (K+1,)
    assert (laws - reach[:, None] * target).abs().max() <= ATOL
    emitted = chain_laws.num_emitted_law(target, draft)  # (K+1,)
    assert abs(emitted.sum().item() - 1) <= ATOL
    assert (emitted - (reach - torch.cat([reach[1:], torch.zeros(1, dtype=torch.float64)]))).abs().max() <= ATOL


def test_position_laws_wrong_rules():
    rng = np.random.default_rng(1)
    target, draft = random_table(rng, 3, 5), random_table(rng, 2, 5)
    canonical = chain_laws.position_laws(target, draft)
    bonus = chain_laws.position_laws(target, draft, rule="bonus_from_residual")
    assert torch.allclose(bonus[:2], canonical[:2], atol=ATOL)  # only the bonus position differs
    assert (bonus[2] - canonical[2]).abs().max() > 1e-3
    residual = chain_laws.position_laws(target, draft, rule="residual_is_p")
    assert (residual[:2] - canonical[:2]).abs().max() > 1e-3
    batched = chain_laws.position_laws(torch.stack([target, target]), torch.stack([draft, draft]))  # (2, K+1, V)
    assert torch.allclose(batched[1], canonical, atol=ATOL)


# --------------------------------------------------------------------------- Markov tables


def brute_force_markov(p_init, p_trans, q_init, q_trans, K, L, rule):
    """Literal enumeration: draft all K tokens, verify in order, residual / bonus, recurse per block."""
    V = p_init.shape[0]
    rule = chain_laws.RULES[rule] if isinstance(rule, str) else rule

    def rows(context):
        return (p_init, q_init) if context is None else (p_trans[context], q_trans[context])

    def pieces(context):
        p, q = rows(context)
        a = rule.accept(p, q).tolist()
        w = rule.residual(p, q)
        w = w if w.sum() > 0 else p
        return p.tolist(), q.tolist(), a, (w / w.sum()).tolist()

    @functools.cache
    def continuation(context, remaining):
        """Law of the next `remaining` emitted tokens, as a dict, from a block boundary."""
        out = {}

        def add(seq, prob):
            if prob == 0:
                return
            if len(seq) >= remaining:
                key = tuple(seq[:remaining])
                out[key] = out.get(key, 0.0) + prob
            else:
                for rest, pr in continuation(seq[-1], remaining - len(seq)).items():
                    out[tuple(seq) + rest] = out.get(tuple(seq) + rest, 0.0) + prob * pr

        for drafts in itertools.product(range(V), repeat=K):
            prob, ctx = 1.0, context
            for x in drafts:  # the drafter conditions on the previous draft
                prob *= rows(ctx)[1][x]
                ctx = x
            if prob == 0:
                continue
            ctx, seq = context, []
            for _i, x in enumerate(drafts):
                p, q, a, r = pieces(ctx)
                for y in range(V):  # rejected at i: residual token, new block
                    add(seq + [y], prob * (1 - a[x]) * r[y])
                prob *= a[x]
                seq.append(x)
                last_ctx, ctx = ctx, x
            if rule.bonus == "target":
                bonus = rows(ctx)[0].tolist()
            else:
                bonus = pieces(last_ctx)[3]
            for y in range(V):
                add(seq + [y], prob * bonus[y])
        return out

    law = torch.zeros((V,) * L, dtype=torch.float64)
    for seq, prob in continuation(None, L).items():
        law[seq] += prob
    return law


@settings(max_examples=60, deadline=None)
@given(target=markov_tables(), data=st.data())
def test_markov_speculative_law_is_target_chain(target, data):
    V, p_init, p_trans = target
    q_init = normalise(data.draw(weight_rows(V)))
    q_trans = torch.stack([normalise(data.draw(weight_rows(V))) for _ in range(V)])  # (V, V)
    K = data.draw(st.integers(1, 3))
    L = data.draw(st.integers(1, 5))
    law = chain_laws.markov_speculative_law(p_init, p_trans, q_init, q_trans, K=K, L=L)
    chain = chain_laws.markov_chain_law(p_init, p_trans, L=L)
    assert law.shape == (V,) * L
    err = (law - chain).abs().max().item()
    assert err <= ATOL, f"V={V} K={K} L={L}: max |spec - chain| = {err:.3g}"


def test_markov_law_is_fast_at_the_largest_size():
    rng = np.random.default_rng(0)
    tables = [random_table(rng, 6), random_table(rng, 6, 6), random_table(rng, 6), random_table(rng, 6, 6)]
    start = time.perf_counter()
    law = chain_laws.markov_speculative_law(*tables, K=3, L=5)
    seconds = time.perf_counter() - start
    assert seconds < 1.0, f"V=6 K=3 L=5 took {seconds:.2f}s"
    assert (law - chain_laws.markov_chain_law(tables[0], tables[1], L=5)).abs().max() <= ATOL


@pytest.mark.parametrize("rule", sorted(chain_laws.RULES))
@pytest.mark.parametrize("V,K,L", [(2, 1, 4), (3, 2, 3), (2, 3, 4), (1, 2, 3)])
def test_markov_dp_matches_literal_enumeration(rule, V, K, L):
    rng = np.random.default_rng(10 * V + K)
    tables = [random_table(rng, V, zeros=0.2), random_table(rng, V, V, zeros=0.2)]
    tables += [random_table(rng, V, zeros=0.2), random_table(rng, V, V, zeros=0.2)]
    law = chain_laws.markov_speculative_law(*tables, K=K, L=L, rule=rule)
    brute = brute_force_markov(*tables, K, L, rule)
    assert (law - brute).abs().max() <= ATOL
    assert abs(law.sum().item() - 1) <= 1e-12


@pytest.mark.parametrize("rule", ["residual_is_p", "bonus_from_residual", "always_accept", "inverted_ratio"])
@pytest.mark.parametrize("K", [1, 2, 3])
def test_markov_wrong_rules_differ_from_target_chain(rule, K):
    rng = np.random.default_rng(K)
    tables = [random_table(rng, 4), random_table(rng, 4, 4), random_table(rng, 4), random_table(rng, 4, 4)]
    law = chain_laws.markov_speculative_law(*tables, K=K, L=4, rule=rule)
    chain = chain_laws.markov_chain_law(tables[0], tables[1], L=4)
    assert abs(law.sum().item() - 1) <= 1e-12
    tv = 0.5 * (law - chain).abs().sum().item()
    assert tv > 1e-3, f"{rule} K={K}: TV to the target chain only {tv:.2e}"


def test_markov_identical_drafter_and_point_masses():
    rng = np.random.default_rng(3)
    p_init, p_trans = random_table(rng, 3), random_table(rng, 3, 3)
    law = chain_laws.markov_speculative_law(p_init, p_trans, p_init, p_trans, K=2, L=4)
    assert (law - chain_laws.markov_chain_law(p_init, p_trans, L=4)).abs().max() <= ATOL
    # deterministic drafter (one-hot rows) and a deterministic target
    eye = torch.eye(3, dtype=torch.float64)
    shift = eye[[1, 2, 0]]
    law = chain_laws.markov_speculative_law(eye[0], shift, eye[2], eye, K=3, L=5)
    assert law[0, 1, 2, 0, 1] == pytest.approx(1.0, abs=ATOL)
    # numpy inputs are accepted
    law_np = chain_laws.markov_speculative_law(
        p_init.numpy(), p_trans.numpy(), p_init.numpy(), p_trans.numpy(), K=1, L=2
    )
    assert law_np.shape == (3, 3)


def test_markov_chain_law_matches_direct_product():
    rng = np.random.default_rng(4)
    init, trans = random_table(rng, 3), random_table(rng, 3, 3)
    law = chain_laws.markov_chain_law(init, trans, L=3)
    for a, b, c in itertools.product(range(3), repeat=3):
        assert law[a, b, c].item() == pytest.approx((init[a] * trans[a, b] * trans[b, c]).item(), rel=1e-14)
