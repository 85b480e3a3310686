"""reference.block: block verification (Sun, Mendlovic et al. 2024, arXiv 2403.10444) is lossless, and
accepts at least as much as token-wise verification -- both shown exactly by enumerating draft blocks.

Lossless is checked as the next-token identity of one round's emitted block e: for every
prefix s and token y, P(|e| > |s|, e starts with s y) = P(|e| > |s|, e starts with s) p(y | s)
(within 1e-12), which makes repeated rounds emit exactly the target's sequence law (also
checked, on Markov tables).  On the paper's example (V = 2, p = (1/3, 2/3), q = (2/3, 1/3),
K = 2) the expected accepted length is 11/9 against token-wise 10/9.  Deliberately wrong
variants are lossy.  The batched sampler matches the exact law by a chi-square at alpha 1e-6.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from _chain_laws import chain_round_law, expected_accepted, multi_round_chain_law, next_token_error
from _strategies import pooled_chisquare, pq_pairs
from _trees import table_pairs
from hypothesis import given, settings
from hypothesis import strategies as st

from specverify.core.errors import InvalidArgument
from specverify.core.sampling import sample
from specverify.core.tables import PositionalCategorical, markov, positional
from specverify.verifier.tree.laws import sequence_law
from specverify_reference.block import verify
from specverify_reference.rules import verify as token_wise_verify

ATOL = 1e-12
ALPHA = 1e-6


def paper_example():
    target = PositionalCategorical(torch.tensor([[1 / 3, 2 / 3]] * 3, dtype=torch.float64))
    drafter = PositionalCategorical(torch.tensor([[2 / 3, 1 / 3]] * 2, dtype=torch.float64))
    return target, drafter


def test_paper_example_block_beats_token_wise_exactly():
    target, drafter = paper_example()
    block = chain_round_law(target, drafter, 2, rule="block")
    token = chain_round_law(target, drafter, 2, rule="token")
    assert next_token_error(block, target) <= ATOL and next_token_error(token, target) <= ATOL
    assert abs(expected_accepted(token) - 10 / 9) <= ATOL
    assert abs(expected_accepted(block) - 11 / 9) <= ATOL, expected_accepted(block)


@settings(max_examples=40, deadline=None)
@given(K=st.integers(1, 3), V=st.integers(1, 3), data=st.data())
def test_block_is_lossless_and_never_worse_on_positional_rows(K, V, data):
    pairs = [data.draw(pq_pairs(V)) for _ in range(K + 1)]
    target = PositionalCategorical(torch.stack([p for p, _ in pairs]))
    drafter = PositionalCategorical(torch.stack([q for _, q in pairs[:K]]))
    block = chain_round_law(target, drafter, K, rule="block")
    token = chain_round_law(target, drafter, K, rule="token")
    err = next_token_error(block, target)
    assert err <= ATOL, f"block verification is not lossless: max error {err:.3g} (K={K}, V={V})"
    assert expected_accepted(block) >= expected_accepted(token) - ATOL


@settings(max_examples=25, deadline=None)
@given(K=st.integers(1, 3), V=st.integers(1, 3), data=st.data())
def test_block_is_lossless_and_never_worse_on_markov_tables(K, V, data):
    target, drafter = data.draw(table_pairs(V))
    block = chain_round_law(target, drafter, K, rule="block")
    token = chain_round_law(target, drafter, K, rule="token")
    assert next_token_error(block, target) <= ATOL
    assert expected_accepted(block) >= expected_accepted(token) - ATOL


def test_repeated_block_rounds_emit_the_target_sequence_law():
    target, drafter = markov(3, seed=1), markov(3, seed=5)
    law = multi_round_chain_law(target, drafter, K=2, L=4, rule="block")
    assert float((law - sequence_law(target, 4)).abs().max()) <= ATOL
    block = chain_round_law(target, drafter, 3, rule="block")
    token = chain_round_law(target, drafter, 3, rule="token")
    assert expected_accepted(block) > expected_accepted(token) + 1e-3  # 0.984 vs 0.926


@pytest.mark.parametrize("wrong", ["block_plain_residual", "block_first_failure"])
def test_wrong_block_variants_are_lossy(wrong):
    target, drafter = markov(3, seed=1), markov(3, seed=5)
    err = next_token_error(chain_round_law(target, drafter, 3, rule=wrong), target)
    assert err > 1e-3, f"{wrong}: error only {err:.3g}"


# --------------------------------------------------------------------------- the batched sampler


def sequence_counts(tokens, num_emitted, V, K):
    """Counts of each emitted sequence, indexed like ``sequence_index``."""
    index = sequence_index(V, K)
    keys = [index[tuple(row[:n])] for row, n in zip(tokens.tolist(), num_emitted.tolist())]
    return np.bincount(keys, minlength=len(index)).astype(np.float64)


def sequence_index(V, K):
    seqs = [()]
    out = {}
    for _ in range(K + 1):
        seqs = [s + (y,) for s in seqs for y in range(V)]
        for s in seqs:
            out[s] = len(out)
    return out


def block_pvalue(verifier, seed, V=3, K=3, B=120_000):
    """Chi-square p-value of ``verifier``'s emitted blocks against block verification's exact law."""
    target = positional(V, K + 1, "dirichlet", seed=seed, concentration=0.7)
    drafter = positional(V, K, "dirichlet", seed=seed + 10, concentration=0.7)
    gen = torch.Generator().manual_seed(seed)
    target_probs = target.table.expand(B, K + 1, V)  # (B, K+1, V)
    draft_probs = drafter.table.expand(B, K, V)  # (B, K, V)
    draft_tokens = sample(draft_probs, generator=gen)  # (B, K)
    tokens, num_emitted = verifier(target_probs, draft_probs, draft_tokens, generator=gen)
    assert ((tokens[:, :K] == draft_tokens) | (torch.arange(K)[None] >= num_emitted[:, None] - 1)).all()
    counts = sequence_counts(tokens, num_emitted, V, K)
    index = sequence_index(V, K)
    law = np.zeros(len(index))
    for e, prob in chain_round_law(target, drafter, K, rule="block").items():
        law[index[e]] += prob
    support_failures = int(counts[law == 0].sum())
    _, pvalue, bins = pooled_chisquare(counts, law, e_min=20.0)
    return pvalue, bins, support_failures


@pytest.mark.parametrize("seed", [3, 4])
def test_sampler_matches_the_exact_law(seed):
    pvalue, bins, failures = block_pvalue(verify, seed)
    assert not failures, f"emitted {failures} blocks of exact probability 0 (seed={seed})"
    assert bins >= 10 and pvalue > ALPHA, f"block sampler vs exact law: p={pvalue:.3g}, bins={bins}, seed={seed}"


def test_token_wise_sampler_is_told_apart():
    """The check has power: token-wise verification is lossless too, but its blocks have another law."""
    pvalue, _, _ = block_pvalue(token_wise_verify, 3)
    assert pvalue < ALPHA, pvalue


def test_sampler_corners_and_bad_input():
    p = torch.tensor([[0.2, 0.3, 0.5]] * 3, dtype=torch.float64)[None].expand(500, 3, 3)
    gen = torch.Generator().manual_seed(0)
    drafts = sample(p[:, :2], generator=gen)
    tokens, n = verify(p, p[:, :2], drafts, generator=gen)
    assert (n == 3).all() and torch.equal(tokens[:, :2], drafts)  # p == q: the whole block is accepted
    q = torch.tensor([[0.0, 0.0, 1.0]] * 2, dtype=torch.float64)[None].expand(500, 2, 3)
    p0 = torch.tensor([[0.5, 0.5, 0.0]] * 3, dtype=torch.float64)[None].expand(500, 3, 3)
    tokens, n = verify(p0, q, torch.full((500, 2), 2), generator=gen)
    assert (n == 1).all() and (tokens[:, 0] != 2).all()  # drafts on p's zeros are never kept
    with pytest.raises(InvalidArgument, match="draft_probs must have shape"):
        verify(p, p, drafts, generator=gen)
    with pytest.raises(InvalidArgument, match="generator"):
        verify(p, p[:, :2], drafts, generator=None)
