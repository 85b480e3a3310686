"""The harness: bookkeeping of tokens/contexts/trials, output validation, property runs."""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from specverify.core import tables
from specverify.core.errors import ImplementationError, InvalidArgument
from specverify.verifier import zoo
from specverify.verifier.battery import check_verifier_on
from specverify.verifier.harness import (
    acceptance_overlap,
    harness_setup,
    run_harness,
    sample_contexts,
    validate_verifier_output,
)
from specverify.verifier.strategies import table_models
from specverify_reference.rules import verify as reference_verify


def _fast(target_probs, draft_probs, draft_tokens, *, generator):
    return reference_verify(target_probs, draft_probs, draft_tokens, generator=generator, check=False)


def test_run_bookkeeping_is_consistent():
    target = tables.markov(5, seed=0)
    drafter = zoo.temperature(target, 2.0)
    run = run_harness(
        _fast, target, drafter, k=3, batch_size=64, length=9, num_groups=2, generator=torch.Generator().manual_seed(0)
    )
    R, L = run.tokens.shape
    assert (R, L) == (128, 9)
    # target contexts are those of the emitted prefix
    for t in range(L):
        assert torch.equal(run.target_contexts[:, t], target.context_ids(run.tokens, torch.full((R,), t)))
    # in-block positions restart at 1 after a block ends and never exceed K+1
    bp = run.block_positions
    assert (bp[:, 0] == 1).all() and (bp >= 1).all() and (bp <= 4).all()
    step = bp[:, 1:] - bp[:, :-1]
    assert ((step == 1) | (bp[:, 1:] == 1)).all()
    # drafter contexts: -1 exactly at the bonus position, else the drafter's context of the prefix
    assert torch.equal(run.draft_contexts == -1, bp == 4)
    for t in range(L):
        ok = run.draft_contexts[:, t] >= 0
        want = drafter.context_ids(run.tokens, torch.full((R,), t))
        assert torch.equal(run.draft_contexts[ok, t], want[ok])
    # one trial per draft judged; acceptance probabilities are sum min(p, q)
    assert run.trial_positions.min() >= 1 and run.trial_positions.max() <= 3
    assert ((run.trial_accept_probs >= 0) & (run.trial_accept_probs <= 1 + 1e-12)).all()


def test_shared_setup_gives_the_same_runs_and_refuses_other_models():
    target = tables.markov(6, seed=3)
    drafter = zoo.make_drafter("noisy", target)
    setup = harness_setup(target, drafter, k=2)
    common = dict(k=2, batch_size=32, length=7)
    for group in range(3):  # one setup serves every group; each run equals one built from scratch
        own = run_harness(_fast, target, drafter, generator=torch.Generator().manual_seed(group), **common)
        shared = run_harness(
            _fast, target, drafter, generator=torch.Generator().manual_seed(group), setup=setup, **common
        )
        for field in ("tokens", "target_contexts", "draft_contexts", "trial_positions", "trial_accept_probs"):
            assert torch.equal(getattr(own, field), getattr(shared, field)), field
    with pytest.raises(ValueError, match="drafter vocabulary 7 != target vocabulary 6"):
        run_harness(_fast, target, tables.markov(7, seed=3), generator=torch.Generator().manual_seed(0), **common)
    other = zoo.make_drafter("uniform", target)
    with pytest.raises(InvalidArgument, match="different drafter"):
        run_harness(_fast, target, other, generator=torch.Generator().manual_seed(0), setup=setup, **common)
    with pytest.raises(InvalidArgument, match="different k"):
        run_harness(_fast, target, drafter, generator=torch.Generator().manual_seed(0), setup=setup, k=3,
                    batch_size=32, length=7)  # fmt: skip


def test_overlap_table():
    target = tables.positional(6, 3, seed=0)
    drafter = zoo.uniform(target)
    ov = acceptance_overlap(target, drafter)
    torch.testing.assert_close(ov[:, 0], torch.minimum(target.table, drafter.table[0]).sum(-1))


def test_sample_contexts_exact_and_support():
    table = torch.tensor([[0.0, 0.25, 0.75], [1.0, 0.0, 0.0]], dtype=torch.float64)
    cdf = table.cumsum(-1)
    ctx = torch.tensor([0, 1]).repeat(100_000)
    x = sample_contexts(cdf, ctx, generator=torch.Generator().manual_seed(0))
    assert (x[ctx == 1] == 0).all() and (x[ctx == 0] != 0).all()
    frac = (x[ctx == 0] == 2).double().mean()
    assert abs(frac - 0.75) < 0.01


def test_no_bonus_trials_are_counted_as_accepts():
    def no_bonus(target_probs, draft_probs, draft_tokens, *, generator):
        tokens, num = _fast(target_probs, draft_probs, draft_tokens, generator=generator)
        K = draft_tokens.shape[1]
        return tokens, torch.where(num == K + 1, torch.full_like(num, K), num)

    target = tables.markov(3, seed=1)
    run = run_harness(
        no_bonus, target, zoo.oracle(target), k=2, batch_size=32, length=6, generator=torch.Generator().manual_seed(0)
    )
    assert run.trial_accepted.all()  # q = p: every trial accepted, none misread as a rejection
    assert (run.block_positions <= 2).all()


def _draft(B=4, K=2):
    return torch.arange(B * K).reshape(B, K) % 5


@pytest.mark.parametrize(
    "output, fragment",
    [
        ((torch.zeros(4, 3, dtype=torch.long),), "must return (tokens, num_emitted)"),
        ((torch.zeros(4, 2, dtype=torch.long), torch.ones(4, dtype=torch.long)), "shape (4, 2)"),
        ((torch.zeros(4, 3), torch.ones(4, dtype=torch.long)), "dtype"),
        ((torch.zeros(4, 3, dtype=torch.long), torch.tensor([1, 1, 4, 1])), "row 2: num_emitted = 4"),
        (
            (torch.tensor([[0, 1, 0], [2, 3, 0], [4, 0, 0], [1, 2, 7]]), torch.tensor([2, 3, 1, 3])),
            "row 3: emitted token 7",
        ),
        (
            (torch.tensor([[0, 1, 0], [2, 4, 0], [4, 0, 0], [1, 2, 3]]), torch.tensor([2, 3, 1, 3])),
            "row 1: emitted token 4",
        ),
    ],
)
def test_validation_messages(output, fragment):
    with pytest.raises(ImplementationError) as info:
        validate_verifier_output(output, _draft(), 5)
    assert fragment in str(info.value)


def test_validation_ignores_entries_past_num_emitted():
    tokens = torch.tensor([[0, -7, 99], [2, 3, 4], [9, 9, 9], [1, 2, 3]])
    tokens[2, 0] = 4
    out = validate_verifier_output((tokens, torch.tensor([1, 3, 1, 3])), _draft(), 5)
    assert out[1].tolist() == [1, 3, 1, 3]


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pair=table_models(st.integers(2, 6)), k=st.integers(1, 4), seed=st.integers(0, 2**32 - 1))
def test_reference_passes_on_arbitrary_models(pair, k, seed):
    target, drafter = pair
    report = check_verifier_on(
        _fast, target, drafter, k=k, batch_size=256, length=5, num_groups=2, seed=seed, alpha=1e-7
    )
    assert report.passed, report.summary()


def test_reference_passes_where_one_rare_token_dominates_the_entropy_score():
    # The example hypothesis found above (before score_test took score bounds): a 5e-5 token in the
    # initial law, hit once in 512 first tokens, gave entropy_score z = -6.1, adjusted p 2e-8 < alpha.
    rare = 1e-4 / 2.0001
    target = tables.MarkovTable.from_table(
        [[0, 0, 1], [1 / 3, 1 / 3, 1 / 3], [0, 0, 1], [(1 - rare) / 2, (1 - rare) / 2, rare]], name="rare"
    )
    drafter = tables.MarkovTable.from_table([[1 / 3] * 3, [1, 0, 0], [1, 0, 0], [1 / 3] * 3], name="drafter")
    report = check_verifier_on(
        _fast, target, drafter, k=2, batch_size=256, length=5, num_groups=2, seed=4858, alpha=1e-7
    )
    entropy = [r for r in report.results if r.name == "entropy_score"]
    assert report.passed, report.summary()
    assert entropy and "Bernstein" in entropy[0].method and entropy[0].statistic < -5


def test_planted_deviation_is_caught_on_small_models():
    """Power check for the property test's configuration: residual = p must fail."""

    target = tables.positional(4, 3, seed=0)
    drafter = zoo.uniform(target)

    def wrong(target_probs, draft_probs, draft_tokens, *, generator):
        # accept as canonically, but resample the rejected position from p itself
        B, K1, V = target_probs.shape
        K = K1 - 1
        tokens, num = _fast(target_probs, draft_probs, draft_tokens, generator=generator)
        rows = torch.arange(B)
        rejected = num <= K
        from specverify.core.sampling import sample

        redraw = sample(target_probs[rows, num - 1].double(), generator=generator, check=False)
        tokens[rows, num - 1] = torch.where(rejected, redraw, tokens[rows, num - 1])
        return tokens, num

    report = check_verifier_on(wrong, target, drafter, k=2, batch_size=256, length=5, num_groups=2, seed=0, alpha=1e-7)
    assert report.verdict == "fail", report.summary()
