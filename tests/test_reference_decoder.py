"""Tests of the reference speculative decoder (reference.decoder) and direct sampling (reference.direct).

Deterministic checks: greedy speculative output equals the target's greedy
continuation token for token; seeds reproduce; rows advance independently.
Statistical checks (fixed seeds, alpha 1e-7 per assertion): the first three new
tokens follow the exact target law computed by teacher forcing, per position and
jointly, and planted decoder bugs (target KV cache not rolled back, top-k on the
drafter's sampling but not on its reported q, target at temperature 1 instead of
0.7) are caught by the same check.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy import stats as sps

from specverify.core.errors import InvalidArgument
from specverify.mutants.decoder import NoTargetRollback, TargetUnprocessed, TopKNotInReportedQ
from specverify_reference.decoder import SpeculativeDecoder
from specverify_reference.direct import DirectSampler, TargetAdapter
from specverify_reference.models import NGramDrafter, make_pair
from specverify_reference.processors import GREEDY, SamplingConfig, logits_to_probs

ALPHA = 1e-7
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def greedy_continuation(target, prompts, n):
    """The target's greedy continuation by full (uncached) forward passes: (B, n)."""
    seq = prompts.clone()
    for _ in range(n):
        seq = torch.cat([seq, target(seq)[:, -1].argmax(-1, keepdim=True)], dim=1)
    return seq[:, prompts.shape[1] :]


# ------------------------------------------------------------------ greedy
@pytest.mark.parametrize("k", [1, 2, 4])
@pytest.mark.parametrize("batch", [1, 5])
@pytest.mark.parametrize("drafter_kind", ["early_exit", "shallow", "ngram"])
def test_greedy_speculative_equals_target_greedy(k, batch, drafter_kind):
    V = 48
    if drafter_kind == "ngram":
        target, _ = make_pair(vocab_size=V, seed=4)
        drafter = NGramDrafter(V)
    else:
        target, drafter = make_pair(vocab_size=V, seed=4, drafter=drafter_kind)
    prompts = torch.randint(0, V, (batch, 6), generator=torch.Generator().manual_seed(k * 10 + batch))
    expected = greedy_continuation(target, prompts, 14)
    dec = SpeculativeDecoder(target, drafter, k=k, greedy=True)
    result = dec.generate_batch(prompts, 14, generator=torch.Generator().manual_seed(0))
    assert torch.equal(result.tokens, expected), (
        f"greedy speculative (K={k}, {drafter_kind}) != target greedy:\n{result.tokens}\nvs\n{expected}"
    )
    # Temperature 0 through the stochastic verifier is the same continuation.
    dec0 = SpeculativeDecoder(target, drafter, k=k, sampling=GREEDY)
    assert torch.equal(dec0.generate_batch(prompts, 14, generator=torch.Generator().manual_seed(1)).tokens, expected)


def test_direct_sampler_greedy_equals_target_greedy():
    target, _ = make_pair(vocab_size=48, seed=4)
    prompts = torch.randint(0, 48, (3, 5), generator=torch.Generator().manual_seed(0))
    out = DirectSampler(target, GREEDY).generate_batch(prompts, 10, generator=torch.Generator().manual_seed(0))
    assert torch.equal(out, greedy_continuation(target, prompts, 10))


# ------------------------------------------------------------------ protocol, determinism, bookkeeping
def test_generate_is_deterministic_in_the_seed():
    target, drafter = make_pair(vocab_size=32, seed=0)
    dec = SpeculativeDecoder(target, drafter, k=3, sampling=SamplingConfig(temperature=0.9), max_batch=37)
    prompt = torch.tensor([1, 2, 3])
    a = dec.generate(prompt, num_samples=100, max_new_tokens=7, seed=5)
    assert a.shape == (100, 7) and a.dtype == torch.long and bool(((a >= 0) & (a < 32)).all())
    assert torch.equal(a, dec.generate(prompt, num_samples=100, max_new_tokens=7, seed=5))
    assert not torch.equal(a, dec.generate(prompt, num_samples=100, max_new_tokens=7, seed=6))
    direct = DirectSampler(target)
    b = direct.generate(prompt, num_samples=50, max_new_tokens=4, seed=5)
    assert b.shape == (50, 4) and torch.equal(b, direct.generate(prompt, num_samples=50, max_new_tokens=4, seed=5))


class RecordingDecoder(SpeculativeDecoder):
    """Records each round's per-row emitted counts (a use of the ``_verify`` hook)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.emitted = []

    def _verify(self, target_probs, draft_probs, draft_tokens, generator):
        tokens, num_emitted = super()._verify(target_probs, draft_probs, draft_tokens, generator)
        self.emitted.append(num_emitted.clone())
        return tokens, num_emitted


def test_rows_advance_independently_and_stats_add_up():
    target, drafter = make_pair(vocab_size=32, seed=1)
    dec = RecordingDecoder(target, drafter, k=4)
    prompts = torch.randint(0, 32, (64, 4), generator=torch.Generator().manual_seed(2))
    result = dec.generate_batch(prompts, 20, generator=torch.Generator().manual_seed(3))
    assert result.tokens.shape == (64, 20)
    assert len(set(dec.emitted[0].tolist())) > 2, "every row emitted the same count in round 1"
    active = [e.numel() for e in dec.emitted]
    assert active[0] == 64 and active[-1] < 64, "finished rows should leave the batch"
    s = result.stats
    assert s.rounds == len(dec.emitted) and s.row_rounds == sum(active)
    assert s.tokens_generated == sum(int(e.sum()) for e in dec.emitted) >= 64 * 20
    assert s.drafted[0] == s.row_rounds and all(a <= d for a, d in zip(s.accepted, s.drafted))
    assert abs(s.tokens_per_pass - (s.mean_accepted + 1)) < 1e-12
    assert s.target_passes_per_token < 1.0 and len(s.acceptance_rate) == 4


def test_greedy_rows_do_not_depend_on_the_batch():
    target, drafter = make_pair(vocab_size=32, seed=1)
    dec = SpeculativeDecoder(target, drafter, k=3, greedy=True)
    prompts = torch.randint(0, 32, (6, 4), generator=torch.Generator().manual_seed(4))
    batched = dec.generate_batch(prompts, 12, generator=torch.Generator().manual_seed(0)).tokens
    for b in range(6):
        alone = dec.generate_batch(prompts[b : b + 1], 12, generator=torch.Generator().manual_seed(0)).tokens
        assert torch.equal(alone[0], batched[b])


def test_validation():
    target, drafter = make_pair(vocab_size=32, seed=0)
    other, _ = make_pair(vocab_size=16, seed=0)
    with pytest.raises(InvalidArgument, match="k"):
        SpeculativeDecoder(target, drafter, k=0)
    with pytest.raises(InvalidArgument, match="vocab_size"):
        SpeculativeDecoder(target, other, k=2)
    with pytest.raises(InvalidArgument, match="sampling"):
        SpeculativeDecoder(target, drafter, k=2, sampling={"temperature": 1.0})
    dec = SpeculativeDecoder(target, drafter, k=2)
    with pytest.raises(InvalidArgument, match="prompt"):
        dec.generate(torch.tensor([1, 99]), num_samples=2, max_new_tokens=2, seed=0)
    with pytest.raises(InvalidArgument, match="prompt"):
        dec.generate(torch.tensor([[1, 2]]), num_samples=2, max_new_tokens=2, seed=0)
    with pytest.raises(InvalidArgument, match="num_samples"):
        dec.generate(torch.tensor([1]), num_samples=0, max_new_tokens=2, seed=0)
    with pytest.raises(InvalidArgument, match="max_new_tokens"):
        dec.generate(torch.tensor([1]), num_samples=2, max_new_tokens=0, seed=0)
    with pytest.raises(InvalidArgument, match="generator"):
        dec.generate_batch(torch.tensor([[1]]), 2, generator=0)


# ------------------------------------------------------------------ statistics
V_STAT, N_STAT, SEED_STAT = 16, 20_000, 1
PROMPT = torch.tensor([3, 1, 4, 1])


@pytest.fixture(scope="module")
def tiny_pair():
    return make_pair(vocab_size=V_STAT, seed=3, d_model=32, n_layers=2, n_heads=2, draft_layers=1)


def exact_joint(target, sampling, n_new=3):
    """Exact law of the first ``n_new`` new tokens, (V,)*n_new, by teacher forcing every continuation."""
    V, T = target.vocab_size, PROMPT.numel()
    grid = torch.cartesian_prod(*[torch.arange(V)] * n_new)  # (V^n, n)
    seqs = torch.cat([PROMPT.expand(grid.shape[0], -1), grid], dim=1)  # (V^n, T+n)
    cond = TargetAdapter(target, sampling).conditionals(seqs, T)  # (V^n, n, V)
    joint = cond.gather(-1, grid[..., None]).squeeze(-1).prod(-1)  # (V^n,)
    return joint.reshape([V] * n_new).numpy()


def pooled_gof(counts, probs, e_min=20.0):
    """Cressie-Read (lambda 2/3) GOF on cells sorted by expected count, tail pooled to >= e_min.

    Returns (pvalue, number of bins); pvalue 0 when a zero-probability cell is observed.
    """
    counts, probs = np.asarray(counts, float).ravel(), np.asarray(probs, float).ravel()
    n = counts.sum()
    if (counts[probs <= 0] > 0).any():
        return 0.0, 0
    order = np.argsort(-probs, kind="stable")
    expected, observed = probs[order] / probs.sum() * n, counts[order]
    bins_e, bins_o, acc_e, acc_o = [], [], 0.0, 0.0
    for e, o in zip(expected, observed):
        acc_e, acc_o = acc_e + e, acc_o + o
        if acc_e >= e_min:
            bins_e.append(acc_e), bins_o.append(acc_o)
            acc_e = acc_o = 0.0
    bins_e[-1] += acc_e
    bins_o[-1] += acc_o
    if len(bins_e) < 2:
        return 1.0, 1
    stat, p = sps.power_divergence(bins_o, bins_e, lambda_="cressie-read")
    return float(p), len(bins_e)


def law_pvalues(decoder, sampling, target):
    """p-values of the first 3 new tokens vs the exact law: positions 1, 2, 3, joint (1,2), joint (1,2,3)."""
    out = decoder.generate(PROMPT, num_samples=N_STAT, max_new_tokens=3, seed=SEED_STAT).numpy()
    V = V_STAT
    counts = np.zeros((V, V, V))
    np.add.at(counts, (out[:, 0], out[:, 1], out[:, 2]), 1)
    exact = exact_joint(target, sampling)
    summed_over = {"x1": (1, 2), "x2": (0, 2), "x3": (0, 1), "x1x2": (2,), "x1x2x3": ()}
    return {name: pooled_gof(counts.sum(axis=ax), exact.sum(axis=ax)) for name, ax in summed_over.items()}


def _describe(pvalues):
    return ", ".join(f"{k}: p={p:.3g} ({b} bins)" for k, (p, b) in pvalues.items())


CONFIGS = {
    "t1": SamplingConfig(),
    "t0.8_topk5": SamplingConfig(temperature=0.8, top_k=5),
    "t1.3_topp0.9_minp0.05": SamplingConfig(temperature=1.3, top_p=0.9, min_p=0.05),
}


@pytest.mark.parametrize("config", list(CONFIGS))
def test_speculative_first_tokens_follow_the_exact_target_law(tiny_pair, config):
    target, drafter = tiny_pair
    sampling = CONFIGS[config]
    pvalues = law_pvalues(SpeculativeDecoder(target, drafter, k=2, sampling=sampling), sampling, target)
    assert min(p for p, _ in pvalues.values()) > ALPHA, (
        f"speculative decoding (K=2, {config}, N={N_STAT}, seed={SEED_STAT}) deviates from the exact "
        f"target law: {_describe(pvalues)}"
    )


@pytest.mark.parametrize("which", ["direct", "ngram"])
def test_direct_and_ngram_decoders_follow_the_exact_target_law(tiny_pair, which):
    target, _ = tiny_pair
    sampling = SamplingConfig(temperature=0.9)
    if which == "direct":
        decoder = DirectSampler(target, sampling)
    else:  # deterministic drafter: one-hot q, so every rejection goes through the residual
        decoder = SpeculativeDecoder(target, NGramDrafter(V_STAT), k=2, sampling=sampling)
    pvalues = law_pvalues(decoder, sampling, target)
    assert min(p for p, _ in pvalues.values()) > ALPHA, f"{which}: {_describe(pvalues)}"


class NoDrafterRollback(SpeculativeDecoder):
    """Equivalent variant: the drafter keeps rejected drafts in its cache (a stale context).

    Its q is still the law it sampled from, so the output law must not change.
    """

    def _rollback_drafter(self, state):
        pass


def test_stale_drafter_context_is_lossless(tiny_pair):
    target, drafter = tiny_pair
    sampling = SamplingConfig()
    pvalues = law_pvalues(NoDrafterRollback(target, drafter, k=2, sampling=sampling), sampling, target)
    assert min(p for p, _ in pvalues.values()) > ALPHA, f"honest stale drafter flagged: {_describe(pvalues)}"


MUTANTS = {
    "no_target_rollback": (NoTargetRollback, SamplingConfig()),
    "topk_not_in_q": (TopKNotInReportedQ, SamplingConfig(top_k=3)),
    "target_temperature_1": (TargetUnprocessed, SamplingConfig(temperature=0.7)),
}


@pytest.mark.parametrize("mutant", list(MUTANTS))
def test_planted_decoder_bugs_are_caught(tiny_pair, mutant):
    target, drafter = tiny_pair
    cls, sampling = MUTANTS[mutant]
    pvalues = law_pvalues(cls(target, drafter, k=2, sampling=sampling), sampling, target)
    assert pvalues["x1x2x3"][0] < ALPHA, f"planted bug {mutant} not detected: {_describe(pvalues)}"


@pytest.mark.parametrize(
    "decoder_cls,sampling,detect",
    [
        (SpeculativeDecoder, SamplingConfig(top_k=3), False),
        (SpeculativeDecoder, SamplingConfig(temperature=0.7), False),
        (TargetUnprocessed, SamplingConfig(temperature=0.7), True),  # rate 0.7067 instead of 0.6617
    ],
)
def test_first_position_acceptance_rate_is_sum_min_p_q(tiny_pair, decoder_cls, sampling, detect):
    """In round 1 the first draft is accepted with probability exactly sum_x min(p(x), q(x)) at the prompt."""
    target, drafter = tiny_pair
    dec = decoder_cls(target, drafter, k=2, sampling=sampling)
    prompts = PROMPT.expand(N_STAT, -1)
    stats = dec.generate_batch(prompts, 1, generator=torch.Generator().manual_seed(SEED_STAT)).stats
    target_probs = logits_to_probs(target(PROMPT[None])[:, -1], sampling)[0]
    draft_probs = logits_to_probs(drafter(PROMPT[None])[:, -1], sampling)[0]
    expected = float(torch.minimum(target_probs, draft_probs).sum())
    assert stats.drafted[0] == N_STAT
    p = sps.binomtest(stats.accepted[0], N_STAT, expected).pvalue
    message = (
        f"{decoder_cls.__name__} ({sampling}): accepted {stats.accepted[0]}/{N_STAT} at position 1, "
        f"expected rate {expected:.4f}, binomial p={p:.3g}, seed={SEED_STAT}"
    )
    assert (p < ALPHA) == detect, message


# ------------------------------------------------------------------ GPU
@pytest.mark.gpu
@cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cuda_decoder(dtype):
    target, drafter = make_pair(vocab_size=64, seed=2, device="cuda", dtype=dtype)
    prompts = torch.randint(0, 64, (8, 5), generator=torch.Generator().manual_seed(0)).cuda()
    dec = SpeculativeDecoder(target, drafter, k=3, greedy=True)
    out = dec.generate_batch(prompts, 16, generator=torch.Generator(device="cuda").manual_seed(0)).tokens
    if dtype == torch.float32:
        assert torch.equal(out, greedy_continuation(target, prompts, 16))
    sampled = SpeculativeDecoder(target, drafter, k=3).generate(prompts[0], num_samples=256, max_new_tokens=8, seed=0)
    assert sampled.shape == (256, 8) and sampled.device.type == "cuda" and bool((sampled < 64).all())
