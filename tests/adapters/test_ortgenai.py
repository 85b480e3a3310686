"""ONNX Runtime GenAI speculative decoding behind the decoder protocol (``specverify.adapters.ortgenai``).

Engine-free tests (always run, CI has no onnxruntime-genai): the engine's sampling law in float64,
per-sample seeds, output validation, the configuration files, argument checks, the report
generator's configurations and the ImportError naming the install line.  Engine tests skip
cleanly without ``onnxruntime_genai``; they export the tiny models once (cached under
``$SPECVERIFY_CACHE``, about 30 s cold), hence ``slow``: run them in the engine's virtualenv with
``pytest tests/adapters/test_ortgenai.py -m slow``.
"""

from __future__ import annotations

import importlib.util
import json
import math

import pytest
import torch

from specverify.adapters.ortgenai import decoder as adapter
from specverify.adapters.ortgenai import engine_drafts as engine_api
from specverify.adapters.ortgenai import law as sampling
from specverify.core.errors import ImplementationError, InvalidArgument
from specverify.core.loading import parse_options
from tools.reports import ortgenai_reports

HAVE_ENGINE = importlib.util.find_spec("onnxruntime_genai") is not None


def _logits(probs) -> torch.Tensor:
    return torch.tensor([[math.log(p) for p in probs]], dtype=torch.float32)  # (1, V)


def _builder_config(vocab_size=32) -> dict:
    decoder = {"filename": "model.onnx", "session_options": {"provider_options": []}}
    return {"model": {"vocab_size": vocab_size, "eos_token_id": 1, "pad_token_id": 1, "decoder": decoder}}


@pytest.fixture
def model_dir(tmp_path):
    (tmp_path / "genai_config.json").write_text(json.dumps(_builder_config()))
    return tmp_path


# ----------------------------------------------------------------------------- engine-free (CI)


def test_plain_law_is_the_softmax_and_banned_tokens_get_zero():
    logits = torch.randn(3, 32, generator=torch.Generator().manual_seed(0))  # (B, V)
    law = sampling.processed_law(logits)
    torch.testing.assert_close(law, torch.softmax(logits.double(), -1))
    law = sampling.processed_law(logits, temperature=0.7, banned=(31,))
    assert law.dtype == torch.float64 and bool((law[:, 31] == 0).all())
    expected = torch.softmax(logits.double()[:, :31] / 0.7, -1)  # (B, 31)
    torch.testing.assert_close(law[:, :31], expected)


def test_top_p_is_applied_inside_the_renormalised_top_k():
    logits = _logits([0.4, 0.35, 0.25])
    # on the top-2 law (0.533, 0.467) the cumulative reaches 0.5 at the first token
    assert sampling.processed_law(logits, top_k=2, top_p=0.5)[0].tolist() == [1.0, 0.0, 0.0]
    # the nucleus over the whole vocabulary (top_k=0) needs two tokens for 0.5
    torch.testing.assert_close(
        sampling.processed_law(logits, top_p=0.5)[0], torch.tensor([0.4, 0.35, 0.0], dtype=torch.float64) / 0.75
    )
    torch.testing.assert_close(
        sampling.processed_law(logits, top_k=2)[0], torch.tensor([0.4, 0.35, 0.0], dtype=torch.float64) / 0.75
    )


def test_top_k_one_is_greedy_and_large_nucleus_vocabularies_are_refused():
    logits = _logits([0.2, 0.5, 0.3])
    assert sampling.processed_law(logits, top_k=1, temperature=5.0)[0].tolist() == [0.0, 1.0, 0.0]
    assert sampling.processed_law(torch.zeros(1, 100), top_k=8, top_p=0.9).shape == (1, 100)
    with pytest.raises(InvalidArgument, match="FindNucleus"):
        sampling.processed_law(torch.zeros(1, 100), top_p=0.9)
    with pytest.raises(InvalidArgument, match="shape"):
        sampling.processed_law(torch.zeros(32))


@pytest.mark.parametrize(
    "options, match",
    [
        (dict(temperature=0.0), "temperature"),
        (dict(temperature=True), "temperature"),
        (dict(top_k=-1), "top_k"),
        (dict(top_p=0.0), "top_p"),
        (dict(top_p=1.5), "top_p"),
        (dict(top_p="0.9"), "top_p"),
    ],
)
def test_sampling_options_name_the_argument(options, match):
    with pytest.raises(InvalidArgument, match=match):
        sampling.sampling_options(**options)


def test_sample_seeds_are_distinct_deterministic_and_fit_a_cpp_int():
    seeds = sampling.sample_seeds(7, 5000)
    assert len(set(seeds)) == 5000 and all(0 <= s <= 2**31 - 1 for s in seeds)
    assert seeds == sampling.sample_seeds(7, 5000) and seeds[:10] == sampling.sample_seeds(7, 10)
    assert seeds != sampling.sample_seeds(8, 5000)
    with pytest.raises(InvalidArgument, match="seed"):
        sampling.sample_seeds(-1, 3)


def test_tokens_from_rows_validates_the_engine_output():
    assert sampling.tokens_from_rows([[1, 2], [3, 4]], num_samples=2, max_new_tokens=2, vocab_size=8).tolist() == [
        [1, 2],
        [3, 4],
    ]
    with pytest.raises(ImplementationError, match="returned 1 sequences"):
        sampling.tokens_from_rows([[1, 2]], num_samples=2, max_new_tokens=2, vocab_size=8)
    with pytest.raises(ImplementationError, match="1 new tokens for sample 0"):
        sampling.tokens_from_rows([[1]], num_samples=1, max_new_tokens=2, vocab_size=8)
    with pytest.raises(ImplementationError, match=r"outside \[0, 8\)"):
        sampling.tokens_from_rows([[1, 8]], num_samples=1, max_new_tokens=2, vocab_size=8)


def test_configuration_files():
    plain = sampling.plain_config(_builder_config(), eos_token_id=31)
    assert plain["model"]["eos_token_id"] == 31 and plain["model"]["pad_token_id"] == sampling.PAD_TOKEN == -1
    assert plain["model"]["decoder"]["session_options"]["intra_op_num_threads"] == 1
    spec = sampling.speculative_config(plain, plain, max_draft_tokens=5)
    assert spec["model"]["decoder"]["filename"] == "target/model.onnx"
    assert spec["model"]["draft"]["filename"] == "draft/model.onnx" and spec["speculative"] == {"max_draft_tokens": 5}
    assert plain["model"]["decoder"]["filename"] == "model.onnx"  # not mutated
    with pytest.raises(InvalidArgument, match="outside the vocabulary"):
        sampling.plain_config(_builder_config(), eos_token_id=32)
    with pytest.raises(InvalidArgument, match="max_draft_tokens"):
        sampling.speculative_config(plain, plain, max_draft_tokens=17)
    with pytest.raises(InvalidArgument, match="share the vocabulary"):
        sampling.speculative_config(plain, sampling.plain_config(_builder_config(64), eos_token_id=3))
    with pytest.raises(InvalidArgument, match="model.decoder"):
        sampling.plain_config({"model": {}}, eos_token_id=1)


def test_decoder_argument_checks(model_dir):
    decoder = adapter.ORTGenAIDecoder(model_dir, max_draft_tokens=5, top_k=8, top_p=0.9)
    assert decoder.vocab_size == 32 and not decoder.speculative and "no draft" in repr(decoder)
    assert decoder.search_options(12, 3) == dict(
        do_sample=True, temperature=1.0, top_k=8, top_p=0.9, max_length=12, min_length=12, random_seed=3
    )
    greedy = adapter.ORTGenAIDecoder(model_dir, greedy=True)
    assert greedy.search_options(5, 0) == dict(do_sample=False, max_length=5, min_length=5, random_seed=0)
    with pytest.raises(InvalidArgument, match="max_draft_tokens"):
        adapter.ORTGenAIDecoder(model_dir, max_draft_tokens=0)
    with pytest.raises(InvalidArgument, match="greedy must be True or False"):
        adapter.ORTGenAIDecoder(model_dir, greedy="no")
    with pytest.raises(InvalidArgument, match="memoize must be True or False"):
        adapter.ORTGenAIDecoder(model_dir, memoize=1)
    with pytest.raises(InvalidArgument, match="genai_config.json"):
        adapter.ORTGenAIDecoder(model_dir / "missing")
    with pytest.raises(InvalidArgument, match="draft must be True or False"):
        adapter.tiny_decoder(draft="yes")


def test_report_configurations_are_well_formed():
    names = [name for name, _, _ in ortgenai_reports.CONFIGS]
    assert len(names) == len(set(names)) and any(n.startswith("control") for n in names)
    for name, _, args in ortgenai_reports.CONFIGS:
        assert args[:2] == ["--decoder", "specverify.adapters.ortgenai:tiny_decoder"]
        options = parse_options([args[i + 1] for i, a in enumerate(args) if a == "--decoder-option"])
        target = parse_options([args[i + 1] for i, a in enumerate(args) if a == "--target-option"])
        assert {k: v for k, v in options.items() if k in ("temperature", "top_k", "top_p")} == target
        assert ("--greedy" in args) == bool(options.get("greedy")) == name.startswith("greedy")
        sampling.sampling_options(**target)


def test_engine_probe_formatting():
    text = engine_api.format_probe([("static `Engine`", "ok: 0"), ("drafts", "RuntimeError: no `drafts` here")])
    assert text.splitlines() == ["- static `Engine`: `ok: 0`", "- drafts: `RuntimeError: no 'drafts' here`"]
    with pytest.raises(InvalidArgument, match="non-empty strings"):
        engine_api.format_probe([("step", "")])
    with pytest.raises(InvalidArgument, match="no probe steps"):
        engine_api.format_probe([])


@pytest.mark.skipif(HAVE_ENGINE, reason="onnxruntime-genai is installed")
def test_missing_engine_names_the_install_line():
    with pytest.raises(ImportError, match="pip install onnxruntime-genai=="):
        adapter.engine_version()


# ----------------------------------------------------------------------------- the engine (slow)


@pytest.fixture(scope="module")
def exported():
    pytest.importorskip("onnxruntime_genai")
    pytest.importorskip("transformers")
    return adapter.export_tiny_models(seed=0)


@pytest.mark.slow
def test_decoder_output_is_valid_reproducible_and_seeded(exported):
    decoder = adapter.ORTGenAIDecoder(exported, max_draft_tokens=3)
    assert decoder.speculative
    prompt = torch.tensor([1, 31, 3, 4])
    out = decoder.generate(prompt, num_samples=16, max_new_tokens=6, seed=5)
    assert out.shape == (16, 6) and int(out.max()) < adapter.EOS_TOKEN  # EOS masked
    assert torch.equal(out, decoder.generate(prompt, num_samples=16, max_new_tokens=6, seed=5))
    assert len({tuple(r) for r in out.tolist()}) > 1
    assert not torch.equal(out, decoder.generate(prompt, num_samples=16, max_new_tokens=6, seed=6))
    with pytest.raises(InvalidArgument, match="prompt"):
        decoder.generate(torch.tensor([1, 99]), num_samples=2, max_new_tokens=2, seed=0)


@pytest.mark.slow
def test_exact_target_and_engine_logits_agree(exported):
    target = adapter.ORTGenAITarget(exported / "hf" / "target", temperature=0.7, top_k=8)
    seqs = torch.randint(0, 32, (3, 7), generator=torch.Generator().manual_seed(0))  # (B, S)
    cond = target.conditionals(seqs, start=3)  # (B, 4, V)
    assert cond.shape == (3, 4, 32) and bool((cond[..., adapter.EOS_TOKEN] == 0).all())
    torch.testing.assert_close(cond[:, 1], target.next_token_probs(seqs[:, :4]))
    engine = adapter.engine_logits(exported / "target", seqs)  # (B, S, V)
    assert (engine - target.logits(seqs)).abs().max() < 1e-4
    assert adapter.max_conditional_difference(seed=0, num_sequences=2, length=6) < 1e-5


@pytest.mark.slow
def test_engine_draft_probe_records_every_step(exported):
    steps = engine_api.probe_draft_verification(seed=0)
    assert len(steps) == 8 and all(step and outcome for step, outcome in steps)
    assert steps[0][1].startswith("ok: ")  # max_draft_tokens_per_proposal() answers
    engine_api.format_probe(steps)
