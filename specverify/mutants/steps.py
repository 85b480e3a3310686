"""The chain verifier factored into small steps, with deliberately wrong variants of each.

Every verifier of the catalogue (``specverify.mutants.verifier``) is the composition
:func:`chain` of five steps, each a small pure function:

1. ``uniforms(block) -> (B, K)``: the acceptance uniforms;
2. ``accept(u, block) -> (B, K) bool``: the per-position acceptance decision;
3. ``count(accepted) -> (B,)``: the number of accepted drafts;
4. ``residual(target_row, draft_row) -> (B, V)`` / ``bonus(block) -> (B, V)``: the weights
   the last token is drawn from after a rejection / after K acceptances;
5. ``draw(weights, ...) -> (B,)``: how that token is drawn; then ``emitted(n, K)`` says
   how many tokens the row reports.

With the defaults, :func:`chain` reproduces :func:`reference.rules.verify` token for token
(same generator calls in the same order), so a mutant differs from the canonical rule
exactly in the step it overrides.  Randomness only comes from the ``generator`` inside
the block; everything is computed in float64 except where a step's point is a lower
precision.

References: Leviathan, Kalman & Matias (ICML 2023), Algorithm 1; Chen et al. (2023),
Algorithm 2; the bug catalogue in ``docs/bugs.md``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import NamedTuple

import numpy as np
import torch

from specverify.core.errors import InvalidArgument
from specverify.core.sampling import sample, uniform
from specverify.core.validation import check_generator, check_shape, check_tokens

__all__ = [
    "Block",
    "check_structure",
    "make_block",
    "chain",
    "iid_uniforms",
    "row_shared_uniforms",
    "batch_shared_uniforms",
    "zero_uniforms",
    "bf16_uniforms",
    "accept_ratio",
    "accept_ratio_le",
    "accept_inverted",
    "accept_pointmass",
    "accept_typical",
    "accept_ensemble",
    "accept_shifted_target",
    "first_always_accepted",
    "count_prefix",
    "count_total",
    "residual_clamped",
    "residual_softmax",
    "residual_target",
    "residual_over_overlap",
    "bonus_next",
    "bonus_same_row",
    "bonus_residual",
    "draw_exact",
    "draw_icdf_assume_normalised",
    "draw_overflow_to_first",
    "draw_bf16_cdf",
    "draw_exponential_race",
    "fp32_running_cdf",
    "draw_fp32_running_cdf",
    "draw_fp32_exponential_race",
    "FP32_EXPONENTIAL_FLOOR",
    "q_unscattered",
    "padding_unmasked",
    "same_block",
    "draw_with_accept_uniform",
    "draw_batch_shared",
    "emitted_next",
    "emitted_no_bonus",
    "emitted_plus_one",
    "emitted_drop_last",
]


class Block(NamedTuple):
    """One verification call's inputs in float64, with the drafted tokens' probabilities."""

    target: torch.Tensor  # (B, K+1, V) float64
    draft: torch.Tensor  # (B, K, V) float64
    tokens: torch.Tensor  # (B, K) long
    p_x: torch.Tensor  # (B, K) target probability of each drafted token
    q_x: torch.Tensor  # (B, K) draft probability of each drafted token
    generator: torch.Generator


def check_structure(target_probs, draft_probs, draft_tokens, generator) -> None:
    """Cheap protocol checks (shapes, dtypes, token range, generator); probability values are trusted.

    Mutants stand for engine kernels, which do not validate their inputs' values either;
    skipping the O(B K V) value scan keeps the catalogue fast on large batches.
    """
    check_generator("generator", generator)
    if not isinstance(target_probs, torch.Tensor) or target_probs.ndim != 3 or target_probs.shape[1] < 2:
        shape = tuple(target_probs.shape) if isinstance(target_probs, torch.Tensor) else type(target_probs).__name__
        raise InvalidArgument(f"target_probs must be a tensor of shape (B, K+1, V) with K >= 1, got {shape}")
    B, K1, V = target_probs.shape
    for name, t in (("target_probs", target_probs), ("draft_probs", draft_probs)):
        if not (isinstance(t, torch.Tensor) and t.is_floating_point()):
            raise InvalidArgument(f"{name} must be a floating tensor, got {getattr(t, 'dtype', type(t).__name__)}")
    check_shape("draft_probs", draft_probs, (B, K1 - 1, V))
    check_shape("draft_tokens", draft_tokens, (B, K1 - 1))
    check_tokens("draft_tokens", draft_tokens, V)


def make_block(target_probs, draft_probs, draft_tokens, generator) -> Block:
    """Check the protocol's structure (:func:`check_structure`) and gather what every step needs."""
    check_structure(target_probs, draft_probs, draft_tokens, generator)
    return _gathered(target_probs.double(), draft_probs.double(), draft_tokens.long(), generator)


def _gathered(target, draft, tokens, generator) -> Block:
    """A block of float64 laws (B, K+1, V), (B, K, V) and tokens (B, K), with p and q at the drafts."""
    K = tokens.shape[1]
    p_x = target[:, :K].gather(-1, tokens[..., None]).squeeze(-1)  # (B, K)
    q_x = draft.gather(-1, tokens[..., None]).squeeze(-1)  # (B, K)
    return Block(target, draft, tokens, p_x, q_x, generator)


def _rebuilt(blk: Block, target, draft) -> Block:
    """``blk`` with other laws (the drafted tokens' p and q read again)."""
    return _gathered(target, draft, blk.tokens, blk.generator)


def same_block(blk: Block) -> Block:
    """Canonical: the laws as the caller passed them."""
    return blk


# ---------------------------------------------------------------- 1. uniforms (B, K)


def iid_uniforms(blk: Block) -> torch.Tensor:
    """Canonical: one fresh float64 uniform per row and position."""
    return uniform(blk.tokens.shape, generator=blk.generator, device=blk.target.device)


def row_shared_uniforms(blk: Block) -> torch.Tensor:
    """Wrong: one uniform per row, reused at every position of the block."""
    B, K = blk.tokens.shape
    return uniform((B, 1), generator=blk.generator, device=blk.target.device).expand(B, K)


def batch_shared_uniforms(blk: Block) -> torch.Tensor:
    """Wrong: one uniform per position, reused by every row of the batch."""
    B, K = blk.tokens.shape
    return uniform((1, K), generator=blk.generator, device=blk.target.device).expand(B, K)


def zero_uniforms(blk: Block) -> torch.Tensor:
    """Wrong: u = 0, so every draft with p(x) > 0 is accepted."""
    return torch.zeros(blk.tokens.shape, dtype=torch.float64, device=blk.target.device)


def bf16_uniforms(blk: Block) -> torch.Tensor:
    """Wrong precision: uniforms drawn in bfloat16 (a grid of step 2**-8 in [0, 1), u = 0 w.p. 1/256)."""
    u = torch.rand(blk.tokens.shape, generator=blk.generator, dtype=torch.bfloat16, device=blk.target.device)
    return u.double()


# ---------------------------------------------------------------- 2. accept (B, K) bool


def accept_ratio(u, blk: Block) -> torch.Tensor:
    """Canonical: accept iff u q(x) < p(x)."""
    return u * blk.q_x < blk.p_x


def accept_ratio_le(u, blk: Block) -> torch.Tensor:
    """Accept iff u <= p(x) / q(x) (q(x) = 0 read as ratio +inf)."""
    ratio = torch.where(blk.q_x > 0, blk.p_x / blk.q_x.clamp_min(1e-300), torch.full_like(blk.q_x, math.inf))
    return u <= ratio


def accept_inverted(u, blk: Block) -> torch.Tensor:
    """Wrong: accept iff u < q(x) / p(x) (the ratio upside down)."""
    return u * blk.p_x < blk.q_x


def accept_pointmass(u, blk: Block) -> torch.Tensor:
    """Accept iff u < p(x), as if q were a point mass at x (correct only for a one-hot q)."""
    return u < blk.p_x


def accept_typical(eps: float = 0.09, delta: float = 0.3) -> Callable:
    """Medusa typical acceptance: accept iff p(x) > min(eps, delta exp(-H(p))); no uniform used."""

    def accept(u, blk: Block) -> torch.Tensor:
        K = blk.tokens.shape[1]
        p = blk.target[:, :K]  # (B, K, V)
        entropy = -(p * p.clamp_min(1e-300).log()).sum(-1)  # (B, K)
        threshold = torch.clamp(delta * torch.exp(-entropy), max=eps)  # (B, K)
        return blk.p_x > threshold

    return accept


def accept_ensemble(weight: float = 0.5) -> Callable:
    """Wrong: accept with min(1, 1 - w + w p/q), i.e. the canonical rule for the target w p + (1-w) q."""

    def accept(u, blk: Block) -> torch.Tensor:
        return u * blk.q_x < weight * blk.p_x + (1.0 - weight) * blk.q_x

    return accept


def accept_shifted_target(u, blk: Block) -> torch.Tensor:
    """Wrong (off by one): accept iff u q_i(x_i) < p_{i+1}(x_i), the target row one position late."""
    p_next = blk.target[:, 1:].gather(-1, blk.tokens[..., None]).squeeze(-1)  # (B, K)
    return u * blk.q_x < p_next


def first_always_accepted(rule: Callable) -> Callable:
    """Wrong: ``rule`` everywhere except the first draft, which is accepted unverified."""

    def accept(u, blk: Block) -> torch.Tensor:
        accepted = rule(u, blk).clone()
        accepted[:, 0] = True
        return accepted

    return accept


# ---------------------------------------------------------------- 3. count (B,)


def count_prefix(accepted: torch.Tensor) -> torch.Tensor:
    """Canonical: length of the accepted prefix (stop at the first rejection)."""
    return accepted.long().cumprod(-1).sum(-1)


def count_total(accepted: torch.Tensor) -> torch.Tensor:
    """Wrong: every acceptance counts, also after the first rejection."""
    return accepted.long().sum(-1)


# ---------------------------------------------------------------- 4. residual / bonus weights (B, V)


def residual_clamped(target_row, draft_row) -> torch.Tensor:
    """Canonical: (p - q)+, unnormalised."""
    return (target_row - draft_row).clamp_min(0.0)


def residual_softmax(target_row, draft_row) -> torch.Tensor:
    """Wrong: softmax((p - q)+), which puts mass exp(0) on every token, also where p <= q."""
    return torch.softmax((target_row - draft_row).clamp_min(0.0), dim=-1)


def residual_target(target_row, draft_row) -> torch.Tensor:
    """Wrong: the target row itself, not the residual."""
    return target_row


def residual_over_overlap(target_row, draft_row) -> torch.Tensor:
    """(p - q)+ divided by 1 - sum min(p, q): a normalised residual (in exact arithmetic)."""
    overlap = torch.minimum(target_row, draft_row).sum(-1, keepdim=True)  # (B, 1)
    return (target_row - draft_row).clamp_min(0.0) / (1.0 - overlap).clamp_min(1e-300)


def bonus_next(blk: Block) -> torch.Tensor:
    """Canonical: the bonus token comes from p_{K+1}."""
    return blk.target[:, -1]


def bonus_same_row(blk: Block) -> torch.Tensor:
    """Wrong: the bonus token comes from p_K, the last draft position's target row."""
    return blk.target[:, -2]


def bonus_residual(blk: Block) -> torch.Tensor:
    """Wrong: the bonus token comes from the residual (p_K - q_K)+ of the last draft position."""
    return (blk.target[:, -2] - blk.draft[:, -1]).clamp_min(0.0)


# ---------------------------------------------------------------- 5. draw (B,)


def draw_exact(weights, blk: Block, **_) -> torch.Tensor:
    """Canonical: exact inverse CDF scaled by each row's total (``specverify.core.sampling.sample``)."""
    return sample(weights, generator=blk.generator, check=False)


def _search(cdf, x, V) -> torch.Tensor:
    return torch.searchsorted(cdf, x, right=True).squeeze(-1).clamp(max=V - 1)


def draw_icdf_assume_normalised(weights, blk: Block, **_) -> torch.Tensor:
    """Inverse CDF that assumes the row sums to 1: u is not scaled by the total; overflow -> last index."""
    cdf = torch.cumsum(weights, -1, dtype=torch.float64)  # (B, V)
    u = uniform((weights.shape[0], 1), generator=blk.generator, device=weights.device)  # (B, 1)
    return _search(cdf, u, weights.shape[-1])


def draw_overflow_to_first(weights, blk: Block, **_) -> torch.Tensor:
    """Wrong: first index with cdf > u on an unnormalised cdf; ``argmax`` of an all-False row is 0."""
    cdf = torch.cumsum(weights, -1, dtype=torch.float64)  # (B, V)
    u = uniform((weights.shape[0], 1), generator=blk.generator, device=weights.device)  # (B, 1)
    return (cdf > u).int().argmax(-1)


def draw_bf16_cdf(weights, blk: Block, **_) -> torch.Tensor:
    """Wrong precision: normalise in float32, cumulative sum in bfloat16 (8-bit mantissa), float32 uniform.

    Near the top of the CDF the bfloat16 spacing is 2**-8, so a token of mass below ~2e-3
    can vanish (its CDF step rounds to 0) or be doubled, and the CDF may stop short of 1.
    """
    w = weights.float()
    w = w / w.sum(-1, keepdim=True)  # (B, V) float32
    cdf = torch.cumsum(w.bfloat16(), -1, dtype=torch.bfloat16).float()  # (B, V)
    u = torch.rand((weights.shape[0], 1), generator=blk.generator, dtype=torch.float32, device=weights.device)
    return _search(cdf, u, weights.shape[-1])


def q_unscattered(blk: Block) -> Block:
    """Wrong id space: the draft rows stay compact (their nonzero entries packed in id order, as a
    reduced draft vocabulary's logits are) while the drafts carry target ids: q is read at the
    wrong columns for the ratio and the residual (rtp-llm #1311, verl-SpeCo #67)."""
    draft = blk.draft  # (B, K, V)
    order = torch.argsort((draft <= 0).to(torch.int8), dim=-1, stable=True)  # nonzero ids first, in id order
    compact = draft.gather(-1, order)  # (B, K, V) q of the j-th draft-vocabulary id at column j
    return _rebuilt(blk, blk.target, compact)


def padding_unmasked(blk: Block, eps: float = 1e-4) -> Block:
    """Padding ids not masked: every id above the last id with target mass in any row of the call
    gets ``eps`` (a logit of 0 against the row's LSE), the target rows renormalised."""
    target = blk.target  # (B, K+1, V)
    live = (target > 0).flatten(0, -2).any(0)  # (V,)
    last = int(live.nonzero().max()) if bool(live.any()) else target.shape[-1] - 1
    pad = torch.zeros(target.shape[-1], dtype=target.dtype, device=target.device)
    pad[last + 1 :] = eps
    leaked = target + pad
    return _rebuilt(blk, leaked / leaked.sum(-1, keepdim=True), blk.draft)


def draw_exponential_race(weights, blk: Block, **_) -> torch.Tensor:
    """argmax_v w_v / E_v with E_v ~ Exp(1) i.i.d.: token v wins with probability w_v / sum w (vLLM V1)."""
    e = -torch.log1p(-uniform(weights.shape, generator=blk.generator, device=weights.device))  # (B, V) Exp(1)
    return (weights.double() / e).argmax(-1)


#: Smallest float32 Exp(1) draw of ``exponential_()`` on CUDA: 2^-24 (none below it in 2e8 draws, vLLM PR #43150).
FP32_EXPONENTIAL_FLOOR = 2.0**-24


def fp32_running_cdf(weights) -> torch.Tensor:
    """The CDF a float32 kernel builds: the row normalised in float64, rounded to float32, then
    summed left to right in float32 (one rounding per token).  (B, V) float64 holding float32 values.

    ``numpy``'s float32 ``cumsum`` is a sequential float32 sum on every CPU (``torch``'s CPU
    ``cumsum`` accumulates float32 in double, which is not the bug)."""
    total = torch.cumsum(weights.double(), -1)[..., -1:]  # (B, 1) sequential float64 sum
    probs32 = (weights.double() / total).float().cpu().numpy()  # (B, V) float32
    return torch.from_numpy(np.cumsum(probs32, axis=-1, dtype=np.float32).astype(np.float64)).to(weights.device)


def draw_fp32_running_cdf(weights, blk: Block, **_) -> torch.Tensor:
    """Wrong precision: inverse CDF over a float32 running sum (:func:`fp32_running_cdf`) against an
    unscaled float64 uniform; a sum that stops short of 1 (tail tokens below half a float32 spacing
    are absorbed) sends u past its end to the last id (SGLang PR #22643, TensorRT-LLM #19485)."""
    cdf = fp32_running_cdf(weights)  # (B, V)
    u = uniform((weights.shape[0], 1), generator=blk.generator, device=weights.device)  # (B, 1)
    return _search(cdf, u, weights.shape[-1])


def draw_fp32_exponential_race(weights, blk: Block, **_) -> torch.Tensor:
    """Wrong precision: the exponential race ``argmax(w / E)`` in float32, with float32 Exp(1) noise
    that never falls below 2^-24 (vLLM's ``q.exponential_()`` on CUDA, PRs #43150, #51367): a token
    of weight below ~2^-24 of the row's largest can no longer win."""
    e = (-torch.log1p(-uniform(weights.shape, generator=blk.generator, device=weights.device))).float()  # (B, V)
    return (weights.float() / e.clamp_min(FP32_EXPONENTIAL_FLOOR)).argmax(-1)


def draw_with_accept_uniform(weights, blk: Block, *, u, num_accepted, **_) -> torch.Tensor:
    """Wrong RNG use: the uniform of the last acceptance test (conditioned by it) drives the draw."""
    K = blk.tokens.shape[1]
    rows = torch.arange(weights.shape[0], device=weights.device)
    reused = u[rows, num_accepted.clamp(max=K - 1)][:, None]  # (B, 1)
    cdf = torch.cumsum(weights, -1, dtype=torch.float64)  # (B, V)
    total = cdf[:, -1:]
    x = torch.minimum(reused * total, torch.nextafter(total, torch.zeros_like(total)))  # (B, 1)
    return _search(cdf, x, weights.shape[-1])


def draw_batch_shared(weights, blk: Block, **_) -> torch.Tensor:
    """Wrong RNG use: one uniform for the whole batch (exact inverse CDF otherwise)."""
    cdf = torch.cumsum(weights, -1, dtype=torch.float64)  # (B, V)
    total = cdf[:, -1:]
    u = uniform((1, 1), generator=blk.generator, device=weights.device).expand_as(total)  # (B, 1)
    x = torch.minimum(u * total, torch.nextafter(total, torch.zeros_like(total)))  # (B, 1)
    return _search(cdf, x, weights.shape[-1])


# ---------------------------------------------------------------- emitted count (B,)


def emitted_next(n, K) -> torch.Tensor:
    """Canonical: the accepted drafts plus one residual or bonus token."""
    return n + 1


def emitted_no_bonus(n, K) -> torch.Tensor:
    """No bonus token: K tokens when all K drafts are accepted."""
    return torch.where(n == K, n, n + 1)


def emitted_plus_one(n, K) -> torch.Tensor:
    """Wrong: one token too many (the unverified draft, or filler, after the residual)."""
    return (n + 2).clamp(max=K + 1)


def emitted_drop_last(n, K) -> torch.Tensor:
    """Wrong: one token too few (the residual/bonus token is dropped unless nothing else was emitted)."""
    return n.clamp(min=1)


# ---------------------------------------------------------------- the composition


def chain(
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor,
    draft_tokens: torch.Tensor,
    *,
    generator: torch.Generator,
    uniforms: Callable = iid_uniforms,
    accept: Callable = accept_ratio,
    count: Callable = count_prefix,
    residual: Callable = residual_clamped,
    residual_offset: int = 0,
    bonus: Callable = bonus_next,
    draw: Callable = draw_exact,
    emitted: Callable = emitted_next,
    mix_rows: bool = False,
    block: Callable = same_block,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Chain verification assembled from the given steps (defaults: the canonical rule).

    ``residual_offset`` = 1 takes the residual's target row one position late (p_{i+1}
    instead of p_i); ``mix_rows`` writes each row's last token into the next row; ``block``
    rewrites the laws before anything reads them (an id-space or masking mistake).
    Returns ``(tokens (B, K+1) long, num_emitted (B,) long)`` as the verifier protocol says.
    """
    blk = block(make_block(target_probs, draft_probs, draft_tokens, generator))
    B, K = blk.tokens.shape
    rows = torch.arange(B, device=blk.target.device)  # (B,)
    u = uniforms(blk)  # (B, K)
    num_accepted = count(accept(u, blk))  # (B,)

    rejected = (num_accepted < K)[:, None]  # (B, 1)
    position = num_accepted.clamp(max=K - 1)  # (B,) the rejected position (or K-1)
    target_row = blk.target[rows, (num_accepted + residual_offset).clamp(max=K)]  # (B, V)
    draft_row = blk.draft[rows, position]  # (B, V)
    bonus_row = bonus(blk)  # (B, V)
    weights = torch.where(rejected, residual(target_row, draft_row), bonus_row)  # (B, V)
    # A residual of mass 0 (possible only through rounding or a dishonest drafter): fall
    # back to the target row, as the reference does.
    empty = ~(weights.sum(-1, keepdim=True) > 0)  # (B, 1)
    weights = torch.where(empty, torch.where(rejected, target_row, bonus_row), weights)  # (B, V)
    last = draw(weights, blk, u=u, num_accepted=num_accepted)  # (B,)
    if mix_rows:
        last = last.roll(1, dims=0)

    tokens = torch.cat([blk.tokens, torch.zeros_like(blk.tokens[:, :1])], dim=1)  # (B, K+1)
    tokens[rows, num_accepted] = last
    return tokens, emitted(num_accepted, K)
