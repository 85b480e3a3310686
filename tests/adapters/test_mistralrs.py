"""mistral.rs (PyPI ``mistralrs``) behind the decoder protocol (``specverify.adapters.mistralrs``).

Engine-free tests (always run, CI has no mistralrs): the float64 re-implementation of mistral.rs's
CPU sampler (penalties, temperature, top-k, top-p on the temperature-scaled law, min-p, greedy)
against direct per-token computations, option checks, the text <-> id mapping, output validation
and the report generator's configurations and README.  Engine tests skip cleanly without
``mistralrs``; they write the tiny model once (cached under ``$SPECVERIFY_CACHE``), hence ``slow``:
run them in the mistral.rs virtualenv with ``pytest tests/adapters/test_mistralrs.py -m slow``.
"""

from __future__ import annotations

import importlib.util
import json

import pytest
import torch

from specverify.adapters.mistralrs import decoder as decoder_module
from specverify.adapters.mistralrs import model, sampler_chain
from specverify.adapters.mistralrs.decoder import KV_F32_ENV, MistralRsDecoder, tokens_from_texts
from specverify.core.errors import ImplementationError, InvalidArgument

HAVE_MISTRALRS = importlib.util.find_spec("mistralrs") is not None

# ----------------------------------------------------------------------------- engine-free (CI)


@pytest.mark.parametrize(
    "options, match",
    [
        (dict(temperature=-0.1), "temperature"),
        (dict(temperature=True), "temperature"),
        (dict(top_p=0.0), "top_p"),
        (dict(top_p=1.5), "top_p"),
        (dict(min_p=1.0), "min_p"),
        (dict(repetition_penalty=0.0), "repetition_penalty"),
        (dict(top_k=2.5), "top_k"),
        (dict(top_k=-1), "top_k"),
        (dict(frequency_penalty=float("nan")), "frequency_penalty"),
        (dict(typo=1), "unknown"),
    ],
)
def test_sampler_options_name_the_argument(options, match):
    with pytest.raises(InvalidArgument, match=match):
        sampler_chain.sampler_options(**options)


def test_request_kwargs_pass_only_what_is_on_and_always_the_temperature():
    o = sampler_chain.sampler_options()
    assert o.request_kwargs() == dict(
        temperature=1.0,
        top_k=None,
        top_p=None,
        min_p=None,
        repetition_penalty=None,
        frequency_penalty=None,
        presence_penalty=None,
    )
    k = sampler_chain.sampler_options(temperature=0.7, top_k=8, top_p=0.9, repetition_penalty=1.5).request_kwargs()
    assert (k["temperature"], k["top_k"], k["top_p"], k["repetition_penalty"]) == (0.7, 8, 0.9, 1.5)
    assert sampler_chain.sampler_options(temperature=0.0).greedy
    assert not sampler_chain.sampler_options(temperature=1e-6).greedy


def test_decoder_options_are_checked_before_the_engine():
    with pytest.raises(InvalidArgument, match="assistant"):
        MistralRsDecoder("unused", assistant="eagle")
    with pytest.raises(InvalidArgument, match="draft_dir"):
        MistralRsDecoder("unused", assistant="draft")
    with pytest.raises(InvalidArgument, match="mtp_n_predict"):
        MistralRsDecoder("unused", mtp_n_predict=0)
    with pytest.raises(InvalidArgument, match="top_p"):
        MistralRsDecoder("unused", top_p=2.0)


def test_kv_cache_switch_is_set_once_per_process(monkeypatch):
    monkeypatch.setattr(decoder_module, "_KV_IN_FORCE", [])
    monkeypatch.delenv(KV_F32_ENV, raising=False)
    decoder_module._set_kv_cache(True)
    assert decoder_module.os.environ[KV_F32_ENV] == "1"
    decoder_module._set_kv_cache(True)  # the same setting again is fine
    with pytest.raises(ImplementationError, match="once"):
        decoder_module._set_kv_cache(False)
    assert decoder_module.os.environ[KV_F32_ENV] == "1"


def _penalise_one(logit: float, generated: int, seen: bool, o) -> float:
    logit = logit - generated * o.frequency_penalty - (o.presence_penalty if generated else 0.0)
    if seen:
        logit = logit / o.repetition_penalty if logit > 0 else logit * o.repetition_penalty
    return logit


def test_penalties_follow_mistral_rs_order_and_count_the_prompt_for_repetition_only():
    o = sampler_chain.sampler_options(repetition_penalty=1.5, frequency_penalty=0.25, presence_penalty=0.5)
    logits = torch.tensor([[1.0, -2.0, 0.0, 3.0, 0.6]], dtype=torch.float64)
    context = torch.tensor([[3, 1, 1, 4, 1]])  # prompt [3, 1]; generated [1, 4, 1]
    out = sampler_chain.apply_penalties(logits, context, 2, o)[0].tolist()
    generated, seen = {1: 2, 4: 1}, {1, 3, 4}
    want = [_penalise_one(v, generated.get(i, 0), i in seen, o) for i, v in enumerate(logits[0].tolist())]
    assert out == pytest.approx(want)
    # token 4: 0.6 - 0.25 - 0.5 = -0.15 < 0 after the subtraction, so the repetition penalty multiplies
    assert out[4] == pytest.approx(-0.15 * 1.5)


def test_top_p_acts_on_the_temperature_scaled_law_renormalised_over_top_k():
    probs = torch.tensor([[0.4, 0.3, 0.2, 0.06, 0.04]], dtype=torch.float64)
    logits = probs.log()
    keep = lambda **kw: (sampler_chain.processed_probs(logits, sampler_chain.sampler_options(**kw))[0] > 0).tolist()  # noqa: E731
    assert keep(top_k=2) == [True, True, False, False, False]
    assert keep(top_p=0.69) == [True, True, False, False, False]  # 0.4 + 0.3 >= 0.69
    assert keep(top_p=0.71) == [True, True, True, False, False]
    assert keep(top_k=2, top_p=0.5) == [True, False, False, False, False]  # cutoff 0.5 * 0.7 = 0.35 <= 0.4
    assert keep(top_k=2, top_p=0.58) == [True, True, False, False, False]  # cutoff 0.406 > 0.4
    assert keep(min_p=0.125) == [True, True, True, True, False]  # drop p <= 0.05 (">=" threshold)
    # at T = 0.5 the law is p^2 / sum p^2: 0.16, 0.09, 0.04, ... / 0.2952; top-p 0.6 keeps 2 there, 3 at T = 1
    assert keep(temperature=0.5, top_p=0.6) == [True, True, False, False, False]
    assert keep(top_p=0.6) == [True, True, False, False, False]
    assert keep(top_p=0.75) == [True, True, True, False, False]
    assert keep(temperature=0.5, top_p=0.75) == [True, True, False, False, False]  # 0.847 of the mass in 2


def test_processed_probs_temperature_and_greedy():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]], dtype=torch.float64))
    probs = sampler_chain.processed_probs(logits, sampler_chain.sampler_options(temperature=0.5, top_k=2))[0]
    want = torch.tensor([0.25, 0.09, 0.0, 0.0], dtype=torch.float64)
    assert probs.tolist() == pytest.approx((want / want.sum()).tolist())
    ties = torch.tensor([[1.0, 3.0, 3.0, 0.0]])
    assert sampler_chain.processed_probs(ties, sampler_chain.sampler_options(temperature=0.0))[0].tolist() == [
        0.0,
        1.0,
        0.0,
        0.0,
    ]
    with pytest.raises(InvalidArgument, match="context"):
        sampler_chain.processed_probs(logits, sampler_chain.sampler_options(repetition_penalty=1.2))


def test_text_and_ids_round_trip_and_bad_completions_are_implementation_errors():
    ids = list(range(model.VOCAB_SIZE))
    assert model.text_to_ids(model.ids_to_text(ids)) == ids
    with pytest.raises(InvalidArgument):
        model.ids_to_text([32])
    out = tokens_from_texts(["abc", "FFa"], num_samples=2, max_new_tokens=3)
    assert out.tolist() == [[0, 1, 2], [31, 31, 0]]
    with pytest.raises(ImplementationError, match="2 tokens"):
        tokens_from_texts(["ab"], num_samples=1, max_new_tokens=3)
    with pytest.raises(ImplementationError, match="not one of"):
        tokens_from_texts(["a b"], num_samples=1, max_new_tokens=3)
    with pytest.raises(ImplementationError, match="completions"):
        tokens_from_texts(["abc"], num_samples=2, max_new_tokens=3)


def test_tokenizer_maps_each_piece_to_its_id(tmp_path):
    pytest.importorskip("tokenizers")
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(model.write_tokenizer(tmp_path / "tokenizer.json")))
    text = "".join(model.PIECES)
    assert tok.encode(text).ids == list(range(model.VOCAB_SIZE))
    assert tok.decode([3, 7, 31]) == "dhF"


def test_report_configurations_and_readme_render(tmp_path):
    from tools.reports import mistralrs_reports as gen

    names = [name for name, *_ in gen.CONFIGS]
    assert len(set(names)) == len(names) == 5
    assert all(d["assistant"] == "none" for _, _, d, _ in gen.CONFIGS)
    assert {d["mtp_n_predict"] for _, _, d, _ in gen.SPECULATIVE} == {1, 3, 5}
    args = gen.config_args(dict(assistant="none"), dict(temperature=0.7, top_k=8))
    assert args[:2] == ["--decoder", "specverify.adapters.mistralrs:tiny_decoder"]
    assert "--target-option" in args and "top_k=8" in args
    refusal = "ImplementationError: mistralrs.Runner(...) failed: MTP needs PagedAttention"
    facts = dict(
        mtp="MTP needs PagedAttention",
        mtp_paged="no paged attention",
        seed="cannot seed",
        seed_later=None,
        fresh_runners_agree=True,
        max_conditional_difference=5.2e-7,
        max_conditional_difference_kv_f16=4.2e-4,
        speculative={name: refusal for name, *_ in gen.SPECULATIVE},
        minp_boundary=dict(
            prefix=list(gen.MINP_PREFIX),
            token=gen.MINP_TOKEN,
            engine_ratio=0.0998937,
            engine_ratio_kv_f16=0.1000139,
            transformers_ratio=0.0998937,
        ),
        later_rows=dict(
            prompt=list(gen.FOLLOWUP_PROMPT),
            audit=dict(n=4000, statistic=35.8, p=0.00064, mde_tv=0.049),
            blocks=[dict(n=4000, statistic=9.5, p=0.74, mde_tv=0.049)] * 3,
            pooled=dict(n=12000, statistic=27.0, p=0.105, mde_tv=0.03),
        ),
    )
    (tmp_path / "probe.json").write_text(json.dumps(facts))
    text = gen.write_readme(tmp_path, seed=0, tier="smoke").read_text()
    assert "MTP needs PagedAttention" in text and "NOT RUNNABLE" in text
    assert "0.00042" in text and "5.2e-07" in text and "0.1000139" in text and "MISTRALRS_CPU_KV_F32=1" in text
    assert "12000 pooled p = 0.1" in text and "(not probed)" not in text
    assert "no repro script" in text
    assert "{" not in text.split("## Results")[0].replace("{{", "")


# ----------------------------------------------------------------------------- with the engine


@pytest.mark.slow
def test_engine_control_is_reproducible_per_call_and_speculation_is_refused():
    pytest.importorskip("mistralrs")
    from specverify.adapters.mistralrs import tiny_decoder, tiny_target

    decoder = tiny_decoder(temperature=1.0)
    prompt = torch.tensor([3, 7, 9])
    a = decoder.generate(prompt, num_samples=200, max_new_tokens=3, seed=0)  # (200, 3)
    b = decoder.generate(prompt, num_samples=200, max_new_tokens=3, seed=0)  # (200, 3)
    assert torch.equal(a, b)
    law = tiny_target(temperature=1.0).next_token_probs(prompt[None])[0]  # (V,)
    counts = torch.bincount(a[:, 0], minlength=model.VOCAB_SIZE).double()
    assert bool((counts[law == 0] == 0).all())
    assert float((counts / 200 - law).abs().sum() / 2) < 0.2
    greedy = tiny_decoder(temperature=0.0).generate(prompt, num_samples=2, max_new_tokens=1, seed=0)
    assert greedy[:, 0].tolist() == [int(law.argmax())] * 2
    with pytest.raises(ImplementationError, match="PagedAttention"):
        tiny_decoder(assistant="draft", temperature=1.0).generate(prompt, num_samples=1, max_new_tokens=1, seed=0)


@pytest.mark.slow
def test_engine_raw_law_is_the_float32_forward_with_the_float32_kv_cache():
    pytest.importorskip("mistralrs")
    from specverify.adapters.mistralrs import max_conditional_difference

    # the default float16 KV cache moves probabilities by ~4e-4 (reports/mistralrs/probe.json)
    assert max_conditional_difference(num_sequences=2, length=4) < 1e-5
