"""Medusa's typical acceptance (``medusa.model.utils.evaluate_posterior``) behind the verifier protocol.

Engine-free tests (always run) check the adapter's validation, its declared laws and its
plumbing with a stand-in ``evaluate_posterior`` that asserts the layout Medusa expects;
the tests marked ``medusa`` drive the real package (``pip install --no-deps medusa-llm``)
and skip cleanly without it.
"""

from __future__ import annotations

import sys

import pytest
import torch
from _medusa import medusa_formula

from specverify.adapters.medusa import chain as adapter
from specverify.core.errors import ImplementationError, InvalidArgument
from specverify.measure.chain import measure_divergence
from specverify_reference import lossy

try:
    import medusa.model.utils  # noqa: F401

    HAVE_MEDUSA = True
except ImportError:
    HAVE_MEDUSA = False

needs_medusa = pytest.mark.skipif(not HAVE_MEDUSA, reason="medusa-llm not installed (pip install --no-deps medusa-llm)")
LEVEL = 0.99


def _rows():
    """Target (1, K+1=3, V=4), draft (1, 2, 4), tokens (1, 2): x_1 = 0 is accepted, x_2 = 1 rejected."""
    target = torch.tensor([[[0.7, 0.1, 0.1, 0.1], [0.05, 0.05, 0.5, 0.4], [0.25, 0.25, 0.25, 0.25]]])
    draft = torch.full((1, 2, 4), 0.25)
    tokens = torch.tensor([[0, 1]])
    return target, draft, tokens


def _fake_evaluate_posterior(calls):
    """A stand-in with Medusa's signature and rule that asserts the one-path layout."""

    def evaluate_posterior(logits, candidates, temperature, posterior_threshold, posterior_alpha):
        calls.append((tuple(logits.shape), tuple(candidates.shape), temperature))
        assert logits.ndim == 3 and candidates.shape == logits.shape[:2] and logits.shape[0] == 1
        return medusa_formula(logits, candidates, temperature, posterior_threshold, posterior_alpha)

    return evaluate_posterior


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(posterior_threshold=0), "posterior_threshold"),
        (dict(posterior_alpha=-1), "posterior_alpha"),
        (dict(posterior_alpha="x"), "posterior_alpha"),
        (dict(temperature=0), "temperature"),
        (dict(next_token="sample"), "next_token"),
        (dict(dtype="int64"), "dtype"),
        (dict(num_threads=0), "num_threads"),
    ],
)
def test_bad_arguments_name_the_argument(kwargs, match):
    with pytest.raises(InvalidArgument, match=match):
        adapter.MedusaTypicalVerifier(**kwargs)


def test_missing_package_names_the_install_line(monkeypatch):
    monkeypatch.setitem(sys.modules, "medusa.model.utils", None)
    with pytest.raises(ImportError, match="pip install --no-deps medusa-llm"):
        adapter.typical_verifier()


def test_greedy_declared_law():
    target, draft, _ = _rows()
    law = adapter.greedy_declared_law(target[0, :2], draft[0])  # (2, V)
    assert law.sum(-1).tolist() == pytest.approx([1.0, 1.0])
    # row 0: p > thr for tokens {0, 1, 2, 3}? thr = min(0.09, 0.3 exp(-H)); 0.1 > 0.09 so every q-token is kept
    assert law[0].tolist() == pytest.approx([0.25, 0.25, 0.25, 0.25])
    # row 1: only tokens 2 and 3 pass; the rest of q's mass goes to argmax p = 2
    assert law[1].tolist() == pytest.approx([0.0, 0.0, 0.75, 0.25])
    assert adapter.greedy_declared_law(target[0, 2:]).tolist() == [[1.0, 0.0, 0.0, 0.0]]


@pytest.mark.parametrize("next_token", ["typical", "greedy"])
def test_layout_with_a_stand_in(monkeypatch, next_token):
    calls: list = []
    monkeypatch.setattr(adapter, "_load_evaluate_posterior", lambda: _fake_evaluate_posterior(calls))
    verify = adapter.typical_verifier(next_token=next_token, temperature=0.7)
    target, draft, tokens = _rows()
    B = 64
    out, n = verify(target.expand(B, -1, -1), draft.expand(B, -1, -1), tokens.expand(B, -1),
                    generator=torch.Generator().manual_seed(0))  # fmt: skip
    assert calls[0] == ((1, 3, 4), (1, 3), 0.7) and len(calls) == B
    assert n.tolist() == [2] * B and out[:, 0].tolist() == [0] * B
    emitted = set(out[:, 1].tolist())
    assert emitted == ({2} if next_token == "greedy" else {2, 3})
    assert out[:, 2].tolist() == [0] * B


@pytest.mark.parametrize("returned", [(torch.tensor(1), torch.tensor(1)), (torch.tensor(0), torch.tensor(3))])
def test_bad_outputs_are_implementation_errors(monkeypatch, returned):
    monkeypatch.setattr(adapter, "_load_evaluate_posterior", lambda: lambda *args: returned)
    target, draft, tokens = _rows()
    with pytest.raises(ImplementationError, match="evaluate_posterior returned"):
        adapter.typical_verifier()(target, draft, tokens, generator=torch.Generator().manual_seed(0))


def test_raising_is_an_implementation_error(monkeypatch):
    def boom(*args):
        raise RuntimeError("boom")

    monkeypatch.setattr(adapter, "_load_evaluate_posterior", lambda: boom)
    target, draft, tokens = _rows()
    with pytest.raises(ImplementationError, match="raised on row 0: RuntimeError: boom"):
        adapter.typical_verifier()(target, draft, tokens, generator=torch.Generator().manual_seed(0))


@needs_medusa
@pytest.mark.parametrize("next_token", ["typical", "greedy"])
def test_real_evaluate_posterior_on_the_layout(next_token):
    verify = adapter.typical_verifier(next_token=next_token)
    target, draft, tokens = _rows()
    out, n = verify(target.expand(32, -1, -1), draft.expand(32, -1, -1), tokens.expand(32, -1),
                    generator=torch.Generator().manual_seed(1))  # fmt: skip
    assert n.tolist() == [2] * 32 and out[:, 0].tolist() == [0] * 32
    assert set(out[:, 1].tolist()) <= {2, 3}


@needs_medusa
@pytest.mark.parametrize(
    "options, scenario",
    [
        (dict(posterior_threshold=0.09, posterior_alpha=0.3), "pos8_uniform_k4"),
        (dict(posterior_threshold=0.03, posterior_alpha=0.3, next_token="greedy"), "markov8_temperature_k2"),
    ],
)
def test_real_medusa_conforms_to_its_declared_law(options, scenario):
    verify = adapter.typical_verifier(**options)
    result = measure_divergence(verify, scenario=scenario, level=LEVEL, declared_law=verify.declared_law,
                                batch_size=1024)  # fmt: skip
    for s in result.by_block + result.by_position:
        e = s.estimate
        assert e.tv_lower <= s.declared_tv <= e.tv_upper, f"{s.stratum}: {s.declared_tv:.4f} vs {e}"
    assert result.conformance_verdict in ("pass", "suspicious")
    assert result.overall.tv_lower > 0.01  # lossy, and measurably so


@needs_medusa
def test_real_medusa_matches_the_reference_rule_declared_law():
    """The adapter's typical declared law is reference.lossy's with Medusa's entropy offset."""
    target, draft, _ = _rows()
    verify = adapter.typical_verifier(posterior_threshold=0.05, posterior_alpha=0.5)
    expected = lossy.typical_declared_law(target[0, :2], draft[0], eps=0.05, delta=0.5, entropy_offset=1e-5)
    assert torch.equal(verify.declared_law(target[0, :2], draft[0]), expected)
