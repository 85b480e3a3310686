"""The peers (engines' own distribution tests, re-implemented): they pass the canonical rule,
return well-formed deterministic results, and behave as their design implies on a few
mutants.  What they miss is the point of the comparison, so nothing here asserts that a
peer catches everything.
"""

from __future__ import annotations

import dataclasses
import functools

import pytest
import torch

from specverify.core.errors import InvalidArgument
from specverify.mutants import by_name
from specverify.selftest.peers import PEERS, PeerResult, peer_matrix
from specverify_reference.rules import verify as reference_verify


@functools.cache
def reference_result(peer_name: str, run: int) -> PeerResult:
    """The peer on the canonical rule at seed 0 (``run`` tells repeated runs apart)."""
    return PEERS[peer_name](reference_verify, seed=0)


@pytest.mark.parametrize("peer_name", sorted(PEERS))
def test_peer_passes_the_reference_and_is_deterministic(peer_name):
    peer = PEERS[peer_name]
    first = reference_result(peer_name, 0)
    second = reference_result(peer_name, 1)
    assert isinstance(first, PeerResult)
    assert first.passed, f"{peer_name} failed the canonical rule at seed 0: {first.details}"
    assert first.samples > 0 and first.seconds >= 0
    assert "error" not in first.details
    assert first.passed == second.passed and first.samples == second.samples
    assert first.details == second.details
    with pytest.raises(dataclasses.FrozenInstanceError):
        first.passed = False  # type: ignore[misc]
    with pytest.raises(InvalidArgument, match="seed"):
        peer(reference_verify, seed=-1)


@pytest.mark.parametrize("peer_name", sorted(PEERS))
def test_peer_catches_a_gross_mutant_and_misses_a_positional_one(peer_name):
    """always_accept (output = q) is caught by every peer; bonus_wrong_row is invisible to them
    because they use the same (p, q) at every position, where p_K == p_{K+1}."""
    peer = PEERS[peer_name]
    caught = peer(by_name("always_accept").fn, seed=0)
    assert not caught.passed and "error" not in caught.details
    missed = peer(by_name("bonus_wrong_row").fn, seed=0)
    assert missed.passed, missed.details


def test_peer_details_are_the_published_statistics():
    l2 = reference_result("vllm_l2_ratio", 0).details
    for case in ("distinct", "equal"):
        assert len(l2[case]["distance_to_target"]) == 5
        assert l2[case]["target_ratio"] > 20 * l2[case]["reference_ratio"]
    chi2 = reference_result("chi2_10sigma", 0).details
    for K, case in ((1, chi2["K=1"]), (3, chi2["K=3"])):
        assert len(case["positions"]) == K + 1
        for r in case["positions"]:
            assert r["threshold"] is None or r["threshold"] == pytest.approx(r["df"] + 10 * (2 * r["df"]) ** 0.5)
    tv = reference_result("tv_0.008", 0).details
    assert tv["n"] == 65_536 and 0 <= tv["tv"] < 0.008


def _raises(target_probs, draft_probs, draft_tokens, *, generator):
    raise RuntimeError("kernel exploded")


def _bad_shape(target_probs, draft_probs, draft_tokens, *, generator):
    return draft_tokens, torch.ones(draft_tokens.shape[0], dtype=torch.long)


def _out_of_vocab(target_probs, draft_probs, draft_tokens, *, generator):
    tokens, n = reference_verify(target_probs, draft_probs, draft_tokens, generator=generator)
    tokens[0, 0] = target_probs.shape[-1]
    return tokens, n


@pytest.mark.parametrize("broken", [_raises, _bad_shape, _out_of_vocab], ids=lambda f: f.__name__)
@pytest.mark.parametrize("peer_name", sorted(PEERS))
def test_broken_implementations_fail_with_an_error(peer_name, broken):
    result = PEERS[peer_name](broken, seed=0)
    assert not result.passed
    assert "error" in result.details


def test_peer_matrix_rows():
    entries = [by_name("canonical"), by_name("always_accept"), by_name("first_unverified")]
    fast = {"tv_0.008": PEERS["tv_0.008"]}
    rows = peer_matrix(entries, seed=0, peers=fast)
    assert [r["name"] for r in rows] == ["canonical", "always_accept", "first_unverified"]
    assert [r["caught"]["tv_0.008"] for r in rows] == [False, True, True]
    for r in rows:
        assert set(r) == {"name", "kind", "provenance", "needs", "requires", "results", "caught"}
        assert isinstance(r["results"]["tv_0.008"], PeerResult)
    with pytest.raises(InvalidArgument, match="seed"):
        peer_matrix(entries, seed="0")


@pytest.mark.slow
def test_peer_matrix_full_catalogue_runs():
    from specverify.mutants import entries

    catalogue = entries(subject="verifier")
    rows = peer_matrix(catalogue, seed=0)
    assert len(rows) == len(catalogue)
    by = {r["name"]: r for r in rows}
    assert not any(by["canonical"]["caught"].values())
    assert all(by["always_accept"]["caught"].values())
