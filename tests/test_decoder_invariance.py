"""Batch invariance of whole decoders (``specverify.decoder.compositions``, run by ``check_decoder``).

A decoder whose law changes only when more than 64 requests share a batch passes every
single-request test and fails the invariance family; a decoder that declares per-request seeds
must give a seeded request the same tokens in every batch; one that cannot run a batch gets an
ERROR, not a crash.  Seeds are fixed; alpha is the battery's 1e-3.
"""

from __future__ import annotations

import pytest
import torch

from specverify.core.errors import InvalidArgument
from specverify.core.tables import markov
from specverify.decoder import check_decoder
from specverify.decoder.compositions import COMPOSITIONS
from specverify.decoder.pipeline import ProtocolDecoder
from specverify.mutants import by_name
from specverify.verifier import zoo


@pytest.fixture(scope="module")
def table():
    return markov(12, "peaked", seed=7)


class WrongPast64(ProtocolDecoder):
    """Accepts every draft (output = q) when a batch holds more than 64 requests (OpenVINO GenAI's class)."""

    def generate_requests(self, prompts, *, num_samples, max_new_tokens, seeds):
        saved = self.verify
        if len(prompts) > 64:
            self.verify = by_name("always_accept").fn
        try:
            return super().generate_requests(
                prompts, num_samples=num_samples, max_new_tokens=max_new_tokens, seeds=seeds
            )
        finally:
            self.verify = saved


class PerRequest(ProtocolDecoder):
    """Each request decoded with its own generator (seeded ones reproducible whatever the neighbours)."""

    per_request_seeds = True

    def generate_requests(self, prompts, *, num_samples, max_new_tokens, seeds):
        return [
            self.generate(p, num_samples=n, max_new_tokens=max_new_tokens, seed=1234 if s is None else s)
            for p, n, s in zip(prompts, num_samples, seeds)
        ]


class SharedStream(ProtocolDecoder):
    """Declares per-request seeds but serves the batch from one stream seeded by the first request."""

    per_request_seeds = True


def _invariance(report):
    return [r for r in report.results if r.family == "invariance"]


def test_a_law_that_changes_past_64_requests_fails_only_the_invariance_family(table):
    report = check_decoder(WrongPast64(zoo.uniform(table), table, k=3), table, tier="smoke", seed=2)
    failed = [r for r in report.results if r.grade == "fail"]
    assert failed and {r.family for r in failed} == {"invariance"}, report.summary()
    assert {r.details["requests"] for r in failed} <= {65, 128, 129}, [r.position for r in failed]


def test_correct_batches_pass_and_say_what_was_not_tested(table):
    report = check_decoder(ProtocolDecoder(zoo.uniform(table), table, k=3), table, tier="smoke", seed=2)
    assert report.verdict == "pass", report.summary()
    tested = {r.details["requests"] for r in _invariance(report) if "requests" in r.details}
    assert tested == set(COMPOSITIONS)
    assert "not tested" in report.extra["batch_invariance"]["seeded_tokens"]


def test_seeded_requests_must_not_depend_on_their_neighbours(table):
    good = check_decoder(PerRequest(zoo.uniform(table), table, k=3), table, tier="smoke", seed=2)
    (seeded,) = [r for r in _invariance(good) if r.name == "seeded_tokens"]
    assert seeded.grade == "pass" and good.verdict == "pass", good.summary()
    bad = check_decoder(SharedStream(zoo.uniform(table), table, k=3), table, tier="smoke", seed=2)
    (seeded,) = [r for r in _invariance(bad) if r.name == "seeded_tokens"]
    assert seeded.grade == "fail" and bad.verdict == "fail"
    assert seeded.details["differs_in_batches_of"] == [2, 64, 65, 128, 129]


def test_a_broken_generate_requests_is_an_error_not_a_crash(table):
    class Broken(ProtocolDecoder):
        def generate_requests(self, prompts, **_):
            raise RuntimeError("no batching today")

    report = check_decoder(Broken(zoo.uniform(table), table, k=3), table, tier="smoke", seed=2)
    assert report.verdict == "error"
    assert any("no batching today" in e and e.startswith("batch:") for e in report.errors)


def test_generate_requests_validates_its_arguments(table):
    decoder = ProtocolDecoder(zoo.uniform(table), table, k=3)
    with pytest.raises(Exception, match="one length"):
        decoder.generate_requests(
            [torch.tensor([1, 2]), torch.tensor([1])], num_samples=[1, 1], max_new_tokens=2, seeds=[0, 0]
        )
    with pytest.raises(Exception, match="num_samples"):
        decoder.generate_requests([torch.tensor([1])], num_samples=[0], max_new_tokens=2, seeds=[0])
    out = decoder.generate_requests(
        [torch.tensor([1]), torch.tensor([2])], num_samples=[3, 2], max_new_tokens=4, seeds=[5, None]
    )
    assert [tuple(o.shape) for o in out] == [(3, 4), (2, 4)]


def test_batch_invariance_can_be_turned_off_and_is_validated(table):
    decoder = ProtocolDecoder(zoo.uniform(table), table, k=3)
    report = check_decoder(decoder, table, tier="smoke", seed=2, batch_invariance=False)
    assert not _invariance(report) and "batch_invariance=False" in report.command
    assert "not tested" in report.extra["batch_invariance"]["batch_invariance"]
    with pytest.raises(InvalidArgument, match="batch_invariance"):
        check_decoder(decoder, table, tier="smoke", seed=2, batch_invariance="yes")
