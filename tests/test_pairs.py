"""The dependence family of the batteries (``specverify.verifier.pairs``, the decoder's row pairs).

* The call layout read back from a run (which rows shared a verify call, in which slot) is
  the one the verifier saw: an instrumented verifier records each call's first tokens.
* Row-layout mutants are failed by the dependence family on one scenario at alpha 1e-3 and
  the correct reorganisations pass it; a declared block size adds its lag and tile edge.
* A whole decoder whose verifier couples neighbouring rows fails ``check_decoder`` through
  the dependence family.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from specverify import check_verifier
from specverify.core.errors import InvalidArgument
from specverify.core.tables import markov
from specverify.decoder import check_decoder
from specverify.decoder.pipeline import ProtocolDecoder
from specverify.mutants import by_name
from specverify.verifier import zoo
from specverify.verifier.harness import run_harness
from specverify.verifier.pairs import call_slots, declared_block_size
from specverify.verifier.scenarios import get_scenarios
from specverify_reference.rules import verify as reference_verify

BOUNDARY = "pos8_boundary129_uniform_k2"


def test_call_layout_is_the_one_the_verifier_saw():
    scenario = get_scenarios([BOUNDARY])[0]
    target, drafter = scenario.build()
    seen = []

    def recording(target_probs, draft_probs, draft_tokens, *, generator):
        out = reference_verify(target_probs, draft_probs, draft_tokens, generator=generator)
        seen.append(out[0][:, 0].clone())  # (b,) each slot's first emitted token
        return out

    run = run_harness(
        recording, target, drafter, k=2, batch_size=129, length=6, generator=torch.Generator().manual_seed(3),
        num_groups=4, determinism_rows=0,
    )  # fmt: skip
    rows, positions, calls, slots, sizes, _ = call_slots(run.block_positions, run.batch_size)
    assert sizes.tolist() == [len(s) for s in seen]
    sizes_seen = sizes.tolist()  # calls of 129 rows shrink across the 128- and 64-row edges
    assert 129 in sizes_seen and any(64 < s <= 128 for s in sizes_seen) and any(s <= 64 for s in sizes_seen)
    tokens = run.tokens.numpy()
    for c, first in enumerate(seen):
        mine = calls == c
        order = np.argsort(slots[mine])
        assert np.array_equal(tokens[rows[mine][order], positions[mine][order]], first.numpy())


@pytest.mark.parametrize(
    "name,scenario,fails",
    [
        ("neighbour_scratch", "pos16_noisy_k1", "pairs_adjacent"),
        ("tile_wrapped_rng", BOUNDARY, "pairs_lag64"),
        ("canonical", BOUNDARY, None),
        ("permuted_rows", "pos16_noisy_k1", None),
        ("tiled_rows", BOUNDARY, None),
    ],
)
def test_dependence_family_fails_row_mutants_and_passes_reorganisations(name, scenario, fails):
    report = check_verifier(by_name(name).fn, tier="smoke", seed=0, scenarios=[scenario])
    dependence = {r.name: r for r in report.results if r.family == "dependence"}
    assert dependence, report.summary()
    failed = {n for n, r in dependence.items() if r.grade == "fail"}
    if fails is None:
        assert report.verdict == "pass" and not failed, report.summary()
    else:
        assert fails in failed, {n: r.statistic for n, r in dependence.items()}
    for r in dependence.values():  # what the run could have detected, at the share it was given
        assert r.details["mde_shared_fraction"] > 0 and r.alpha < report.alpha


def test_declared_block_size_adds_its_lag_and_edge():
    def tiled(target_probs, draft_probs, draft_tokens, *, generator):
        return reference_verify(target_probs, draft_probs, draft_tokens, generator=generator)

    tiled.block_size = 96
    assert declared_block_size(tiled) == 96
    report = check_verifier(tiled, tier="smoke", seed=0, scenarios=[BOUNDARY])
    names = {r.name for r in report.results if r.family == "dependence"}
    assert "pairs_lag96" in names and report.verdict == "pass"
    boundary = next(r for r in report.results if r.name == "pairs_boundary")
    assert boundary.details["pairs"] > 0
    for bad in (1, "64", 2.5, True):
        tiled.block_size = bad
        with pytest.raises(InvalidArgument, match="block_size"):
            declared_block_size(tiled)


def test_decoder_whose_rows_share_a_draw_fails_by_dependence():
    table = markov(12, "peaked", seed=7)
    coupled = ProtocolDecoder(zoo.uniform(table), table, k=3, verify=by_name("neighbour_scratch").fn)
    report = check_decoder(coupled, table, tier="smoke", seed=1)
    failed = {r.name for r in report.results if r.family == "dependence" and r.grade == "fail"}
    assert "pairs_adjacent" in failed, report.summary()
    correct = ProtocolDecoder(zoo.uniform(table), table, k=3, verify=by_name("tiled_rows").fn)
    passed = check_decoder(correct, table, tier="smoke", seed=1)
    assert passed.verdict == "pass", passed.summary()
