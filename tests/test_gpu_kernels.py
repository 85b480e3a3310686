"""GPU kernel adapters: importable without a GPU; the FlashInfer plumbing checked on CPU with stand-in
modules of both signatures; the real kernels on CUDA (marked gpu, skipped here)."""

from __future__ import annotations

import importlib.util
import sys
import types

import pytest
import torch

import specverify as sv
from specverify.adapters import flashinfer, layouts, vllm
from specverify.core.errors import ImplementationError
from specverify_reference.uniforms import chain_kernel

SCENARIOS = ["pos8_uniform_k4", "markov8_temperature_k2"]


def _padded(tokens, num_emitted):
    j = torch.arange(tokens.shape[1])[None]
    return torch.where(j < num_emitted[:, None], tokens, -1).int()


def _old_signature(draft_probs, draft_token_ids, uniform_samples, target_probs, deterministic=True):
    assert uniform_samples.dtype == torch.float32 and draft_token_ids.dtype == torch.int32
    out = chain_kernel(target_probs, draft_probs, draft_token_ids.long(), uniforms=uniform_samples.double())
    return _padded(*out)


def _new_signature(
    draft_probs, draft_token_ids, target_probs, maybe_output_accepted_token_num=None,
    maybe_output_emitted_draft_token_num=None, deterministic=True, generator=None, seed=None, offset=None,
):  # fmt: skip
    gen = torch.Generator().manual_seed((seed * 7 + offset) % 2**63)
    uniforms = torch.rand(draft_token_ids.shape[0], draft_token_ids.shape[1] + 1, generator=gen, dtype=torch.float64)
    out = _padded(*chain_kernel(target_probs, draft_probs, draft_token_ids.long(), uniforms=uniforms))
    return out, None, None


def _install(monkeypatch, fn):
    package, module = types.ModuleType("flashinfer"), types.ModuleType("flashinfer.sampling")
    module.chain_speculative_sampling = fn
    package.sampling = module
    monkeypatch.setitem(sys.modules, "flashinfer", package)
    monkeypatch.setitem(sys.modules, "flashinfer.sampling", module)


def test_importable_without_the_packages():
    assert callable(flashinfer.flashinfer_chain) and callable(vllm.vllm_rejection_sample)
    if importlib.util.find_spec("flashinfer") is None:
        with pytest.raises(ImportError, match="flashinfer-python"):
            flashinfer.flashinfer_chain_verifier()


def test_a_package_that_fails_to_import_is_named_with_its_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "flashinfer", types.ModuleType("flashinfer"))
    monkeypatch.setitem(sys.modules, "flashinfer.sampling", None)  # installed, but its import fails
    with pytest.raises(ImportError, match=r"flashinfer-python\).*importing it failed with ModuleNotFoundError"):
        flashinfer.flashinfer_chain_verifier()
    monkeypatch.setitem(sys.modules, "vllm", None)
    with pytest.raises(ImportError, match=r"pip install vllm\).*importing it failed with ModuleNotFoundError"):
        vllm.vllm_rejection_sample_verifier()


def test_from_padded():
    ids = torch.tensor([[3, -1, -1], [1, 2, 0], [5, 4, -1]], dtype=torch.int32)
    tokens, n = layouts.from_padded((ids, None), 3, 2, "x")
    assert n.tolist() == [1, 3, 2] and tokens[0].tolist() == [3, 0, 0]
    with pytest.raises(ImplementationError, match="shape"):
        layouts.from_padded(ids[:, :2], 3, 2, "x")


@pytest.mark.parametrize("fn, form", [(_old_signature, "uniforms"), (_new_signature, "seed_offset")])
def test_flashinfer_adapter_forms_pass_the_battery(monkeypatch, fn, form):
    _install(monkeypatch, fn)
    verify = flashinfer.flashinfer_chain_verifier()
    assert verify.form == form
    report = sv.check_verifier(verify, tier="smoke", seed=0, scenarios=SCENARIOS)
    assert report.passed, report.errors


def test_flashinfer_unknown_signature(monkeypatch):
    _install(monkeypatch, lambda draft_probs, draft_token_ids, target_probs: None)
    with pytest.raises(ImplementationError, match="neither"):
        flashinfer.flashinfer_chain_verifier()


needs = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.mark.gpu
@needs
def test_flashinfer_on_cuda():
    pytest.importorskip("flashinfer")
    report = sv.check_verifier(flashinfer.flashinfer_chain_verifier(), device="cuda:0", scenarios=SCENARIOS)
    assert not report.errors, report.errors


@pytest.mark.gpu
@needs
def test_vllm_rejection_sample_on_cuda():
    pytest.importorskip("vllm")
    report = sv.check_verifier(vllm.vllm_rejection_sample_verifier(), device="cuda:0", scenarios=SCENARIOS)
    assert not report.errors, report.errors
