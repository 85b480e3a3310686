"""One round of the table-model harness, piece by piece: drafting, contexts, trials, buffers.

:func:`~specverify.verifier.harness.run_harness` drives the rounds; this module holds what a
round does besides calling the verifier, each piece as vectorised gathers over the unfinished
rows (no Python loop over rows):

* :class:`_ContextSampler` draws drafts exactly from a table's float64 CDFs (guide table);
* :class:`_Transitions` moves table-model contexts on by one gather (``next_context``
  precomputed), and whole blocks at once for token-independent models;
* :class:`_Trials` records the acceptance trials of a round, with their exact acceptance
  probabilities (:func:`acceptance_overlap`);
* :class:`_Group` writes the emitted tokens of a group of rows and rebuilds the per-token
  contexts once at the end, into its rows of the run's outputs (:class:`_Columns`).

Each piece computes exactly what its plain formulation would (the harness' outputs are
bit-identical to the row-by-row definitions); ``tests/verifier/test_harness_fast_paths.py``
checks the equivalences that are not plain rewrites.

Shapes: b unfinished rows, K draft length, V vocabulary, L sequence length, C contexts.
"""

from __future__ import annotations

import torch

from specverify.core.sampling import chunk_rows, search_cdf, uniform
from specverify.core.tables import TableModel

__all__ = ["acceptance_overlap", "OVERLAP_CELLS"]

#: Largest C_target * C_draft * V for which the acceptance-probability table is precomputed.
OVERLAP_CELLS = 1 << 25


class _ContextSampler:
    """:func:`~specverify.verifier.harness.sample_contexts` for one CDF table, with per-context work done once.

    A draw with uniform ``u`` in context ``c`` returns ``#{j : cdf[c, j] <= x}`` with
    ``x = min(u * total[c], nextafter(total[c], 0))`` (``searchsorted(right=True)`` on a
    non-decreasing row).  That token is non-decreasing in ``u``, so on a *guide table*
    (Chen & Asau 1974) of ``G`` (a power of two) equal slices of [0, 1) per context it is
    constant on every slice whose two ends give the same token: those draws are one
    lookup at ``floor(u * G)`` (exact, as ``u * G`` is).  The other slices (at most V - 1
    per context) hold a CDF step.  When none holds more than one, each stores its
    *threshold*, the smallest float64 ``u`` of the slice whose token is the next one (found
    by bisection on the float64 ordering, exact), and every draw is the slice's first token
    plus ``u >= threshold``: no branch and no host sync.  Otherwise draws on such slices
    gather their CDF rows and count, in cache-sized chunks.  Either way the token is exactly
    that of the formula above.  (Thresholds for slices of several steps would cost more per
    draw than the counting fallback: a draw gathers every threshold of its slice.)
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
        self.guide = self.thresholds = None
        self.unambiguous = False
        if C * slices <= self.MAX_GUIDE and C * slices * V <= self.MAX_GUIDE_WORK:
            edges = torch.arange(slices + 1, dtype=torch.float64) / slices  # (G+1,) exact
            u_low = edges[:-1].repeat(C)  # (C*G,) first u of each slice
            u_high = torch.nextafter(edges[1:], torch.zeros(())).repeat(C)  # (C*G,) last u of each slice
            ctx = torch.arange(C).repeat_interleave(slices)  # (C*G,)
            low, high = self._exact(ctx, u_low), self._exact(ctx, u_high)  # (C*G,)
            steps = high - low  # (C*G,) CDF steps inside each slice
            self.unambiguous = bool((steps == 0).all())
            self.guide = torch.where(steps == 0, low, -1)  # (C*G,) the token, or -1: ambiguous slice
            if int(steps.max()) == 1:
                self.guide = low  # (C*G,) the first token of each slice
                self.thresholds = torch.full_like(u_low, 2.0)  # (C*G,) above every uniform: no step
                at = steps.nonzero().squeeze(1)  # (A,) the slices with a step
                self.thresholds[at] = self._first_reaching(ctx[at], high[at], u_low[at], u_high[at])

    def _first_reaching(self, contexts, tokens, u_low, u_high) -> torch.Tensor:
        """The smallest float64 u in [u_low, u_high] whose draw is at least ``tokens`` (reached at u_high).

        Bisection on the bit patterns, which order non-negative float64 values as their values.
        """
        low, high = u_low.view(torch.int64).clone(), u_high.view(torch.int64).clone()  # (n,) each
        while bool((low < high).any()):
            mid = low + (high - low) // 2  # (n,)
            reached = self._exact(contexts, mid.view(torch.float64)) >= tokens  # (n,)
            high = torch.where(reached, mid, high)
            low = torch.where(reached, low, torch.minimum(mid + 1, high))
        return low.view(torch.float64)

    def _exact(self, contexts: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
        """Token ``#{j : cdf[c, j] <= x}`` per draw (contexts (n,), u (n,) float64)."""
        n, V = contexts.numel(), self.cdf.shape[1]
        x = torch.minimum(u * self.total.index_select(0, contexts), self.cap.index_select(0, contexts))  # (n,)
        step = chunk_rows(n, V, "cpu")
        if step >= n:  # one cached chunk
            return search_cdf(self.cdf.index_select(0, contexts), x[:, None])  # (n,)
        out = torch.empty(n, dtype=torch.long)  # (n,)
        for start in range(0, n, step):
            stop = min(start + step, n)
            rows = self.cdf.index_select(0, contexts[start:stop])  # (m, V) cached chunk
            out[start:stop] = search_cdf(rows, x[start:stop, None])
        return out

    def __call__(self, contexts: torch.Tensor, *, generator: torch.Generator) -> torch.Tensor:
        u = uniform((*contexts.shape, 1), generator=generator).view(-1)  # (n,) one uniform per draw
        return self.draw(contexts.reshape(-1), u).view(contexts.shape)

    def slice_of(self, u: torch.Tensor) -> torch.Tensor | None:
        """``floor(u * G)`` (exact) of uniforms of any shape, or None without a guide table."""
        return None if self.guide is None else (u * self.slices).long()

    def draw(
        self,
        contexts: torch.Tensor,
        u: torch.Tensor,
        slices: torch.Tensor | None = None,
        out: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """The tokens of contexts (n,) for the uniforms u (n,) float64; ``slices``: their :meth:`slice_of`.

        ``out``: a contiguous (n,) long tensor to write them into.
        """
        if self.guide is None:
            tokens = self._exact(contexts, u)  # (n,)
            return tokens if out is None else out.copy_(tokens)
        if slices is None:
            slices = (u * self.slices).long()  # (n,) floor(u * G), exact
        if out is None:
            out = torch.empty(contexts.numel(), dtype=torch.long)  # (n,)
        at = torch.add(slices, contexts, alpha=self.slices)  # (n,) the slice of each draw
        tokens = torch.index_select(self.guide, 0, at, out=out)  # (n,)
        if self.thresholds is not None:  # the first token of the slice, plus one from its threshold on
            return tokens.add_(u >= self.thresholds.index_select(0, at))
        if self.unambiguous:
            return tokens
        ambiguous = (tokens < 0).nonzero().squeeze(1)  # (a,)
        if ambiguous.numel():  # index_select / index_copy_: several times cheaper than advanced indexing
            exact = self._exact(contexts.index_select(0, ambiguous), u.index_select(0, ambiguous))  # (a,)
            tokens.index_copy_(0, ambiguous, exact)
        return tokens


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


class _Transitions:
    """``model.next_context`` as one gather from its precomputed ``(C*V,)`` table (when small).

    The table holds ``next_context(c, x)`` for every context c and token x, so a lookup
    returns exactly what the model computes; token-independent models (a clamp) and large
    tables call the model.  When every row of the table is the same -- the next context is a
    function of the last token alone, as for a first-order Markov model -- ``last_token``
    holds that ``(V,)`` row, and a lookup needs no context.
    """

    MAX_CELLS = 1 << 22

    def __init__(self, model: TableModel, K: int):
        self.model = model
        self.token_independent = model.token_independent
        C, V = model.num_contexts, model.vocab_size
        self.V = V
        self.table = self.advance = self.last_token = None
        if not model.token_independent and C * V <= self.MAX_CELLS:
            contexts = torch.arange(C).repeat_interleave(V)  # (C*V,)
            self.table = model.next_context(contexts, torch.arange(V).repeat(C)).contiguous()  # (C*V,)
            rows = self.table.view(C, V)  # (C, V)
            if bool((rows == rows[0]).all()):
                self.last_token = rows[0].clone()  # (V,) next_context(c, x) for every c
        if model.token_independent and C * (K + 1) <= self.MAX_CELLS:
            self.advance = _walk(model, torch.arange(C), K)  # (C, K+1) context after i steps from c

    def __call__(self, contexts: torch.Tensor, tokens: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """Context after ``tokens`` (n,) from ``contexts`` (n,); tokens in [0, V).  ``out``: a contiguous (n,) long tensor."""
        if self.table is None and self.last_token is None:
            after = self.model.next_context(contexts, tokens)  # (n,)
            return after if out is None else out.copy_(after)
        if out is None:
            out = torch.empty(tokens.numel(), dtype=torch.long)  # (n,)
        if self.last_token is not None:
            return torch.index_select(self.last_token, 0, tokens, out=out)  # (n,)
        return torch.index_select(self.table, 0, torch.add(tokens, contexts, alpha=self.V), out=out)  # (n,)

    def after(self, contexts: torch.Tensor, last_j: torch.Tensor, last: torch.Tensor) -> torch.Tensor:
        """Context after each row's token ``last`` (b,), emitted at block index ``last_j`` (b, 1) of ``contexts`` (b, K+1)."""
        if self.last_token is not None:  # the token alone decides
            return self.last_token.index_select(0, last)  # (b,)
        return self(contexts.gather(1, last_j).squeeze(1), last)  # (b,)

    def sequences(self, initial: int, tokens: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor | None:
        """The context before every token of rows that start in ``initial``, tokens (B, L): (B, L), by a closed form.

        For token-independent models the contexts are the same in every row (``initial`` moved
        on t times before token t); for last-token models they are ``last_token`` of the previous
        token.  None for other models (their contexts follow the rows step by step).  ``out``:
        a (B, L) long tensor to write them into.
        """
        B, L = tokens.shape
        if not self.token_independent and self.last_token is None:
            return None
        if out is None:
            out = torch.empty(B, L, dtype=torch.long)  # (B, L)
        if self.token_independent:
            return out.copy_(_walk(self.model, torch.tensor([initial]), L - 1).expand(B, L))  # (B, L)
        out[:, 0] = initial
        # the context after each token but the last, shifted one place right
        out[:, 1:] = self.last_token.index_select(0, tokens[:, :-1].reshape(-1)).view(B, L - 1)
        return out

    def block(self, start: torch.Tensor, K: int) -> torch.Tensor:
        """Token-independent models: the contexts before K+1 positions from ``start`` (b,): (b, K+1)."""
        if self.advance is not None:
            return self.advance.index_select(0, start)  # (b, K+1)
        return _walk(self.model, start, K)


def _walk(model: TableModel, start: torch.Tensor, steps: int) -> torch.Tensor:
    """A token-independent model's contexts from ``start`` (b,) on, ``steps`` moves: (b, steps+1)."""
    out = torch.empty(start.numel(), steps + 1, dtype=torch.long)  # (b, steps+1)
    out[:, 0] = start
    for i in range(steps):
        out[:, i + 1] = model.next_context(out[:, i], out[:, i])  # the token is ignored
    return out


def _draft_block(step: _Transitions, draft_sampler, dcur: torch.Tensor, K: int, generator) -> tuple:
    """K drafts per row drawn exactly from the drafter table; ``(drafts (b, K), dctx (b, K+1))``.

    ``dctx[:, i]`` is the drafter's context before position i (the last one, after the
    K-th draft, is where the next round starts if every draft is accepted).
    """
    if step.token_independent:
        dctx = step.block(dcur, K)  # (b, K+1)
        return draft_sampler(dctx[:, :K], generator=generator), dctx  # (b, K)
    b = dcur.numel()
    # The K positions' uniforms in one call: the generator's stream is consumed in order, so
    # row i is what the i-th of K calls drawing b uniforms each would get (tested).
    u = uniform((K, b), generator=generator)  # (K, b)
    slices = draft_sampler.slice_of(u)  # (K, b) or None
    by_position = torch.empty(2 * K + 1, b, dtype=torch.long)  # (2K+1, b): K+1 contexts, then K drafts
    contexts, drafts = by_position[: K + 1], by_position[K + 1 :]  # (K+1, b), (K, b)
    contexts[0] = dcur
    for i in range(K):
        draft_sampler.draw(contexts[i], u[i], None if slices is None else slices[i], out=drafts[i])
        step(contexts[i], drafts[i], out=contexts[i + 1])
    return drafts.t(), contexts.t()  # (b, K), (b, K+1) transposed views


def last_tokens(tokens: torch.Tensor, num_emitted: torch.Tensor) -> torch.Tensor:
    """Each row's last emitted token: ``tokens[b, num_emitted[b] - 1]``, tokens (b, K+1): (b,)."""
    return tokens.gather(1, (num_emitted - 1)[:, None]).squeeze(1)


def _target_contexts(step: _Transitions, tcur: torch.Tensor, drafts: torch.Tensor) -> torch.Tensor:
    """The target's context before each of the K+1 positions of the drafted block; (b, K+1)."""
    b, K = drafts.shape
    if step.token_independent:
        return step.block(tcur, K)  # (b, K+1)
    tctx = torch.empty(b, K + 1, dtype=torch.long)  # (b, K+1)
    tctx[:, 0] = tcur
    for i in range(K):
        tctx[:, i + 1] = step(tctx[:, i], drafts[:, i])
    return tctx


class _Trials:
    """Acceptance trials of every round: in-block position, exact accept probability, outcome."""

    def __init__(self, target: TableModel, drafter: TableModel, K: int, overlap: torch.Tensor | None = None):
        """``overlap``: :func:`acceptance_overlap` of the two models, when already computed (else computed here)."""
        self.target, self.drafter, self.K = target, drafter, K
        if overlap is None:
            overlap = acceptance_overlap(target, drafter)  # (Ct, Cd) or None
        self.overlap_flat = overlap.view(-1) if overlap is not None else None  # (Ct*Cd,)
        self.ar = torch.arange(K)  # (K,)
        self.positions: list[torch.Tensor] = []
        self.accept_probs: list[torch.Tensor] = []
        self.accepted: list[torch.Tensor] = []

    def record(self, num_emitted, drafts, tctx, draft_index, last) -> None:
        """The trials of one round: a draft reached verification unless an earlier one was rejected.

        ``draft_index``: the drafter's context of each draft, ``dctx[:, :K]`` flattened row-major
        (b*K,); ``last``: each row's last emitted token (b,) (:func:`last_tokens`).
        """
        K = self.K
        last_j = (num_emitted - 1)[:, None]  # (b, 1)
        last_draft = drafts.gather(1, last_j.clamp(max=K - 1)).squeeze(1)  # (b,)
        corrected = (num_emitted > K) | (last != last_draft)  # (b,) a bonus or a correction ends the block
        accepted_n = num_emitted - corrected.long()  # (b,)
        trials_n = num_emitted.clamp(max=K)  # (b,) K after a bonus, else num_emitted
        # flat indices (row-major) of the trials: the first trials_n[b] positions of row b
        trial_at = (self.ar < trials_n[:, None]).view(-1).nonzero().squeeze(1)  # (T,)
        trial_j = trial_at % K  # (T,) in-block position - 1
        self.positions.append(trial_j + 1)
        self.accepted.append(trial_j < accepted_n.index_select(0, trial_at // K))
        if self.overlap_flat is not None:
            pair = torch.add(draft_index.view(-1, K), tctx[:, :K], alpha=self.drafter.num_contexts)  # (b, K)
            self.accept_probs.append(self.overlap_flat.index_select(0, pair.view(-1).index_select(0, trial_at)))
        else:
            trial_tctx = tctx[:, :K].reshape(-1).index_select(0, trial_at)  # (T,)
            trial_dctx = draft_index.index_select(0, trial_at)  # (T,)
            self.accept_probs.append(_overlap_rows(self.target.table, self.drafter.table, trial_tctx, trial_dctx))


class _Group:
    """One group of B rows decoded to length L: the emitted tokens and the state of unfinished rows.

    A round writes each row's (K+1)-block from the row's length on; entries past num_emitted
    are overwritten by the next round or cut at L, so every position < L ends up holding an
    emitted token and the buffer needs no initialisation.  Each token is packed with a code:
    its in-block position j (0..K), plus K+1 when the position has no draft law.  The target
    and drafter contexts of a token are functions of the row's earlier tokens (the models are
    finite-state machines, and an emitted block's tokens before the last are its drafts), so
    :meth:`columns` recomputes them once instead of writing them every round: in one lookup
    for last-token and token-independent models (:meth:`_Transitions.sequences`), else L steps
    over the rows.
    """

    def __init__(self, target: TableModel, drafter: TableModel, B: int, L: int, K: int, steps=None):
        self.target, self.drafter, self.K = target, drafter, K
        self.steps = steps or (_Transitions(target, K), _Transitions(drafter, K))
        self.W = L + K + 1
        self.L = L
        self.shift = (2 * K + 1).bit_length()  # bits of a code in [0, 2K+1]
        self.packed = torch.empty(B, self.W, dtype=torch.long)  # (B, W) token << shift | code
        self.ar = torch.arange(K + 1)  # (K+1,)
        self.bonus_codes = torch.where(self.ar < K, self.ar, self.ar + K + 1)  # (K+1,) no draft law at K+1
        self.position_of = torch.arange(2 * K + 2) % (K + 1) + 1  # (2K+2,) the block position of each code
        # State of the unfinished rows only (kept compact, in row order).
        self.lengths = torch.zeros(B, dtype=torch.long)  # (b,)
        self.offsets = torch.arange(B) * self.W  # (b,) where the next block of each row goes in packed.view(-1)
        self.tcur = torch.full((B,), target.initial_context, dtype=torch.long)  # (b,)
        self.dcur = torch.full((B,), drafter.initial_context, dtype=torch.long)  # (b,)

    @property
    def num_unfinished(self) -> int:
        """Rows still short of L tokens (the batch of the next round)."""
        return self.lengths.numel()

    def append(self, tokens, num_emitted, tctx, dctx, has_law=None, last=None) -> None:
        """Write the emitted block (tokens (b, K+1), validated, in [0, V) up to num_emitted).

        ``tctx``, ``dctx`` (b, K+1) are the target's and drafter's contexts before each
        position (they advance the rows); ``has_law`` (b, K+1) bool says which positions
        have a draft law (default: all but the bonus position K+1); ``last`` (b,) each row's
        last emitted token, when already known (:func:`last_tokens`).
        """
        K = self.K
        last_j = (num_emitted - 1)[:, None]  # (b, 1)
        if last is None:
            last = last_tokens(tokens, num_emitted)  # (b,)
        flat = torch.add(self.ar, self.offsets[:, None]).view(-1)  # (b*(K+1),) where each row's block goes
        codes = self.bonus_codes if has_law is None else torch.where(has_law, self.ar, self.ar + K + 1)
        # Distinct indices (rows own disjoint blocks), so scatter_ writes what index_copy_ would, ~2.5x faster.
        self.packed.view(-1).scatter_(0, flat, torch.add(codes, tokens, alpha=1 << self.shift).view(-1))
        self.tcur = self.steps[0].after(tctx, last_j, last)  # (b,)
        self.dcur = self.steps[1].after(dctx, last_j, last)  # (b,)
        self.offsets.add_(num_emitted)
        self.lengths.add_(num_emitted)
        unfinished = self.lengths < self.L  # (b,)
        if not bool(unfinished.all()):
            keep = unfinished.nonzero().squeeze(1)  # (b',)
            self.lengths, self.offsets = self.lengths[keep], self.offsets[keep]
            self.tcur, self.dcur = self.tcur[keep], self.dcur[keep]

    def columns(self, out) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(tokens, target contexts, draft-law contexts (-1: none), block positions)``, each (B, L).

        Written into ``out``, four contiguous (B, L) long tensors (this group's rows of a run's
        outputs, :class:`_Columns`, so that no copy is made when the groups are put together).
        Whole-buffer passes only (no ``torch.where`` with a scalar or ``masked_fill``: on CPU
        those run several times slower than a lookup or an in-place multiply).
        """
        K, L = self.K, self.L
        tokens, target_contexts, draft_contexts, positions = out
        packed = self.packed[:, :L]  # (B, L)
        torch.bitwise_right_shift(packed, self.shift, out=tokens)  # (B, L)
        codes = packed & ((1 << self.shift) - 1)  # (B, L) in [0, 2K+1]
        torch.index_select(self.position_of, 0, codes.view(-1), out=positions.view(-1))  # (B, L) in 1..K+1
        self._contexts(self.steps[0], self.target.initial_context, tokens, target_contexts)  # (B, L)
        self._contexts(self.steps[1], self.drafter.initial_context, tokens, draft_contexts)  # (B, L) >= 0
        draft_contexts.add_(1).mul_(codes <= K).sub_(1)  # -1 where the position has no draft law
        return tokens, target_contexts, draft_contexts, positions

    def _contexts(self, step, initial: int, tokens: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """The model's context before every token of each row (written into ``out`` when given): (B, L)."""
        if out is None:
            out = torch.empty_like(tokens)  # (B, L)
        if step.sequences(initial, tokens, out=out) is not None:
            return out
        by_position = tokens.t().contiguous()  # (L, B)
        contexts = torch.empty_like(by_position)  # (L, B)
        contexts[0] = initial
        for t in range(self.L - 1):
            contexts[t + 1] = step(contexts[t], by_position[t])
        return out.copy_(contexts.t())  # (B, L)


class _Columns:
    """The (R, L) outputs of a run's G groups of B rows, each group written into its rows when it finishes."""

    def __init__(self, B: int, G: int, L: int):
        self.B, self.G = B, G
        self.out = tuple(torch.empty(B * G, L, dtype=torch.long) for _ in range(4))  # 4 x (R, L)

    def add(self, g: int, group: _Group) -> None:
        """Write the columns of finished group ``g`` (cut at L) into its rows."""
        group.columns(out=tuple(o[g * self.B : (g + 1) * self.B] for o in self.out))
