"""reference.rules: the canonical verifier matches its exact law per in-block position; greedy; corners.

Statistical checks: per in-block position i, the category "token y emitted at i" or
"block ended before i" over B rows is multinomial with probabilities from
``specverify.core.chain_laws.position_laws``; a pooled chi-square at alpha 1e-7 per position
(seed drawn inside the example).  Planted wrong rules (residual = p, bonus from the
residual) run through the same check and must be rejected.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from _strategies import normalise, pooled_chisquare, weight_rows
from hypothesis import given, settings
from hypothesis import strategies as st

from specverify.core import chain_laws
from specverify.core.sampling import sample, uniform
from specverify.mutants import by_name
from specverify_reference.rules import check_verifier_inputs, greedy_verify, residual_weights, verify

ALPHA = 1e-7


# --------------------------------------------------------------------------- planted wrong rules


# The catalogue's versions (specverify.mutants; their own tests are in test_mutants.py).
verify_residual_is_p = by_name("residual_is_p").fn  # Spec-RL #14: resample from p, not (p - q)+
verify_bonus_from_residual = by_name("bonus_from_residual").fn  # EAGLE PR #47: bonus from r_K, not p_{K+1}


# --------------------------------------------------------------------------- the statistical check


def position_pvalues(verifier, target_table, draft_table, B, seed, rule="canonical"):
    """Run ``verifier`` on B copies of one block; p-value per in-block position and for num_emitted.

    Returns ``(pvalues, support_failures)``; a support failure is a token emitted at a
    position where the exact law gives it probability 0.
    """
    K1, V = target_table.shape
    K = K1 - 1
    generator = torch.Generator().manual_seed(seed)
    target_probs = target_table.expand(B, K1, V)  # (B, K+1, V)
    draft_probs = draft_table.expand(B, K, V)  # (B, K, V)
    draft_tokens = sample(draft_probs, generator=generator)  # (B, K)
    tokens, num_emitted = verifier(target_probs, draft_probs, draft_tokens, generator=generator)
    laws = chain_laws.position_laws(target_table, draft_table, rule=rule).numpy()  # (K+1, V)
    pvalues, failures = [], []
    for i in range(K1):
        reached = (num_emitted > i).numpy()  # (B,)
        counts = np.bincount(tokens[:, i].numpy()[reached], minlength=V).astype(np.float64)  # (V,)
        expected = np.append(laws[i], max(0.0, 1.0 - laws[i].sum()))  # (V+1,): token or not reached
        observed = np.append(counts, B - reached.sum())
        if (observed[expected == 0] > 0).any():
            failures.append((i, np.flatnonzero((observed > 0) & (expected == 0)).tolist()))
        pvalues.append(pooled_chisquare(observed, expected)[1])
    emitted = np.bincount(num_emitted.numpy() - 1, minlength=K1).astype(np.float64)  # (K+1,)
    pvalues.append(
        pooled_chisquare(emitted, chain_laws.num_emitted_law(target_table, draft_table, rule=rule).numpy())[1]
    )
    return pvalues, failures


@settings(max_examples=20, deadline=None)
@given(K=st.integers(1, 3), V=st.integers(1, 8), data=st.data())
def test_verify_matches_exact_position_laws(K, V, data):
    seed = data.draw(st.integers(0, 2**32 - 1), label="seed")
    dtype = data.draw(st.sampled_from([torch.float32, torch.float64]), label="dtype")
    target = torch.stack([normalise(data.draw(weight_rows(V))) for _ in range(K + 1)])  # (K+1, V)
    draft = torch.stack([normalise(data.draw(weight_rows(V))) for _ in range(K)])  # (K, V)
    target, draft = target.to(dtype), draft.to(dtype)
    pvalues, failures = position_pvalues(verify, target, draft, B=20_000, seed=seed)
    assert not failures, f"zero-probability tokens emitted (position, tokens): {failures}; seed={seed}"
    assert min(pvalues) > ALPHA, (
        f"verify's output law differs from the exact law: p-values per position {pvalues} "
        f"(last: num_emitted), seed={seed}, K={K}, V={V}"
    )


ADVERSARIAL_TARGET = torch.tensor(
    [[0.6, 0.25, 0.1, 0.05], [0.1, 0.2, 0.3, 0.4], [0.4, 0.3, 0.2, 0.1]], dtype=torch.float64
)  # (K+1=3, V=4)
ADVERSARIAL_DRAFT = torch.tensor([[0.05, 0.05, 0.1, 0.8], [0.7, 0.1, 0.1, 0.1]], dtype=torch.float64)  # (K=2, V)


def test_verify_adversarial_drafter_passes():
    pvalues, failures = position_pvalues(verify, ADVERSARIAL_TARGET, ADVERSARIAL_DRAFT, B=50_000, seed=7)
    assert not failures and min(pvalues) > ALPHA, pvalues


@pytest.mark.parametrize(
    "wrong, rule, positions",
    [(verify_residual_is_p, "residual_is_p", [0, 1]), (verify_bonus_from_residual, "bonus_from_residual", [2])],
)
def test_planted_wrong_rules_are_caught(wrong, rule, positions):
    pvalues, _ = position_pvalues(wrong, ADVERSARIAL_TARGET, ADVERSARIAL_DRAFT, B=50_000, seed=7)
    for i in positions:
        assert pvalues[i] < ALPHA, f"{rule} not caught at position {i + 1}: p={pvalues[i]:.3g}"
    # the wrong verifier does follow its own (wrong) exact law: the check has no other reason to fire
    own, failures = position_pvalues(wrong, ADVERSARIAL_TARGET, ADVERSARIAL_DRAFT, B=50_000, seed=8, rule=rule)
    assert not failures and min(own) > ALPHA, own


@pytest.mark.slow
@settings(max_examples=100, deadline=None)
@given(K=st.integers(1, 5), V=st.integers(1, 64), data=st.data())
def test_verify_matches_exact_position_laws_large(K, V, data):
    seed = data.draw(st.integers(0, 2**32 - 1), label="seed")
    target = torch.stack([normalise(data.draw(weight_rows(V))) for _ in range(K + 1)])  # (K+1, V)
    draft = torch.stack([normalise(data.draw(weight_rows(V))) for _ in range(K)])  # (K, V)
    pvalues, failures = position_pvalues(verify, target, draft, B=200_000, seed=seed)
    assert not failures and min(pvalues) > ALPHA, (pvalues, seed)


# --------------------------------------------------------------------------- greedy


@settings(max_examples=100, deadline=None)
@given(B=st.integers(1, 6), K=st.integers(1, 5), V=st.integers(1, 10), data=st.data())
def test_greedy_verify_is_the_argmax_continuation(B, K, V, data):
    seed = data.draw(st.integers(0, 2**32 - 1))
    generator = torch.Generator().manual_seed(seed)
    target_probs = torch.softmax(3 * torch.randn(B, K + 1, V, generator=generator, dtype=torch.float64), -1)
    argmax = target_probs.argmax(-1)  # (B, K+1)
    mismatch_at = torch.randint(0, K + 1, (B,), generator=generator)  # K means all drafts match
    draft_tokens = argmax[:, :K].clone()  # (B, K)
    for b in range(B):
        if mismatch_at[b] < K and V > 1:
            draft_tokens[b, mismatch_at[b]] = (argmax[b, mismatch_at[b]] + 1) % V
    tokens, num_emitted = greedy_verify(target_probs, draft_tokens)
    expected_emitted = torch.where(torch.tensor(V > 1), mismatch_at, torch.full_like(mismatch_at, K)) + 1
    assert torch.equal(num_emitted, expected_emitted)
    for b in range(B):
        n = int(num_emitted[b])
        assert torch.equal(tokens[b, :n], argmax[b, :n])  # accepted drafts, then the target's argmax


def test_greedy_verify_ties_and_float32():
    target_probs = torch.tensor([[[0.5, 0.5, 0.0], [0.2, 0.2, 0.6]]], dtype=torch.float32)  # (1, 2, 3)
    tokens, n = greedy_verify(target_probs, torch.tensor([[1]]))
    assert n.tolist() == [1] and tokens[0, 0] == 0  # ties go to the lowest id
    tokens, n = greedy_verify(target_probs, torch.tensor([[0]]))
    assert n.tolist() == [2] and tokens[0, :2].tolist() == [0, 2]


# --------------------------------------------------------------------------- corners


def run(target_probs, draft_probs, draft_tokens, seed=0):
    return verify(target_probs, draft_probs, draft_tokens, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_p_equals_q_accepts_everything(dtype):
    generator = torch.Generator().manual_seed(1)
    B, K, V = 5000, 4, 16
    probs = torch.softmax(2 * torch.randn(B, K + 1, V, generator=generator), -1).to(dtype)  # (B, K+1, V)
    draft_probs = probs[:, :K].clone()  # (B, K, V)
    draft_tokens = sample(draft_probs, generator=generator)  # (B, K)
    tokens, num_emitted = verify(probs, draft_probs, draft_tokens, generator=generator)
    assert (num_emitted == K + 1).all()
    assert torch.equal(tokens[:, :K], draft_tokens)
    assert tokens.dtype == torch.long and num_emitted.dtype == torch.long


def test_drafted_token_outside_q_support():
    """u q(x) < p(x): q(x) = 0 with p(x) > 0 is accepted (ratio infinite); p(x) = q(x) = 0 is rejected."""
    B = 1000
    target = torch.tensor([[[0.5, 0.5, 0.0], [0.2, 0.3, 0.5]]], dtype=torch.float64).expand(B, 2, 3)
    draft = torch.tensor([[[0.0, 0.5, 0.5]]], dtype=torch.float64).expand(B, 1, 3)
    tokens, n = run(target, draft, torch.zeros(B, 1, dtype=torch.long))
    assert (n == 2).all() and (tokens[:, 0] == 0).all()
    # p(x) = q(x) = 0 and p == q: rejected, residual mass 0 falls back to p
    target = torch.tensor([[[0.5, 0.5, 0.0], [0.2, 0.3, 0.5]]], dtype=torch.float64).expand(B, 2, 3)
    tokens, n = run(target, target[:, :1], torch.full((B, 1), 2))
    assert (n == 1).all() and set(tokens[:, 0].tolist()) <= {0, 1}
    assert (tokens[:, 1] == 0).all()  # entries past num_emitted are 0


def test_target_zero_token_is_rejected_and_never_emitted():
    B = 20_000
    target = torch.tensor([[[0.0, 0.3, 0.7], [0.0, 0.5, 0.5]]], dtype=torch.float32).expand(B, 2, 3)
    draft = torch.tensor([[[0.9, 0.05, 0.05]]], dtype=torch.float32).expand(B, 1, 3)
    generator = torch.Generator().manual_seed(3)
    draft_tokens = sample(draft, generator=generator)  # (B, 1)
    tokens, n = verify(target, draft, draft_tokens, generator=generator)
    assert ((draft_tokens[:, 0] == 0) <= (n == 1)).all()  # drafted 0 -> rejected
    emitted = torch.cat([tokens[n > i, i] for i in range(2)])
    assert (emitted != 0).all()


def test_one_hot_target_is_deterministic():
    B, K, V = 2000, 3, 5
    generator = torch.Generator().manual_seed(4)
    hot = torch.tensor([3, 1, 4, 0])
    target = torch.nn.functional.one_hot(hot, V).to(torch.float64).expand(B, K + 1, V)  # (B, K+1, V)
    draft = torch.softmax(torch.randn(B, K, V, generator=generator, dtype=torch.float64), -1)  # (B, K, V)
    draft_tokens = sample(draft, generator=generator)  # (B, K)
    tokens, n = verify(target, draft, draft_tokens, generator=generator)
    for i in range(K + 1):
        assert (tokens[n > i, i] == hot[i]).all()


def test_minimal_shapes_V1_K1_B1():
    one = torch.ones(1, 2, 1)
    tokens, n = run(one, torch.ones(1, 1, 1), torch.zeros(1, 1, dtype=torch.long))
    assert tokens.tolist() == [[0, 0]] and n.tolist() == [2]
    target = torch.tensor([[[0.5, 0.5], [1.0, 0.0]]])
    tokens, n = run(target, torch.tensor([[[1.0, 0.0]]]), torch.zeros(1, 1, dtype=torch.long))
    assert tokens.shape == (1, 2) and 1 <= int(n) <= 2
    empty_tokens, empty_n = run(torch.ones(0, 3, 4) / 4, torch.ones(0, 2, 4) / 4, torch.zeros(0, 2, dtype=torch.long))
    assert empty_tokens.shape == (0, 3) and empty_n.shape == (0,)


def test_generator_determinism_and_device():
    generator = torch.Generator().manual_seed(5)
    B, K, V = 3000, 3, 7
    target = torch.softmax(torch.randn(B, K + 1, V, generator=generator), -1)  # (B, K+1, V)
    draft = torch.softmax(torch.randn(B, K, V, generator=generator), -1)  # (B, K, V)
    draft_tokens = sample(draft, generator=generator).int()  # int32 tokens are accepted
    a = run(target, draft, draft_tokens, seed=11)
    b = run(target, draft, draft_tokens, seed=11)
    c = run(target, draft, draft_tokens, seed=12)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    assert not torch.equal(a[0], c[0])
    assert a[0].device == target.device and a[1].device == target.device
    u = uniform((3, 2), generator=torch.Generator(device="cpu"), device=torch.device("cpu"))
    assert u.device.type == "cpu" and u.dtype == torch.float64
    # exactly K uniforms per row, then one per row for the last token: the generator advances by that much
    g1, g2 = torch.Generator().manual_seed(9), torch.Generator().manual_seed(9)
    verify(target, draft, draft_tokens, generator=g1)
    torch.rand((B, K), generator=g2, dtype=torch.float64)
    torch.rand((B, 1), generator=g2, dtype=torch.float64)
    assert torch.equal(g1.get_state(), g2.get_state())


def test_contiguous_and_expanded_inputs_agree():
    generator = torch.Generator().manual_seed(6)
    K, V, B = 2, 6, 4000
    target = torch.softmax(torch.randn(1, K + 1, V, generator=generator, dtype=torch.float64), -1)
    draft = torch.softmax(torch.randn(1, K, V, generator=generator, dtype=torch.float64), -1)
    draft_tokens = sample(draft.expand(B, K, V), generator=generator)  # (B, K)
    expanded = run(target.expand(B, K + 1, V), draft.expand(B, K, V), draft_tokens, seed=1)
    contiguous = run(target.expand(B, K + 1, V).contiguous(), draft.expand(B, K, V).contiguous(), draft_tokens, seed=1)
    assert torch.equal(expanded[0], contiguous[0]) and torch.equal(expanded[1], contiguous[1])


def test_residual_weights_and_input_check():
    target = torch.tensor([0.5, 0.3, 0.2], dtype=torch.float32)
    draft = torch.tensor([0.2, 0.5, 0.3], dtype=torch.float32)
    w = residual_weights(target, draft)
    assert w.dtype == torch.float64 and torch.allclose(w, torch.tensor([0.3, 0.0, 0.0], dtype=torch.float64))
    assert check_verifier_inputs(
        torch.ones(2, 4, 3) / 3, torch.ones(2, 3, 3) / 3, torch.zeros(2, 3, dtype=torch.long)
    ) == (2, 3, 3)
