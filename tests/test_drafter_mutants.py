"""Tests of the drafter half of the mutation catalogue (``specverify.mutants.drafter``).

Power: every drafter mutant is caught by the consistency family of ``audit_drafter`` at
the smoke tier (run alpha 1e-6), by the test its entry names, and the audit names the
drafter as the culprit.  Calibration of the same tests: every honest equivalent
(zoo drafters, deterministic one-hot drafters, the fixed versions of the bugs) passes at
the same alpha.  Exactness: each mutant's sampled and reported laws really differ (by a
margin the smoke tier can see), and the wrapper samples exactly its sampling table.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from specverify import stats
from specverify.core.errors import InvalidArgument
from specverify.core.tables import markov, positional
from specverify.drafter import audit_drafter
from specverify.mutants import CatalogueEntry, by_name, entries
from specverify.mutants.drafter import (
    CATALOGUE,
    EQUIVALENTS,
    ReportedLawDrafter,
    make_drafter_mutant,
    top_k_mask,
    top_p_mask,
)
from specverify.verifier import zoo

ALPHA = 1e-6
K = 4


TARGETS = {
    "markov": lambda: markov(16, "peaked", seed=1),
    "positional": lambda: positional(16, 12, "peaked", seed=2),  # rows differ past prompt + K positions
}


def _consistency_failures(report) -> list[str]:
    return sorted({r.name for r in report.results if r.family == "consistency" and r.grade == "fail"})


def _audit(drafter, target, seed=0):
    return audit_drafter(drafter, target, tier="smoke", seed=seed, alpha=ALPHA, k=K)


@pytest.mark.parametrize("entry", CATALOGUE, ids=lambda e: e.name)
def test_every_drafter_mutant_is_caught_by_consistency(entry):
    target = TARGETS["markov"]()
    report = _audit(entry.build(target), target)
    caught = _consistency_failures(report)
    assert report.verdict == "fail", f"{entry.name} ({entry.provenance}) not detected:\n{report.summary()}"
    assert entry.caught_by in caught, f"{entry.name}: expected {entry.caught_by}, consistency failures {caught}"
    assert report.extra["diagnosis"]["culprit"] == "drafter", report.extra["diagnosis"]


@pytest.mark.slow
@pytest.mark.parametrize("entry", CATALOGUE, ids=lambda e: e.name)
def test_every_drafter_mutant_is_caught_on_a_positional_target(entry):
    target = TARGETS["positional"]()
    report = _audit(entry.build(target), target, seed=1)
    assert report.verdict == "fail" and _consistency_failures(report), report.summary()


@pytest.mark.parametrize("entry", EQUIVALENTS, ids=lambda e: e.name)
def test_honest_equivalents_pass(entry):
    target = TARGETS["markov"]()
    report = _audit(entry.build(target), target)
    assert report.verdict == "pass" and not report.errors, f"{entry.name}:\n{report.summary()}"


# ------------------------------------------------------------------ the mutants really are mutants
def _laws(drafter: ReportedLawDrafter) -> tuple[torch.Tensor, torch.Tensor]:
    """Sampled and reported law (C, V) per context (reported rows renormalised)."""
    sampled = drafter.sample_table / drafter.sample_table.sum(-1, keepdim=True)
    reported = drafter.report_table
    if drafter.report_next:  # the reported row depends on the drawn token: its mixture over x ~ sampled
        C, V = sampled.shape
        nxt = drafter.base.next_context(torch.arange(C)[:, None].expand(C, V), torch.arange(V).expand(C, V))
        reported = (sampled[..., None] * reported[nxt]).sum(1)  # (C, V)
    return sampled, reported / reported.sum(-1, keepdim=True)


@pytest.mark.parametrize("entry", CATALOGUE, ids=lambda e: e.name)
def test_sampled_and_reported_laws_differ(entry):
    drafter = entry.build(TARGETS["markov"]())
    sampled, reported = _laws(drafter)
    tv = 0.5 * (sampled - reported).abs().sum(-1)  # (C,)
    unnormalised = (drafter.report_table.sum(-1) - 1).abs().max()
    assert float(tv.max()) > 0.05 or float(unnormalised) > 0.05, (entry.name, tv.max(), unnormalised)


@pytest.mark.parametrize("entry", EQUIVALENTS, ids=lambda e: e.name)
def test_equivalents_report_their_sampling_law(entry):
    drafter = entry.build(TARGETS["markov"]())
    if isinstance(drafter, ReportedLawDrafter):
        sampled, reported = _laws(drafter)
        torch.testing.assert_close(sampled, reported, rtol=0, atol=1e-12)


def test_bf16_rounding_changes_the_law_only_at_large_logits():
    from specverify.mutants.drafter import _bf16_pair

    target = TARGETS["markov"]()
    for offset, lo, hi in [(96.0, 0.02, 1.0), (0.0, 0.0, 0.02)]:
        _, fp32, bf16 = _bf16_pair(target, offset)
        tv = float((0.5 * (fp32 - bf16).abs().sum(-1)).max())
        assert lo < tv <= hi, (offset, tv)


def _position1_gof(seed: int):
    """Draft position 1 of the wrapper (sampling law: q sharpened by 1/T = 2) vs its sampled and reported rows."""
    target = markov(6, "peaked", seed=seed % 97)
    base = zoo.noisy(target)
    sampled = torch.softmax(base.table.log() / 0.5, -1)
    drafter = ReportedLawDrafter(base, sampled, base.table)
    prefix = torch.tensor([[2, 3]]).expand(4000, -1)
    tokens, probs = drafter.draft(prefix, 2, generator=torch.Generator().manual_seed(seed))
    assert tokens.shape == (4000, 2) and probs.shape == (4000, 2, 6) and tokens.dtype == torch.long
    ctx = int(base.context_ids(prefix[:1], torch.tensor([2]))[0])
    torch.testing.assert_close(probs[:, 0], base.table[ctx].expand(4000, -1))  # reports the base row
    counts = np.bincount(tokens[:, 0].numpy(), minlength=6)
    return stats.gof_test(counts, sampled[ctx].numpy()), stats.gof_test(counts, base.table[ctx].numpy())


@settings(max_examples=10, deadline=None)
@given(seed=st.integers(0, 2**32 - 1))
def test_wrapper_samples_its_sampling_table_exactly(seed):
    against_sampled, _ = _position1_gof(seed)
    assert against_sampled.pvalue > 1e-7, against_sampled.summary()


def test_wrapper_gof_has_power_against_the_reported_row():
    _, against_reported = _position1_gof(0)
    assert against_reported.pvalue < 1e-7, against_reported.summary()


def test_processors():
    probs = torch.tensor([[0.5, 0.2, 0.2, 0.1]], dtype=torch.float64)
    assert top_k_mask(probs, 1).tolist() == [[0.5, 0.0, 0.0, 0.0]]
    assert top_k_mask(probs, 2).tolist() == [[0.5, 0.2, 0.2, 0.0]]  # ties at the threshold kept
    assert top_p_mask(probs, 0.6).tolist() == [[0.5, 0.2, 0.0, 0.0]]
    assert top_p_mask(probs, 0.5).tolist() == [[0.5, 0.0, 0.0, 0.0]]


def test_catalogue_entries():
    names = [e.name for e in CATALOGUE + EQUIVALENTS]
    assert len(names) == len(set(names))
    assert entries(subject="drafter") == CATALOGUE + EQUIVALENTS
    assert all(e.lossy for e in CATALOGUE) and not any(e.lossy for e in EQUIVALENTS)
    assert {"raw_q_processed_sample", "greedy_sample_soft_q", "precision_mismatch"} <= set(names)
    assert all(e.kind == "drafter" and e.provenance and e.needs and e.caught_by for e in CATALOGUE)
    assert all(e.kind == "drafter_equivalent" for e in EQUIVALENTS)
    assert by_name("greedy_sample_soft_q").provenance.startswith("transformers #32867")
    target = TARGETS["markov"]()
    assert make_drafter_mutant("processed_q_raw_sample", target, top_k=2).name == "processed_q_raw_sample"
    with pytest.raises(InvalidArgument, match="name"):
        by_name("nope")
    with pytest.raises(InvalidArgument, match="kind"):
        CatalogueEntry("x", "drafter?", lambda t: t, "", "")
    with pytest.raises(InvalidArgument, match="base"):
        ReportedLawDrafter(object(), torch.ones(1, 2), torch.ones(1, 2))
    with pytest.raises(InvalidArgument, match="sample_table"):
        ReportedLawDrafter(target, torch.ones(2, 2), torch.ones(2, 2))
