"""Bad input: every public function raises InvalidArgument naming the argument (and its value).

Covers reference.rules (verify, greedy_verify), specverify.core.sampling (sample),
specverify.core.chain_laws, and the specverify.core.validation helpers directly.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch

from specverify.core import chain_laws
from specverify.core.errors import InvalidArgument, SpecVerifyError
from specverify.core.sampling import sample
from specverify.core.validation import (
    check_alpha,
    check_bool,
    check_float,
    check_generator,
    check_int,
    check_probs,
    check_shape,
    check_tokens,
)
from specverify_reference.rules import greedy_verify, verify

B, K, V = 3, 2, 4
GOOD_T = torch.full((B, K + 1, V), 1.0 / V)  # (B, K+1, V)
GOOD_D = torch.full((B, K, V), 1.0 / V)  # (B, K, V)
GOOD_X = torch.zeros(B, K, dtype=torch.long)  # (B, K)
GEN = torch.Generator().manual_seed(0)


def poke(t, index, value):
    t = t.clone()
    t[index] = value
    return t


NAN_T = poke(GOOD_T, (1, 2, 3), float("nan"))
NEG_D = poke(GOOD_D, (2, 1, 0), -0.25)
UNNORM_T = poke(GOOD_T, (0, 1, 0), 0.5)
INF_T = poke(GOOD_T, (0, 0, 0), float("inf"))


def call_verify(target=GOOD_T, draft=GOOD_D, tokens=GOOD_X, generator=GEN):
    return verify(target, draft, tokens, generator=generator)


def call_greedy(target=GOOD_T, tokens=GOOD_X):
    return greedy_verify(target, tokens)


# (id, thunk, substrings that the message must contain)
CASES = [
    ("verify-nan", lambda: call_verify(target=NAN_T), ["target_probs[1, 2, 3]", "nan"]),
    ("verify-inf", lambda: call_verify(target=INF_T), ["target_probs[0, 0, 0]", "inf"]),
    ("verify-negative", lambda: call_verify(draft=NEG_D), ["draft_probs[2, 1, 0]", "-0.25"]),
    ("verify-unnormalised", lambda: call_verify(target=UNNORM_T), ["target_probs[0, 1]", "1.25"]),
    (
        "verify-int-dtype",
        lambda: call_verify(target=torch.ones(B, K + 1, V, dtype=torch.long)),
        ["target_probs", "dtype"],
    ),
    ("verify-2d-target", lambda: call_verify(target=GOOD_T[0]), ["target_probs", "(3, 4)"]),
    (
        "verify-K0",
        lambda: call_verify(target=GOOD_T[:, :1], draft=GOOD_D[:, :0], tokens=GOOD_X[:, :0]),
        ["target_probs", "K >= 1"],
    ),
    ("verify-draft-shape", lambda: call_verify(draft=GOOD_D[:, :1]), ["draft_probs", "(3, 1, 4)"]),
    ("verify-draft-vocab", lambda: call_verify(draft=torch.full((B, K, V + 1), 1.0 / (V + 1))), ["draft_probs"]),
    ("verify-tokens-shape", lambda: call_verify(tokens=GOOD_X[:, :1]), ["draft_tokens", "(3, 1)"]),
    ("verify-tokens-oov", lambda: call_verify(tokens=poke(GOOD_X, (1, 1), V)), ["draft_tokens[1, 1]", "4"]),
    ("verify-tokens-negative", lambda: call_verify(tokens=poke(GOOD_X, (0, 0), -1)), ["draft_tokens[0, 0]", "-1"]),
    ("verify-tokens-float", lambda: call_verify(tokens=GOOD_X.double()), ["draft_tokens", "float64"]),
    ("verify-tokens-list", lambda: call_verify(tokens=[[0, 0]] * B), ["draft_tokens", "list"]),
    ("verify-generator-none", lambda: call_verify(generator=None), ["generator", "None"]),
    ("verify-generator-int", lambda: call_verify(generator=0), ["generator", "0"]),
    ("verify-generator-numpy", lambda: call_verify(generator=np.random.default_rng(0)), ["generator", "Generator"]),
    ("verify-numpy-target", lambda: call_verify(target=GOOD_T.numpy()), ["target_probs", "ndarray"]),
    ("greedy-nan", lambda: call_greedy(target=NAN_T), ["target_probs[1, 2, 3]"]),
    ("greedy-unnormalised", lambda: call_greedy(target=UNNORM_T), ["target_probs[0, 1]"]),
    ("greedy-K0", lambda: call_greedy(target=GOOD_T[:, :1], tokens=GOOD_X[:, :0]), ["target_probs", "K >= 1"]),
    ("greedy-tokens-shape", lambda: call_greedy(tokens=GOOD_X[:1]), ["draft_tokens", "(1, 2)"]),
    ("greedy-tokens-oov", lambda: call_greedy(tokens=poke(GOOD_X, (2, 0), 9)), ["draft_tokens[2, 0]", "9"]),
    ("greedy-tokens-float", lambda: call_greedy(tokens=GOOD_X.float()), ["draft_tokens", "float32"]),
    ("sample-nan", lambda: sample(torch.tensor([[0.5, float("nan")]]), generator=GEN), ["probs[0, 1]", "nan"]),
    ("sample-negative", lambda: sample(torch.tensor([0.5, -1.0]), generator=GEN), ["probs[1]", "-1"]),
    (
        "sample-inf",
        lambda: sample(torch.tensor([[1.0, 0.0], [float("inf"), 1.0]]), generator=GEN),
        ["probs[1, 0]", "inf"],
    ),
    ("sample-zero-row", lambda: sample(torch.tensor([[1.0, 0.0], [0.0, 0.0]]), generator=GEN), ["probs[1]", "0"]),
    (
        "sample-sum-overflow",
        lambda: sample(torch.tensor([[1e308, 1e308]], dtype=torch.float64), generator=GEN),
        ["probs[0]", "inf"],
    ),
    ("sample-int", lambda: sample(torch.tensor([1, 2]), generator=GEN), ["probs", "int64"]),
    ("sample-scalar", lambda: sample(torch.tensor(1.0), generator=GEN), ["probs", "shape"]),
    ("sample-empty-vocab", lambda: sample(torch.ones(3, 0), generator=GEN), ["probs", "(3, 0)"]),
    ("sample-list", lambda: sample([0.5, 0.5], generator=GEN), ["probs", "list"]),
    ("sample-generator", lambda: sample(torch.ones(2), generator="seed"), ["generator", "seed"]),
    (
        "one-step-nan",
        lambda: chain_laws.one_step_law(torch.tensor([float("nan"), 1.0]), torch.tensor([0.5, 0.5])),
        ["target_probs[0]", "nan"],
    ),
    (
        "one-step-unnormalised",
        lambda: chain_laws.one_step_law(torch.tensor([0.5, 0.5]), torch.tensor([0.5, 0.7])),
        ["draft_probs[]", "1.2"],
    ),
    ("one-step-shape", lambda: chain_laws.one_step_law(torch.ones(3) / 3, torch.ones(4) / 4), ["draft_probs", "(3)"]),
    (
        "one-step-int",
        lambda: chain_laws.one_step_law(torch.tensor([0, 1]), torch.tensor([0.5, 0.5])),
        ["target_probs", "dtype"],
    ),
    (
        "one-step-rule",
        lambda: chain_laws.one_step_law(torch.ones(2) / 2, torch.ones(2) / 2, rule="lossy"),
        ["rule", "lossy"],
    ),
    (
        "acceptance-negative",
        lambda: chain_laws.acceptance_probability(torch.tensor([1.5, -0.5]), torch.ones(2) / 2),
        ["target_probs[1]", "-0.5"],
    ),
    (
        "position-laws-K0",
        lambda: chain_laws.position_laws(torch.ones(1, 3) / 3, torch.ones(0, 3)),
        ["target_probs", "K >= 1"],
    ),
    (
        "position-laws-shape",
        lambda: chain_laws.position_laws(torch.ones(3, 3) / 3, torch.ones(3, 3) / 3),
        ["draft_probs", "(2, 3)"],
    ),
    (
        "num-emitted-nan",
        lambda: chain_laws.num_emitted_law(torch.ones(3, 2) / 2, torch.tensor([[float("nan"), 1.0], [0.5, 0.5]])),
        ["draft_probs[0, 0]"],
    ),
    (
        "markov-init-shape",
        lambda: chain_laws.markov_chain_law(torch.ones(2, 2) / 2, torch.ones(2, 2) / 2, L=2),
        ["target_init", "(2, 2)"],
    ),
    (
        "markov-transition-row",
        lambda: chain_laws.markov_chain_law(torch.ones(2) / 2, torch.tensor([[0.5, 0.5], [0.9, 0.9]]), L=2),
        ["target_transition[1]", "1.8"],
    ),
    (
        "markov-transition-shape",
        lambda: chain_laws.markov_chain_law(torch.ones(2) / 2, torch.ones(3, 3) / 3, L=2),
        ["target_transition", "(3, 3)"],
    ),
    ("markov-L0", lambda: chain_laws.markov_chain_law(torch.ones(2) / 2, torch.ones(2, 2) / 2, L=0), ["L", "0"]),
    (
        "markov-L-float",
        lambda: chain_laws.markov_chain_law(torch.ones(2) / 2, torch.ones(2, 2) / 2, L=2.0),
        ["L", "2.0"],
    ),
    (
        "markov-L-huge",
        lambda: chain_laws.markov_chain_law(torch.ones(6) / 6, torch.ones(6, 6) / 6, L=40),
        ["L=40", "V=6"],
    ),
    ("spec-K0", lambda: chain_laws.markov_speculative_law(*MARKOV, K=0, L=2), ["K", "0"]),
    ("spec-K-bool", lambda: chain_laws.markov_speculative_law(*MARKOV, K=True, L=2), ["K", "True"]),
    (
        "spec-draft-vocab",
        lambda: chain_laws.markov_speculative_law(*MARKOV[:2], torch.ones(3) / 3, torch.ones(3, 3) / 3, K=1, L=2),
        ["draft_init", "(3,)"],
    ),
    (
        "spec-draft-nan",
        lambda: chain_laws.markov_speculative_law(
            *MARKOV[:3], torch.tensor([[1.0, 0.0], [float("nan"), 0.5]]), K=1, L=2
        ),
        ["draft_transition[1, 0]"],
    ),
    ("spec-rule", lambda: chain_laws.markov_speculative_law(*MARKOV, K=1, L=2, rule=3), ["rule", "3"]),
    (
        "rule-bonus",
        lambda: chain_laws.VerificationRule("x", chain_laws.CANONICAL.accept, chain_laws.CANONICAL.residual, bonus="p"),
        ["bonus", "'p'"],
    ),
]
MARKOV = (torch.ones(2) / 2, torch.eye(2), torch.ones(2) / 2, torch.eye(2))


@pytest.mark.parametrize("thunk, fragments", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_public_functions_reject_bad_input(thunk, fragments):
    with pytest.raises(InvalidArgument) as info:
        thunk()
    message = str(info.value)
    for fragment in fragments:
        assert fragment in message, f"{fragment!r} not in {message!r}"
    assert isinstance(info.value, ValueError) and isinstance(info.value, SpecVerifyError)


def test_valid_edge_inputs_are_accepted():
    call_verify(target=GOOD_T.double(), draft=GOOD_D.half().float())
    float32_almost = torch.full((B, K + 1, V), (1.0 - 5e-5) / V)  # sums to 1 - 5e-5, within PROB_ATOL
    call_verify(target=float32_almost)
    call_verify(tokens=GOOD_X.int())
    sample(torch.tensor([0.0, 3.0, 1e-300]), generator=GEN)
    chain_laws.one_step_law(torch.ones(1), torch.ones(1))
    chain_laws.markov_speculative_law(*MARKOV, K=np.int64(2), L=np.int32(3))


# --------------------------------------------------------------------------- the helpers directly


def test_check_int():
    assert check_int("n", 3) == 3
    assert check_int("n", np.int16(4), minimum=0) == 4
    assert check_int("n", torch.tensor(5)) == 5
    for bad in (True, 2.0, "3", None, torch.tensor(1.0), torch.tensor([1])):
        with pytest.raises(InvalidArgument, match="n must be an integer"):
            check_int("n", bad)
    with pytest.raises(InvalidArgument, match="K must be >= 1, got 0"):
        check_int("K", 0, minimum=1)
    with pytest.raises(InvalidArgument, match="K must be <= 3, got 4"):
        check_int("K", 4, maximum=3)


def test_check_bool():
    assert check_bool("flag", True) is True
    assert check_bool("flag", False) is False
    for bad in (1, 0, "yes", None, np.bool_(True), torch.tensor(True)):
        with pytest.raises(InvalidArgument, match="flag must be True or False, got"):
            check_bool("flag", bad)
    with pytest.raises(InvalidArgument, match="memoize must be True or False, got 'yes'"):
        check_bool("memoize", "yes")


def test_check_float_converts_what_float_converts():
    assert check_float("x", 2) == 2.0 and isinstance(check_float("x", 2), float)
    assert check_float("x", np.float32(0.5)) == 0.5
    assert check_float("x", torch.tensor(0.25)) == 0.25
    assert check_float("x", "0.7") == 0.7
    assert check_float("x", True) == 1.0
    for bad in ("hot", None, [0.1], 10**400):
        with pytest.raises(InvalidArgument, match="x must be a finite number, got"):
            check_float("x", bad)
    for bad in (float("nan"), float("inf"), -float("inf")):
        with pytest.raises(InvalidArgument, match="x must be a finite number, got"):
            check_float("x", bad)


@pytest.mark.parametrize(
    "bounds, accepted, rejected, words",
    [
        (dict(minimum=0.0), [0, 0.0, 3.5], [-1e-9, float("inf")], "noise must be a finite number >= 0, got"),
        (dict(minimum=0.0, exclusive_minimum=True), [1e-300, 7], [0, -1.0], "noise must be a finite number > 0, got"),
        (dict(maximum=1.0), [-5, 1.0], [1.5], "noise must be a finite number <= 1, got"),
        (dict(maximum=1.0, exclusive_maximum=True), [0.999], [1.0], "noise must be a finite number < 1, got"),
        (dict(minimum=0.0, maximum=1.0), [0.0, 1.0], [-0.1, 1.1], r"noise must be a finite number in \[0, 1\], got"),
        (
            dict(minimum=0.0, maximum=1.0, exclusive_minimum=True),
            [1.0, 0.5],
            [0.0, 1.5, float("nan")],
            r"noise must be a finite number in \(0, 1\], got",
        ),
        (
            dict(minimum=0.0, maximum=1.0, exclusive_minimum=True, exclusive_maximum=True),
            [0.5],
            [0.0, 1.0],
            r"noise must be a finite number in \(0, 1\), got",
        ),
    ],
)
def test_check_float_bounds(bounds, accepted, rejected, words):
    for value in accepted:
        assert check_float("noise", value, **bounds) == float(value)
    for value in rejected:
        with pytest.raises(InvalidArgument, match=words + " " + re.escape(repr(value))):
            check_float("noise", value, **bounds)


def test_check_alpha():
    assert check_alpha("alpha", 1e-3) == 1e-3
    assert check_alpha("alpha", np.float32(0.5)) == 0.5
    for bad in (0, 1, 1.5, -0.1, float("nan"), float("inf")):
        with pytest.raises(InvalidArgument, match="alpha must be in"):
            check_alpha("alpha", bad)
    for bad in ("x", None, [0.1]):
        with pytest.raises(InvalidArgument, match="alpha must be a number"):
            check_alpha("alpha", bad)


def test_check_generator():
    g = torch.Generator()
    assert check_generator("generator", g) is g
    for bad in (None, 0, np.random.default_rng(0), torch.default_generator.seed):
        with pytest.raises(InvalidArgument, match="generator must be a torch.Generator"):
            check_generator("generator", bad)


def test_check_shape():
    t = torch.zeros(2, 3)
    assert check_shape("x", t, (2, 3)) is t
    assert check_shape("x", t, (None, 3)) is t
    with pytest.raises(InvalidArgument, match=r"x must have shape \(2, \*, 4\), got \(2, 3\)"):
        check_shape("x", t, (2, None, 4))
    with pytest.raises(InvalidArgument, match=r"x must have shape \(3, 3\), got \(2, 3\)"):
        check_shape("x", t, (3, 3))
    with pytest.raises(InvalidArgument, match="x must be a torch.Tensor, got ndarray"):
        check_shape("x", np.zeros((2, 3)), (2, 3))


def test_check_probs():
    good = torch.tensor([[0.25, 0.75], [1.0, 0.0]])
    assert check_probs("p", good) is good
    check_probs("p", torch.tensor([0.5, 0.5 + 5e-5]))  # within the default atol
    check_probs("p", torch.tensor([2.0, 3.0]), normalised=False)
    check_probs("p", torch.ones(0, 3))  # empty batch
    cases = [
        (np.ones(2) / 2, {}, "p must be a torch.Tensor, got ndarray"),
        (torch.tensor([1, 0]), {}, "p must have a floating dtype, got torch.int64"),
        (torch.ones(2, 0), {}, r"p must have a non-empty last \(vocabulary\) dimension, got shape \(2, 0\)"),
        (torch.tensor(1.0), {}, "non-empty last"),
        (torch.tensor([[0.5, 0.5], [float("nan"), 1.0]]), {}, r"p\[1, 0\] is nan \(must be finite\)"),
        (torch.tensor([float("-inf"), 1.0]), {}, r"p\[0\] is -inf \(must be finite\)"),
        (torch.tensor([[1.5, -0.5]]), {}, r"p\[0, 1\] is -0.5 \(must be >= 0\)"),
        (torch.tensor([[0.5, 0.5], [0.5, 0.6]]), {}, r"p\[1\] sums to 1.1 \(expected 1 within 0.0001\)"),
        (torch.tensor([0.5, 0.501]), {"atol": 1e-4}, r"p\[\] sums to 1.001"),
        (torch.tensor([[0.0, 0.0]]), {"normalised": False}, r"p\[0\] sums to 0 \(expected a positive sum\)"),
    ]
    for value, kwargs, pattern in cases:
        with pytest.raises(InvalidArgument, match=pattern):
            check_probs("p", value, **kwargs)
    check_probs("p", torch.tensor([0.5, 0.501]), atol=1e-2)


def test_check_tokens():
    t = torch.tensor([[0, 3], [2, 1]])
    assert check_tokens("x", t, 4) is t
    check_tokens("x", torch.zeros(0, dtype=torch.int32), 1)
    cases = [
        ([0, 1], "x must be a torch.Tensor, got list"),
        (torch.tensor([0.0]), "x must have an integer dtype, got torch.float32"),
        (torch.tensor([True]), "x must have an integer dtype, got torch.bool"),
        (torch.tensor([[0, 4]]), r"x\[0, 1\] is 4, outside the vocabulary \[0, 4\)"),
        (torch.tensor([1, -2]), r"x\[1\] is -2, outside the vocabulary \[0, 4\)"),
    ]
    for value, pattern in cases:
        with pytest.raises(InvalidArgument, match=pattern):
            check_tokens("x", value, 4)


def test_check_probs_on_expanded_input_does_not_materialise():
    row = torch.ones(1 << 15) / (1 << 15)
    check_probs("w", row.expand(1 << 16, 1 << 15))  # 2**31 logical elements: would need 8 GB
    bad = torch.ones(1, 4)
    with pytest.raises(InvalidArgument, match=r"w\[0\] sums to 4"):
        check_probs("w", bad.expand(3, 4))
