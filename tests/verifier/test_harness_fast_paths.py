"""The harness' and the reference rule's fast paths decide exactly as the plain code they replace.

* the fast path of ``check_probs`` (``specverify.core.rowsums.plainly_normalised``, behind the
  reference rule's input checks) accepts only input the full check accepts (and invalid input
  still gets the full check's message);
* ``search_cdf`` is ``searchsorted(right=True)`` whichever form it takes;
* the harness' transition tables, block advances and closed-form context sequences equal the
  models' ``next_context`` followed step by step;
* one call drawing K*b uniforms consumes the generator exactly as K calls drawing b each
  (the harness draws a round's draft uniforms at once);
* the drafter sampler's guide table, with or without slice thresholds, draws exactly the
  token of the inverse-CDF formula, at every threshold and slice edge too.
"""

from __future__ import annotations

from unittest import mock

import pytest
import torch

from specverify.core import tables, validation
from specverify.core.errors import InvalidArgument
from specverify.core.rowsums import plainly_normalised
from specverify.core.sampling import search_cdf, uniform
from specverify.core.validation import PROB_ATOL, check_probs, check_tokens
from specverify.protocols.chain import validate_verifier_output
from specverify.verifier import zoo
from specverify.verifier.harness import _Transitions
from specverify.verifier.rounds import _ContextSampler, _Group
from specverify_reference import rules
from specverify_reference.rules import check_verifier_inputs


def _full_check_accepts(target, draft, tokens) -> bool:
    """What the full checks decide, their fast path disabled."""
    with mock.patch.object(validation, "plainly_normalised", lambda probs, atol: False):
        try:
            check_probs("target_probs", target)
            check_probs("draft_probs", draft)
            check_tokens("draft_tokens", tokens, target.shape[-1])
        except InvalidArgument:
            return False
    return True


def _rows(B, R, V, *, dtype, off, generator):
    """Rows summing to 1 + off (in float64, then rounded to dtype)."""
    x = torch.rand(B, R, V, generator=generator, dtype=torch.float64)
    return (x / x.sum(-1, keepdim=True) * (1 + off)).to(dtype)


@pytest.fixture(params=[1, 2], ids=["1thread", "2threads"])
def threads(request):
    """Run under 1 and 2 intra-op threads (2: the serial-chunk paths)."""
    previous = torch.get_num_threads()
    torch.set_num_threads(request.param)
    yield request.param
    torch.set_num_threads(previous)


@pytest.mark.parametrize("V", [32, 768])  # one input-dtype sum per row; blocks of 256 summed in float64
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("B", [6, 300])  # 300 rows: several serial chunks with 2 threads
def test_fast_input_check_accepts_only_what_the_full_check_accepts(dtype, V, B, threads):
    gen = torch.Generator().manual_seed(0)
    K = 3
    offsets = [0.0, 1e-7, -1e-7, 0.5 * PROB_ATOL, 0.99 * PROB_ATOL, PROB_ATOL, 1.01 * PROB_ATOL, -1.01 * PROB_ATOL]
    seen_fast = seen_slow = 0
    for off in offsets:
        for corrupt in ("none", "nan", "inf", "neg", "negzero", "token_high", "token_low"):
            target = _rows(B, K + 1, V, dtype=dtype, off=off, generator=gen)
            draft = _rows(B, K, V, dtype=dtype, off=0.0, generator=gen)
            tokens = torch.randint(0, V, (B, K), generator=gen)
            if corrupt == "nan":
                target[2, 1, 5] = float("nan")
            elif corrupt == "inf":
                draft[1, 0, 3] = float("inf")
            elif corrupt == "neg":
                draft[4, 2, 7] = -1e-12
            elif corrupt == "negzero":
                target[0, 0, 0] = -0.0
            elif corrupt == "token_high":
                tokens[3, 1] = V
            elif corrupt == "token_low":
                tokens[5, 2] = -1
            fast = plainly_normalised(target, PROB_ATOL) and plainly_normalised(draft, PROB_ATOL)
            full = _full_check_accepts(target, draft, tokens)
            if fast:
                assert full or corrupt.startswith("token"), (off, corrupt)
                seen_fast += 1
            else:
                seen_slow += 1
            if full:
                assert check_verifier_inputs(target, draft, tokens) == (B, K, V)
            else:
                with pytest.raises(InvalidArgument):
                    check_verifier_inputs(target, draft, tokens)
    assert seen_fast and seen_slow


def _outcome(fn, *args):
    """``("ok", value)`` or ``("raised", message)`` of ``fn(*args)``."""
    try:
        return "ok", fn(*args)
    except InvalidArgument as exc:
        return "raised", str(exc)


def _usual_checks_then_drafted(target, draft, tokens):
    check_verifier_inputs(target, draft, tokens)
    return rules._drafted_probs(target, draft, tokens)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("V", [2, 32, 256])
def test_one_pass_input_check_decides_and_returns_what_the_usual_checks_do(dtype, V):
    """``verify``'s one-pass check (1 thread, several chunks here) against check_verifier_inputs + _drafted_probs."""
    gen = torch.Generator().manual_seed(V)
    B, K = 300, 3
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        chunks = mock.patch.object(rules, "CHECK_CHUNK_ELEMENTS", 64 * (2 * K + 1) * V)  # 64 rows per chunk: 5 chunks
        with chunks, mock.patch.object(rules, "ONE_PASS_MIN_ELEMENTS", 0):
            for off in (0.0, 0.99 * PROB_ATOL, 1.01 * PROB_ATOL):
                for row in (0, 130, B - 1):  # first, a middle and the last chunk
                    for corrupt in ("none", "nan", "inf", "neg", "negzero", "sum", "token_high", "token_low"):
                        target = _rows(B, K + 1, V, dtype=dtype, off=off, generator=gen)
                        draft = _rows(B, K, V, dtype=dtype, off=0.0, generator=gen)
                        tokens = torch.randint(0, V, (B, K), generator=gen)
                        if corrupt == "nan":
                            target[row, 1, V - 1] = float("nan")
                        elif corrupt == "inf":
                            draft[row, 0, 0] = float("inf")
                        elif corrupt == "neg":
                            draft[row, 2, V // 2] = -1e-12
                        elif corrupt == "negzero":
                            target[row, 0, 0] = -0.0
                        elif corrupt == "sum":
                            draft[row, 1] *= 1.5
                        elif corrupt == "token_high":
                            tokens[row, 1] = V
                        elif corrupt == "token_low":
                            tokens[row, 2] = -1
                        assert rules._one_pass_checkable(target, draft, tokens)
                        got = _outcome(rules._checked_drafted_probs, target, draft, tokens)
                        want = _outcome(_usual_checks_then_drafted, target, draft, tokens)
                        assert got[0] == want[0], (off, row, corrupt)
                        if got[0] == "raised":
                            assert got[1] == want[1]
                        else:
                            assert all(torch.equal(a, b) for a, b in zip(got[1], want[1]))
    finally:
        torch.set_num_threads(previous)


def test_one_pass_input_check_is_taken_only_where_it_applies():
    B, K, V = 4, 2, 8
    target, draft = torch.full((B, K + 1, V), 1 / V), torch.full((B, K, V), 1 / V)
    tokens = torch.zeros(B, K, dtype=torch.long)
    wide = torch.full((B, K + 1, 512), 1 / 512), torch.full((B, K, 512), 1 / 512)
    previous = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        assert not rules._one_pass_checkable(target, draft, tokens)  # small inputs stay in cache
        with mock.patch.object(rules, "ONE_PASS_MIN_ELEMENTS", 0):
            assert rules._one_pass_checkable(target, draft, tokens)
            assert rules._one_pass_checkable(target.double(), draft.double(), tokens.int())
            assert not rules._one_pass_checkable(target.half(), draft.half(), tokens)  # low precision
            assert not rules._one_pass_checkable(target, draft.double(), tokens)  # mixed dtypes
            assert not rules._one_pass_checkable(target[:1].expand(B, K + 1, V), draft, tokens)  # not contiguous
            assert not rules._one_pass_checkable(target, draft, tokens.float())  # not integer tokens
            assert not rules._one_pass_checkable(target, draft[:, :1], tokens)  # shapes disagree: the usual messages
            assert not rules._one_pass_checkable(*wide, tokens)  # rows summed in blocks
            torch.set_num_threads(2)
            assert not rules._one_pass_checkable(target, draft, tokens)  # several threads: the serial-chunk checks
    finally:
        torch.set_num_threads(previous)


def test_fast_input_check_defers_other_layouts_and_dtypes():
    B, K, V = 2, 2, 4
    target, draft = torch.full((B, K + 1, V), 0.25), torch.full((B, K, V), 0.25)
    tokens = torch.zeros(B, K, dtype=torch.long)
    assert plainly_normalised(target, PROB_ATOL) and plainly_normalised(draft, PROB_ATOL)
    assert not plainly_normalised(target.half(), PROB_ATOL)  # low precision: full check
    assert not plainly_normalised(target[:1].expand(B, K + 1, V), PROB_ATOL)  # expanded: full check
    big = 50257  # prime factors 29 * 1733: no block length, full check
    assert not plainly_normalised(torch.full((B, K + 1, big), 1 / big), PROB_ATOL)
    assert plainly_normalised(torch.full((B, K + 1, 4096), 1 / 4096), PROB_ATOL)
    assert not plainly_normalised(torch.full((B, K + 1, 4096), 1 / 4096), 1e-13)  # margin above atol / 2
    with pytest.raises(InvalidArgument, match="integer dtype"):
        check_verifier_inputs(target, draft, tokens.float())
    assert check_verifier_inputs(target[:1].expand(B, K + 1, V), draft, tokens) == (B, K, V)


def test_search_cdf_is_searchsorted_right(threads):
    gen = torch.Generator().manual_seed(1)
    for rows in (3, 129, 700):
        w = torch.rand(rows, 9, generator=gen, dtype=torch.float64)
        w[w < 0.3] = 0.0  # zero weights: flat CDF steps
        cdf = w.cumsum(-1)
        x = torch.minimum(torch.rand(rows, 1, generator=gen, dtype=torch.float64) * cdf[:, -1:], cdf[:, -1:])
        x[::5] = cdf[::5, 2:3]  # exactly on a CDF value
        want = torch.searchsorted(cdf, x, right=True).squeeze(-1)
        assert torch.equal(search_cdf(cdf, x), want)
        assert torch.equal((cdf <= x).sum(-1), want)


@pytest.mark.parametrize(
    "model",
    [
        tables.markov(5, "peaked", seed=3),
        tables.ngram(4, 3, "peaked", seed=4),
        zoo.stale(tables.markov(3, "peaked", seed=5)),
        tables.positional(6, 4, "peaked", seed=6),
    ],
    ids=["markov", "ngram3", "stale_fsm", "positional"],
)
def test_transitions_equal_next_context(model):
    K = 3
    step = _Transitions(model, K)
    C, V = model.num_contexts, model.vocab_size
    contexts = torch.arange(C).repeat_interleave(V)
    tokens = torch.arange(V).repeat(C)
    assert torch.equal(step(contexts, tokens), model.next_context(contexts, tokens))
    if model.token_independent:
        start = torch.arange(C)
        block = step.block(start, K)  # (C, K+1)
        want = [start]
        for _ in range(K):
            want.append(model.next_context(want[-1], want[-1]))
        assert torch.equal(block, torch.stack(want, 1))


@pytest.mark.parametrize(
    "model, closed",
    [
        (tables.markov(5, "peaked", seed=3), True),  # the next context is the last token
        (tables.ngram(4, 3, "peaked", seed=4), False),
        (zoo.stale(tables.markov(3, "peaked", seed=5)), False),
        (tables.positional(6, 9, "peaked", seed=6), True),  # token-independent
        (tables.positional(6, 4, "peaked", seed=6), True),  # rows longer than the positions: clamped
    ],
    ids=["markov", "ngram3", "stale_fsm", "positional", "positional_clamped"],
)
def test_context_sequences_follow_next_context(model, closed):
    B, L = 7, 9
    tokens = torch.randint(0, model.vocab_size, (B, L), generator=torch.Generator().manual_seed(1))
    want = torch.empty(B, L, dtype=torch.long)
    want[:, 0] = model.initial_context
    for t in range(L - 1):
        want[:, t + 1] = model.next_context(want[:, t], tokens[:, t])
    got = _Transitions(model, 3).sequences(model.initial_context, tokens)
    assert (got is not None) == closed
    if closed:
        assert torch.equal(got, want)
    assert torch.equal(
        _Group(model, model, B, L, 3)._contexts(_Transitions(model, 3), model.initial_context, tokens), want
    )


def test_one_call_draws_what_k_calls_draw():
    for b in (1, 5, 4096):
        gen = torch.Generator().manual_seed(7)
        separate = torch.stack([uniform((b, 1), generator=gen).view(-1) for _ in range(4)])  # (4, b)
        gen = torch.Generator().manual_seed(7)
        assert torch.equal(uniform((4, b), generator=gen), separate)


def test_output_validation_ignores_padding_and_still_catches_errors():
    drafts = torch.tensor([[1, 2, 3], [1, 2, 3]])
    tokens = torch.tensor([[1, 0, -1, -1], [1, 2, 3, 9]])  # vLLM-style -1 padding past num_emitted
    got, n = validate_verifier_output((tokens, torch.tensor([2, 4])), drafts, 10)
    assert torch.equal(got, tokens) and n.tolist() == [2, 4]
    with pytest.raises(Exception, match="outside the vocabulary"):
        validate_verifier_output((tokens, torch.tensor([3, 4])), drafts, 10)
    with pytest.raises(Exception, match="differs from the accepted draft"):
        validate_verifier_output((torch.tensor([[1, 5, 0, 0], [1, 2, 3, 4]]), torch.tensor([3, 4])), drafts, 10)
    with pytest.raises(Exception, match="outside \\[1, K\\+1\\]"):
        validate_verifier_output((tokens, torch.tensor([0, 4])), drafts, 10)


@pytest.mark.parametrize("vocab", [2, 5, 32])
@pytest.mark.parametrize("drafter", ["target", "uniform", "least_likely", "anti_inverse", "noisy", "temperature"])
def test_guide_draws_equal_the_exact_formula(vocab, drafter):
    target = tables.markov(vocab, "peaked", seed=vocab)
    model = target if drafter == "target" else zoo.make_drafter(drafter, target)
    sampler = _ContextSampler(torch.cumsum(model.table, -1))
    assert sampler.guide is not None
    gen = torch.Generator().manual_seed(vocab)
    C = model.table.shape[0]
    contexts = torch.randint(0, C, (50_000,), generator=gen)
    u = torch.rand(50_000, generator=gen, dtype=torch.float64)
    edges = torch.arange(sampler.slices, dtype=torch.float64) / sampler.slices  # (G,) slice edges and the float below
    at_edges = torch.randint(0, C, (sampler.slices,), generator=gen)
    contexts = torch.cat([contexts, at_edges, at_edges])
    u = torch.cat([u, edges, torch.nextafter(edges, torch.ones(()))])
    if sampler.thresholds is not None:  # every threshold and the float just below it
        slice_at = (sampler.thresholds < 2).nonzero().squeeze(1)
        thresholds = sampler.thresholds[slice_at]
        contexts = torch.cat([contexts, slice_at // sampler.slices, slice_at // sampler.slices])
        u = torch.cat([u, thresholds, torch.nextafter(thresholds, torch.zeros(()))])
    exact = sampler._exact(contexts, u)
    total = sampler.cdf[contexts, -1]  # the formula written out: searchsorted(right=True) of the capped u * total
    x = torch.minimum(u * total, torch.nextafter(total, torch.zeros(())))
    assert torch.equal(exact, torch.searchsorted(sampler.cdf[contexts], x[:, None], right=True).squeeze(1))
    assert torch.equal(sampler.draw(contexts, u), exact)


def test_guide_has_each_kind_of_slice():
    """The cases above cover all three forms of the guide: one token per slice, thresholds, counting fallback."""
    kinds = set()
    for vocab in (2, 5, 32):
        target = tables.markov(vocab, "peaked", seed=vocab)
        for drafter in ("uniform", "least_likely", "anti_inverse", "noisy", "temperature"):
            sampler = _ContextSampler(torch.cumsum(zoo.make_drafter(drafter, target).table, -1))
            kinds.add(
                "unambiguous" if sampler.unambiguous else "thresholds" if sampler.thresholds is not None else "count"
            )
    assert kinds == {"unambiguous", "thresholds", "count"}
