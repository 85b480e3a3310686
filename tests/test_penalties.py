"""Penalties, logit bias and each engine's processor order against an independent implementation.

The independent law below is written from the engines' own descriptions (see
``specverify_reference.penalties`` and ``processors``) in plain Python floats, one token at a
time, with dictionaries for the counts: no code shared with the reference processors.
"""

from __future__ import annotations

import math
from collections import Counter

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from specverify.core.errors import InvalidArgument
from specverify_reference.penalties import History, penalise
from specverify_reference.processors import SamplingConfig, logits_to_probs, logits_to_probs_by_rows


def _softmax(values, temperature=1.0):
    finite = [v for v in values if v != -math.inf]
    top = max(finite)
    weights = [0.0 if v == -math.inf else math.exp((v - top) / temperature) for v in values]
    total = math.fsum(weights)
    return [w / total for w in weights]


def _renorm(probs, keep):
    total = math.fsum(p for p, k in zip(probs, keep) if k)
    return [p / total if k else 0.0 for p, k in zip(probs, keep)]


def _top_k(probs, k):
    if k is None or k >= len(probs):
        return probs
    kth = sorted(probs, reverse=True)[k - 1]
    return _renorm(probs, [p >= kth for p in probs])


def _top_p(probs, top_p):
    if top_p is None or top_p >= 1:
        return probs
    order = sorted(range(len(probs)), key=lambda t: (-probs[t], t))
    keep, before = [False] * len(probs), 0.0
    for t in order:
        keep[t] = before < top_p
        before += probs[t]
    return _renorm(probs, keep)


def _min_p(probs, min_p):
    if min_p is None or min_p <= 0:
        return probs
    bar = min_p * max(probs)
    return _renorm(probs, [p >= bar for p in probs])


def independent_law(logits, prompt, output, cfg: SamplingConfig):
    """The processed law of one row, from its engine's description."""
    x = [float(v) for v in logits]
    for token, bias in cfg.logit_bias:
        x[token] += bias
    history = list(prompt) + list(output)
    if cfg.engine == "hf":
        repeated, counts = set(history), Counter()
    elif cfg.engine == "vllm":
        repeated, counts = set(history), Counter(output)
    else:  # llama.cpp: one window over prompt and output
        n = cfg.penalty_last_n
        window = history if n is None else (history[max(0, len(history) - n) :] if n > 0 else [])
        repeated, counts = set(window), Counter(window)
    for t in range(len(x)):
        if t in repeated:
            x[t] = x[t] / cfg.repetition_penalty if x[t] > 0 else x[t] * cfg.repetition_penalty
        c = counts.get(t, 0)
        x[t] -= cfg.frequency_penalty * c + cfg.presence_penalty * (c > 0)
    if cfg.temperature == 0:
        best = max(range(len(x)), key=lambda t: (x[t], -t))
        return [1.0 if t == best else 0.0 for t in range(len(x))]
    if cfg.engine == "llama.cpp":
        kept = _min_p(_top_p(_top_k(_softmax(x), cfg.top_k), cfg.top_p), cfg.min_p)
        return _renorm(_softmax(x, cfg.temperature), [p > 0 for p in kept])
    probs = _top_k(_softmax(x, cfg.temperature), cfg.top_k)
    if cfg.engine == "vllm":
        return _top_p(_min_p(probs, cfg.min_p), cfg.top_p)
    return _min_p(_top_p(probs, cfg.top_p), cfg.min_p)


@st.composite
def configs(draw, vocab_size: int):
    engine = draw(st.sampled_from(["hf", "vllm", "llama.cpp"]))
    extra = {}
    if engine != "hf":
        extra["frequency_penalty"] = draw(st.sampled_from([0.0, 0.4, -0.3, 1.5]))
        extra["presence_penalty"] = draw(st.sampled_from([0.0, 0.7, -0.5]))
        ids = draw(st.lists(st.integers(0, vocab_size - 1), max_size=3, unique=True))
        extra["logit_bias"] = {t: draw(st.sampled_from([-2.0, 1.5, 5.0, -math.inf])) for t in ids}
    if engine == "llama.cpp":
        extra["penalty_last_n"] = draw(st.sampled_from([None, 0, 1, 3, 64]))
    return SamplingConfig(
        temperature=draw(st.sampled_from([0.0, 0.6, 1.0, 1.7])),
        top_k=draw(st.sampled_from([None, 1, 3, vocab_size])),
        top_p=draw(st.sampled_from([None, 0.5, 0.9])),
        min_p=draw(st.sampled_from([None, 0.05, 0.3])),
        engine=engine,
        repetition_penalty=draw(st.sampled_from([1.0, 1.3, 0.8, 2.0])),
        **extra,
    )


@st.composite
def cases(draw):
    V = draw(st.integers(2, 24))
    seed = draw(st.integers(0, 2**31 - 1))  # drawn in the example: a failure replays
    prompt_len = draw(st.integers(1, 5))
    out_len = draw(st.integers(0, 6))
    return V, seed, prompt_len, out_len, draw(configs(V))


def _row(V, seed, prompt_len, out_len):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(V, generator=g, dtype=torch.float64) * 2
    tokens = torch.randint(0, V, (prompt_len + out_len,), generator=g)
    return logits, tokens


@settings(max_examples=300, deadline=None)
@given(cases())
def test_each_engine_law_matches_the_independent_implementation(case):
    V, seed, prompt_len, out_len, cfg = case
    logits, tokens = _row(V, seed, prompt_len, out_len)
    prompt, output = tokens[:prompt_len].tolist(), tokens[prompt_len:].tolist()
    if cfg.logit_bias and all(logits[t] + b == -math.inf for t, b in cfg.logit_bias) and len(cfg.logit_bias) == V:
        return  # every token banned: no law
    history = History.of_prefixes(tokens[None], prompt_len)
    got = logits_to_probs(logits[None], cfg, history=history)[0]
    want = torch.tensor(independent_law(logits.tolist(), prompt, output, cfg), dtype=torch.float64)
    assert torch.equal(got > 0, want > 0), (got, want)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-14)


@settings(max_examples=60, deadline=None)
@given(cases(), st.integers(1, 4))
def test_every_position_of_a_teacher_forced_row_gets_its_own_history(case, blocks):
    """Laws at positions prompt_len..S of one sequence, in one call and in row blocks, equal the
    independent law of each prefix (the prompt, then the output before that position)."""
    V, seed, prompt_len, out_len, cfg = case
    logits_rows = torch.randn(out_len + 1, V, generator=torch.Generator().manual_seed(seed + 1), dtype=torch.float64)
    _, tokens = _row(V, seed, prompt_len, out_len)
    ends = torch.arange(prompt_len, prompt_len + out_len + 1)[None]  # (1, n)
    history = History(tokens[None], prompt_len, ends)
    got = logits_to_probs(logits_rows[None].clone(), cfg, history=history)[0]  # (n, V)
    by_rows = logits_to_probs_by_rows(logits_rows[None].clone(), cfg, rows=blocks, history=history)[0]
    assert torch.equal(got, by_rows)
    for j in range(out_len + 1):
        want = independent_law(logits_rows[j].tolist(), tokens[:prompt_len].tolist(),
                                tokens[prompt_len : prompt_len + j].tolist(), cfg)  # fmt: skip
        torch.testing.assert_close(got[j], torch.tensor(want, dtype=torch.float64), rtol=1e-12, atol=1e-14)


def test_penalise_touches_only_the_history_tokens():
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(2, 3, 1000, generator=g, dtype=torch.float64)
    tokens = torch.randint(0, 1000, (2, 9), generator=g)
    history = History(tokens, 4, torch.tensor([[4, 6, 9], [5, 5, 8]]))
    before = logits.clone()
    penalise(logits, history, engine="vllm", repetition=1.7, frequency=0.5, presence=0.25)
    changed = (logits != before).nonzero()
    assert changed.numel() > 0
    for b, j, t in changed.tolist():
        assert t in tokens[b, : history.ends[b, j]].tolist()


def test_defaults_leave_the_law_unchanged_bit_for_bit():
    g = torch.Generator().manual_seed(5)
    logits = torch.randn(4, 50, generator=g, dtype=torch.float64)
    plain = SamplingConfig(temperature=0.8, top_k=7, top_p=0.9)
    for engine in ("hf", "vllm"):
        assert torch.equal(logits_to_probs(logits, plain), logits_to_probs(logits, SamplingConfig(
            temperature=0.8, top_k=7, top_p=0.9, engine=engine)))  # fmt: skip


def test_min_p_and_top_p_order_is_the_engines():
    # sorted probabilities (0.5, 0.3, 0.2): vLLM's min-p 0.5 first keeps two, whose renormalised top-p
    # 0.6 keeps one; transformers' top-p 0.6 first keeps two, min-p then keeps both
    logits = torch.tensor([[math.log(0.5), math.log(0.3), math.log(0.2)]], dtype=torch.float64)
    hf = logits_to_probs(logits, SamplingConfig(top_p=0.6, min_p=0.5))
    vllm = logits_to_probs(logits, SamplingConfig(top_p=0.6, min_p=0.5, engine="vllm"))
    assert (hf > 0).sum() == 2 and (vllm > 0).sum() == 1


def test_llama_cpp_cuts_before_its_temperature():
    # at T = 1 the probabilities are (0.6, 0.3, 0.1): top-p 0.8 keeps two; at T = 3 the tempered law would keep three
    logits = torch.tensor([[math.log(0.6), math.log(0.3), math.log(0.1)]], dtype=torch.float64)
    llama = logits_to_probs(logits, SamplingConfig(temperature=3.0, top_p=0.8, engine="llama.cpp"))
    hf = logits_to_probs(logits, SamplingConfig(temperature=3.0, top_p=0.8))
    assert (llama > 0).sum() == 2 and (hf > 0).sum() == 3
    ratio = float(llama[0, 0] / llama[0, 1])
    assert ratio == pytest.approx(2.0 ** (1 / 3), rel=1e-12)


@pytest.mark.parametrize(
    ("kwargs", "named"),
    [
        ({"frequency_penalty": 0.5}, "frequency_penalty"),
        ({"presence_penalty": 0.5}, "presence_penalty"),
        ({"logit_bias": {1: 2.0}}, "logit_bias"),
        ({"engine": "vllm", "repetition_penalty": 0.0}, "repetition_penalty"),
        ({"engine": "vllm", "frequency_penalty": math.nan}, "frequency_penalty"),
        ({"engine": "vllm", "logit_bias": {-1: 2.0}}, "logit_bias"),
        ({"engine": "vllm", "logit_bias": {1: math.inf}}, "logit_bias"),
        ({"engine": "vllm", "penalty_last_n": 4}, "penalty_last_n"),
        ({"engine": "llama.cpp", "penalty_last_n": -1}, "penalty_last_n"),
        ({"engine": "sglang"}, "engine"),
    ],
)
def test_bad_options_are_named(kwargs, named):
    with pytest.raises(InvalidArgument, match=named):
        SamplingConfig(**kwargs)


def test_bad_histories_are_named():
    logits = torch.zeros(1, 2, 5, dtype=torch.float64)
    cfg = SamplingConfig(engine="vllm", repetition_penalty=1.2)
    with pytest.raises(InvalidArgument, match="history"):
        logits_to_probs(logits, cfg)
    with pytest.raises(InvalidArgument, match="ends"):
        History(torch.zeros(1, 3, dtype=torch.long), 2, torch.tensor([[1, 3]]))
    with pytest.raises(InvalidArgument, match="prompt_len"):
        History(torch.zeros(1, 3, dtype=torch.long), 4, torch.tensor([[3]]))
    with pytest.raises(InvalidArgument, match="does not match"):
        logits_to_probs(logits, cfg, history=History(torch.zeros(1, 3, dtype=torch.long), 1, torch.tensor([[3]])))
    with pytest.raises(InvalidArgument, match="outside the vocabulary"):
        logits_to_probs(logits, SamplingConfig(engine="vllm", logit_bias={7: 1.0}))
