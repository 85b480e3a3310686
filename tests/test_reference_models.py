"""Tests of reference.models (transformer, KV cache, drafters), reference.processors and the target adapter."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from specverify.core.errors import InvalidArgument
from specverify_reference.direct import TargetAdapter
from specverify_reference.models import ModelConfig, ModelDrafter, NGramDrafter, TinyTransformer, make_pair
from specverify_reference.processors import (
    GREEDY,
    SamplingConfig,
    greedy_probs,
    logits_to_probs,
    logits_to_probs_by_rows,
    min_p_probs,
    temperature_probs,
    top_k_probs,
    top_p_probs,
)

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def _tokens(B, n, V, seed):
    return torch.randint(0, V, (B, n), generator=torch.Generator().manual_seed(seed))


# ------------------------------------------------------------------ transformer and KV cache
@pytest.mark.parametrize("dtype,atol", [(torch.float32, 1e-5), (torch.float64, 1e-12)])
@pytest.mark.parametrize("chunks", [(12,), (1,) * 12, (5, 1, 4, 2), (3, 9)])
def test_cached_forward_equals_full_forward(dtype, atol, chunks):
    target, _ = make_pair(vocab_size=64, seed=1, dtype=dtype)
    x = _tokens(6, 12, 64, seed=2)
    full = target(x)  # (B, 12, V)
    cache = target.new_cache(6, capacity=2)  # capacity grows on demand
    parts, at = [], 0
    for n in chunks:
        parts.append(target(x[:, at : at + n], cache))
        at += n
    inc = torch.cat(parts, dim=1)
    assert cache.lengths.tolist() == [12] * 6
    err = (full.softmax(-1) - inc.softmax(-1)).abs().max().item()
    assert err <= atol, f"cached vs full forward: max prob difference {err:.3g} > {atol:g} for chunks {chunks}"
    assert (full - inc).abs().max().item() <= 20 * atol * target.config.logit_scale


def test_truncate_and_refeed_equals_full_forward():
    target, _ = make_pair(vocab_size=32, seed=3, dtype=torch.float64)
    x = _tokens(4, 10, 32, seed=4)
    y = x.clone()
    y[:, 6:] = (y[:, 6:] + 7) % 32  # a different continuation after position 6
    cache = target.new_cache(4)
    target(x, cache)  # caches x[:, :10]
    cache.truncate(6)  # to a length
    inc = target(y[:, 6:], cache)
    torch.testing.assert_close(inc, target(y)[:, 6:], atol=1e-10, rtol=0)


def test_per_row_truncation_and_ragged_feed():
    """Rows truncated to different lengths, then fed ragged (right-padded) tokens, match their own full pass."""
    V = 32
    target, _ = make_pair(vocab_size=V, seed=5, dtype=torch.float64)
    x = _tokens(3, 9, V, seed=6)
    cache = target.new_cache(3)
    target(x, cache)
    keep = torch.tensor([2, 5, 8])
    cache.truncate(keep)
    new = _tokens(3, 3, V, seed=7)
    num_valid = torch.tensor([3, 1, 2])
    logits = target(new, cache, num_valid=num_valid)  # (3, 3, V); padding entries are garbage
    assert cache.lengths.tolist() == (keep + num_valid).tolist()
    for b in range(3):
        nv, kb = int(num_valid[b]), int(keep[b])
        seq = torch.cat([x[b, :kb], new[b, :nv]])[None]
        torch.testing.assert_close(logits[b, :nv], target(seq)[0, kb:], atol=1e-10, rtol=0)
    # The cache keeps working after the ragged write (padding slots were overwritten, never attended).
    nxt = _tokens(3, 1, V, seed=8)
    out = target(nxt, cache)
    for b in range(3):
        seq = torch.cat([x[b, : int(keep[b])], new[b, : int(num_valid[b])], nxt[b]])[None]
        torch.testing.assert_close(out[b, 0], target(seq)[0, -1], atol=1e-10, rtol=0)


def test_truncate_validates():
    target, _ = make_pair(vocab_size=16, seed=0)
    cache = target.new_cache(2)
    target(_tokens(2, 4, 16, 0), cache)
    with pytest.raises(InvalidArgument, match="lengths"):
        cache.truncate(5)
    with pytest.raises(InvalidArgument, match="lengths"):
        cache.truncate(torch.tensor([1, 2, 3]))
    with pytest.raises(InvalidArgument, match="lengths"):
        cache.truncate(-1)
    cache.truncate(torch.tensor([4, 0]))
    assert cache.lengths.tolist() == [4, 0]


def test_seeded_init_is_deterministic_and_leaves_global_rng_alone():
    state = torch.random.get_rng_state()
    a, _ = make_pair(vocab_size=32, seed=11)
    b, _ = make_pair(vocab_size=32, seed=11)
    c, _ = make_pair(vocab_size=32, seed=12)
    assert torch.equal(torch.random.get_rng_state(), state), "model construction consumed the global RNG"
    x = _tokens(2, 5, 32, 0)
    assert torch.equal(a(x), b(x))
    assert not torch.equal(a(x), c(x))


def test_conditionals_far_from_uniform_and_context_dependent():
    V = 64
    target, drafter = make_pair(vocab_size=V, seed=0)
    x = _tokens(256, 10, V, seed=1)
    probs = target(x).double().softmax(-1)  # (B, T, V)
    entropy = -(probs * probs.clamp_min(1e-300).log()).sum(-1).mean().item()
    assert entropy < 0.6 * math.log(V), f"mean entropy {entropy:.3f} not well below log V = {math.log(V):.3f}"
    y = x.clone()
    y[:, 0] = (y[:, 0] + 1) % V
    tv = 0.5 * (probs[:, -1] - target(y)[:, -1].double().softmax(-1)).abs().sum(-1).mean().item()
    assert tv > 0.05, f"the first token barely changes the last conditional (mean TV {tv:.3f})"
    overlap = torch.minimum(probs, drafter(x).double().softmax(-1)).sum(-1).mean().item()
    assert 0.3 < overlap < 0.95, f"early-exit drafter acceptance sum min(p, q) = {overlap:.3f}"


def test_early_exit_and_shallow_drafters_share_embeddings_and_head():
    target, early = make_pair(vocab_size=32, seed=0, draft_layers=2)
    assert len(early.blocks) == 2 and early.blocks[0] is target.blocks[0]
    assert early.embed is target.embed and early.head is target.head
    _, shallow = make_pair(vocab_size=32, seed=0, drafter="shallow", draft_layers=1)
    assert len(shallow.blocks) == 1 and shallow.blocks[0] is not target.blocks[0]
    with pytest.raises(InvalidArgument, match="drafter"):
        make_pair(vocab_size=32, drafter="oracle")
    with pytest.raises(InvalidArgument, match="draft_layers"):
        make_pair(vocab_size=32, n_layers=2, draft_layers=3)
    with pytest.raises(InvalidArgument, match="d_model"):
        ModelConfig(d_model=30, n_heads=4)


def test_max_seq_len_is_enforced():
    target = TinyTransformer.from_seed(ModelConfig(vocab_size=8, max_seq_len=6), seed=0)
    with pytest.raises(InvalidArgument, match="max_seq_len"):
        target(_tokens(1, 7, 8, 0))


# ------------------------------------------------------------------ drafters
def test_ngram_drafter_hand_example():
    drafter = NGramDrafter(10, max_ngram=2)
    tokens, probs = drafter.draft(torch.tensor([[1, 2, 3, 1, 2], [5, 6, 7, 8, 9]]), 3)
    # Row 0: "1 2" occurred before, followed by 3; then "2 3" -> 1; then "3 1" -> 2.
    # Row 1: no earlier occurrence of any suffix: repeat the last token.
    assert tokens.tolist() == [[3, 1, 2], [9, 9, 9]]
    assert probs.shape == (2, 3, 10)
    assert torch.equal(probs, torch.nn.functional.one_hot(tokens, 10).double())


def test_ngram_drafter_prefers_the_latest_longest_match_and_respects_row_lengths():
    drafter = NGramDrafter(10, max_ngram=3)
    # suffix "4 5": occurrences at 0 (followed by 6) and 3 (followed by 7): the latest wins.
    seq = torch.tensor([[4, 5, 6, 4, 5, 7, 4, 5, 0, 0]])
    tok, _ = drafter.propose(seq, torch.tensor([8]), 1)
    assert tok.tolist() == [[7]]
    # Same buffer, shorter valid length 5 ("4 5 6 4 5"): the match at 0 only; padding is never read.
    tok, _ = drafter.propose(seq, torch.tensor([5]), 1)
    assert tok.tolist() == [[6]]


def test_model_drafter_is_honest_and_seeded():
    _, drafter_model = make_pair(vocab_size=32, seed=0)
    drafter = ModelDrafter(drafter_model, SamplingConfig(temperature=0.8, top_k=4))
    prefix = _tokens(64, 5, 32, 1)
    tokens, probs = drafter.draft(prefix, 3, generator=torch.Generator().manual_seed(0))
    assert tokens.shape == (64, 3) and probs.shape == (64, 3, 32)
    torch.testing.assert_close(probs.sum(-1), torch.ones(64, 3, dtype=probs.dtype))
    assert bool((probs.gather(-1, tokens[..., None]) > 0).all()), "a drafted token has reported probability 0"
    assert bool(((probs > 0).sum(-1) <= 4).all()), "top-k not applied to the reported law"
    again, _ = drafter.draft(prefix, 3, generator=torch.Generator().manual_seed(0))
    assert torch.equal(tokens, again)
    # The first law is the processed drafter conditional at the prefix.
    torch.testing.assert_close(probs[:, 0], logits_to_probs(drafter_model(prefix)[:, -1], drafter.sampling))


# ------------------------------------------------------------------ processors
def test_temperature_and_greedy_hand_examples():
    logits = torch.tensor([[1.0, 2.0, 2.0, 0.0]])
    torch.testing.assert_close(temperature_probs(logits, 0.5), torch.softmax(logits.double() * 2, -1))
    assert greedy_probs(logits).tolist() == [[0.0, 1.0, 0.0, 0.0]]  # ties -> lowest id
    assert logits_to_probs(logits, GREEDY).tolist() == [[0.0, 1.0, 0.0, 0.0]]
    assert logits_to_probs(logits, SamplingConfig(temperature=0.0, top_k=1)).dtype == torch.float64
    assert logits_to_probs(logits, SamplingConfig(), dtype=torch.float32).dtype == torch.float32


def test_top_k_hand_examples():
    probs = torch.tensor([[0.1, 0.4, 0.2, 0.3]], dtype=torch.float64)
    torch.testing.assert_close(top_k_probs(probs, 2), torch.tensor([[0.0, 4 / 7, 0.0, 3 / 7]], dtype=torch.float64))
    ties = torch.tensor([[0.3, 0.3, 0.2, 0.2]], dtype=torch.float64)
    torch.testing.assert_close(top_k_probs(ties, 1), torch.tensor([[0.5, 0.5, 0.0, 0.0]], dtype=torch.float64))
    assert torch.equal(top_k_probs(probs, 4), probs)


def _dense_top_k(logits, temperature, k):
    """The definition: the full-vocabulary softmax, masked to the top k probabilities, renormalised."""
    return top_k_probs(temperature_probs(logits, temperature), k)


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    V=st.integers(2, 300),
    k=st.integers(1, 40),
    temperature=st.sampled_from([0.3, 1.0, 1.7]),
    dtype=st.sampled_from([torch.float32, torch.float64]),
)
def test_top_k_from_the_largest_logits_is_the_dense_law(seed, V, k, temperature, dtype):
    """The fast top-k (softmax of the k largest logits, scattered) keeps the same tokens as the
    dense definition and gives the same law to float64 rounding."""
    gen = torch.Generator().manual_seed(seed)
    logits = (torch.randn(7, V, generator=gen, dtype=torch.float64) * 4).to(dtype)  # (B, V)
    cfg = SamplingConfig(temperature=temperature, top_k=k)
    fast, dense = logits_to_probs(logits, cfg), _dense_top_k(logits, temperature, k)
    assert torch.equal(fast > 0, dense > 0)
    torch.testing.assert_close(fast, dense, rtol=1e-13, atol=1e-300)


def test_top_k_near_ties_and_infinite_logits_take_the_dense_path_row_by_row():
    """Rows tied at the k-th logit (or with fewer than k finite logits) get the dense law to the
    bit, with every tied token kept; the other rows of the batch still take the fast path, and
    each row's bits are those it gets alone (batch invariance)."""
    inf = float("inf")
    logits = torch.tensor(
        [
            [2.0, 1.0, 1.0, 0.0, -1.0],  # tie at k = 2: both 1.0 kept
            [2.0, 1.0, 1.0 - 1e-12, 0.0, -1.0],  # closer than TOP_K_GAP: dense
            [3.0, 1.0, 0.5, 0.0, -1.0],  # fast
            [0.0, -inf, -inf, -inf, -inf],  # one finite logit, k = 2: dense
        ],
        dtype=torch.float64,
    )
    cfg = SamplingConfig(top_k=2)
    batch = logits_to_probs(logits, cfg)
    for i in (0, 1, 3):
        assert torch.equal(batch[i], _dense_top_k(logits[i : i + 1], 1.0, 2)[0])
    assert (batch[0] > 0).tolist() == [True, True, True, False, False]
    assert batch[3].tolist() == [1.0, 0.0, 0.0, 0.0, 0.0]
    torch.testing.assert_close(batch[2], _dense_top_k(logits[2:3], 1.0, 2)[0], rtol=1e-15, atol=0.0)
    for i in range(4):
        assert torch.equal(logits_to_probs(logits[i : i + 1], cfg)[0], batch[i])
    over = logits.clone()  # written over the logits, in blocks: the dense rows are read before the zeroing
    assert torch.equal(logits_to_probs_by_rows(over, cfg, rows=3, overwrite=True), batch)


def test_top_p_hand_examples():
    probs = torch.tensor([[0.15, 0.5, 0.05, 0.3]], dtype=torch.float64)
    # Sorted: 0.5, 0.3, 0.15, 0.05; mass before: 0, 0.5, 0.8, 0.95.
    torch.testing.assert_close(top_p_probs(probs, 0.8), torch.tensor([[0.0, 0.625, 0.0, 0.375]], dtype=torch.float64))
    torch.testing.assert_close(
        top_p_probs(probs, 0.81), torch.tensor([[0.15, 0.5, 0.0, 0.3]], dtype=torch.float64) / 0.95
    )
    torch.testing.assert_close(top_p_probs(probs, 0.1), torch.tensor([[0.0, 1.0, 0.0, 0.0]], dtype=torch.float64))
    assert torch.equal(top_p_probs(probs, 1.0), probs)


def test_min_p_hand_example():
    probs = torch.tensor([[0.5, 0.3, 0.1, 0.1]], dtype=torch.float64)
    torch.testing.assert_close(min_p_probs(probs, 0.3), torch.tensor([[0.625, 0.375, 0.0, 0.0]], dtype=torch.float64))
    torch.testing.assert_close(min_p_probs(probs, 0.2), probs)  # threshold 0.1 keeps the ties


def test_pipeline_order_temperature_topk_topp_minp():
    logits = torch.log(torch.tensor([[0.4, 0.3, 0.2, 0.1]], dtype=torch.float64))
    cfg = SamplingConfig(temperature=1.0, top_k=3, top_p=0.7, min_p=0.0)
    # top-k 3: (4, 3, 2)/9; top-p 0.7: mass before = 0, 4/9, 7/9 -> keep 2 tokens: (4, 3)/7.
    torch.testing.assert_close(
        logits_to_probs(logits, cfg), torch.tensor([[4 / 7, 3 / 7, 0.0, 0.0]], dtype=torch.float64)
    )
    cfg = SamplingConfig(temperature=1.0, top_k=3, min_p=0.7)
    torch.testing.assert_close(
        logits_to_probs(logits, cfg), torch.tensor([[4 / 7, 3 / 7, 0.0, 0.0]], dtype=torch.float64)
    )


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    temperature=st.sampled_from([0.0, 0.3, 1.0, 2.0]),
    top_k=st.one_of(st.none(), st.integers(1, 12)),
    top_p=st.one_of(st.none(), st.floats(0.05, 1.0)),
    min_p=st.one_of(st.none(), st.floats(0.0, 1.0)),
)
def test_processors_return_normalised_rows_supported_on_the_argmax(seed, temperature, top_k, top_p, min_p):
    cfg = SamplingConfig(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p)
    logits = torch.randn(5, 10, generator=torch.Generator().manual_seed(seed)) * 3
    probs = logits_to_probs(logits, cfg)
    torch.testing.assert_close(probs.sum(-1), torch.ones(5, dtype=torch.float64))
    assert bool((probs >= 0).all())
    assert bool((probs.gather(-1, logits.argmax(-1, keepdim=True)) > 0).all()), "the argmax was removed"
    if top_k is not None and temperature > 0:
        assert bool(((probs > 0).sum(-1) <= top_k).all())


@pytest.mark.parametrize(
    "kwargs",
    [
        {"temperature": -0.1},
        {"temperature": float("nan")},
        {"temperature": True},
        {"top_k": 0},
        {"top_k": 2.5},
        {"top_p": 0.0},
        {"top_p": 1.5},
        {"min_p": -0.1},
        {"min_p": 1.1},
    ],
)
def test_sampling_config_validation(kwargs):
    name = next(iter(kwargs))
    with pytest.raises(InvalidArgument, match=name):
        SamplingConfig(**kwargs)


@settings(max_examples=25, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    rows=st.integers(1, 9),
    top_k=st.sampled_from([None, 1, 3]),
    top_p=st.sampled_from([None, 0.7]),
    temperature=st.sampled_from([0.0, 0.6, 1.0]),
)
def test_processing_by_blocks_of_rows_gives_the_same_bits(seed, rows, top_k, top_p, temperature):
    """Every processor works row by row: blocks of rows, and laws written over the logits, change
    memory only, never a bit (the decoder's batch-invariance batches rely on it)."""
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(3, 5, 40, generator=gen, dtype=torch.float64) * 3  # (B, K+1, V)
    cfg = SamplingConfig(temperature=temperature, top_k=top_k, top_p=top_p)
    whole = logits_to_probs(logits, cfg)
    assert torch.equal(logits_to_probs_by_rows(logits, cfg, rows=rows), whole)
    again = logits.clone()
    out = logits_to_probs_by_rows(again, cfg, rows=rows, overwrite=True)
    assert torch.equal(out, whole) and out.data_ptr() == again.data_ptr()  # written over the logits
    assert torch.equal(logits_to_probs_by_rows(logits.float(), cfg, rows=rows, overwrite=True),
                       logits_to_probs(logits.float(), cfg))  # float32 logits: a new float64 tensor  # fmt: skip
    with pytest.raises(InvalidArgument, match="rows"):
        logits_to_probs_by_rows(logits, cfg, rows=0)


def test_logits_to_probs_validation():
    with pytest.raises(InvalidArgument, match="config"):
        logits_to_probs(torch.zeros(1, 3), {"temperature": 1.0})
    with pytest.raises(InvalidArgument, match="logits"):
        logits_to_probs(torch.zeros(1, 3, dtype=torch.long), SamplingConfig())


# ------------------------------------------------------------------ target adapter
def test_target_adapter_conditionals_match_next_token_probs():
    target, _ = make_pair(vocab_size=32, seed=2)
    adapter = TargetAdapter(target, SamplingConfig(temperature=0.7, top_p=0.9), max_batch=3)
    seqs = _tokens(5, 8, 32, 3)
    cond = adapter.conditionals(seqs, 4)  # (5, 4, V)
    assert cond.shape == (5, 4, 32) and cond.dtype == torch.float64
    for j in range(4):
        torch.testing.assert_close(cond[:, j], adapter.next_token_probs(seqs[:, : 4 + j]), atol=1e-6, rtol=0)
    with pytest.raises(InvalidArgument, match="start"):
        adapter.conditionals(seqs, 0)
    with pytest.raises(InvalidArgument, match="prefix"):
        adapter.next_token_probs(torch.tensor([[40]]))


# ------------------------------------------------------------------ GPU
@pytest.mark.gpu
@cuda
def test_cuda_cached_forward_matches_cpu():
    cpu, _ = make_pair(vocab_size=64, seed=1)
    gpu, _ = make_pair(vocab_size=64, seed=1, device="cuda")
    x = _tokens(4, 10, 64, 2)
    cache = gpu.new_cache(4)
    inc = torch.cat([gpu(x[:, :6].cuda(), cache), gpu(x[:, 6:].cuda(), cache)], 1).cpu()
    torch.testing.assert_close(inc.softmax(-1), cpu(x).softmax(-1), atol=1e-4, rtol=0)
    bf16, _ = make_pair(vocab_size=64, seed=1, device="cuda", dtype=torch.bfloat16)
    probs = logits_to_probs(bf16(x.cuda()), SamplingConfig())
    torch.testing.assert_close(probs.sum(-1).cpu(), torch.ones(4, 10, dtype=torch.float64))
