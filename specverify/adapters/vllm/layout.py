"""Engine-free conversions between the verifier protocol's (B, K) layout and vLLM's ragged one.

vLLM's V1 rejection sampler (``vllm/v1/sample/rejection_sampler.py``) takes the drafts
of a whole scheduler step flattened over requests ("ragged"), not as a (B, K) block:

* ``num_draft_tokens``: a Python list, drafts per request (may differ between requests);
* ``cu_num_draft_tokens`` (B,) int32: inclusive cumulative sum of ``num_draft_tokens``;
* ``draft_token_ids`` (T,) int32 with ``T = sum(num_draft_tokens)``, request after request;
* ``draft_probs`` (T, V) float32, or None for point-mass drafts (ngram, greedy draft models);
* target rows (T, V): the target's row *at* each draft position (``rejection_sample``
  takes them as ``target_logits``); the bonus rows (B, V) come separately;
* ``RejectionSampler.forward`` instead takes all ``T + B`` logits rows of the step in the
  model runner's order -- each request's draft-position rows followed by its bonus row --
  plus ``target_logits_indices`` (T,) and ``bonus_logits_indices`` (B,) into them and
  ``cu_num_sampled_tokens`` (B,) = cumsum(num_draft_tokens + 1);
* output ``output_token_ids`` (B, max_spec_len + 1) int32: the emitted tokens of each
  request left-aligned, every other entry ``PLACEHOLDER_TOKEN_ID = -1``.

These functions need only torch, so they run (and are tested) without vLLM.  Shapes:
B requests, K drafts per request (the protocol's block), V vocabulary, T flattened drafts.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from specverify.core.errors import ImplementationError, InvalidArgument
from specverify.core.validation import check_shape

__all__ = [
    "PLACEHOLDER_TOKEN_ID",
    "RaggedDrafts",
    "SpecIndices",
    "to_ragged",
    "spec_decode_indices",
    "engine_logits",
    "probs_to_logits",
    "from_output_token_ids",
    "expand_to_tokens",
]

#: vLLM's marker for "no token here" in ``output_token_ids`` (``rejection_sampler.PLACEHOLDER_TOKEN_ID``).
PLACEHOLDER_TOKEN_ID = -1


class RaggedDrafts(NamedTuple):
    """One verification step in ``rejection_sample``'s flattened layout."""

    num_draft_tokens: list[int]  # B Python ints
    cu_num_draft_tokens: torch.Tensor  # (B,) int32, inclusive cumsum
    draft_token_ids: torch.Tensor  # (T,) int32
    draft_probs: torch.Tensor | None  # (T, V) or None
    target_rows: torch.Tensor  # (T, V): the target row at each draft position
    bonus_rows: torch.Tensor  # (B, V): the target row after each request's last draft


class SpecIndices(NamedTuple):
    """The index tensors of vLLM's ``SpecDecodeMetadata`` for rows laid out by :func:`engine_logits`."""

    cu_num_draft_tokens: torch.Tensor  # (B,) int32
    cu_num_sampled_tokens: torch.Tensor  # (B,) int32, cumsum(num_draft_tokens + 1)
    target_logits_indices: torch.Tensor  # (T,) int32
    bonus_logits_indices: torch.Tensor  # (B,) int32
    logits_indices: torch.Tensor  # (T + B,) int32: every row, in order


def _check_num_draft_tokens(num_draft_tokens, B: int, K: int) -> list[int]:
    if num_draft_tokens is None:
        return [K] * B
    counts = [int(n) for n in num_draft_tokens]
    if len(counts) != B:
        raise InvalidArgument(f"num_draft_tokens must have one entry per request (B={B}), got {len(counts)}")
    bad = [n for n in counts if not 0 <= n <= K]
    if bad:
        raise InvalidArgument(f"num_draft_tokens entries must lie in [0, K={K}], got {bad[0]}")
    return counts


def _keep_mask(counts: list[int], K: int, device) -> torch.Tensor:
    """(B, K) bool: position i of request b is a real draft (i < counts[b])."""
    n = torch.tensor(counts, dtype=torch.long, device=device)  # (B,)
    return torch.arange(K, device=device)[None, :] < n[:, None]  # (B, K)


def to_ragged(target_probs, draft_probs, draft_tokens, *, num_draft_tokens=None, point_mass: bool = False):
    """Flatten a protocol batch into :class:`RaggedDrafts`.

    Parameters
    ----------
    target_probs : Tensor, shape (B, K+1, V)
    draft_probs : Tensor, shape (B, K, V)
    draft_tokens : Tensor, shape (B, K), integer
    num_draft_tokens : sequence of B ints in [0, K], optional
        Keep only the first ``num_draft_tokens[b]`` drafts of request ``b`` (vLLM's
        ragged batches); default K for every request.  The bonus row of request ``b``
        is then ``target_probs[b, num_draft_tokens[b]]``.
    point_mass : bool
        Return ``draft_probs=None`` (vLLM's convention for drafts without a law).

    Returns
    -------
    RaggedDrafts
        Draft ids int32, index tensors int32; probability rows keep their dtype.
    """
    check_shape("target_probs", target_probs, (None, None, None))
    B, K1, V = target_probs.shape
    if K1 < 2:
        raise InvalidArgument(f"target_probs must have shape (B, K+1, V) with K >= 1, got {tuple(target_probs.shape)}")
    K = K1 - 1
    check_shape("draft_probs", draft_probs, (B, K, V))
    check_shape("draft_tokens", draft_tokens, (B, K))
    if draft_tokens.dtype.is_floating_point or draft_tokens.dtype == torch.bool:
        raise InvalidArgument(f"draft_tokens must be an integer tensor, got dtype {draft_tokens.dtype}")
    counts = _check_num_draft_tokens(num_draft_tokens, B, K)
    device = target_probs.device
    keep = _keep_mask(counts, K, device)  # (B, K)
    n = torch.tensor(counts, dtype=torch.long, device=device)  # (B,)
    cu = torch.cumsum(n, 0).to(torch.int32)  # (B,)
    ids = draft_tokens.to(device)[keep].to(torch.int32).contiguous()  # (T,)
    probs = None if point_mass else draft_probs.to(device)[keep].contiguous()  # (T, V)
    target_rows = target_probs[:, :K][keep].contiguous()  # (T, V)
    bonus_rows = target_probs[torch.arange(B, device=device), n].contiguous()  # (B, V)
    return RaggedDrafts(counts, cu, ids, probs, target_rows, bonus_rows)


def spec_decode_indices(num_draft_tokens, *, device=None) -> SpecIndices:
    """Index tensors for logits rows laid out request by request: drafts' rows, then the bonus row.

    ``num_draft_tokens = [3, 0, 2]`` gives ``cu_num_draft_tokens = [3, 3, 5]``,
    ``cu_num_sampled_tokens = [4, 5, 8]``, ``target_logits_indices = [0, 1, 2, 5, 6]``,
    ``bonus_logits_indices = [3, 4, 7]`` (the model runner's ``_calc_spec_decode_metadata``
    for a pure decode step).
    """
    counts = [int(c) for c in num_draft_tokens]
    if not counts or any(c < 0 for c in counts):
        raise InvalidArgument(f"num_draft_tokens must be a non-empty list of ints >= 0, got {list(num_draft_tokens)}")
    n = torch.tensor(counts, dtype=torch.long, device=device)  # (B,)
    cu_draft = torch.cumsum(n, 0)  # (B,)
    cu_sampled = torch.cumsum(n + 1, 0)  # (B,)
    starts = cu_sampled - (n + 1)  # (B,) first row of each request
    offsets = torch.arange(int(cu_draft[-1]), device=device) - torch.repeat_interleave(cu_draft - n, n)  # (T,)
    target_idx = torch.repeat_interleave(starts, n) + offsets  # (T,)
    bonus_idx = cu_sampled - 1  # (B,)
    i32 = torch.int32
    return SpecIndices(
        cu_draft.to(i32),
        cu_sampled.to(i32),
        target_idx.to(i32),
        bonus_idx.to(i32),
        torch.arange(int(cu_sampled[-1]), device=device, dtype=i32),
    )


def probs_to_logits(probs: torch.Tensor, *, temperature: float = 1.0, dtype=torch.float32) -> torch.Tensor:
    """Logits whose temperature-``temperature`` softmax is ``probs``: ``temperature * log(probs)``.

    ``log 0 = -inf`` softmaxes back to exactly 0; the logarithm is taken in float64 and
    the result cast to ``dtype`` (float32: the dtype vLLM's samplers compute in).
    """
    if not (temperature > 0.0 and temperature < float("inf")):
        raise InvalidArgument(f"temperature must be a positive finite float, got {temperature!r}")
    return (probs.double().log() * float(temperature)).to(dtype)


def engine_logits(ragged: RaggedDrafts, *, temperature: float = 1.0, dtype=torch.float32) -> torch.Tensor:
    """All ``T + B`` logits rows of the step in the model runner's order (see :func:`spec_decode_indices`).

    Returns
    -------
    Tensor, shape (T + B, V)
        Request by request: its draft positions' rows then its bonus row, each
        ``temperature * log p`` so that vLLM's division by the temperature restores ``log p``.
    """
    idx = spec_decode_indices(ragged.num_draft_tokens, device=ragged.target_rows.device)
    V = ragged.target_rows.shape[-1]
    rows = torch.empty((int(idx.cu_num_sampled_tokens[-1]), V), dtype=dtype, device=ragged.target_rows.device)
    rows[idx.target_logits_indices.long()] = probs_to_logits(ragged.target_rows, temperature=temperature, dtype=dtype)
    rows[idx.bonus_logits_indices.long()] = probs_to_logits(ragged.bonus_rows, temperature=temperature, dtype=dtype)
    return rows  # (T + B, V)


def from_output_token_ids(output_token_ids, *, num_draft_tokens=None, engine: str = "vLLM"):
    """vLLM's ``output_token_ids`` (B, max_spec_len + 1) back to the protocol's ``(tokens, num_emitted)``.

    Parameters
    ----------
    output_token_ids : Tensor, shape (B, S), integer
        Emitted tokens left-aligned, then ``PLACEHOLDER_TOKEN_ID`` (-1).
    num_draft_tokens : sequence of B ints, optional
        Drafts per request; a request may emit at most ``num_draft_tokens[b] + 1`` tokens.
    engine : str
        Named in error messages.

    Returns
    -------
    tokens : Tensor, shape (B, S), long
        The emitted tokens, 0 past ``num_emitted`` (values are not range-checked here:
        the harness reports out-of-vocabulary tokens itself).
    num_emitted : Tensor, shape (B,), long

    Raises
    ------
    ImplementationError
        A row with no token, a token after a placeholder, a negative token other than the
        placeholder, or more tokens than drafts + 1.
    """
    check_shape("output_token_ids", output_token_ids, (None, None))
    out = output_token_ids.to(torch.long)  # (B, S)
    B, S = out.shape
    valid = out != PLACEHOLDER_TOKEN_ID  # (B, S)
    num = valid.sum(-1)  # (B,)
    prefix = torch.arange(S, device=out.device)[None, :] < num[:, None]  # (B, S)
    bad_rows = (valid != prefix).any(-1) | (num == 0) | ((out < 0) & valid).any(-1)  # (B,)
    if num_draft_tokens is not None:
        limit = torch.tensor([int(n) + 1 for n in num_draft_tokens], device=out.device)  # (B,)
        bad_rows |= num > limit
    if bool(bad_rows.any()):
        b = int(bad_rows.nonzero()[0, 0])
        raise ImplementationError(
            f"{engine} returned output_token_ids row {b} = {out[b].tolist()}: expected 1 .. drafts + 1 tokens >= 0 "
            f"followed only by the placeholder {PLACEHOLDER_TOKEN_ID}",
            row=b,
        )
    return torch.where(valid, out, torch.zeros_like(out)), num


def expand_to_tokens(x: torch.Tensor, cu_num_tokens: torch.Tensor, num_tokens: int, replace_from=0, replace_to=0):
    """Per-request values repeated over each request's tokens, ``replace_from`` replaced by ``replace_to``.

    The semantics of vLLM's ``expand_batch_to_tokens`` (``x = [a, b, c]``, ``cu_num_tokens =
    [2, 5, 6]`` gives ``[a, a, b, b, b, c]``), in the dtype of ``x``; used by the forward
    adapter's ``patch_expand`` diagnostic.

    Returns
    -------
    Tensor, shape (num_tokens,)
    """
    check_shape("x", x, (None,))
    check_shape("cu_num_tokens", cu_num_tokens, (x.shape[0],))
    cu = cu_num_tokens.to(torch.long)  # (B,)
    counts = torch.diff(cu, prepend=cu.new_zeros(1))  # (B,)
    if bool((counts < 0).any()) or int(cu[-1]) != int(num_tokens):
        raise InvalidArgument(
            f"cu_num_tokens must be non-decreasing and end at num_tokens={num_tokens}, got {cu.tolist()}"
        )
    values = torch.where(x == replace_from, torch.full_like(x, replace_to), x)  # (B,)
    return torch.repeat_interleave(values, counts.to(x.device))  # (num_tokens,)
