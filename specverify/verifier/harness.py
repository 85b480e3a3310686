"""Drive full speculative decoding around a verifier under test, on table models.

One *round* for every unfinished row: draft K tokens exactly from the drafter
table (:func:`reference.sampling.sample`), gather the target rows p_1..p_{K+1}
for the drafted prefix, call the verifier, validate its output
(:func:`validate_verifier_output`), append the emitted tokens.  Rows advance
independently (per-row lengths into a ``(B, L+K+1)`` buffer) until every row
holds L tokens; the batch of one verify call is the set of unfinished rows of a
group.  Model contexts are tracked incrementally, so for table models a round is
gathers plus the verifier: no Python loop over rows.

What the statistics need is returned in a :class:`HarnessRun`: every emitted
token with its target context (its exact conditional is ``target.table[ctx]``),
its drafter context (the draft law q at that position; -1 at the bonus position)
and its in-block position 1..K+1; per acceptance trial its in-block position, the
exact acceptance probability ``sum_x min(p, q)`` and whether the draft was
accepted.  Validity: the emitted tokens of a correct verifier form, row by row, a
sequence whose conditional law given the past is ``target.table[ctx]``; the
in-block position and both contexts are known before the token is drawn, so
stratifying by them keeps conditional tests valid.

Acceptances are read off the output: ``num_emitted = K+1`` means K accepted and a
bonus; otherwise, when the last emitted token differs from the draft at its
position it is a correction after a rejection (a correct residual never equals
the rejected draft), and when it equals the draft the verifier emitted only
accepted drafts (the "no bonus token" variant: K accepted, no trial recorded as
rejected).

Verifiers see float32 copies of the tables (as real kernels do); the tables'
float64 values are the exact law (the float32 rounding shifts it by < 1e-7 in TV,
far below any detectable effect).

Shapes: B batch, K draft length, V vocabulary, L sequence length, C contexts.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from reference.sampling import chunk_rows, uniform
from specverify.core.errors import ImplementationError
from specverify.core.tables import TableModel
from specverify.core.validation import check_generator, check_int

__all__ = [
    "HarnessRun",
    "run_harness",
    "validate_verifier_output",
    "call_verifier",
    "acceptance_overlap",
    "sample_contexts",
]

#: Largest C_target * C_draft * V for which the acceptance-probability table is precomputed.
OVERLAP_CELLS = 1 << 25


@dataclass(frozen=True)
class HarnessRun:
    """Everything one harness run emitted, with what the statistics need.

    Attributes
    ----------
    tokens : Tensor (R, L) long
        Emitted sequences, R = batch_size * num_groups rows.
    target_contexts : Tensor (R, L) long
        Target context of each token (its exact conditional is ``target.table[ctx]``).
    draft_contexts : Tensor (R, L) long
        Drafter context of each token (q at that position), -1 at the bonus position K+1.
    block_positions : Tensor (R, L) long
        In-block position 1..K+1 of each token.
    trial_positions : Tensor (T,) long
        In-block position 1..K of each acceptance trial (each draft the verifier had to judge).
    trial_accept_probs : Tensor (T,) float64
        Exact acceptance probability ``sum_x min(p, q)`` of each trial.
    trial_accepted : Tensor (T,) bool
    k, batch_size, num_groups, length : int
    num_calls : int
        Verify calls made.
    seconds : float
        Wall time of the run.
    """

    tokens: torch.Tensor
    target_contexts: torch.Tensor
    draft_contexts: torch.Tensor
    block_positions: torch.Tensor
    trial_positions: torch.Tensor
    trial_accept_probs: torch.Tensor
    trial_accepted: torch.Tensor
    k: int
    batch_size: int
    num_groups: int
    length: int
    num_calls: int
    seconds: float

    @property
    def num_tokens(self) -> int:
        return int(self.tokens.numel())


def sample_contexts(cdf_table: torch.Tensor, contexts: torch.Tensor, *, generator: torch.Generator) -> torch.Tensor:
    """One token per entry of ``contexts`` from the rows whose float64 CDFs are ``cdf_table`` (C, V).

    The inverse CDF of :func:`reference.sampling.sample` with the per-context
    cumulative sums computed once: the same float64 CDF, one uniform per draw scaled
    by the row total (capped below it), ``searchsorted(right=True)`` so that a token of
    weight 0 is never returned.
    """
    return _ContextSampler(cdf_table)(contexts, generator=generator)


class _ContextSampler:
    """:func:`sample_contexts` for one CDF table, with per-context work done once.

    A draw with uniform ``u`` in context ``c`` returns ``#{j : cdf[c, j] <= x}`` with
    ``x = min(u * total[c], nextafter(total[c], 0))`` (``searchsorted(right=True)`` on a
    non-decreasing row).  That token is non-decreasing in ``u``, so on a *guide table*
    (Chen & Asau 1974) of ``G`` (a power of two) equal slices of [0, 1) per context it is
    constant on every slice whose two ends give the same token: those draws are one
    lookup at ``floor(u * G)`` (exact, as ``u * G`` is).  The other draws (at most V - 1
    slices per context hold a CDF step) gather their CDF rows and count, in cache-sized
    chunks.  Either way the token is exactly that of the formula above.
    """

    #: Slices per vocabulary entry (at most 1/16 of the u-mass then falls on ambiguous slices).
    SLICES_PER_TOKEN = 16
    #: Largest guide table (entries) and largest precomputation (contexts x slices x V).
    MAX_GUIDE, MAX_GUIDE_WORK = 1 << 22, 1 << 27

    def __init__(self, cdf_table: torch.Tensor):
        self.cdf = cdf_table.contiguous()  # (C, V) float64
        C, V = self.cdf.shape
        total = self.cdf[:, -1]  # (C,)
        self.total = total
        self.cap = torch.nextafter(total, torch.zeros_like(total))  # (C,) largest float64 below the total
        slices = 1 << max(8, (self.SLICES_PER_TOKEN * V - 1).bit_length())
        self.slices = slices
        self.guide = None
        if C * slices <= self.MAX_GUIDE and C * slices * V <= self.MAX_GUIDE_WORK:
            edges = torch.arange(slices + 1, dtype=torch.float64) / slices  # (G+1,) exact
            u_low = edges[:-1].repeat(C)  # (C*G,) first u of each slice
            u_high = torch.nextafter(edges[1:], torch.zeros(())).repeat(C)  # (C*G,) last u of each slice
            ctx = torch.arange(C).repeat_interleave(slices)  # (C*G,)
            low, high = self._exact(ctx, u_low), self._exact(ctx, u_high)  # (C*G,)
            self.guide = torch.where(low == high, low, -1)  # (C*G,) the token, or -1: ambiguous slice

    def _exact(self, contexts: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
        """Token ``#{j : cdf[c, j] <= x}`` per draw (contexts (n,), u (n,) float64)."""
        n, V = contexts.numel(), self.cdf.shape[1]
        x = torch.minimum(u * self.total[contexts], self.cap[contexts])  # (n,)
        out = torch.empty(n, dtype=torch.long)  # (n,)
        step = chunk_rows(n, V, "cpu")
        for start in range(0, n, step):
            stop = min(start + step, n)
            rows = self.cdf.index_select(0, contexts[start:stop])  # (m, V) cached chunk
            torch.sum(rows <= x[start:stop, None], -1, out=out[start:stop])
        return out

    def __call__(self, contexts: torch.Tensor, *, generator: torch.Generator) -> torch.Tensor:
        u = uniform((*contexts.shape, 1), generator=generator).view(-1)  # (n,) one uniform per draw
        flat = contexts.reshape(-1)  # (n,)
        if self.guide is None:
            return self._exact(flat, u).view(contexts.shape)
        slice_ = (u * self.slices).long()  # (n,) floor(u * G), exact
        tokens = self.guide.index_select(0, torch.add(slice_, flat, alpha=self.slices))  # (n,)
        ambiguous = (tokens < 0).nonzero().squeeze(1)  # (a,)
        if ambiguous.numel():
            tokens[ambiguous] = self._exact(flat[ambiguous], u[ambiguous])
        return tokens.view(contexts.shape)


def acceptance_overlap(target: TableModel, drafter: TableModel) -> torch.Tensor | None:
    """``(C_target, C_draft)`` table of ``sum_x min(p, q)``, or None when too large to precompute."""
    Ct, Cd, V = target.num_contexts, drafter.num_contexts, target.vocab_size
    if Ct * Cd * V > OVERLAP_CELLS:
        return None
    out = torch.empty(Ct, Cd, dtype=torch.float64)
    step = max(1, OVERLAP_CELLS // max(1, Cd * V * 8))
    for s in range(0, Ct, step):
        out[s : s + step] = torch.minimum(target.table[s : s + step, None], drafter.table[None]).sum(-1)
    return out


class _ReusedBuffer:
    """A CPU buffer for tensors handed to the verifier, reused only while nothing else holds it.

    Fresh multi-megabyte tensors cost a page fault per 4 KiB on every round (about 5x the
    cost of the gather that fills them).  The buffer is reused only when its storage has no
    other user -- no tensor, view, array or capsule of the verifier kept from an earlier call
    -- so a verifier can never observe the reuse; otherwise (or without the use count) a
    new buffer is allocated, as a fresh tensor would be.
    """

    def __init__(self, dtype: torch.dtype):
        self.dtype = dtype
        self.buffer = None

    def _unshared(self) -> bool:
        use_count = getattr(torch._C, "_storage_Use_Count", None)
        if use_count is None:
            return False
        # our tensor and the temporary storage handle hold two references
        return use_count(self.buffer.untyped_storage()._cdata) == 2

    def take(self, shape) -> torch.Tensor:
        """A contiguous tensor of ``shape`` (contents undefined)."""
        numel = 1
        for size in shape:
            numel *= size
        if self.buffer is None or self.buffer.numel() < numel or not self._unshared():
            self.buffer = torch.empty(numel, dtype=self.dtype)
        return self.buffer[:numel].view(shape)


def _overlap_rows(target_table, draft_table, target_contexts, draft_contexts) -> torch.Tensor:
    """``sum_x min(p, q)`` per (target context, drafter context) pair, in cache-sized chunks: (T,) float64."""
    T, V = target_contexts.numel(), target_table.shape[1]
    out = torch.empty(T, dtype=torch.float64)  # (T,)
    step = chunk_rows(T, V, "cpu")
    for start in range(0, T, step):
        stop = min(start + step, T)
        rows = torch.minimum(
            target_table[target_contexts[start:stop]], draft_table[draft_contexts[start:stop]]
        )  # (m, V)
        torch.sum(rows, -1, out=out[start:stop])
    return out


def _describe(value) -> str:
    shape = tuple(getattr(value, "shape", ()))
    return f"{type(value).__name__} of shape {shape}, dtype {getattr(value, 'dtype', '?')}"


def _as_long(name: str, value, shape) -> torch.Tensor:
    if not isinstance(value, torch.Tensor):
        try:
            value = torch.as_tensor(value)
        except Exception:
            raise ImplementationError(f"verifier returned {name} as {type(value).__name__}, not a tensor") from None
    if value.is_floating_point() or value.is_complex() or value.dtype == torch.bool:
        raise ImplementationError(f"verifier returned {name} with dtype {value.dtype} (expected an integer dtype)")
    if tuple(value.shape) != tuple(shape):
        raise ImplementationError(f"verifier returned {name} of shape {tuple(value.shape)} (expected {tuple(shape)})")
    return value.to(device="cpu", dtype=torch.long)


def validate_verifier_output(output, draft_tokens: torch.Tensor, vocab_size: int):
    """Check one verify call's output against the protocol; return ``(tokens, num_emitted)`` as long.

    Checks: a pair of integer tensors of shapes (B, K+1) and (B,); ``num_emitted``
    in [1, K+1]; emitted token ids in [0, V); the emitted draft prefix (positions
    < num_emitted - 1) equal to the drafted tokens.  Entries past ``num_emitted``
    are ignored, as the protocol says.

    Raises
    ------
    ImplementationError
        naming the offending row and values.
    """
    B, K = draft_tokens.shape
    if not isinstance(output, (tuple, list)) or len(output) != 2:
        raise ImplementationError(f"verifier must return (tokens, num_emitted), got {_describe(output)}")
    tokens = _as_long("tokens", output[0], (B, K + 1))
    num_emitted = _as_long("num_emitted", output[1], (B,))
    j = torch.arange(K + 1)  # (K+1,)
    bad_n = (num_emitted < 1) | (num_emitted > K + 1)  # (B,)
    emitted = j[None] < num_emitted[:, None]  # (B, K+1)
    bad_tok = emitted & ((tokens < 0) | (tokens >= vocab_size))  # (B, K+1)
    bad_prefix = (j[None, :K] < (num_emitted[:, None] - 1)) & (tokens[:, :K] != draft_tokens)  # (B, K)
    if not bool(bad_n.any() | bad_tok.any() | bad_prefix.any()):
        return tokens, num_emitted
    if bool(bad_n.any()):
        b = int(bad_n.nonzero()[0])
        raise ImplementationError(
            f"row {b}: num_emitted = {int(num_emitted[b])} outside [1, K+1] = [1, {K + 1}]", row=b
        )
    if bool(bad_tok.any()):
        b, i = (int(v) for v in bad_tok.nonzero()[0])
        raise ImplementationError(
            f"row {b}: emitted token {int(tokens[b, i])} at in-block position {i + 1} is outside the vocabulary [0, {vocab_size})",
            row=b,
        )
    b, i = (int(v) for v in bad_prefix.nonzero()[0])
    raise ImplementationError(
        f"row {b}: emitted token {int(tokens[b, i])} at in-block position {i + 1} differs from the accepted draft "
        f"{int(draft_tokens[b, i])} (num_emitted = {int(num_emitted[b])}: positions before the last must be drafts)",
        row=b,
    )


def call_verifier(verify, target_probs, draft_probs, draft_tokens, *, generator):
    """Call ``verify``; any exception becomes an :class:`ImplementationError`; validate the output."""
    try:
        output = verify(target_probs, draft_probs, draft_tokens, generator=generator)
    except ImplementationError:
        raise
    except Exception as exc:  # the implementation under test may raise anything
        raise ImplementationError(f"verifier raised {type(exc).__name__}: {exc}") from exc
    return validate_verifier_output(output, draft_tokens, target_probs.shape[-1])


def check_determinism(verify, target_probs, draft_probs, draft_tokens, *, seed: int) -> None:
    """Two calls with equal generator states must give equal emitted outputs."""
    outs = [
        call_verifier(verify, target_probs, draft_probs, draft_tokens, generator=torch.Generator().manual_seed(seed))
        for _ in range(2)
    ]
    (t1, n1), (t2, n2) = outs
    K1 = t1.shape[1]
    mask = torch.arange(K1)[None] < n1[:, None]
    diff = (n1 != n2) | ((t1 != t2) & mask).any(-1)
    if bool(diff.any()):
        b = int(diff.nonzero()[0])
        raise ImplementationError(
            f"row {b}: two calls with the same generator seed {seed} gave different outputs "
            f"({t1[b, : int(n1[b])].tolist()} vs {t2[b, : int(n2[b])].tolist()}): the verifier must draw "
            "its randomness from the generator argument only",
            row=b,
        )


def run_harness(
    verify,
    target: TableModel,
    drafter: TableModel,
    *,
    k: int,
    batch_size: int,
    length: int,
    generator: torch.Generator,
    num_groups: int = 1,
    verifier_dtype: torch.dtype = torch.float32,
    determinism_rows: int = 64,
) -> HarnessRun:
    """Run speculative decoding with ``verify`` on table models; see the module docstring.

    Parameters
    ----------
    verify : callable
        The verifier protocol ``verify(target_probs, draft_probs, draft_tokens, *, generator)``.
    target, drafter : TableModel
        Same vocabulary.
    k : int >= 1
        Draft length K.
    batch_size : int
        Rows per group (the batch of the first verify call of a group).
    length : int
        Tokens kept per row (L).
    generator : torch.Generator
        Seeds the drafting and verifier generators (two independent streams).
    num_groups : int
        Groups of ``batch_size`` rows run one after another (R = batch_size * num_groups).
    verifier_dtype : torch.dtype
        dtype of the probability tensors passed to the verifier.
    determinism_rows : int
        Rows of the first round used for the determinism check (0 disables it).

    Raises
    ------
    ImplementationError
        when the verifier raises or violates its protocol.
    """
    K = check_int("k", k, minimum=1)
    B = check_int("batch_size", batch_size, minimum=1)
    L = check_int("length", length, minimum=1)
    G = check_int("num_groups", num_groups, minimum=1)
    check_generator("generator", generator)
    if drafter.vocab_size != target.vocab_size:
        raise ValueError(f"drafter vocabulary {drafter.vocab_size} != target vocabulary {target.vocab_size}")
    V = target.vocab_size
    seeds = torch.randint(0, 2**62, (3,), generator=generator).tolist()
    draft_gen = torch.Generator().manual_seed(seeds[0])
    verify_gen = torch.Generator().manual_seed(seeds[1])
    overlap = acceptance_overlap(target, drafter)  # (Ct, Cd) or None
    overlap_flat = overlap.view(-1) if overlap is not None else None
    Cd = drafter.num_contexts
    # Float64 CDFs of the drafter's rows, as reference.sampling.sample computes them.
    draft_sampler = _ContextSampler(torch.cumsum(drafter.table, -1))
    t_tab = target.table32 if verifier_dtype == torch.float32 else target.table.to(verifier_dtype)
    d_tab = drafter.table32 if verifier_dtype == torch.float32 else drafter.table.to(verifier_dtype)
    target_buffer, draft_buffer = _ReusedBuffer(t_tab.dtype), _ReusedBuffer(d_tab.dtype)
    W = L + K + 1
    ar = torch.arange(K + 1)  # (K+1,)
    block_pos_row = ar + 1  # (K+1,)
    start = time.perf_counter()
    out_tokens, out_tctx, out_dctx, out_bpos = [], [], [], []
    trial_pos, trial_prob, trial_acc = [], [], []
    num_calls = 0
    for group in range(G):
        # Every position < L of a row is written (each round writes from the row's length on,
        # and the length grows by what was emitted), so the buffers need no initialisation.
        buf = torch.empty(B, W, dtype=torch.long)
        tbuf = torch.empty(B, W, dtype=torch.long)
        dbuf = torch.empty(B, W, dtype=torch.long)
        pbuf = torch.empty(B, W, dtype=torch.long)
        # State of the unfinished rows only (kept compact, in row order).
        idx = torch.arange(B)  # (b,) row ids
        lengths = torch.zeros(B, dtype=torch.long)  # (b,)
        tcur = torch.full((B,), target.initial_context, dtype=torch.long)  # (b,)
        dcur = torch.full((B,), drafter.initial_context, dtype=torch.long)  # (b,)
        while idx.numel():
            b = idx.numel()
            # --- draft K tokens exactly from the drafter table
            dctx = torch.empty(b, K + 1, dtype=torch.long)  # (b, K+1) drafter context before each position
            dctx[:, 0] = dcur
            if drafter.token_independent:
                for i in range(K):
                    dctx[:, i + 1] = drafter.next_context(dctx[:, i], dctx[:, i])
                drafts = draft_sampler(dctx[:, :K], generator=draft_gen)  # (b, K)
            else:
                drafts = torch.empty(b, K, dtype=torch.long)
                for i in range(K):
                    drafts[:, i] = draft_sampler(dctx[:, i], generator=draft_gen)
                    dctx[:, i + 1] = drafter.next_context(dctx[:, i], drafts[:, i])
            # --- target contexts of the K+1 positions of the drafted block
            tctx = torch.empty(b, K + 1, dtype=torch.long)  # (b, K+1)
            tctx[:, 0] = tcur
            for i in range(K):
                tctx[:, i + 1] = target.next_context(tctx[:, i], drafts[:, i])
            dctx_k = dctx[:, :K].reshape(-1)  # (b*K,)
            target_probs = target_buffer.take((b, K + 1, V))  # (b, K+1, V)
            torch.index_select(t_tab, 0, tctx.view(-1), out=target_probs.view(b * (K + 1), V))
            draft_probs = draft_buffer.take((b, K, V))  # (b, K, V)
            torch.index_select(d_tab, 0, dctx_k, out=draft_probs.view(b * K, V))
            if group == 0 and num_calls == 0 and determinism_rows > 0:
                r = min(b, determinism_rows)
                check_determinism(verify, target_probs[:r], draft_probs[:r], drafts[:r], seed=seeds[2] % 2**63)
            tokens, num_emitted = call_verifier(verify, target_probs, draft_probs, drafts.clone(), generator=verify_gen)
            del target_probs, draft_probs
            num_calls += 1
            # --- acceptance trials
            last_j = (num_emitted - 1)[:, None]  # (b, 1)
            last = tokens.gather(1, last_j).squeeze(1)  # (b,)
            last_draft = drafts.gather(1, last_j.clamp(max=K - 1)).squeeze(1)  # (b,)
            bonus = num_emitted == K + 1
            corrected = bonus | (last != last_draft)
            accepted_n = torch.where(corrected, num_emitted - 1, num_emitted)  # (b,)
            trials_n = torch.where(bonus, torch.full_like(num_emitted, K), num_emitted)  # (b,)
            # flat indices (row-major) of the trials: the first trials_n[b] positions of row b
            trial_at = (ar[None, :K] < trials_n[:, None]).view(-1).nonzero().squeeze(1)  # (T,)
            trial_j = trial_at % K  # (T,) in-block position - 1
            trial_pos.append(trial_j + 1)
            trial_acc.append(trial_j < accepted_n.index_select(0, trial_at // K))
            trial_tctx = tctx[:, :K].reshape(-1).index_select(0, trial_at)  # (T,)
            trial_dctx = dctx_k.index_select(0, trial_at)  # (T,)
            if overlap_flat is not None:
                trial_prob.append(overlap_flat.index_select(0, torch.add(trial_dctx, trial_tctx, alpha=Cd)))
            else:
                trial_prob.append(_overlap_rows(target.table, drafter.table, trial_tctx, trial_dctx))
            # --- append the emitted block (entries past num_emitted are overwritten later or cut at L)
            flat = ((idx * W + lengths)[:, None] + ar).view(-1)  # (b*(K+1),)
            buf.view(-1).index_copy_(0, flat, tokens.reshape(-1))
            tbuf.view(-1).index_copy_(0, flat, tctx.view(-1))
            d_last = dctx.gather(1, last_j).squeeze(1)  # (b,)
            dctx[:, K] = -1  # the bonus position has no draft law
            dbuf.view(-1).index_copy_(0, flat, dctx.view(-1))
            pbuf.view(-1).index_copy_(0, flat, block_pos_row.repeat(b))
            tcur = target.next_context(tctx.gather(1, last_j).squeeze(1), last)  # (b,)
            dcur = drafter.next_context(d_last, last)  # (b,)
            lengths = lengths + num_emitted
            unfinished = lengths < L  # (b,)
            if not bool(unfinished.all()):
                keep = unfinished.nonzero().squeeze(1)  # (b',)
                idx, lengths, tcur, dcur = idx[keep], lengths[keep], tcur[keep], dcur[keep]
        out_tokens.append(buf[:, :L])
        out_tctx.append(tbuf[:, :L])
        out_dctx.append(dbuf[:, :L])
        out_bpos.append(pbuf[:, :L])
    return HarnessRun(
        tokens=torch.cat(out_tokens),
        target_contexts=torch.cat(out_tctx),
        draft_contexts=torch.cat(out_dctx),
        block_positions=torch.cat(out_bpos),
        trial_positions=torch.cat(trial_pos),
        trial_accept_probs=torch.cat(trial_prob),
        trial_accepted=torch.cat(trial_acc),
        k=K,
        batch_size=B,
        num_groups=G,
        length=L,
        num_calls=num_calls,
        seconds=time.perf_counter() - start,
    )
