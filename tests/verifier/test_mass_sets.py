"""The set-mass tests of large vocabularies: the sets by hand, the reference passes, a planted bug is caught."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from specverify.decoder.conditionals import ExactPlan, analyse_exact
from specverify.mutants import by_name
from specverify.verifier.battery import run_scenario
from specverify.verifier.mass_sets import LARGE_VOCAB, emitted_in_tail, outside_support_mass, tail_sets
from specverify.verifier.scenarios import get_scenarios
from specverify_reference.rules import verify

ALPHA = 1e-3


def test_tail_sets_by_hand():
    table = torch.tensor(
        [
            [0.4, 0.1, 0.1, 0.0, 0.3, 0.1],  # head 2: ids 0, 4; tail: 1, 2, 5 (not the zero at 3)
            [0.1, 0.1, 0.1, 0.1, 0.1, 0.5],  # ties: the lower id stays in the head (5, then 0)
        ],
        dtype=torch.float64,
    )
    in_tail, mass = tail_sets(table, head=2)
    assert in_tail.tolist() == [
        [False, True, True, False, False, True],
        [False, True, True, True, True, False],
    ]
    assert mass.dtype == torch.float64 and mass.tolist() == pytest.approx([0.3, 0.4], abs=1e-15)
    # a head as wide as the vocabulary leaves no tail
    assert not tail_sets(table, head=6)[0].any()


def test_outside_support_mass_by_hand():
    target = torch.tensor([[0.5, 0.25, 0.25], [0.2, 0.3, 0.5]], dtype=torch.float64)
    draft = torch.tensor([[1.0, 0.0, 0.0], [0.1, 0.4, 0.5]], dtype=torch.float64)
    assert outside_support_mass(target, draft).tolist() == [0.5, 0.0]


def _scenario(vocab_size: int):
    """The hot-set scenario of Llama 3's vocabulary, at a smaller vocabulary (same layout, ~25% hot)."""
    base = get_scenarios(["pos128256_lm_hot_set_k2"])[0]
    size = vocab_size // 4
    return dataclasses.replace(
        base,
        name=f"pos{vocab_size}_lm_hot_set_k2",
        vocab_size=vocab_size,
        row_options=(("hot", size),),
        drafter_options=(("size", size),),
    )


def _mass_tests(fn, scenario) -> dict:
    results, errors, _ = run_scenario(fn, scenario, tier="smoke", seed=0, alpha=ALPHA)
    assert not errors
    return {r.name: r for r in results if r.name in ("tail_mass", "outside_draft_mass")}


def test_reference_passes_and_q_unscattered_is_caught():
    scenario = _scenario(LARGE_VOCAB)
    ref = _mass_tests(verify, scenario)
    assert set(ref) == {"tail_mass", "outside_draft_mass"}
    for res in ref.values():
        assert res.pvalue > ALPHA / 10, res.summary()  # two of ~40 tests: a false alarm here has p < 1e-4
        assert 0 < res.mde_tv < 0.2 and res.details["expected"] > 5
    # q left in draft ids: mass moves across the draft vocabulary's edge
    bad = _mass_tests(by_name("q_unscattered").fn, scenario)
    assert bad["outside_draft_mass"].pvalue < 1e-6, bad["outside_draft_mass"].summary()


def test_toy_vocabularies_get_no_set_tests():
    assert _mass_tests(verify, _scenario(LARGE_VOCAB // 2)) == {}


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 2**31 - 1))
def test_the_emitted_tokens_tail_is_tail_sets_without_a_sort(seed):
    """Rows with ties and zeros (four levels), any head: the same flags and masses as :func:`tail_sets`."""
    g = torch.Generator().manual_seed(seed)
    V = int(torch.randint(2, 40, (1,), generator=g))
    head = int(torch.randint(1, V + 3, (1,), generator=g))
    levels = torch.tensor([0.0, 1.0, 2.0, 3.0], dtype=torch.float64)
    rows = levels[torch.randint(0, 4, (6, V), generator=g)]  # (6, V)
    rows[rows.sum(-1) == 0, 0] = 1.0
    rows = rows / rows.sum(-1, keepdim=True)
    tokens = torch.randint(0, V, (6,), generator=g)
    in_tail, mass = tail_sets(rows, head)
    flags, masses = emitted_in_tail(rows, tokens, head)
    assert torch.equal(flags, in_tail[torch.arange(6), tokens])
    assert torch.allclose(masses, mass, rtol=0, atol=1e-15)


class _FixedLaw:
    """A target whose conditional is one law after every prefix."""

    def __init__(self, law: torch.Tensor):
        self.law = law

    def next_token_probs(self, prefix: torch.Tensor) -> torch.Tensor:
        return self.law.expand(prefix.shape[0], -1)


def _decoder_tail_test(law: torch.Tensor, sampled: torch.Tensor, n: int = 400, length: int = 2):
    g = torch.Generator().manual_seed(1)
    tokens = torch.multinomial(sampled, n * length, replacement=True, generator=g).reshape(n, length)
    out = analyse_exact(_FixedLaw(law), torch.tensor([1, 2]), tokens, law.numel(), scenario="tail",
                        plan=ExactPlan(alpha=ALPHA), pit_seed=0)  # fmt: skip
    return {r.name: r for r in out.results}.get("tail_mass")


def test_the_decoder_battery_weighs_the_tail_and_catches_a_silent_top_k():
    """A Zipf law over 16,384 ids (18.6 % of its mass beyond the top 1,024): tokens drawn from it pass;
    tokens drawn from its top 1,024 alone (a silent top-k, the tail cut away) fail, while a toy
    vocabulary gets no such test."""
    V = 2 * LARGE_VOCAB
    law = 1.0 / torch.arange(1, V + 1, dtype=torch.float64) ** 1.1
    law /= law.sum()
    tail = float(law[1024:].sum())
    assert 0.15 < tail < 0.25
    passed = _decoder_tail_test(law, law)
    assert passed is not None and passed.pvalue > ALPHA / 10, passed.summary()
    assert passed.details["expected"] == pytest.approx(800 * tail)
    assert 0 < passed.mde_tv < 0.1  # 800 tokens: a shift of the tail's mass by 0.1 is caught at power 0.9
    truncated = law.clone()
    truncated[1024:] = 0
    failed = _decoder_tail_test(law, truncated / truncated.sum())
    assert failed.pvalue < 1e-12 and failed.details["observed"] == 0, failed.summary()
    small = law[: LARGE_VOCAB // 2] / law[: LARGE_VOCAB // 2].sum()
    assert _decoder_tail_test(small, small) is None
