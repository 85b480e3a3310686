"""Drive full speculative decoding around a verifier under test, on table models.

One *round* for every unfinished row: draft K tokens exactly from the drafter
table (:func:`specverify.core.sampling.sample`), gather the target rows p_1..p_{K+1}
for the drafted prefix, call the verifier, validate its output
(:func:`validate_verifier_output`), append the emitted tokens.  Rows advance
independently (per-row lengths into a ``(B, L+K+1)`` buffer) until every row
holds L tokens; the batch of one verify call is the set of unfinished rows of a
group.  Model contexts are tracked incrementally, so for table models a round is
gathers plus the verifier: no Python loop over rows (the pieces of a round are in
:mod:`specverify.verifier.rounds`; per-token contexts are rebuilt once per group).

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

import threading
import time
from dataclasses import dataclass, field

import torch

from specverify.core.devices import check_device
from specverify.core.errors import InvalidArgument
from specverify.core.tables import TableModel
from specverify.core.validation import check_generator, check_int
from specverify.protocols.chain import call_verifier, check_determinism, validate_verifier_output
from specverify.verifier.rounds import (
    _Columns,
    _ContextSampler,
    _draft_block,
    _Group,
    _target_contexts,
    _Transitions,
    _Trials,
    acceptance_overlap,
    last_tokens,
)

__all__ = [
    "HarnessRun",
    "HarnessSetup",
    "harness_setup",
    "run_harness",
    "validate_verifier_output",
    "call_verifier",
    "acceptance_overlap",
    "sample_contexts",
]


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

    The inverse CDF of :func:`specverify.core.sampling.sample` with the per-context
    cumulative sums computed once: the same float64 CDF, one uniform per draw scaled
    by the row total (capped below it), ``searchsorted(right=True)`` so that a token of
    weight 0 is never returned.
    """
    return _ContextSampler(cdf_table)(contexts, generator=generator)


@dataclass(frozen=True)
class HarnessSetup:
    """What :func:`run_harness` precomputes from its models, built once by :func:`harness_setup`.

    Everything here depends only on the two models, K, the verifier's dtype and device, so the
    runs of one scenario's groups (each its own :func:`run_harness` call, seeded per group)
    share one.

    Attributes
    ----------
    target, drafter : TableModel
        The models it was built for (compared by identity).
    k : int
    verifier_dtype : torch.dtype
    device : torch.device
    draft_sampler : _ContextSampler
        Exact draws from the drafter's rows (their float64 CDFs, as
        :func:`specverify.core.sampling.sample` computes them).
    steps : tuple of two _Transitions
        Context transitions of the target and the drafter.
    target_table, draft_table : Tensor (Ct, V), (Cd, V)
        The tables in ``verifier_dtype``, on ``device``.
    overlap : Tensor (Ct, Cd) float64 or None
        ``sum_x min(p, q)`` per context pair (:func:`acceptance_overlap`), None when too large.
    buffers : threading.local
        Per thread, the reused CPU buffers of the tensors handed to the verifier
        (:class:`_ReusedBuffer`), so that the runs of one scenario's groups in a thread share them.
    """

    target: TableModel
    drafter: TableModel
    k: int
    verifier_dtype: torch.dtype
    device: torch.device
    draft_sampler: _ContextSampler
    steps: tuple[_Transitions, _Transitions]
    target_table: torch.Tensor
    draft_table: torch.Tensor
    overlap: torch.Tensor | None
    buffers: threading.local = field(default_factory=threading.local, compare=False, repr=False)

    def reused_buffers(self) -> tuple[_ReusedBuffer, _ReusedBuffer, _ReusedBuffer]:
        """This thread's buffers for the target rows, the draft rows and the drafted tokens."""
        local = self.buffers
        if not hasattr(local, "target"):
            local.target = _ReusedBuffer(self.target_table.dtype)
            local.draft = _ReusedBuffer(self.draft_table.dtype)
            local.tokens = _ReusedBuffer(torch.long)
        return local.target, local.draft, local.tokens

    def check_matches(self, target, drafter, k: int, verifier_dtype, device: torch.device) -> None:
        """Raise :class:`InvalidArgument` unless this setup was built for these models and options."""
        built = (self.target, self.drafter, self.k, self.verifier_dtype, self.device)
        given = (target, drafter, k, verifier_dtype, device)
        names = ("target", "drafter", "k", "verifier_dtype", "device")
        for name, mine, theirs in zip(names, built, given):
            same = mine is theirs if name in ("target", "drafter") else mine == theirs
            if not same:
                shown = "another model" if name in ("target", "drafter") else repr(theirs)
                raise InvalidArgument(f"setup was built for a different {name} (got {shown}, built for {mine!r})")


def harness_setup(
    target: TableModel, drafter: TableModel, *, k: int, verifier_dtype: torch.dtype = torch.float32, device=None
) -> HarnessSetup:
    """The :class:`HarnessSetup` of :func:`run_harness` for these models and options (see there)."""
    K = check_int("k", k, minimum=1)
    if drafter.vocab_size != target.vocab_size:
        raise ValueError(f"drafter vocabulary {drafter.vocab_size} != target vocabulary {target.vocab_size}")
    dev = check_device("device", device)
    t_tab = target.table32 if verifier_dtype == torch.float32 else target.table.to(verifier_dtype)  # (Ct, V)
    d_tab = drafter.table32 if verifier_dtype == torch.float32 else drafter.table.to(verifier_dtype)  # (Cd, V)
    return HarnessSetup(
        target=target,
        drafter=drafter,
        k=K,
        verifier_dtype=verifier_dtype,
        device=dev,
        draft_sampler=_ContextSampler(torch.cumsum(drafter.table, -1)),
        steps=(_Transitions(target, K), _Transitions(drafter, K)),
        target_table=t_tab.to(dev),  # (Ct, V) once on the device
        draft_table=d_tab.to(dev),  # (Cd, V)
        overlap=acceptance_overlap(target, drafter),
    )


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
        self.buffer: torch.Tensor | None = None

    def _unshared(self, buffer: torch.Tensor) -> bool:
        use_count = getattr(torch._C, "_storage_Use_Count", None)
        if use_count is None:
            return False
        # our tensor and the temporary storage handle hold two references
        return use_count(buffer.untyped_storage()._cdata) == 2

    def take(self, shape) -> torch.Tensor:
        """A contiguous tensor of ``shape`` (contents undefined)."""
        numel = 1
        for size in shape:
            numel *= size
        buffer = self.buffer
        if buffer is None or buffer.numel() < numel or not self._unshared(buffer):
            buffer = self.buffer = torch.empty(numel, dtype=self.dtype)
        return buffer[:numel].view(shape)


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
    setup: HarnessSetup | None = None,
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
    setup : HarnessSetup, optional
        The precomputed tables of these models, ``k``, ``verifier_dtype`` and ``device``
        (:func:`harness_setup`), shared by the runs of one scenario's groups; built here when
        omitted.  A run's output does not depend on whether it is passed.

    Raises
    ------
    ImplementationError
        when the verifier raises or violates its protocol.
    InvalidArgument
        when ``setup`` was built for other models or options.
    """
    K = check_int("k", k, minimum=1)
    B = check_int("batch_size", batch_size, minimum=1)
    L = check_int("length", length, minimum=1)
    G = check_int("num_groups", num_groups, minimum=1)
    check_generator("generator", generator)
    V = target.vocab_size
    dev = check_device("device", device)
    if setup is None:  # checks that the vocabularies agree
        setup = harness_setup(target, drafter, k=K, verifier_dtype=verifier_dtype, device=dev)
    else:
        setup.check_matches(target, drafter, K, verifier_dtype, dev)
    seeds = torch.randint(0, 2**62, (3,), generator=generator).tolist()
    on_cpu = dev.type == "cpu"
    draft_gen = torch.Generator().manual_seed(seeds[0])
    verify_gen = torch.Generator(device=dev).manual_seed(seeds[1])
    draft_sampler, steps, t_tab, d_tab = setup.draft_sampler, setup.steps, setup.target_table, setup.draft_table
    target_buffer, draft_buffer, drafts_buffer = setup.reused_buffers()
    trials = _Trials(target, drafter, K, overlap=setup.overlap)
    start = time.perf_counter()
    columns, num_calls = _Columns(B, G, L), 0
    for g in range(G):
        group = _Group(target, drafter, B, L, K, steps=steps)
        while b := group.num_unfinished:
            drafts, dctx = _draft_block(steps[1], draft_sampler, group.dcur, K, draft_gen)  # (b, K), (b, K+1)
            tctx = _target_contexts(steps[0], group.tcur, drafts)  # (b, K+1)
            draft_index = dctx[:, :K].reshape(-1)  # (b*K,) the drafter's context of each draft, row-major
            if on_cpu:
                target_probs = target_buffer.take((b, K + 1, V))  # (b, K+1, V)
                torch.index_select(t_tab, 0, tctx.view(-1), out=target_probs.view(b * (K + 1), V))
                draft_probs = draft_buffer.take((b, K, V))  # (b, K, V)
                torch.index_select(d_tab, 0, draft_index, out=draft_probs.view(b * K, V))
                dev_drafts = drafts_buffer.take((b, K)).copy_(drafts)  # (b, K) the verifier's own copy
            else:  # one host-to-device copy of the contexts and drafts, gathers on the device
                moved = torch.cat([tctx.view(-1), draft_index, drafts.reshape(-1)]).to(dev)  # (b*(3K+1),)
                n_t, n_d = b * (K + 1), b * K
                target_probs = t_tab.index_select(0, moved[:n_t]).view(b, K + 1, V)  # (b, K+1, V)
                draft_probs = d_tab.index_select(0, moved[n_t : n_t + n_d]).view(b, K, V)  # (b, K, V)
                dev_drafts = moved[n_t + n_d :].view(b, K)  # (b, K) the verifier's own copy
            if num_calls == 0 and determinism_rows > 0:
                r = min(b, determinism_rows)
                check_determinism(
                    verify, target_probs[:r], draft_probs[:r], dev_drafts[:r].clone(), seed=seeds[2] % 2**63
                )
            tokens, num_emitted = call_verifier(verify, target_probs, draft_probs, dev_drafts, generator=verify_gen)
            del target_probs, draft_probs, dev_drafts
            num_calls += 1
            last = last_tokens(tokens, num_emitted)  # (b,)
            trials.record(num_emitted, drafts, tctx, draft_index, last)
            group.append(tokens, num_emitted, tctx, dctx, last=last)
        columns.add(g, group)
    return collect_run(columns, trials.positions, trials.accept_probs, trials.accepted, K, num_calls, start)


def collect_run(columns: _Columns, positions, accept_probs, accepted, K: int, num_calls: int, start: float):
    """The :class:`HarnessRun` of a run's columns (every group added) and the trials' lists."""
    tokens, target_contexts, draft_contexts, block_positions = columns.out  # (R, L) each
    B, L = columns.B, tokens.shape[1]
    return HarnessRun(
        tokens=tokens,
        target_contexts=target_contexts,
        draft_contexts=draft_contexts,
        block_positions=block_positions,
        trial_positions=torch.cat(positions),
        trial_accept_probs=torch.cat(accept_probs),
        trial_accepted=torch.cat(accepted),
        k=K,
        batch_size=B,
        num_groups=columns.G,
        length=L,
        num_calls=num_calls,
        seconds=time.perf_counter() - start,
    )
