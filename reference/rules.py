"""The canonical chain verifier of speculative sampling, and greedy verification.

Leviathan, Kalman & Matias, "Fast Inference from Transformers via Speculative
Decoding" (ICML 2023), Algorithm 1; Chen et al., "Accelerating Large Language
Model Decoding with Speculative Sampling" (2023), Algorithm 2.

For each row b and draft position i = 1..K (x_i ~ q_i drafted, u_i ~ U[0, 1)):

* accept x_i iff ``u_i * q_i(x_i) < p_i(x_i)``  (the ratio min(1, p/q) without a
  division, so q(x) = 0 never divides and p(x) = 0 always rejects);
* at the first rejection emit one token from the residual
  ``r_i = (p_i - q_i)+ / sum (p_i - q_i)+`` and stop;
* when all K drafts are accepted emit a bonus token from ``p_{K+1}``.

The emitted token at every position is then distributed exactly as p, for any q.

Corners, handled explicitly:

* p == q: every draft is accepted (u q < q for u < 1), so the residual, whose
  mass is 0, is never used;
* residual mass 0 after a rejection can only come from a drafted token outside
  q's support (a dishonest drafter) or from float rounding; the row then falls
  back to sampling p itself, which is the law the residual would represent;
* one-hot p (temperature 0) and V = 1 need no special code.

Shapes: B batch rows, K draft tokens, V vocabulary.
"""

from __future__ import annotations

import torch

from specverify.core.errors import InvalidArgument
from specverify.core.rowsums import sum_block, sum_margin, within_margin
from specverify.core.sampling import chunk_rows, inverse_cdf, search_cdf, uniform
from specverify.core.validation import PROB_ATOL, check_generator, check_probs, check_shape, check_tokens

__all__ = ["verify", "greedy_verify", "residual_weights", "check_verifier_inputs"]

#: Elements of the two probability tensors read per chunk by the one-pass input check of
#: :func:`_checked_drafted_probs` (4 MiB of float32: the chunk is still in the last-level cache when
#: it is read the second and third time, and there are few chunks' calls).  On a VM with 1 MiB of
#: L2 per core and 32 MiB of L3, the check took 140 ns per batch row at 2^20 elements against 163
#: at 2^19, 168 at 2^18 and 174 in whole-tensor passes (medians of 12 alternating runs, B = 65536,
#: K = 4, V = 32; 151 against 167 and 174 against 209 with two processes running it at once).
CHECK_CHUNK_ELEMENTS = 1 << 20
#: The one-pass check runs only on inputs of more elements than this (32 MiB of float32, a CPU's
#: last-level cache): smaller inputs stay in cache between whole-tensor passes, and their chunks'
#: extra calls made them 2% slower (B = 4096 and 16384 at K = 4, V = 32).
ONE_PASS_MIN_ELEMENTS = 1 << 23


def check_verifier_inputs(target_probs, draft_probs, draft_tokens) -> tuple[int, int, int]:
    """Validate the verifier protocol's inputs; return ``(B, K, V)``.

    Valid contiguous float32/float64 input costs two cheap passes per tensor (the fast path
    of :func:`~specverify.core.validation.check_probs`) and one over the tokens.
    """
    check_probs("target_probs", target_probs)
    if target_probs.ndim != 3:
        raise InvalidArgument(f"target_probs must have shape (B, K+1, V), got {tuple(target_probs.shape)}")
    B, K1, V = target_probs.shape
    if K1 < 2:
        raise InvalidArgument(
            f"target_probs must have K+1 >= 2 rows per batch entry (K >= 1), got shape {tuple(target_probs.shape)}"
        )
    K = K1 - 1
    check_shape("draft_probs", draft_probs, (B, K, V))
    check_probs("draft_probs", draft_probs)
    check_shape("draft_tokens", draft_tokens, (B, K))
    check_tokens("draft_tokens", draft_tokens, V)
    return B, K, V


def residual_weights(target_probs: torch.Tensor, draft_probs: torch.Tensor) -> torch.Tensor:
    """Unnormalised residual ``(p - q)+`` in float64, shape of the inputs."""
    return (target_probs.double() - draft_probs.double()).clamp_min_(0.0)


def verify(
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor,
    draft_tokens: torch.Tensor,
    *,
    generator: torch.Generator,
    check: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Canonical speculative-sampling verification of one block per row.

    Parameters
    ----------
    target_probs : Tensor, shape (B, K+1, V)
        Target conditionals at the K draft positions plus the bonus position.
    draft_probs : Tensor, shape (B, K, V)
        The laws the draft tokens were drawn from.
    draft_tokens : Tensor, shape (B, K), integer
        The drafted tokens.
    generator : torch.Generator
        The only source of randomness: K uniforms per row, then one residual or
        bonus draw per row.
    check : bool
        Validate the inputs (skip only in trusted hot loops).

    Returns
    -------
    tokens : Tensor, shape (B, K+1), long
        The accepted drafts followed by the residual or bonus token; entries past
        ``num_emitted`` are 0 and must be ignored.
    num_emitted : Tensor, shape (B,), long
        Number of valid entries per row, in [1, K+1].
    """
    if check:  # the checks see the tokens' own dtype
        p_drafted, q_drafted = _checked_drafted_probs(target_probs, draft_probs, draft_tokens)  # (B, K) float64 each
        check_generator("generator", generator)
    draft_tokens = draft_tokens.long()
    if not check:
        p_drafted, q_drafted = _drafted_probs(target_probs, draft_probs, draft_tokens)  # (B, K) float64 each
    B, K1, V = target_probs.shape
    K = K1 - 1
    device = target_probs.device

    u = uniform((B, K), generator=generator, device=device)  # (B, K)
    accepted = u * q_drafted < p_drafted  # (B, K)
    num_accepted = accepted.long().cumprod(-1).sum(-1)  # (B,)

    # The row each sequence samples its last token from: the residual (p_i - q_i)+ at the
    # first rejected position i, or the target's bonus row p_{K+1} when all K were accepted.
    # Only these B rows are gathered (in the input dtype, chunk by chunk) and converted to float64.
    target_rows = _RowSelector(target_probs, num_accepted)  # (B, V) rows, gathered per chunk
    draft_rows = _RowSelector(draft_probs, num_accepted.clamp(max=K - 1))  # (B, V)
    rejected = (num_accepted < K).to(torch.float64)[:, None]  # (B, 1)
    # The sampler's draw order: one float64 uniform per row (as ``sample`` draws it).
    u_last = uniform((B, 1), generator=generator, device=device)  # (B, 1)
    last = torch.empty(B, dtype=torch.long, device=device)  # (B,)
    totals = torch.empty(B, 1, dtype=torch.float64, device=device)  # (B, 1)
    step = chunk_rows(B, V, device)
    zeros = torch.zeros(min(step, B), 1, dtype=torch.float64, device=device)  # (step, 1)
    for start in range(0, B, step):  # chunks keep each row's float64 work in cache on CPU
        stop = min(start + step, B)
        # (p - q)+ on rejected rows, p on the others (p - 0 * q == p exactly), in float64.
        # Converted first: a float32 x float32 x float64 addcmul takes ATen's slow casting loop.
        weights = torch.addcmul(
            target_rows.rows(start, stop).double(),
            draft_rows.rows(start, stop).double(),
            rejected[start:stop],
            value=-1.0,
        ).clamp_min_(0.0)  # (b, V) float64
        cdf = weights.cumsum_(-1)  # (b, V)
        total = cdf[:, -1:]  # (b, 1)
        totals[start:stop] = total
        # inverse_cdf: the first index whose cumulative weight exceeds u * total (capped below it)
        x = torch.minimum(u_last[start:stop] * total, torch.nextafter(total, zeros[: stop - start]))  # (b, 1)
        last[start:stop] = search_cdf(cdf, x)
    # A residual of mass 0 (non-negative weights: total 0 iff every weight is 0) falls back to p.
    empty = (totals <= 0).squeeze(-1)  # (B,)
    if bool(empty.any()):
        rows = empty.nonzero().squeeze(-1)  # (E,)
        last[rows] = inverse_cdf(_select_rows(target_probs, num_accepted)[rows].double(), u_last[rows])[0]

    positions = torch.arange(K, device=device)  # (K,)
    tokens = torch.empty(B, K1, dtype=torch.long, device=device)  # (B, K+1)
    torch.mul(draft_tokens, positions < num_accepted[:, None], out=tokens[:, :K])  # accepted drafts, zero past them
    tokens[:, K] = 0  # the bonus position, unless the scatter below writes there
    tokens.scatter_(1, num_accepted[:, None], last[:, None])
    return tokens, num_accepted + 1


def _select_rows(probs: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """``probs[b, index[b]]`` for probs (B, R, V): one (B, V) copy in the input dtype."""
    B = probs.shape[0]
    return probs[torch.arange(B, device=probs.device), index]  # (B, V)


class _RowSelector:
    """Rows ``probs[b, index[b]]`` of probs (B, R, V), gathered a chunk of b at a time.

    A contiguous tensor is read with ``index_select`` on its (B*R, V) view (a row memcpy
    into a cache-resident chunk); other layouts (e.g. expanded ones) use advanced indexing.
    """

    def __init__(self, probs: torch.Tensor, index: torch.Tensor):
        B, R, V = probs.shape
        self.probs = probs
        self.index = index
        self.flat = None
        if probs.is_contiguous():
            self.flat = probs.view(B * R, V)  # (B*R, V)
            self.flat_index = index + torch.arange(B, device=probs.device) * R  # (B,)

    def rows(self, start: int, stop: int) -> torch.Tensor:
        if self.flat is not None:
            return self.flat.index_select(0, self.flat_index[start:stop])  # (b, V)
        return self.probs[torch.arange(start, stop, device=self.probs.device), self.index[start:stop]]  # (b, V)


def _flat_offsets(draft_tokens: torch.Tensor, V: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Where ``p_i(x_i)`` and ``q_i(x_i)`` lie in the flattened contiguous (B, K+1, V) and (B, K, V) tensors: (B*K,) each."""
    B, K = draft_tokens.shape
    # q at ((b*K + i) * V + x), p at that + b * V (rows of K+1)
    q_at = torch.add(draft_tokens.reshape(-1), torch.arange(B * K, device=draft_tokens.device), alpha=V)  # (B*K,)
    p_at = (q_at.view(B, K) + (torch.arange(B, device=draft_tokens.device) * V)[:, None]).view(-1)  # (B*K,)
    return p_at, q_at


def _checked_drafted_probs(target_probs, draft_probs, draft_tokens):
    """:func:`check_verifier_inputs`, then :func:`_drafted_probs`: in one pass over the probabilities when it can.

    On one CPU thread, for contiguous float32/float64 inputs whose rows the fast test of
    :func:`~specverify.core.rowsums.plainly_normalised` sums whole (one block per row), each
    chunk of batch rows is checked (smallest entry, input-dtype row sums) and its drafted
    probabilities are gathered while the chunk is in cache, instead of three passes over the
    whole tensors: on inputs above ``ONE_PASS_MIN_ELEMENTS``, that is, larger than a CPU's cache.
    Whatever the fast test does not clear -- all invalid input -- goes to
    :func:`check_verifier_inputs`, which raises naming the first offence in its usual order (or
    accepts valid rows outside the fast margin).  The values returned are the same either way.
    """
    if not _one_pass_checkable(target_probs, draft_probs, draft_tokens):
        check_verifier_inputs(target_probs, draft_probs, draft_tokens)
        return _drafted_probs(target_probs, draft_probs, draft_tokens.long())
    B, K1, V = target_probs.shape
    K, dtype = K1 - 1, target_probs.dtype
    low, high = torch.aminmax(draft_tokens)
    if not bool((low >= 0) & (high < V)):  # tokens out of range: the full check names the first offence
        check_verifier_inputs(target_probs, draft_probs, draft_tokens)
    p_at, q_at = _flat_offsets(draft_tokens.long(), V)  # (B*K,) each
    target_rows, draft_rows = target_probs.view(B * K1, V), draft_probs.view(B * K, V)
    target_flat, draft_flat = target_probs.view(-1), draft_probs.view(-1)
    step = max(1, CHECK_CHUNK_ELEMENTS // ((2 * K + 1) * V))  # batch rows per chunk
    sums = torch.empty(B * (2 * K + 1), dtype=dtype)  # the target's row sums, then the draft's
    target_sums, draft_sums = sums[: B * K1], sums[B * K1 :]
    drafted = torch.empty(2, B * K, dtype=dtype)  # p_i(x_i), q_i(x_i)
    mins = torch.empty(2, (B + step - 1) // step, dtype=dtype)  # per chunk: the target's smallest entry, the draft's
    for i, start in enumerate(range(0, B, step)):
        stop = min(start + step, B)
        t_part, d_part = slice(start * K1, stop * K1), slice(start * K, stop * K)
        torch.amin(target_rows[t_part], out=mins[0, i])
        torch.sum(target_rows[t_part], -1, out=target_sums[t_part])
        torch.amin(draft_rows[d_part], out=mins[1, i])
        torch.sum(draft_rows[d_part], -1, out=draft_sums[d_part])
        torch.index_select(target_flat, 0, p_at[d_part], out=drafted[0, d_part])
        torch.index_select(draft_flat, 0, q_at[d_part], out=drafted[1, d_part])
    t_low, t_high = torch.aminmax(target_sums)
    d_low, d_high = torch.aminmax(draft_sums)
    extremes = torch.stack([*torch.amin(mins, 1), t_low, t_high, d_low, d_high]).tolist()  # one host sync
    t_min, d_min, t_low, t_high, d_low, d_high = extremes
    margin = sum_margin(dtype, V)
    if not (
        within_margin(t_min, t_low, t_high, margin, PROB_ATOL)
        and within_margin(d_min, d_low, d_high, margin, PROB_ATOL)
    ):
        check_verifier_inputs(target_probs, draft_probs, draft_tokens)
    return drafted[0].view(B, K).double(), drafted[1].view(B, K).double()  # (B, K) each


def _one_pass_checkable(target_probs, draft_probs, draft_tokens) -> bool:
    """Whether :func:`_checked_drafted_probs` may check in one pass (else the usual checks run)."""
    tensors = (target_probs, draft_probs, draft_tokens)
    if torch.get_num_threads() != 1 or not all(isinstance(t, torch.Tensor) and t.device.type == "cpu" for t in tensors):
        return False  # several threads: the usual checks' serial chunks avoid many parallel regions
    if target_probs.dtype not in (torch.float32, torch.float64) or draft_probs.dtype != target_probs.dtype:
        return False
    if target_probs.ndim != 3 or target_probs.shape[1] < 2:
        return False
    if target_probs.numel() + draft_probs.numel() <= ONE_PASS_MIN_ELEMENTS:
        return False
    B, K1, V = target_probs.shape
    if tuple(draft_probs.shape) != (B, K1 - 1, V) or tuple(draft_tokens.shape) != (B, K1 - 1):
        return False
    if draft_tokens.is_floating_point() or draft_tokens.is_complex() or draft_tokens.dtype == torch.bool:
        return False
    contiguous = target_probs.is_contiguous() and draft_probs.is_contiguous()
    # one input-dtype sum per row, as the margin assumes when the block is the whole row
    return contiguous and sum_block(V) == V and sum_margin(target_probs.dtype, V) <= PROB_ATOL / 2


def _drafted_probs(target_probs, draft_probs, draft_tokens):
    """``p_i(x_i)`` and ``q_i(x_i)`` for the K draft positions: two (B, K) float64 tensors."""
    B, K = draft_tokens.shape
    V = target_probs.shape[-1]
    if target_probs.is_contiguous() and draft_probs.is_contiguous() and target_probs.device.type == "cpu":
        p_at, q_at = _flat_offsets(draft_tokens, V)  # (B*K,) each
        p_drafted = target_probs.view(-1).index_select(0, p_at).view(B, K).double()  # (B, K)
        q_drafted = draft_probs.view(-1).index_select(0, q_at).view(B, K).double()  # (B, K)
        return p_drafted, q_drafted
    p_drafted = target_probs[:, :K].gather(-1, draft_tokens[..., None]).squeeze(-1).double()  # (B, K)
    q_drafted = draft_probs.gather(-1, draft_tokens[..., None]).squeeze(-1).double()  # (B, K)
    return p_drafted, q_drafted


def greedy_verify(target_probs: torch.Tensor, draft_tokens: torch.Tensor, *, check: bool = True):
    """Greedy verification: accept the longest draft prefix that equals argmax p.

    Then emit the target's argmax at the first mismatch (or the bonus position).
    Ties in argmax resolve to the lowest token id, as ``torch.argmax`` does.

    Parameters
    ----------
    target_probs : Tensor, shape (B, K+1, V)
    draft_tokens : Tensor, shape (B, K), integer

    Returns
    -------
    tokens : Tensor, shape (B, K+1), long
    num_emitted : Tensor, shape (B,), long
    """
    if check:
        check_probs("target_probs", target_probs)
        if target_probs.ndim != 3 or target_probs.shape[1] < 2:
            raise InvalidArgument(
                f"target_probs must have shape (B, K+1, V) with K >= 1, got {tuple(target_probs.shape)}"
            )
        B, K1, V = target_probs.shape
        check_shape("draft_tokens", draft_tokens, (B, K1 - 1))
        check_tokens("draft_tokens", draft_tokens, V)
    target_argmax = target_probs.argmax(-1)  # (B, K+1)
    K = draft_tokens.shape[1]
    matches = draft_tokens.long() == target_argmax[:, :K]  # (B, K)
    num_accepted = matches.long().cumprod(-1).sum(-1)  # (B,)
    # Accepted drafts equal the argmax, so the argmax row is the emitted block.
    return target_argmax, num_accepted + 1
