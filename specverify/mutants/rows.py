"""Row-layout entries of the catalogue: bugs that live between the rows of one verify call.

Kernels process a batch in tiles and index their random streams, scratch buffers and
outputs by row; an index computed the wrong way leaves each row's marginal law exact (or
nearly) and makes rows dependent, or breaks only some batch sizes.  Each mutant is the
canonical rule (:func:`specverify.mutants.steps.chain`'s steps, float64) with one row-level
mistake; the two correct variants reorganise the rows without changing the law.

Mutants:

* ``tile_wrapped_rng`` -- a row's random offset is its index modulo a 64-row tile: rows 64
  apart draw the same acceptance uniforms and the same residual/bonus uniform;
* ``neighbour_scratch`` -- the uniform of the residual/bonus draw lives in a per-pair
  scratch slot and the odd row reads its even neighbour's (acceptance coins are its own);
* ``rejection_index_wrong_row`` -- in each 32-row tile the number of accepted drafts of the
  tile's first row is written into every row of the tile (flash-attention PR #2779's
  class: one row's rejection index in other rows);
* ``batch_over_64`` -- in a call of more than 64 rows, rows 64.. take their first draft
  unverified (OpenVINO GenAI's first token goes wrong only when more than 64 requests share
  a batch).

Correct variants: ``permuted_rows`` (every random number drawn for the rows in a random
order) and ``tiled_rows`` (64-row tiles, each with its own generator seeded from the call's
generator, declared through ``block_size = 64``).
"""

from __future__ import annotations

import torch

from specverify.core.sampling import uniform
from specverify.mutants import steps as S
from specverify.mutants.entry import CatalogueEntry
from specverify_reference.rules import verify as reference_verify

__all__ = ["ENTRIES", "TILE"]

#: Rows per tile of the tiled mutants and of ``tiled_rows``.
TILE = 64


def _icdf(weights: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Inverse CDF of each row of ``weights`` (B, V) at the uniform ``v`` (B,), scaled by the row's total."""
    cdf = torch.cumsum(weights.double(), -1)  # (B, V)
    total = cdf[:, -1:]  # (B, 1)
    x = torch.minimum(v[:, None] * total, torch.nextafter(total, torch.zeros_like(total)))  # (B, 1)
    return torch.searchsorted(cdf, x, right=True).squeeze(-1).clamp(max=weights.shape[-1] - 1)


def _rule(blk: S.Block, u: torch.Tensor, v: torch.Tensor, accepted_count=None):
    """The canonical rule on given acceptance uniforms u (B, K) and draw uniforms v (B,).

    ``accepted_count(n) -> n'`` rewrites the number of accepted drafts before the draw.
    """
    B, K = blk.tokens.shape
    rows = torch.arange(B, device=blk.target.device)  # (B,)
    n = S.count_prefix(S.accept_ratio(u, blk))  # (B,)
    if accepted_count is not None:
        n = accepted_count(n)
    rejected = (n < K)[:, None]  # (B, 1)
    target_row = blk.target[rows, n]  # (B, V)
    residual = S.residual_clamped(target_row, blk.draft[rows, n.clamp(max=K - 1)])  # (B, V)
    weights = torch.where(rejected, residual, target_row)  # (B, V) the bonus row is p_{K+1} = target[K]
    weights = torch.where(weights.sum(-1, keepdim=True) > 0, weights, target_row)  # (B, V)
    tokens = torch.cat([blk.tokens, torch.zeros_like(blk.tokens[:, :1])], dim=1)  # (B, K+1)
    tokens[rows, n] = _icdf(weights, v)
    return tokens, n + 1


def _fresh(blk: S.Block, rows: int):
    """Acceptance uniforms (rows, K) and draw uniforms (rows,) from the call's generator."""
    K = blk.tokens.shape[1]
    u = uniform((rows, K), generator=blk.generator, device=blk.target.device)
    v = uniform((rows,), generator=blk.generator, device=blk.target.device)
    return u, v


def tile_wrapped_rng(target_probs, draft_probs, draft_tokens, *, generator):
    """Random numbers indexed by row modulo 64: rows 64 apart share every uniform."""
    blk = S.make_block(target_probs, draft_probs, draft_tokens, generator)
    B = blk.tokens.shape[0]
    u, v = _fresh(blk, min(B, TILE))
    wrap = torch.arange(B, device=u.device) % TILE  # (B,)
    return _rule(blk, u[wrap], v[wrap])


def neighbour_scratch(target_probs, draft_probs, draft_tokens, *, generator):
    """The odd row of each pair reads its even neighbour's draw uniform; acceptance coins are per row."""
    blk = S.make_block(target_probs, draft_probs, draft_tokens, generator)
    u, v = _fresh(blk, blk.tokens.shape[0])
    return _rule(blk, u, v[torch.arange(v.shape[0], device=v.device) & ~1])


def rejection_index_wrong_row(target_probs, draft_probs, draft_tokens, *, generator):
    """Every row of a 32-row tile gets the number of accepted drafts of the tile's first row."""
    blk = S.make_block(target_probs, draft_probs, draft_tokens, generator)
    u, v = _fresh(blk, blk.tokens.shape[0])
    lead = torch.arange(v.shape[0], device=v.device) // 32 * 32  # (B,) the tile's first row
    return _rule(blk, u, v, accepted_count=lambda n: n[lead])


def batch_over_64(target_probs, draft_probs, draft_tokens, *, generator):
    """In a call of more than 64 rows, rows 64.. accept their first draft without a test."""
    blk = S.make_block(target_probs, draft_probs, draft_tokens, generator)
    B = blk.tokens.shape[0]
    u, v = _fresh(blk, B)
    if B > TILE:
        u = u.clone()
        u[TILE:, 0] = 0.0  # u = 0 accepts any draft with p(x) > 0
    return _rule(blk, u, v)


def permuted_rows(target_probs, draft_probs, draft_tokens, *, generator):
    """Correct: the uniforms are drawn for the rows in a random order (a permutation from the generator)."""
    blk = S.make_block(target_probs, draft_probs, draft_tokens, generator)
    B = blk.tokens.shape[0]
    order = torch.randperm(B, generator=generator, device=blk.target.device)  # (B,)
    u, v = _fresh(blk, B)
    return _rule(blk, u[order], v[order])


def tiled_rows(target_probs, draft_probs, draft_tokens, *, generator):
    """Correct: 64-row tiles verified by the reference rule, each with a generator seeded from the call's."""
    S.check_structure(target_probs, draft_probs, draft_tokens, generator)
    B = draft_tokens.shape[0]
    seeds = torch.randint(0, 2**62, ((B + TILE - 1) // TILE,), generator=generator, device=generator.device)
    tokens, emitted = [], []
    for i, lo in enumerate(range(0, B, TILE)):
        tile_gen = torch.Generator(device=generator.device).manual_seed(int(seeds[i]))
        t, n = reference_verify(
            target_probs[lo : lo + TILE], draft_probs[lo : lo + TILE], draft_tokens[lo : lo + TILE],
            generator=tile_gen, check=False,
        )  # fmt: skip
        tokens.append(t)
        emitted.append(n)
    return torch.cat(tokens), torch.cat(emitted)


tiled_rows.block_size = TILE  # type: ignore[attr-defined]

_M = CatalogueEntry
_ROWS = "specverify (row-layout class)"

# fmt: off
ENTRIES: tuple[CatalogueEntry, ...] = (
    _M("tile_wrapped_rng", "verifier", tile_wrapped_rng,
       "a row's random offset is its index modulo a 64-row tile: rows 64 apart share every uniform (marginals exact)",
       _ROWS + ": a Philox offset computed from the row index modulo the tile size",
       "B > 64 and a pair test at offset 64 (first and bonus tokens of rows 64 apart)"),
    _M("neighbour_scratch", "verifier", neighbour_scratch,
       "the odd row of each pair reads its even neighbour's draw uniform from scratch (marginals exact)",
       _ROWS + ": a per-block scratch value read by the wrong row",
       "B >= 2 and a pair test of adjacent rows (both rejected, or both emitting a bonus)"),
    _M("rejection_index_wrong_row", "verifier", rejection_index_wrong_row,
       "every row of a 32-row tile gets the accepted count of the tile's first row",
       "flash-attention PR #2779 (one row's rejection index written into other rows)",
       "B > 1, rows rejecting at different positions"),
    _M("batch_over_64", "verifier", batch_over_64,
       "in a call of more than 64 rows, rows 64.. take the first draft unverified",
       "OpenVINO GenAI (first token wrong only when more than 64 requests share a batch; found by a "
       "hand-written repro)", "a call of more than 64 rows"),
    _M("permuted_rows", "equivalent", permuted_rows,
       "every uniform drawn for the rows in a random order (a permutation from the generator)",
       "correct variant of the row-layout class"),
    _M("tiled_rows", "equivalent", tiled_rows,
       "64-row tiles verified by the reference rule, each tile with its own generator seeded from the call's "
       "(declares block_size = 64)", "correct variant of the row-layout class"),
)
# fmt: on
