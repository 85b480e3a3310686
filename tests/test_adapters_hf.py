"""Hugging Face transformers adapters: HF kernel verifier, assisted decoder, exact target.

Skipped when transformers is not installed.  Every random assertion uses a fixed
seed and alpha = 1e-7 (pooled Pearson chi-square, bins of expected count >= 20 in
p-order, zero-probability emissions are support failures on their own) and has a
planted deviation with the same samples that the same test rejects, proving power.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

pytest.importorskip("transformers")

from _strategies import pooled_chisquare
from scipy import stats as sps
from transformers import GenerationConfig

import specverify_reference.rules as rules
from specverify.adapters import hf
from specverify.adapters.fixtures.llama import tiny_llama, tiny_llama_pair
from specverify.adapters.hf import kernel as hf_kernel
from specverify.core.errors import ImplementationError, InvalidArgument

ALPHA = 1e-7
VERSION = hf.TRANSFORMERS_VERSION


# ---------------------------------------------------------------------------- helpers


def counts_of(tokens: torch.Tensor, V: int) -> np.ndarray:
    return np.bincount(tokens.reshape(-1).numpy(), minlength=V)


def assert_law(counts, probs, what: str, repro: str) -> None:
    stat, p, bins = pooled_chisquare(counts, probs, e_min=20.0, support=True)
    df = max(bins - 1, 0)
    n = int(np.sum(counts))
    assert p > ALPHA, (
        f"{what}: observed {np.asarray(counts).tolist()} vs expected "
        f"{np.round(np.asarray(probs) * n, 1).tolist()}: chi2={stat:.1f} df={df} p={p:.2e} N={n} "
        f"(transformers {VERSION}); repro: {repro}"
    )


def assert_detects(counts, probs, what: str) -> None:
    stat, p, bins = pooled_chisquare(counts, probs, e_min=20.0, support=True)
    df = max(bins - 1, 0)
    assert p < ALPHA, f"no power: {what} not rejected (chi2={stat:.1f} df={df} p={p:.2e} N={int(np.sum(counts))})"


# ------------------------------------------------------------------- kernel (verifier)

# A fixed K=2 scenario, V=6: position-dependent p, drafts from q (TV(p, q) about 0.4).
TARGET = torch.tensor(
    [
        [0.30, 0.25, 0.20, 0.15, 0.10, 0.00],
        [0.05, 0.05, 0.10, 0.20, 0.25, 0.35],
        [0.40, 0.00, 0.30, 0.00, 0.20, 0.10],
    ],
    dtype=torch.float64,
)  # (K+1, V)
DRAFT = torch.tensor(
    [
        [0.05, 0.10, 0.15, 0.20, 0.25, 0.25],
        [0.30, 0.30, 0.20, 0.10, 0.05, 0.05],
    ],
    dtype=torch.float64,
)  # (K, V)


def scenario(B: int, seed: int):
    generator = torch.Generator().manual_seed(seed)
    K, V = DRAFT.shape
    target_probs = TARGET.expand(B, K + 1, V).clone()  # (B, K+1, V)
    draft_probs = DRAFT.expand(B, K, V).clone()  # (B, K, V)
    draft_tokens = torch.multinomial(draft_probs.reshape(-1, V), 1, generator=generator).reshape(B, K)  # (B, K)
    return target_probs, draft_probs, draft_tokens


def test_kernel_signature_recognised():
    assert hf_kernel.KERNEL_PROBLEM is None, hf_kernel.KERNEL_PROBLEM
    assert hf_kernel.KERNEL_PARAMETERS[:4] == (
        "candidate_input_ids",
        "candidate_logits",
        "candidate_length",
        "new_logits",
    )


def test_kernel_signature_change_is_reported(monkeypatch):
    def changed(candidate_input_ids, candidate_logits, new_logits, temperature):  # pragma: no cover - never called
        raise AssertionError

    monkeypatch.setattr(hf_kernel._hf_utils, "_speculative_sampling", changed)
    _, _, problem = hf_kernel._inspect_kernel()
    assert problem is not None and VERSION in problem and "_speculative_sampling" in problem
    monkeypatch.setattr(hf_kernel, "KERNEL_PROBLEM", problem)
    with pytest.raises(ImplementationError, match=VERSION.replace(".", r"\.")):
        hf_kernel.SpeculativeSamplingVerifier()


def test_kernel_output_law_matches_target_at_positions_1_and_2():
    B, seed = 4000, 11
    target_probs, draft_probs, draft_tokens = scenario(B, seed)
    generator = torch.Generator().manual_seed(seed + 1)
    tokens, emitted = hf.speculative_sampling_verifier(target_probs, draft_probs, draft_tokens, generator=generator)
    repro = f"scenario(B={B}, seed={seed}); speculative_sampling_verifier(..., generator=manual_seed({seed + 1}))"
    V = TARGET.shape[1]
    assert_law(counts_of(tokens[:, 0], V), TARGET[0], "HF kernel, position 1", repro)
    second = tokens[emitted >= 2, 1]
    assert second.numel() > 1500
    assert_law(counts_of(second, V), TARGET[1], "HF kernel, position 2 (after an accepted draft)", repro)
    # acceptance at position 1 is exactly sum_x min(p, q) under the canonical rule
    accept_prob = float(torch.minimum(TARGET[0], DRAFT[0]).sum())
    accepted = int((emitted >= 2).sum())
    pvalue = sps.binomtest(accepted, B, accept_prob).pvalue
    assert pvalue > ALPHA, f"acceptance {accepted}/{B} vs sum min(p,q)={accept_prob:.4f}: p={pvalue:.2e}; {repro}"
    # power: the same test rejects HF's own lossy ensemble verification (w = 0.5), same drafts and seed
    lossy = hf.SpeculativeSamplingVerifier(assistant_ensemble_weight=0.5)
    bad, bad_emitted = lossy.verify(
        target_probs, draft_probs, draft_tokens, generator=torch.Generator().manual_seed(seed + 1)
    )
    assert_detects(counts_of(bad[:, 0], V), TARGET[0], "ensemble w=0.5 at position 1 (support failure: p(5)=0)")
    assert_detects(counts_of(bad[bad_emitted >= 2, 1], V), TARGET[1], "ensemble w=0.5 at position 2 (full support)")


def test_kernel_is_deterministic_and_leaves_global_rng_alone():
    target_probs, draft_probs, draft_tokens = scenario(200, 5)
    state = torch.get_rng_state()
    threads = torch.get_num_threads()
    for dtype in ("float32", "float64", None):
        verifier = hf.SpeculativeSamplingVerifier(dtype=dtype)
        a = verifier.verify(target_probs, draft_probs, draft_tokens, generator=torch.Generator().manual_seed(1))
        b = verifier.verify(target_probs, draft_probs, draft_tokens, generator=torch.Generator().manual_seed(1))
        c = verifier.verify(target_probs, draft_probs, draft_tokens, generator=torch.Generator().manual_seed(2))
        assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
        assert not torch.equal(a[0], c[0])
        tokens, emitted = a
        assert tokens.shape == (200, 3) and tokens.dtype == torch.long and emitted.dtype == torch.long
        assert bool(((emitted >= 1) & (emitted <= 3)).all())
        K = draft_tokens.shape[1]
        for row in range(200):
            n = int(emitted[row])
            assert torch.equal(tokens[row, : n - 1], draft_tokens[row, : n - 1])  # accepted drafts kept
            assert bool((tokens[row, n:] == 0).all()) and n <= K + 1
    assert torch.equal(state, torch.get_rng_state()), "the adapter changed the caller's global RNG state"
    assert torch.get_num_threads() == threads


def test_kernel_bonus_token_comes_from_the_last_target_row():
    # q == p at positions 1..K: every draft is accepted, the bonus is drawn from p_{K+1} (a point mass here).
    K, V, B = 3, 5, 50
    rows = torch.softmax(torch.randn(K, V, generator=torch.Generator().manual_seed(0), dtype=torch.float64), -1)
    bonus = torch.zeros(1, V, dtype=torch.float64)
    bonus[0, 4] = 1.0
    target_probs = torch.cat([rows, bonus]).expand(B, K + 1, V).clone()
    draft_probs = rows.expand(B, K, V).clone()
    draft_tokens = torch.multinomial(
        rows, B, replacement=True, generator=torch.Generator().manual_seed(1)
    ).T.contiguous()
    tokens, emitted = hf.speculative_sampling_verifier(
        target_probs, draft_probs, draft_tokens, generator=torch.Generator().manual_seed(2)
    )
    assert bool((emitted == K + 1).all()) and bool((tokens[:, K] == 4).all())


def test_kernel_accepts_a_zero_probability_draft_when_its_uniform_is_zero(monkeypatch):
    """Documents upstream behaviour: accept iff r <= p/q, so r == 0 accepts p(x) = 0 (float32: P = 2**-24)."""
    target_probs = torch.tensor([[[0.0, 0.5, 0.5], [0.2, 0.3, 0.5]]])  # (1, 2, 3)
    draft_probs = torch.tensor([[[1.0, 0.0, 0.0]]])  # (1, 1, 3)
    draft_tokens = torch.tensor([[0]])
    monkeypatch.setattr(torch, "rand_like", lambda t, **kw: torch.zeros_like(t))
    tokens, emitted = hf.speculative_sampling_verifier(
        target_probs, draft_probs, draft_tokens, generator=torch.Generator().manual_seed(0)
    )
    if int(emitted[0]) == 1:
        pytest.skip(f"transformers {VERSION} no longer accepts p(x)=0 drafts when r == 0")
    assert int(tokens[0, 0]) == 0 and int(emitted[0]) == 2
    # the reference rule (u q < p) rejects it for every u
    ref, ref_emitted = rules.verify(target_probs, draft_probs, draft_tokens, generator=torch.Generator().manual_seed(0))
    assert int(ref_emitted[0]) == 1 and int(ref[0, 0]) != 0


def test_kernel_failure_becomes_implementation_error(monkeypatch):
    # r = 2 > p/q = 1 rejects a draft with p == q: the residual has mass 0, the kernel divides by 0
    # and torch.multinomial raises on NaN -> ImplementationError naming the row.
    target_probs, draft_probs, draft_tokens = scenario(3, 0)
    target_probs[:, :2] = draft_probs
    monkeypatch.setattr(torch, "rand_like", lambda t, **kw: torch.full_like(t, 2.0))
    with pytest.raises(ImplementationError, match="row 0") as info:
        hf.speculative_sampling_verifier(
            target_probs, draft_probs, draft_tokens, generator=torch.Generator().manual_seed(0)
        )
    assert info.value.row == 0


def test_kernel_rejects_bad_input():
    target_probs, draft_probs, draft_tokens = scenario(4, 0)
    g = torch.Generator().manual_seed(0)
    with pytest.raises(InvalidArgument, match="draft_probs"):
        hf.speculative_sampling_verifier(target_probs, draft_probs[:, :1], draft_tokens, generator=g)
    with pytest.raises(InvalidArgument, match="target_probs"):
        hf.speculative_sampling_verifier(target_probs * 2, draft_probs, draft_tokens, generator=g)
    with pytest.raises(InvalidArgument, match="generator"):
        hf.speculative_sampling_verifier(target_probs, draft_probs, draft_tokens, generator=None)
    with pytest.raises(InvalidArgument, match="dtype"):
        hf.SpeculativeSamplingVerifier(dtype="int64")
    with pytest.raises(InvalidArgument, match="assistant_ensemble_weight"):
        hf.SpeculativeSamplingVerifier(assistant_ensemble_weight=1.5)


# ------------------------------------------------------------------------ models, target

OPTION_SETS = [
    dict(),
    dict(temperature=0.7),
    dict(temperature=1.3, top_k=5),
    dict(temperature=0.9, top_k=20, top_p=0.8),
    dict(top_p=0.6, min_p=0.05),
]


def test_tiny_models_are_deterministic_and_leave_global_rng_alone():
    state = torch.get_rng_state()
    a, b = tiny_llama(seed=3), tiny_llama(seed=3)
    c = tiny_llama(seed=4)
    assert torch.equal(state, torch.get_rng_state())
    sa, sb, sc = a.state_dict(), b.state_dict(), c.state_dict()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    assert not all(torch.equal(sa[k], sc[k]) for k in sa)
    target, assistant = tiny_llama_pair(seed=3)
    assert all(torch.equal(sa[k], v) for k, v in target.state_dict().items())
    assert assistant.config.num_hidden_layers == 1
    # same seed => the target factory and the decoder factory hold the same weights
    dec, tgt = hf.tiny_assisted_decoder(seed=3), hf.tiny_target(seed=3)
    assert all(torch.equal(v, tgt.model.state_dict()[k]) for k, v in dec.model.state_dict().items())


@pytest.mark.parametrize("options", OPTION_SETS)
def test_processors_equal_the_ones_generate_builds(options):
    model = tiny_llama(seed=0)
    config = GenerationConfig(do_sample=True, **{"top_k": 0, **options})
    try:
        theirs = model._get_logits_processor(generation_config=config, input_ids_seq_length=4, device="cpu")
    except (AttributeError, TypeError) as exc:  # private API of transformers
        pytest.skip(f"transformers {VERSION}: _get_logits_processor unavailable ({exc})")
    ours = hf.sampling_processors(**options)
    assert [type(p) for p in ours] == [type(p) for p in theirs]
    scores = torch.randn(64, 32, generator=torch.Generator().manual_seed(1)) * 3
    ids = torch.zeros(64, 4, dtype=torch.long)
    assert torch.equal(ours(ids, scores.clone()), theirs(ids, scores.clone()))


@pytest.mark.parametrize("options", OPTION_SETS[1:4])
def test_target_conditionals_equal_generate_scores(options):
    target = hf.tiny_target(seed=0, **options)
    prompt = torch.tensor([[5, 1, 7]])
    config = GenerationConfig(
        do_sample=True,
        max_new_tokens=6,
        output_scores=True,
        return_dict_in_generate=True,
        pad_token_id=0,
        **{"top_k": 0, **options},
    )
    with torch.random.fork_rng(devices=[]), hf_kernel.torch_threads(1):
        torch.default_generator.manual_seed(0)
        out = target.model.generate(prompt, attention_mask=torch.ones_like(prompt), generation_config=config)
    scores = torch.stack(out.scores, dim=1).double().softmax(-1)  # (1, L, V)
    ours = target.conditionals(out.sequences, start=3)  # (1, L, V)
    assert ours.shape == scores.shape == (1, 6, 32) and ours.dtype == torch.float64
    torch.testing.assert_close(ours, scores, atol=2e-6, rtol=0)
    assert torch.equal(ours > 0, scores > 0)
    # teacher forcing equals step-by-step next_token_probs
    for i in range(6):
        step = target.next_token_probs(out.sequences[:, : 3 + i])
        torch.testing.assert_close(step, ours[:, i], atol=2e-6, rtol=0)


def test_assisted_generate_verifies_against_the_processed_target():
    dec = hf.tiny_assisted_decoder(k=3, temperature=0.8, top_k=12, top_p=0.9, seed=1)
    target = dec.target()
    prompt = torch.tensor([[2, 9, 4, 4]])
    config = GenerationConfig(max_new_tokens=9, output_scores=True, return_dict_in_generate=True, **dec._config_kwargs)
    with torch.random.fork_rng(devices=[]), hf_kernel.torch_threads(1):
        torch.default_generator.manual_seed(3)
        out = dec.model.generate(
            prompt, attention_mask=torch.ones_like(prompt), assistant_model=dec.assistant, generation_config=config
        )
    scores = torch.stack(out.scores, dim=1).double().softmax(-1)  # (1, L, V)
    torch.testing.assert_close(target.conditionals(out.sequences, start=4), scores, atol=2e-6, rtol=0)


def test_target_rejects_bad_input():
    target = hf.tiny_target()
    with pytest.raises(InvalidArgument, match="prefix"):
        target.next_token_probs(torch.tensor([1, 2]))
    with pytest.raises(InvalidArgument, match="prefix"):
        target.next_token_probs(torch.tensor([[1, 32]]))
    with pytest.raises(InvalidArgument, match="start"):
        target.conditionals(torch.tensor([[1, 2, 3]]), start=3)
    with pytest.raises(InvalidArgument, match="top_p"):
        hf.tiny_target(top_p=0.0)
    with pytest.raises(InvalidArgument, match="temperature"):
        hf.tiny_target(temperature=0)


# ------------------------------------------------------------------------------ decoder


@pytest.fixture(scope="module")
def decoder():
    return hf.tiny_assisted_decoder(k=2, temperature=0.8, top_k=20, top_p=0.95, seed=0)


def test_decoder_shapes_determinism_and_rng_hygiene(decoder):
    prompt = torch.tensor([3, 14, 15])
    state, threads = torch.get_rng_state(), torch.get_num_threads()
    a = decoder.generate(prompt, num_samples=4, max_new_tokens=5, seed=7)
    b = decoder.generate(prompt, num_samples=4, max_new_tokens=5, seed=7)
    c = decoder.generate(prompt, num_samples=4, max_new_tokens=5, seed=8)
    assert torch.equal(state, torch.get_rng_state()) and torch.get_num_threads() == threads
    assert a.shape == (4, 5) and a.dtype == torch.long
    assert torch.equal(a, b) and not torch.equal(a, c)
    assert bool(((a >= 0) & (a < 32)).all())
    # every emitted token is inside the processed target support (top-k / top-p zeros)
    seqs = torch.cat([prompt.expand(4, 3), a], dim=1)
    cond = decoder.target().conditionals(seqs, start=3)  # (4, 5, V)
    assert bool((cond.gather(-1, a[..., None]) > 0).all())


def test_decoder_rejects_bad_input(decoder):
    with pytest.raises(InvalidArgument, match="prompt"):
        decoder.generate(torch.tensor([[1, 2]]), num_samples=1, max_new_tokens=2, seed=0)
    with pytest.raises(InvalidArgument, match="prompt"):
        decoder.generate(torch.tensor([40]), num_samples=1, max_new_tokens=2, seed=0)
    with pytest.raises(InvalidArgument, match="num_samples"):
        decoder.generate(torch.tensor([1]), num_samples=0, max_new_tokens=2, seed=0)
    with pytest.raises(InvalidArgument, match="seed"):
        decoder.generate(torch.tensor([1]), num_samples=1, max_new_tokens=2, seed=-1)
    with pytest.raises(InvalidArgument, match="k"):
        hf.tiny_assisted_decoder(k=0)


def _first_token_check(decoder, prompt, n, max_new_tokens, seed):
    out = decoder.generate(prompt, num_samples=n, max_new_tokens=max_new_tokens, seed=seed)
    counts = counts_of(out[:, 0], decoder.vocab_size)
    law = decoder.target().next_token_probs(prompt[None])[0].numpy()
    repro = (
        f"tiny_assisted_decoder(**{decoder.options}, k={decoder.k}).generate({prompt.tolist()}, "
        f"num_samples={n}, max_new_tokens={max_new_tokens}, seed={seed})"
    )
    assert_law(counts, law, "assisted generate, first token", repro)
    # power: the same samples against the assistant's processed law (what always-accept would emit)
    q = hf.HFTarget(decoder.assistant, **{k: v for k, v in decoder.options.items()}).next_token_probs(prompt[None])[0]
    assert_detects(counts, q.numpy(), "first token vs the assistant's law")


def test_decoder_first_token_law_matches_target(decoder):
    # max_new_tokens=2: the first round drafts one token, so the first emitted token went
    # through _speculative_sampling (accepted draft or residual)
    _first_token_check(decoder, torch.tensor([3, 14, 15]), n=150, max_new_tokens=2, seed=0)


@pytest.mark.slow
def test_decoder_first_token_law_full_block():
    decoder = hf.tiny_assisted_decoder(k=4, temperature=0.9, top_k=16, seed=2)
    _first_token_check(decoder, torch.tensor([7, 7, 1]), n=800, max_new_tokens=5, seed=1)


@pytest.mark.slow
@pytest.mark.parametrize("ensemble", [None, 0.5])
def test_decoder_every_position_pit(ensemble):
    """Randomised PIT of every emitted token under its exact conditional: iid U(0,1) under H0."""
    decoder = hf.tiny_assisted_decoder(k=3, temperature=0.9, top_p=0.9, seed=4, assistant_ensemble_weight=ensemble)
    prompt, n, L = torch.tensor([1, 2, 3]), 400, 7
    out = decoder.generate(prompt, num_samples=n, max_new_tokens=L, seed=5)
    seqs = torch.cat([prompt.expand(n, 3), out], dim=1)
    cond = decoder.target().conditionals(seqs, start=3)  # (n, L, V)
    cdf_before = (cond.cumsum(-1) - cond).gather(-1, out[..., None]).squeeze(-1)  # (n, L)
    mass = cond.gather(-1, out[..., None]).squeeze(-1)  # (n, L)
    support_failures = int((mass == 0).sum())
    v = torch.rand(n, L, generator=torch.Generator().manual_seed(6), dtype=torch.float64)
    pit = (cdf_before + v * mass).reshape(-1).numpy()
    pvalue = sps.kstest(pit, "uniform").pvalue
    if ensemble is None:
        assert support_failures == 0, f"{support_failures} emitted tokens have processed probability 0"
        assert pvalue > ALPHA, f"PIT KS p={pvalue:.2e} N={pit.size} (transformers {VERSION})"
    else:
        assert support_failures > 0 or pvalue < ALPHA, (
            f"no power: ensemble w={ensemble} not rejected (KS p={pvalue:.2e}, no support failure)"
        )
