"""The large-vocabulary precision mutants: their mechanism and their validated effect.

``residual_fp32_running_cdf`` and ``residual_fp32_exponential`` change the law by less than the
smoke tier can detect on real-vocabulary rows; their catalogue entries state the effect and the
tokens the battery needs (``CatalogueEntry.tokens_to_detect``).  Here: each mechanism on a law
built to show it, the exact effect of the float32 running sum on the witness scenario's rows, and
(slow) a direct large-sample test of the float32 exponential race on the witness's bonus row.
"""

from __future__ import annotations

import math

import pytest
import torch

from specverify.mutants import by_name
from specverify.mutants import steps as S
from specverify.selftest.verifiers import BELOW_TIER, _expected
from specverify.verifier.scenarios import get_scenarios

WITNESS = "pos151936_lm_padding_leak_k2"


def _block(rows: int, seed: int) -> S.Block:
    """A block whose only use here is its generator (the draws read ``weights`` directly)."""
    g = torch.Generator().manual_seed(seed)
    empty = torch.zeros(rows, 1, dtype=torch.long)
    return S.Block(torch.zeros(rows, 2, 1), torch.zeros(rows, 1, 1), empty, empty, empty, g)


def fp32_cdf_law(weights: torch.Tensor) -> torch.Tensor:
    """The exact law of :func:`steps.draw_fp32_running_cdf` for one row (V,): the steps of the float32
    running CDF (capped at 1), plus what u in [0, 1) finds past its end, on the last id."""
    cdf = S.fp32_running_cdf(weights[None])[0].clamp(max=1.0)  # (V,)
    law = torch.diff(cdf, prepend=torch.zeros(1, dtype=torch.float64))
    law[-1] += 1.0 - cdf[-1]
    return law


def test_fp32_running_cdf_absorbs_the_tail_and_overflows_to_the_last_id():
    # a dominant token, then 2^17 tokens of 2.5e-8 each: every one is below half the float32 spacing
    # near 1 (2^-25 = 2.98e-8), so the float32 sum never moves past the head and u > 0.9967 lands on
    # the last id
    V = 1 + (1 << 17)
    weights = torch.full((V,), 2.5e-8, dtype=torch.float64)
    weights[0] = 1.0
    target = weights / weights.sum()
    law = fp32_cdf_law(weights)
    assert law[1:-1].sum() == 0.0  # the whole tail but its last id is never drawn
    assert law[-1].item() == pytest.approx(1 - target[0].item(), rel=1e-4)  # 3.3e-3 on one id
    n, rows, hits = 4000, 250, 0
    blk = _block(rows, 1)
    for _ in range(n // rows):
        drawn = S.draw_fp32_running_cdf(weights.expand(rows, V), blk)  # (rows,)
        hits += int((drawn == V - 1).sum())
        assert not bool(((drawn > 0) & (drawn < V - 1)).any())
    # Binomial(4000, 3.3e-3): mean 13; the exact law puts 2.5e-8 there (P(hits >= 4) < 1e-12)
    assert 4 <= hits <= 35


def test_fp32_running_cdf_effect_on_the_witness_rows():
    """The effect stated in the catalogue: exact, from the rows themselves (no sampling)."""
    (scenario,) = get_scenarios([WITNESS])
    target, drafter = scenario.build()
    p, q = target.table, drafter.table  # (3, V)
    bonus = p[scenario.k]
    tv_bonus = 0.5 * (fp32_cdf_law(bonus) - bonus / bonus.sum()).abs().sum().item()
    residual = (p[0] - q[0]).clamp_min(0.0)
    tv_residual = 0.5 * (fp32_cdf_law(residual) - residual / residual.sum()).abs().sum().item()
    assert 5e-4 < tv_bonus < 1e-3  # the bonus row's long tail (tokens down to 4.6e-8)
    assert tv_residual < 1e-6  # the residual rows hold the head and no deep tail
    entry = by_name("residual_fp32_running_cdf")
    assert f"{tv_bonus:.1e}" in entry.effect


def floored_race_loss(weights: torch.Tensor, floor: float = S.FP32_EXPONENTIAL_FLOOR) -> torch.Tensor:
    """First-order loss of each token (V,) under the floored race: P(E_v < floor, v would win, v
    does not win floored) = int_0^floor [G(w_v / x) - G(w_v / floor)] dx with G(s) = exp(-(W - w_v) / s)
    the law of the best other score (second-order terms: two floored tokens, e^-x != 1)."""
    w = weights / weights.sum()
    a = (1.0 - w) / w.clamp_min(1e-300)
    return torch.where(w > 0, -torch.expm1(-a * floor) / a - floor * torch.exp(-a * floor), torch.zeros_like(w))


def test_fp32_exponential_race_never_draws_a_tail_far_below_the_floor():
    # vLLM PR #43150's law: a dominant token and a tail at logit gap 20.5; the tail can win only if the
    # dominant's Exp(1) exceeds e^20.5 / 2^24 = 47.5 (probability e^-47.5)
    V = 1 + 4096
    weights = torch.full((V,), math.exp(-20.5), dtype=torch.float64)
    weights[0] = 1.0
    loss = floored_race_loss(weights)
    tail = weights[1:].sum() / weights.sum()
    assert loss[1:].sum().item() == pytest.approx(tail.item(), rel=1e-6)  # the whole tail is lost
    # and a token well above the floor keeps its mass (loss ~ floor^2 / (2 w))
    assert floored_race_loss(torch.tensor([0.5, 0.5], dtype=torch.float64)).max().item() < 1e-14


def test_below_tier_mutants_are_expected_only_where_the_run_is_large_enough():
    entry = by_name("residual_fp32_exponential")
    assert entry.tokens_to_detect > 0 and entry.effect
    assert _expected(entry, entry.tokens_to_detect) == BELOW_TIER  # a lower bound: not killed at this size
    assert _expected(entry, entry.tokens_to_detect + 1) == "fail"
    assert _expected(by_name("residual_is_p"), 1) == "fail"
    assert _expected(by_name("canonical"), 10**9) == "pass"


def test_fp32_exponential_race_effect_on_the_witness_bonus_row():
    """The effect stated in the catalogue, from the first-order loss (no sampling): the tokens below
    the floor hold m_A of the bonus row and the race loses TV = the summed loss, to the head."""
    (scenario,) = get_scenarios([WITNESS])
    target, _ = scenario.build()
    row = target.table[scenario.k]  # (V,)
    w = row / row.sum()
    m_a = w[(w > 0) & (w < S.FP32_EXPONENTIAL_FLOOR)].sum().item()
    tv = floored_race_loss(row).sum().item()
    assert 1e-3 < tv < m_a + tv  # tokens above the floor lose too: none is far below it
    effect = by_name("residual_fp32_exponential").effect
    assert f"{m_a:.1e}" in effect and f"TV {tv:.1e}" in effect


@pytest.mark.slow
def test_fp32_exponential_race_matches_the_first_order_loss_at_the_floor():
    """Direct large-sample test of the loss formula where the loss is partial: a dominant token and
    2^17 tail tokens of normalised weight 2^-25 (half the floor, a f = 2): each keeps 3 e^-2 = 40.6%
    of its mass; the tail holds 3.9e-3, so 16,000 draws expect 62.5 tail hits under
    the exact law and 25.4 under the mutant."""
    tail, n, rows = 1 << 17, 16_000, 500
    half_floor = S.FP32_EXPONENTIAL_FLOOR / 2
    weights = torch.full((1 + tail,), half_floor / (1 - tail * half_floor), dtype=torch.float64)
    weights[0] = 1.0  # (V,): normalised, each tail token is exactly half the floor
    w = weights / weights.sum()
    m_a = w[1:].sum().item()
    kept = m_a - floored_race_loss(weights)[1:].sum().item()
    assert kept / m_a == pytest.approx(3 * math.exp(-2), rel=1e-4)
    hits, blk = 0, _block(rows, 7)
    for _ in range(n // rows):
        drawn = S.draw_fp32_exponential_race(weights.expand(rows, -1), blk)  # (rows,)
        hits += int((drawn > 0).sum())
    # far from the exact law, within Poisson noise of the formula
    assert hits < n * m_a - 3 * math.sqrt(n * m_a)
    assert abs(hits - n * kept) <= 3 * math.sqrt(n * kept) + 1
