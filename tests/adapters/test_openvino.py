"""OpenVINO GenAI speculative decoding behind the decoder protocol (``specverify.adapters.openvino``).

Engine-free tests (always run, CI has no OpenVINO): argument checks, per-sample seeds, output
validation, the report generator's configurations, and the ImportError naming the install line.
Engine tests skip cleanly without ``openvino_genai``; they export the tiny models once (cached
under ``$SPECVERIFY_CACHE``, about 30 s cold), hence ``slow``: run them in the OpenVINO virtualenv
with ``pytest tests/adapters/test_openvino.py -m slow``.
"""

from __future__ import annotations

import importlib.util
import json

import pytest
import torch

from specverify.adapters.openvino import decoder as adapter
from specverify.core.errors import ImplementationError, InvalidArgument
from specverify.core.loading import parse_options
from tools.reports import openvino_reports

HAVE_OPENVINO = importlib.util.find_spec("openvino_genai") is not None


@pytest.fixture
def model_dir(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"vocab_size": 32}))
    return tmp_path


# ----------------------------------------------------------------------------- engine-free (CI)


@pytest.mark.parametrize(
    "options, match",
    [
        (dict(temperature=0.0), "temperature"),
        (dict(temperature=float("nan")), "temperature"),
        (dict(temperature=True), "temperature"),
        (dict(top_k=-1), "top_k"),
        (dict(top_k=2.5), "top_k"),
        (dict(top_p=0.0), "top_p"),
        (dict(top_p=1.5), "top_p"),
    ],
)
def test_sampling_options_name_the_argument_and_value(options, match):
    with pytest.raises(InvalidArgument, match=match):
        adapter.sampling_options(**options)


def test_sampling_options_normalise():
    assert adapter.sampling_options(1, 0, 1) == dict(temperature=1.0, top_k=0, top_p=1.0)


def test_sample_seeds_are_distinct_deterministic_32_bit():
    seeds = adapter.sample_seeds(7, 5000)
    assert len(seeds) == len(set(seeds)) == 5000
    assert all(0 <= s < 2**32 for s in seeds)
    assert seeds == adapter.sample_seeds(7, 5000)
    assert seeds[:10] == adapter.sample_seeds(7, 10)
    assert seeds != adapter.sample_seeds(8, 5000)
    with pytest.raises(InvalidArgument, match="num_samples"):
        adapter.sample_seeds(0, 0)
    with pytest.raises(InvalidArgument, match="seed"):
        adapter.sample_seeds(-1, 3)


def test_tokens_from_rows_validates_the_engine_output():
    out = adapter.tokens_from_rows([[1, 2, 3], [4, 5, 6]], num_samples=2, max_new_tokens=3, vocab_size=8)
    assert out.dtype == torch.long and out.tolist() == [[1, 2, 3], [4, 5, 6]]
    with pytest.raises(ImplementationError, match="returned 1 sequences, want 2"):
        adapter.tokens_from_rows([[1, 2, 3]], num_samples=2, max_new_tokens=3, vocab_size=8)
    with pytest.raises(ImplementationError, match="2 tokens for sample 1"):
        adapter.tokens_from_rows([[1, 2, 3], [4, 5]], num_samples=2, max_new_tokens=3, vocab_size=8)
    with pytest.raises(ImplementationError, match=r"outside \[0, 8\)"):
        adapter.tokens_from_rows([[1, 2, 8]], num_samples=1, max_new_tokens=3, vocab_size=8)


def test_decoder_argument_checks(model_dir):
    decoder = adapter.OpenVINODecoder(model_dir, draft_dir=model_dir, num_assistant_tokens=5, top_k=8, top_p=0.9)
    assert decoder.vocab_size == 32 and "num_assistant_tokens=5" in repr(decoder)
    assert "no draft" in repr(adapter.OpenVINODecoder(model_dir))
    with pytest.raises(InvalidArgument, match="num_assistant_tokens"):
        adapter.OpenVINODecoder(model_dir, draft_dir=model_dir, num_assistant_tokens=0)
    with pytest.raises(InvalidArgument, match="pipeline must be one of"):
        adapter.OpenVINODecoder(model_dir, pipeline="batched")
    with pytest.raises(InvalidArgument, match="precision must be one of"):
        adapter.OpenVINODecoder(model_dir, precision="bf16")
    with pytest.raises(InvalidArgument, match="memoize must be True or False, got 1"):
        adapter.OpenVINODecoder(model_dir, memoize=1)
    assert "memoize=True" in repr(adapter.OpenVINODecoder(model_dir, memoize=True))
    with pytest.raises(InvalidArgument, match="config.json"):
        adapter.OpenVINODecoder(model_dir / "missing")
    with pytest.raises(InvalidArgument, match="draft must be True or False, got 'yes'"):
        adapter.tiny_decoder(draft="yes")
    target = adapter.OpenVINOTarget(model_dir, temperature=0.7, top_k=8, top_p=0.9)
    assert target.config.top_k == 8 and target.config.top_p == 0.9 and target.vocab_size == 32
    assert adapter.OpenVINOTarget(model_dir).config.top_k is None


def test_report_configurations_are_well_formed():
    names = [name for name, _, _ in openvino_reports.CONFIGS]
    assert len(names) == len(set(names))
    assert any("control" in n for n in names)
    for _, _, args in openvino_reports.CONFIGS:
        assert args[:2] == ["--decoder", "specverify.adapters.openvino:tiny_decoder"]
        options = parse_options([args[i + 1] for i, a in enumerate(args) if a == "--decoder-option"])
        target = parse_options([args[i + 1] for i, a in enumerate(args) if a == "--target-option"])
        sampling = {k: v for k, v in options.items() if k in ("temperature", "top_k", "top_p")}
        assert sampling == target  # decoder and exact target use the same processors
        adapter.sampling_options(**sampling)


@pytest.mark.skipif(HAVE_OPENVINO, reason="openvino-genai is installed")
def test_missing_engine_names_the_install_line():
    with pytest.raises(ImportError, match="pip install 'openvino-genai"):
        adapter.engine_version()


# ----------------------------------------------------------------------------- the engine (slow)


@pytest.fixture(scope="module")
def exported():
    pytest.importorskip("openvino_genai")
    pytest.importorskip("optimum.intel")
    return adapter.export_tiny_models(seed=0)


@pytest.mark.slow
def test_decoder_output_is_valid_reproducible_and_independent_across_rows(exported):
    target_dir, draft_dir = exported
    decoder = adapter.OpenVINODecoder(target_dir, draft_dir=draft_dir, num_assistant_tokens=3)
    prompt = torch.tensor([1, 2, 3, 4])
    out = decoder.generate(prompt, num_samples=16, max_new_tokens=6, seed=5)
    assert out.shape == (16, 6) and out.dtype == torch.long and 0 <= int(out.min()) and int(out.max()) < 32
    assert torch.equal(out, decoder.generate(prompt, num_samples=16, max_new_tokens=6, seed=5))
    assert len({tuple(r) for r in out.tolist()}) > 1  # one rng_seed per row
    assert not torch.equal(out, decoder.generate(prompt, num_samples=16, max_new_tokens=6, seed=6))
    batched = adapter.OpenVINODecoder(target_dir, draft_dir=draft_dir, num_assistant_tokens=3, pipeline="continuous")
    rows = batched.generate(prompt, num_samples=16, max_new_tokens=6, seed=5)  # (N, L)
    assert rows.shape == (16, 6) and len({tuple(r) for r in rows.tolist()}) > 1
    with pytest.raises(InvalidArgument, match="prompt"):
        decoder.generate(torch.tensor([1, 99]), num_samples=2, max_new_tokens=2, seed=0)


@pytest.mark.slow
def test_exact_target_rows_and_teacher_forcing(exported):
    target = adapter.OpenVINOTarget(exported[0], temperature=0.7, top_k=8)
    seqs = torch.randint(0, 32, (5, 9), generator=torch.Generator().manual_seed(0))  # (B, S)
    cond = target.conditionals(seqs, start=4)  # (B, 5, V)
    assert cond.shape == (5, 5, 32) and cond.dtype == torch.float64
    torch.testing.assert_close(cond.sum(-1), torch.ones(5, 5, dtype=torch.float64))
    assert int((cond > 0).sum(-1).max()) <= 8
    torch.testing.assert_close(cond[:, 2], target.next_token_probs(seqs[:, :6]))


@pytest.mark.slow
def test_openvino_and_transformers_conditionals_agree(exported):
    assert adapter.max_conditional_difference(seed=0, num_sequences=4, length=8) < 1e-4
