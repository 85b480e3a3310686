"""The set-mass tests of large vocabularies: the sets by hand, the reference passes, a planted bug is caught."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from specverify.mutants import by_name
from specverify.verifier.battery import run_scenario
from specverify.verifier.mass_sets import LARGE_VOCAB, outside_support_mass, tail_sets
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
