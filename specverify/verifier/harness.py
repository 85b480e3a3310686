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
from specverify.core.devices import check_device
from specverify.core.tables import TableModel
from specverify.core.validation import check_generator, check_int
from specverify.verifier.protocol import call_verifier, check_determinism, validate_verifier_output

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
    device=None,
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
    device : torch.device or str, optional
        Where the verifier runs (default the CPU): the probability tables are copied there
        once, each round's inputs are gathered there, the verifier gets a generator of that
        device, and its output is validated there and copied back in one transfer.  The
        drafting and all bookkeeping stay on the CPU, so ``device="cpu"`` is bit-identical
        to the default.

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
    dev = check_device("device", device)
    on_cpu = dev.type == "cpu"
    draft_gen = torch.Generator().manual_seed(seeds[0])
    verify_gen = torch.Generator(device=dev).manual_seed(seeds[1])
    # Float64 CDFs of the drafter's rows, as reference.sampling.sample computes them.
    draft_sampler = _ContextSampler(torch.cumsum(drafter.table, -1))
    t_tab = target.table32 if verifier_dtype == torch.float32 else target.table.to(verifier_dtype)  # (Ct, V)
    d_tab = drafter.table32 if verifier_dtype == torch.float32 else drafter.table.to(verifier_dtype)  # (Cd, V)
    t_tab, d_tab = t_tab.to(dev), d_tab.to(dev)  # (Ct, V), (Cd, V) once on the device
    target_buffer, draft_buffer = _ReusedBuffer(t_tab.dtype), _ReusedBuffer(d_tab.dtype)
    trials = _Trials(target, drafter, K)
    start = time.perf_counter()
    groups, num_calls = [], 0
    for _ in range(G):
        group = _Group(target, drafter, B, L, K)
        while group.rows.numel():
            b = group.rows.numel()
            drafts, dctx = _draft_block(drafter, draft_sampler, group.dcur, K, draft_gen)  # (b, K), (b, K+1)
            tctx = _target_contexts(target, group.tcur, drafts)  # (b, K+1)
            if on_cpu:
                target_probs = target_buffer.take((b, K + 1, V))  # (b, K+1, V)
                torch.index_select(t_tab, 0, tctx.view(-1), out=target_probs.view(b * (K + 1), V))
                draft_probs = draft_buffer.take((b, K, V))  # (b, K, V)
                torch.index_select(d_tab, 0, dctx[:, :K].reshape(-1), out=draft_probs.view(b * K, V))
                dev_drafts = drafts
            else:  # one host-to-device copy of the contexts and drafts, gathers on the device
                moved = torch.cat([tctx.view(-1), dctx[:, :K].reshape(-1), drafts.view(-1)]).to(dev)  # (b*(3K+1),)
                n_t, n_d = b * (K + 1), b * K
                target_probs = t_tab.index_select(0, moved[:n_t]).view(b, K + 1, V)  # (b, K+1, V)
                draft_probs = d_tab.index_select(0, moved[n_t : n_t + n_d]).view(b, K, V)  # (b, K, V)
                dev_drafts = moved[n_t + n_d :].view(b, K)  # (b, K)
            if num_calls == 0 and determinism_rows > 0:
                r = min(b, determinism_rows)
                check_determinism(verify, target_probs[:r], draft_probs[:r], dev_drafts[:r], seed=seeds[2] % 2**63)
            tokens, num_emitted = call_verifier(
                verify, target_probs, draft_probs, dev_drafts.clone(), generator=verify_gen
            )
            del target_probs, draft_probs, dev_drafts
            num_calls += 1
            trials.record(tokens, num_emitted, drafts, tctx, dctx)
            group.append(tokens, num_emitted, tctx, dctx)
        groups.append(group)
    return collect_run(groups, trials.positions, trials.accept_probs, trials.accepted, K, B, L, num_calls, start)


def collect_run(groups, positions, accept_probs, accepted, K: int, B: int, L: int, num_calls: int, start: float):
    """The :class:`HarnessRun` of finished groups (each cut at L) and the trials' lists."""
    return HarnessRun(
        tokens=torch.cat([g.tokens[:, :L] for g in groups]),  # (R, L)
        target_contexts=torch.cat([g.target_contexts[:, :L] for g in groups]),  # (R, L)
        draft_contexts=torch.cat([g.draft_contexts[:, :L] for g in groups]),  # (R, L)
        block_positions=torch.cat([g.block_positions[:, :L] for g in groups]),  # (R, L)
        trial_positions=torch.cat(positions),
        trial_accept_probs=torch.cat(accept_probs),
        trial_accepted=torch.cat(accepted),
        k=K,
        batch_size=B,
        num_groups=len(groups),
        length=L,
        num_calls=num_calls,
        seconds=time.perf_counter() - start,
    )


def _draft_block(drafter: TableModel, draft_sampler, dcur: torch.Tensor, K: int, generator) -> tuple:
    """K drafts per row drawn exactly from the drafter table; ``(drafts (b, K), dctx (b, K+1))``.

    ``dctx[:, i]`` is the drafter's context before position i (the last one, after the
    K-th draft, is where the next round starts if every draft is accepted).
    """
    b = dcur.numel()
    dctx = torch.empty(b, K + 1, dtype=torch.long)  # (b, K+1)
    dctx[:, 0] = dcur
    if drafter.token_independent:
        for i in range(K):
            dctx[:, i + 1] = drafter.next_context(dctx[:, i], dctx[:, i])
        return draft_sampler(dctx[:, :K], generator=generator), dctx  # (b, K)
    drafts = torch.empty(b, K, dtype=torch.long)  # (b, K)
    for i in range(K):
        drafts[:, i] = draft_sampler(dctx[:, i], generator=generator)
        dctx[:, i + 1] = drafter.next_context(dctx[:, i], drafts[:, i])
    return drafts, dctx


def _target_contexts(target: TableModel, tcur: torch.Tensor, drafts: torch.Tensor) -> torch.Tensor:
    """The target's context before each of the K+1 positions of the drafted block; (b, K+1)."""
    b, K = drafts.shape
    tctx = torch.empty(b, K + 1, dtype=torch.long)  # (b, K+1)
    tctx[:, 0] = tcur
    for i in range(K):
        tctx[:, i + 1] = target.next_context(tctx[:, i], drafts[:, i])
    return tctx


class _Trials:
    """Acceptance trials of every round: in-block position, exact accept probability, outcome."""

    def __init__(self, target: TableModel, drafter: TableModel, K: int):
        self.target, self.drafter, self.K = target, drafter, K
        overlap = acceptance_overlap(target, drafter)  # (Ct, Cd) or None
        self.overlap_flat = overlap.view(-1) if overlap is not None else None  # (Ct*Cd,)
        self.ar = torch.arange(K)  # (K,)
        self.positions: list[torch.Tensor] = []
        self.accept_probs: list[torch.Tensor] = []
        self.accepted: list[torch.Tensor] = []

    def record(self, tokens, num_emitted, drafts, tctx, dctx) -> None:
        """The trials of one round: a draft reached verification unless an earlier one was rejected."""
        K = self.K
        last_j = (num_emitted - 1)[:, None]  # (b, 1)
        last = tokens.gather(1, last_j).squeeze(1)  # (b,)
        last_draft = drafts.gather(1, last_j.clamp(max=K - 1)).squeeze(1)  # (b,)
        bonus = num_emitted == K + 1
        corrected = bonus | (last != last_draft)
        accepted_n = torch.where(corrected, num_emitted - 1, num_emitted)  # (b,)
        trials_n = torch.where(bonus, torch.full_like(num_emitted, K), num_emitted)  # (b,)
        # flat indices (row-major) of the trials: the first trials_n[b] positions of row b
        trial_at = (self.ar[None, :] < trials_n[:, None]).view(-1).nonzero().squeeze(1)  # (T,)
        trial_j = trial_at % K  # (T,) in-block position - 1
        self.positions.append(trial_j + 1)
        self.accepted.append(trial_j < accepted_n.index_select(0, trial_at // K))
        trial_tctx = tctx[:, :K].reshape(-1).index_select(0, trial_at)  # (T,)
        trial_dctx = dctx[:, :K].reshape(-1).index_select(0, trial_at)  # (T,)
        if self.overlap_flat is not None:
            flat = torch.add(trial_dctx, trial_tctx, alpha=self.drafter.num_contexts)  # (T,)
            self.accept_probs.append(self.overlap_flat.index_select(0, flat))
        else:
            self.accept_probs.append(_overlap_rows(self.target.table, self.drafter.table, trial_tctx, trial_dctx))


class _Group:
    """One group of B rows decoded to length L: output buffers and the state of unfinished rows.

    Every position < L of a row is written (each round writes from the row's length on, and
    the length grows by what was emitted), so the buffers need no initialisation.
    """

    def __init__(self, target: TableModel, drafter: TableModel, B: int, L: int, K: int):
        self.target, self.drafter, self.K = target, drafter, K
        self.W = L + K + 1
        self.L = L
        self.tokens = torch.empty(B, self.W, dtype=torch.long)  # (B, W)
        self.target_contexts = torch.empty(B, self.W, dtype=torch.long)  # (B, W)
        self.draft_contexts = torch.empty(B, self.W, dtype=torch.long)  # (B, W)
        self.block_positions = torch.empty(B, self.W, dtype=torch.long)  # (B, W)
        self.ar = torch.arange(K + 1)  # (K+1,)
        # State of the unfinished rows only (kept compact, in row order).
        self.rows = torch.arange(B)  # (b,) row ids
        self.lengths = torch.zeros(B, dtype=torch.long)  # (b,)
        self.tcur = torch.full((B,), target.initial_context, dtype=torch.long)  # (b,)
        self.dcur = torch.full((B,), drafter.initial_context, dtype=torch.long)  # (b,)

    def append(self, tokens, num_emitted, tctx, dctx, law_contexts=None) -> None:
        """Write the emitted block (entries past num_emitted are overwritten later or cut at L).

        ``dctx`` (b, K+1) is the drafter's context before each position (it advances the
        rows); ``law_contexts`` what is recorded as the draft law of each position (default:
        ``dctx`` with -1 at the bonus position, which has no draft law).
        """
        b, K = tokens.shape[0], self.K
        last_j = (num_emitted - 1)[:, None]  # (b, 1)
        last = tokens.gather(1, last_j).squeeze(1)  # (b,)
        flat = ((self.rows * self.W + self.lengths)[:, None] + self.ar).view(-1)  # (b*(K+1),)
        self.tokens.view(-1).index_copy_(0, flat, tokens.reshape(-1))
        self.target_contexts.view(-1).index_copy_(0, flat, tctx.view(-1))
        d_last = dctx.gather(1, last_j).squeeze(1)  # (b,)
        if law_contexts is None:
            law_contexts = dctx
            law_contexts[:, K] = -1  # the bonus position has no draft law
        self.draft_contexts.view(-1).index_copy_(0, flat, law_contexts.reshape(-1))
        self.block_positions.view(-1).index_copy_(0, flat, (self.ar + 1).repeat(b))
        self.tcur = self.target.next_context(tctx.gather(1, last_j).squeeze(1), last)  # (b,)
        self.dcur = self.drafter.next_context(d_last, last)  # (b,)
        self.lengths = self.lengths + num_emitted
        unfinished = self.lengths < self.L  # (b,)
        if not bool(unfinished.all()):
            keep = unfinished.nonzero().squeeze(1)  # (b',)
            self.rows, self.lengths = self.rows[keep], self.lengths[keep]
            self.tcur, self.dcur = self.tcur[keep], self.dcur[keep]
