"""Speedup and latency models against closed forms (Leviathan et al. 2023, eq. 1 and Thm 3.8)."""

import math

import pytest

from specverify.core.errors import InvalidArgument
from specverify.measure.costmodel import (
    best_draft_length,
    expected_tokens_per_round,
    latency_per_token,
    speedup,
    target_pass_seconds,
)


@pytest.mark.parametrize("a", [0.0, 0.3, 0.8, 0.99])
@pytest.mark.parametrize("k", [1, 2, 4, 8])
def test_constant_rate_matches_leviathan_closed_form(a, k):
    closed = (1 - a ** (k + 1)) / (1 - a)
    assert expected_tokens_per_round(a, k) == pytest.approx(closed, rel=1e-12)
    assert speedup(a, k, 0.05) == pytest.approx(closed / (0.05 * k + 1), rel=1e-12)


def test_per_position_rates_multiply_along_the_block():
    assert expected_tokens_per_round([0.9, 0.5, 0.1], 3) == pytest.approx(1 + 0.9 + 0.45 + 0.045)
    # a sequence shorter than k is extended with its last rate
    assert expected_tokens_per_round([0.5], 3) == pytest.approx(expected_tokens_per_round(0.5, 3))


def test_perfect_drafter_emits_k_plus_one_and_useless_drafter_one():
    assert expected_tokens_per_round(1.0, 5) == 6
    assert expected_tokens_per_round(0.0, 5) == 1


def test_best_draft_length_is_argmax_of_the_curve():
    plan = best_draft_length(0.8, 0.05, max_k=16)
    assert plan.best_speedup == max(plan.speedups)
    assert plan.speedups[plan.best_k - 1] == plan.best_speedup
    assert 1 < plan.best_k < 16
    # a free drafter with perfect acceptance wants the longest block
    assert best_draft_length(1.0, 0.0, max_k=7).best_k == 7


def test_memory_bound_cost_of_an_8b_model_on_an_h100():
    assert target_pass_seconds(8e9) == pytest.approx(16e9 / 3.35e12)
    assert 4.7e-3 < target_pass_seconds(8e9) < 4.9e-3
    t = target_pass_seconds(8e9)
    assert latency_per_token(0.0, 4, 0.0, t) == pytest.approx(t)
    assert latency_per_token(0.8, 4, 0.05, t) == pytest.approx(t * (0.05 * 4 + 1) / expected_tokens_per_round(0.8, 4))


@pytest.mark.parametrize(
    "call",
    [
        lambda: expected_tokens_per_round(1.5, 2),
        lambda: expected_tokens_per_round([math.nan], 2),
        lambda: expected_tokens_per_round(0.5, 0),
        lambda: speedup(0.5, 2, -1.0),
        lambda: target_pass_seconds(0),
        lambda: latency_per_token(0.5, 2, 0.1, -1.0),
    ],
)
def test_bad_input_is_invalid_argument(call):
    with pytest.raises(InvalidArgument):
        call()
