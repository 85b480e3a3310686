"""Tests of ``specverify.decoder.pipeline.ProtocolDecoder``: the speculative decoder built from protocol objects.

Law: the output must be the target's law, checked by ``check_decoder`` and by a direct
chi-square per position against a context-free target (alpha 1e-7); a verifier whose
residual is p (Spec-RL #14) must fail both at the same alpha (power).  Counters: the
per-position drafted/accepted counts, exact acceptance probabilities and accepted-length
histogram obey their identities (hypothesis over small table models), and the oracle
drafter gives exact values.  Protocol: determinism, bad arguments, broken components.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from _targets import WithConditionals
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scipy import stats as _st

from specverify.core.errors import ImplementationError, InvalidArgument
from specverify.core.sampling import sample, uniform
from specverify.core.tables import PositionalCategorical, markov, positional
from specverify.decoder import check_decoder
from specverify.decoder.pipeline import ProtocolDecoder, merge_stats
from specverify.verifier import zoo
from specverify_reference.rules import verify as canonical_verify

ALPHA = 1e-7
PROMPT = torch.tensor([3, 1, 4])


def residual_is_p(target_probs, draft_probs, draft_tokens, *, generator):
    """Lossy verifier (Spec-RL #14): canonical accept step, but the replacement token is drawn from p."""
    B, K1, V = target_probs.shape
    K = K1 - 1
    p_x = target_probs[:, :K].double().gather(-1, draft_tokens[..., None]).squeeze(-1)  # (B, K)
    q_x = draft_probs.double().gather(-1, draft_tokens[..., None]).squeeze(-1)  # (B, K)
    accepted = uniform((B, K), generator=generator) * q_x < p_x  # (B, K)
    n = accepted.long().cumprod(-1).sum(-1)  # (B,)
    last = sample(target_probs.double()[torch.arange(B), n], generator=generator)  # (B,)
    tokens = torch.cat([draft_tokens, torch.zeros_like(draft_tokens[:, :1])], 1)  # (B, K+1)
    tokens = torch.where(torch.arange(K1)[None] < n[:, None], tokens, 0)
    tokens.scatter_(1, n[:, None], last[:, None])
    return tokens, n + 1


def no_bonus(target_probs, draft_probs, draft_tokens, *, generator):
    """Correct variant: the canonical rule without the bonus token."""
    tokens, n = canonical_verify(target_probs, draft_probs, draft_tokens, generator=generator)
    return tokens, n.clamp(max=draft_tokens.shape[1])


@pytest.fixture(scope="module")
def table():
    return markov(12, "peaked", seed=7)


# ------------------------------------------------------------------ output law
@pytest.mark.parametrize("drafter_name", ["uniform", "adversary", "least_likely"])
def test_output_law_is_the_target_law_by_check_decoder(table, drafter_name):
    decoder = ProtocolDecoder(zoo.make_drafter(drafter_name, table), table, k=3)
    report = check_decoder(decoder, table, tier="smoke", seed=1, alpha=ALPHA)
    assert report.verdict == "pass" and not report.errors, report.summary()


def test_wrong_verifier_fails_check_decoder(table):
    decoder = ProtocolDecoder(zoo.uniform(table), table, k=3, verify=residual_is_p)
    report = check_decoder(decoder, table, tier="smoke", seed=1, alpha=ALPHA)
    assert report.verdict == "fail" and not report.errors, report.summary()


def _chi_square_pvalues(verify) -> list[float]:
    """Per new position: chi-square of the emitted tokens against the positional target's row (exact law)."""
    target = positional(8, 10, "peaked", seed=3)
    decoder = ProtocolDecoder(zoo.uniform(target), target, k=3, verify=verify)
    tokens = decoder.generate(PROMPT, num_samples=20_000, max_new_tokens=6, seed=11)
    pvalues = []
    for j in range(tokens.shape[1]):
        law = target.table[min(PROMPT.numel() + j, target.num_contexts - 1)].numpy()
        counts = np.bincount(tokens[:, j].numpy(), minlength=8)
        pvalues.append(float(_st.chisquare(counts, law * counts.sum()).pvalue))
    return pvalues


def test_direct_chi_square_per_position():
    good = _chi_square_pvalues(canonical_verify)
    assert min(good) > ALPHA, f"canonical pipeline: per-position chi-square p-values {good}"
    bad = _chi_square_pvalues(residual_is_p)
    assert min(bad) < ALPHA, f"residual=p pipeline not detected: p-values {bad}"


# ------------------------------------------------------------------ counters
def test_oracle_counters_are_exact(table):
    K = 4
    run = ProtocolDecoder(zoo.oracle(table), table, k=K).decode(PROMPT, num_samples=300, max_new_tokens=9, seed=0)
    s = run.stats
    assert s.acceptance_rate == (1.0,) * K and s.expected_acceptance_rate == pytest.approx((1.0,) * K, abs=1e-12)
    assert s.length_counts == (0,) * K + (s.rounds,)
    assert s.tokens_per_pass == K + 1 and s.rounds == 300 * 2  # 9 tokens need two rounds of 5
    assert s.target_passes_per_token == pytest.approx(2 / 9)


def test_no_bonus_verifier_counts_accepted_drafts(table):
    kwargs = dict(num_samples=500, max_new_tokens=8, seed=4)
    a = ProtocolDecoder(zoo.oracle(table), table, k=3, verify=no_bonus).decode(PROMPT, **kwargs).stats
    assert a.accepted == a.drafted and a.length_counts[-1] == a.rounds and a.tokens_per_pass == 3


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    V=st.integers(2, 6),
    K=st.integers(1, 4),
    N=st.integers(1, 40),
    L=st.integers(1, 7),
    kind=st.sampled_from(["peaked", "topk", "onehot", "flat"]),
    drafter=st.sampled_from(["uniform", "noisy", "stale", "argmax"]),
    seed=st.integers(0, 2**32 - 1),
)
def test_counter_identities(V, K, N, L, kind, drafter, seed):
    target = markov(V, kind, seed=seed % 1000)
    decoder = ProtocolDecoder(zoo.make_drafter(drafter, target), target, k=K)
    run = decoder.decode(torch.tensor([0, V - 1]), num_samples=N, max_new_tokens=L, seed=seed)
    tokens, s = run.tokens, run.stats
    assert tokens.shape == (N, L) and tokens.dtype == torch.long and int(tokens.min()) >= 0 and int(tokens.max()) < V
    assert sum(s.length_counts) == s.rounds == s.drafted[0]
    assert all(s.drafted[i + 1] == s.accepted[i] for i in range(K - 1))
    assert sum(s.accepted) == sum(j * c for j, c in enumerate(s.length_counts))
    assert s.tokens_generated == s.rounds + sum(s.accepted) >= N * L
    assert [p.size for p in s.accept_probs] == list(s.drafted)
    assert all(((p >= 0) & (p <= 1 + 1e-12)).all() for p in s.accept_probs)
    assert sum(s.length_probs_sum) == pytest.approx(s.rounds, rel=1e-9)
    # the support of the output: never a token the target gives probability 0
    seqs = torch.cat([torch.tensor([0, V - 1]).expand(N, -1), tokens], 1)
    for j in range(L):
        probs = target.next_token_probs(seqs[:, : 2 + j])  # (N, V)
        assert bool((probs.gather(1, tokens[:, j : j + 1]) > 0).all())
    assert decoder.last_stats is s
    merged = merge_stats([s, s])
    assert merged.rounds == 2 * s.rounds and merged.accept_probs[0].size == 2 * s.accept_probs[0].size


def test_same_seed_same_output_and_seeds_matter(table):
    decoder = ProtocolDecoder(zoo.noisy(table), table, k=3)
    a = decoder.generate(PROMPT, num_samples=64, max_new_tokens=10, seed=5)
    b = decoder.generate(PROMPT, num_samples=64, max_new_tokens=10, seed=5)
    c = decoder.generate(PROMPT, num_samples=64, max_new_tokens=10, seed=6)
    assert torch.equal(a, b) and not torch.equal(a, c)


def test_batched_conditionals_give_the_same_run(table):
    kwargs = dict(num_samples=200, max_new_tokens=7, seed=9)
    loop = ProtocolDecoder(zoo.noisy(table), table, k=3).decode(PROMPT, **kwargs)
    batched = ProtocolDecoder(zoo.noisy(table), WithConditionals(table), k=3).decode(PROMPT, **kwargs)
    assert torch.equal(loop.tokens, batched.tokens) and loop.stats.accepted == batched.stats.accepted


# ------------------------------------------------------------------ bad input and broken components
def test_bad_arguments(table):
    d = zoo.uniform(table)
    with pytest.raises(InvalidArgument, match="k"):
        ProtocolDecoder(d, table, k=0)
    with pytest.raises(InvalidArgument, match="drafter"):
        ProtocolDecoder(object(), table, k=2)
    with pytest.raises(InvalidArgument, match="target"):
        ProtocolDecoder(d, object(), k=2)
    decoder = ProtocolDecoder(d, table, k=2)
    with pytest.raises(InvalidArgument, match="prompt"):
        decoder.generate(torch.tensor([[1, 2]]), num_samples=2, max_new_tokens=2, seed=0)
    with pytest.raises(InvalidArgument, match="num_samples"):
        decoder.generate(PROMPT, num_samples=0, max_new_tokens=2, seed=0)
    with pytest.raises(InvalidArgument, match="merge|parts"):
        merge_stats([])


class BadDrafter:
    def __init__(self, target, how):
        self.inner, self.how = zoo.uniform(target), how

    def draft(self, prefix, k, *, generator):
        tokens, probs = self.inner.draft(prefix, k, generator=generator)
        if self.how == "raises":
            raise RuntimeError("boom")
        if self.how == "shape":
            return tokens[:, :-1], probs
        if self.how == "oov":
            return tokens + 100, probs
        return tokens, probs * float("nan")


@pytest.mark.parametrize("how", ["raises", "shape", "oov", "nan"])
def test_broken_drafter_raises_implementation_error(table, how):
    decoder = ProtocolDecoder(BadDrafter(table, how), table, k=2)
    with pytest.raises(ImplementationError, match="drafter"):
        decoder.generate(PROMPT, num_samples=4, max_new_tokens=3, seed=0)


def test_broken_verifier_raises_implementation_error(table):
    def too_many(target_probs, draft_probs, draft_tokens, *, generator):
        tokens, n = canonical_verify(target_probs, draft_probs, draft_tokens, generator=generator)
        return tokens, n + 1

    with pytest.raises(ImplementationError, match="num_emitted"):
        ProtocolDecoder(zoo.oracle(table), table, k=2, verify=too_many).generate(
            PROMPT, num_samples=4, max_new_tokens=3, seed=0
        )


def test_context_free_target_from_table():
    target = PositionalCategorical(torch.tensor([[0.5, 0.5, 0.0]], dtype=torch.float64))
    out = ProtocolDecoder(zoo.uniform(target), target, k=2).generate(
        torch.tensor([0]), num_samples=500, max_new_tokens=4, seed=1
    )
    assert int(out.max()) <= 1, "a token of target probability 0 was emitted"
