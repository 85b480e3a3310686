"""llama.cpp through llama-cpp-python behind the decoder protocol (``specverify.adapters.llamacpp``).

Engine-free tests (always run, CI has no llama_cpp): the float64 re-implementation of llama.cpp's
sampler chain (penalties, top-k, top-p, min-p, temperature, greedy) against direct per-token
computations, the grammar's character DFA against a regular expression of the same language,
argument checks, per-sample seeds, output validation and the report generator's configurations.
Engine tests skip cleanly without ``llama_cpp``; they write the tiny GGUF files once (cached under
``$SPECVERIFY_CACHE``), hence ``slow``: run them in the llama.cpp virtualenv with
``pytest tests/adapters/test_llamacpp.py -m slow``.
"""

from __future__ import annotations

import importlib.util
import math
import random
import re

import pytest
import torch

from specverify.adapters.llamacpp import decoder as adapter
from specverify.adapters.llamacpp import sampler_chain as sampling
from specverify.adapters.llamacpp.gguf_model import EOG, PIECES
from specverify.core.errors import ImplementationError, InvalidArgument
from tools.reports import llamacpp_reports

HAVE_LLAMA_CPP = importlib.util.find_spec("llama_cpp") is not None and importlib.util.find_spec("gguf") is not None
PURE = dict(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0)

# ----------------------------------------------------------------------------- engine-free (CI)


@pytest.mark.parametrize(
    "options, match",
    [
        (dict(temperature=-0.1), "temperature"),
        (dict(temperature=True), "temperature"),
        (dict(top_p=0.0), "top_p"),
        (dict(top_p=1.5), "top_p"),
        (dict(min_p=1.0), "min_p"),
        (dict(repeat_penalty=0.0), "repeat_penalty"),
        (dict(top_k=2.5), "top_k"),
        (dict(last_n=-1), "last_n"),
        (dict(frequency_penalty=float("nan")), "frequency_penalty"),
        (dict(typo=1), "unknown"),
    ],
)
def test_sampler_options_name_the_argument(options, match):
    with pytest.raises(InvalidArgument, match=match):
        sampling.sampler_options(**options)


def test_defaults_are_generate_defaults():
    o = sampling.sampler_options()
    assert (o.temperature, o.top_k, o.top_p, o.min_p, o.last_n) == (0.8, 40, 0.95, 0.05, 64)
    assert not o.penalised
    assert sampling.sampler_options(repeat_penalty=1.1).penalised
    assert not sampling.sampler_options(repeat_penalty=1.1, last_n=0).penalised
    assert o.generate_kwargs()["temp"] == 0.8


def _penalise_one(logit: float, count: int, o) -> float:
    if count == 0:
        return logit
    logit = logit * o.repeat_penalty if logit <= 0 else logit / o.repeat_penalty
    return logit - count * o.frequency_penalty - o.presence_penalty


def test_penalties_match_llama_cpp_rule_over_the_window():
    o = sampling.sampler_options(repeat_penalty=1.5, frequency_penalty=0.25, presence_penalty=0.5, last_n=3)
    logits = torch.tensor([[1.0, -2.0, 0.0, 3.0, -0.5]], dtype=torch.float64)
    history = torch.tensor([[3, 1, 1, 4, 1]])  # window: last 3 = [1, 4, 1]
    out = sampling.apply_penalties(logits, history, o)[0].tolist()
    counts = {1: 2, 4: 1}
    want = [_penalise_one(v, counts.get(i, 0), o) for i, v in enumerate(logits[0].tolist())]
    assert out == pytest.approx(want)


def test_truncation_top_k_top_p_min_p():
    logits = torch.log(torch.tensor([[0.4, 0.3, 0.2, 0.06, 0.04]], dtype=torch.float64))
    keep = lambda **kw: torch.isfinite(sampling.truncate(logits, sampling.sampler_options(**kw)))[0].tolist()  # noqa: E731
    assert keep(top_k=2, top_p=1.0, min_p=0.0) == [True, True, False, False, False]
    # top-p keeps the shortest prefix reaching p: 0.4 + 0.3 = 0.7 >= 0.69
    assert keep(top_k=0, top_p=0.69, min_p=0.0) == [True, True, False, False, False]
    assert keep(top_k=0, top_p=0.71, min_p=0.0) == [True, True, True, False, False]
    # min-p keeps p_i >= 0.125 * 0.4 = 0.05
    assert keep(top_k=0, top_p=1.0, min_p=0.125) == [True, True, True, True, False]
    # top-p after top-k renormalises over the k kept: 0.4 / 0.7 >= 0.5
    assert keep(top_k=2, top_p=0.5, min_p=0.0) == [True, False, False, False, False]


def test_processed_probs_temperature_after_truncation_and_greedy():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]], dtype=torch.float64))
    o = sampling.sampler_options(temperature=0.5, top_k=0, top_p=0.75, min_p=0.0)
    probs = sampling.processed_probs(logits, o)[0]
    want = torch.tensor([0.5**2, 0.3**2, 0.0, 0.0], dtype=torch.float64)
    assert probs.tolist() == pytest.approx((want / want.sum()).tolist())
    greedy = sampling.processed_probs(logits, sampling.sampler_options(temperature=0.0))[0]
    assert greedy.tolist() == [1.0, 0.0, 0.0, 0.0]
    allowed = torch.tensor([[False, True, True, True]])
    assert sampling.processed_probs(logits, sampling.sampler_options(temperature=0.0), allowed=allowed)[0, 1] == 1.0


# The prefixes of the grammar's language: words separated by spaces, word = a[bc]* | ba.
PREFIX = re.compile(r"((a[bc]*|ba) )*(a[bc]*|b|ba)?")


def test_word_grammar_dfa_matches_its_regular_expression():
    rng = random.Random(0)
    g = sampling.WORD_GRAMMAR
    for _ in range(3000):
        text = "".join(rng.choice("abc ") for _ in range(rng.randint(1, 8)))
        assert (g.step(0, text) is not None) == bool(PREFIX.fullmatch(text)), text


def test_grammar_mask_is_context_dependent_and_never_allows_eog_or_control_tokens():
    g, pieces = sampling.WORD_GRAMMAR, list(PIECES)
    states = g.states(torch.tensor([[], []], dtype=torch.long).reshape(2, 0), pieces)
    assert states == [0, 0]
    tokens = torch.tensor([[pieces.index("b")], [pieces.index("a")]])
    after = g.states(tokens, pieces)
    mask = g.mask(after, pieces, EOG)  # (2, V)
    assert mask[0].tolist() != mask[1].tolist()
    assert not mask[:, :3].any()  # <unk>, <s>, </s>
    assert mask[0, pieces.index("a ")] and not mask[1, pieces.index("a ")]  # "ba " after b; "aa " not a word
    for row, state in zip(mask, after):
        for token, piece in enumerate(pieces):
            assert bool(row[token]) == (token not in EOG and g.step(state, piece) is not None)
    assert g.mask([None], pieces, EOG).all()  # after a broken grammar: every token (see mask's docstring)


def test_sample_seeds_are_distinct_deterministic_and_never_the_random_seed():
    seeds = adapter.sample_seeds(7, 3000)
    assert len(set(seeds)) == 3000 and seeds == adapter.sample_seeds(7, 3000)
    assert all(0 <= s < 0xFFFFFFFF for s in seeds)


def test_tokens_from_rows_validates():
    assert adapter.tokens_from_rows([[1, 2], [3, 4]], num_samples=2, max_new_tokens=2, vocab_size=8).shape == (2, 2)
    for rows, match in (([[1, 2]], "sequences"), ([[1], [2, 3]], "tokens for sample"), ([[1, 9], [1, 2]], "outside")):
        with pytest.raises(ImplementationError, match=match):
            adapter.tokens_from_rows(rows, num_samples=2, max_new_tokens=2, vocab_size=8)


def test_decoder_arguments_are_checked_before_the_engine_loads(tmp_path):
    with pytest.raises(InvalidArgument, match="drafter"):
        adapter.LlamaCppDecoder(tmp_path / "m.gguf", drafter="medusa")
    with pytest.raises(InvalidArgument, match="draft_path"):
        adapter.LlamaCppDecoder(tmp_path / "m.gguf", drafter="draft_model")
    with pytest.raises(InvalidArgument, match="top_p"):
        adapter.LlamaCppDecoder(tmp_path / "m.gguf", top_p=2.0)


def test_report_configs_cover_every_drafter_and_setting():
    names = [name for name, *_ in llamacpp_reports.CONFIGS]
    assert len(names) == len(set(names)) == 18
    for drafter in ("control", "lookup", "draftmodel"):
        for setting in ("t1.0", "defaults", "t0.7_topk8_topp0.9", "penalties", "grammar", "greedy"):
            assert f"{drafter}_{setting}" in names
    for name, _, decoder, sampler in llamacpp_reports.CONFIGS:
        args = llamacpp_reports.config_args(decoder, sampler)
        targets = [args[i + 1] for i, a in enumerate(args) if a == "--target-option"]
        assert all(t.split("=")[0] in llamacpp_reports.SAMPLER_KEYS for t in targets), name


def test_missing_engine_names_the_install_line(monkeypatch):
    import builtins

    real = builtins.__import__

    def fake(name, *args, **kwargs):
        if name == "llama_cpp":
            raise ImportError("no module named llama_cpp")
        return real(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", fake)
    with pytest.raises(ImportError, match="CMAKE_BUILD_PARALLEL_LEVEL"):
        adapter.engine_version()


# ----------------------------------------------------------------------------- engine (llama venv)

engine = pytest.mark.skipif(not HAVE_LLAMA_CPP, reason="llama-cpp-python / gguf not installed (see INSTALL)")


@engine
@pytest.mark.slow
def test_engine_law_matches_transformers_on_the_same_weights():
    assert adapter.max_conditional_difference(seed=0) < 1e-4


@engine
@pytest.mark.slow
@pytest.mark.parametrize("drafter", [None, "prompt_lookup", "draft_model"])
def test_decoder_is_reproducible_per_seed_and_respects_the_grammar(drafter):
    dec = adapter.tiny_decoder(drafter=drafter, grammar=True, **PURE)
    prompt = torch.tensor([3, 7, 9, 3])
    a = dec.generate(prompt, num_samples=20, max_new_tokens=6, seed=1)
    assert torch.equal(a, dec.generate(prompt, num_samples=20, max_new_tokens=6, seed=1))
    for row in a.tolist():
        assert sampling.WORD_GRAMMAR.step(0, "".join(PIECES[t] for t in row)) is not None


@engine
@pytest.mark.slow
def test_first_token_law_of_target_is_a_distribution():
    target = adapter.tiny_target(**PURE)
    probs = target.next_token_probs(torch.tensor([[3, 7, 9]]))
    assert math.isclose(float(probs.sum()), 1.0, rel_tol=1e-12)
