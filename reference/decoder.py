"""The reference batched speculative decoder: drafting, one-pass verification, KV rollback.

Leviathan, Kalman & Matias (ICML 2023), Algorithm 1; Chen et al. (2023),
Algorithm 2.  One *round* for every active row of the batch:

1. ``_draft``: the drafter catches up on the tokens its KV cache has not seen,
   then samples K tokens autoregressively from its *processed* law q
   (the same :class:`SamplingConfig` as the target), reporting that q;
2. ``_score``: ONE target forward pass over the row's last committed token and
   the K drafts gives the K+1 processed target conditionals p_1..p_{K+1}
   (the first round also carries the prompt: it doubles as the prefill);
3. ``_verify``: :func:`reference.rules.verify` (or ``greedy_verify``) keeps the
   accepted drafts plus one residual/bonus token;
4. ``_append``: the emitted tokens are committed (each row its own count);
5. ``_rollback``: both KV caches are truncated to the committed length minus
   one (the last committed token is fed at the start of the next round);
6. ``_retire``: rows holding ``max_new_tokens`` new tokens leave the batch.

Rows are ragged: each has its own committed length ``seq_len[b]`` and its own
cache length; the model writes row b's tokens at its own slots, so rows
advance independently with no padding inside a row's context.

Invariant between rounds (correct decoder): target cache length =
``seq_len - 1``; drafter cache length <= ``seq_len - 1``.

Penalties (``SamplingConfig.repetition_penalty`` and the others): the law at a draft
position conditions on the prompt, the committed output and the drafts before that position,
for the drafter and for the target's verification alike (a rejected draft then rejects every
law after it, so the output law is the penalised target's; vLLM's sampler appends the draft
tokens to the output for the same reason).  ``_history`` gives those tokens.

Override hooks for mutants (each is a small method): ``_draft_token``,
``_draft_probs``, ``_target_probs``, ``_verify``, ``_rollback_target``,
``_rollback_drafter``, ``_draft_context``, ``_history``, ``_append``.

Shapes: B active rows, K draft length, V vocabulary, L token-buffer capacity,
W packed feed width.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specverify.core.errors import InvalidArgument
from specverify.core.sampling import sample
from specverify.core.validation import check_int
from specverify_reference.direct import CHUNK_ROW_ENTRIES, ChunkedGenerate, TargetAdapter, validate_batch_args
from specverify_reference.models import KVCache, NGramDrafter, TinyTransformer
from specverify_reference.processors import History, SamplingConfig, greedy_probs, logits_to_probs_by_rows
from specverify_reference.rules import greedy_verify, verify

__all__ = ["SpeculativeDecoder", "DecodeResult", "DecodeStats"]


@dataclass(frozen=True)
class DecodeStats:
    """Counters of one ``generate_batch`` call.

    ``drafted[i]`` counts drafts at in-block position i (0-based) that reached
    verification (all earlier drafts of the block accepted); ``accepted[i]``
    those accepted.  ``row_rounds`` is the number of per-row target passes.
    """

    k: int
    rounds: int
    row_rounds: int
    tokens_generated: int
    tokens_kept: int
    drafted: tuple[int, ...]
    accepted: tuple[int, ...]

    @property
    def acceptance_rate(self) -> tuple[float, ...]:
        """P(draft i accepted | drafts before it accepted), per in-block position."""
        return tuple(a / d if d else float("nan") for a, d in zip(self.accepted, self.drafted))

    @property
    def mean_accepted(self) -> float:
        """Mean number of accepted drafts per row and round."""
        return sum(self.accepted) / self.row_rounds

    @property
    def tokens_per_pass(self) -> float:
        """Mean tokens emitted per target pass (``mean_accepted + 1``, before truncation)."""
        return self.tokens_generated / self.row_rounds

    @property
    def target_passes_per_token(self) -> float:
        """Per-row target passes per kept output token (1.0 for plain decoding)."""
        return self.row_rounds / self.tokens_kept


@dataclass(frozen=True)
class DecodeResult:
    """``tokens``: (B, max_new_tokens) long new tokens per prompt row; ``stats``: :class:`DecodeStats`."""

    tokens: torch.Tensor
    stats: DecodeStats


class _State:
    """Mutable per-call state of the active rows (compacted as rows finish)."""

    def __init__(
        self, prompts: torch.Tensor, max_new_tokens: int, k: int, target_cache: KVCache, draft_cache: KVCache | None
    ):
        B, T = prompts.shape
        device = prompts.device
        self.prompt_len = T
        self.max_new_tokens = max_new_tokens
        self.seq = torch.zeros(B, T + max_new_tokens + k + 1, dtype=torch.long, device=device)  # (B, L)
        self.seq[:, :T] = prompts
        self.seq_len = torch.full((B,), T, dtype=torch.long, device=device)  # (B,) committed lengths
        self.rows = torch.arange(B, device=device)  # (B,) original row of each active row
        self.target_cache = target_cache
        self.draft_cache = draft_cache
        self.out = torch.zeros(B, max_new_tokens, dtype=torch.long, device=device)  # (B_all, max_new)
        self.drafted = torch.zeros(k, dtype=torch.long, device=device)  # (K,)
        self.accepted = torch.zeros(k, dtype=torch.long, device=device)  # (K,)
        self.rounds = 0
        self.row_rounds = 0
        self.tokens_generated = 0

    def select(self, keep: torch.Tensor) -> None:
        idx = keep.nonzero().squeeze(1)  # (B',)
        self.seq, self.seq_len, self.rows = self.seq[idx], self.seq_len[idx], self.rows[idx]
        self.target_cache.select(idx)
        if self.draft_cache is not None:
            self.draft_cache.select(idx)


def _outputs(state: _State, done: dict[int, torch.Tensor], B: int) -> list[torch.Tensor]:
    """Every row's new tokens so far (at most ``max_new_tokens``); ``done`` keeps retired rows' outputs."""
    T, N = state.prompt_len, state.max_new_tokens
    for b, row in enumerate(state.rows.tolist()):
        done[row] = state.seq[b, T : min(int(state.seq_len[b]), T + N)]
    return [done[row] for row in range(B)]


def _pack(seq: torch.Tensor, start: torch.Tensor, stop: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-align the ragged slices ``seq[b, start[b]:stop[b]]`` into (B, W); pad by repeating the last token."""
    count = stop - start  # (B,)
    W = int(count.max())
    idx = start[:, None] + torch.arange(W, device=seq.device)  # (B, W)
    idx = torch.minimum(idx, (stop - 1)[:, None])  # (B, W) padding repeats the last valid token
    return seq.gather(1, idx), count  # (B, W), (B,)


class SpeculativeDecoder(ChunkedGenerate):
    """Batched speculative decoding of ``target`` with ``drafter``.

    Parameters
    ----------
    target : TinyTransformer
    drafter : TinyTransformer or NGramDrafter
        A model drafter (own KV cache, processed law q) or a deterministic one.
    k : int
        Draft length K >= 1.
    sampling : SamplingConfig
        Processors applied identically to the target and the (model) drafter.
    greedy : bool
        Greedy verification (:func:`reference.rules.greedy_verify`); the
        drafter then proposes its argmax.
    max_batch : int
        ``generate`` splits ``num_samples`` into batches of at most this size.
    """

    def __init__(
        self,
        target: TinyTransformer,
        drafter,
        *,
        k: int,
        sampling: SamplingConfig = SamplingConfig(),
        greedy: bool = False,
        max_batch: int = 65536,
    ):
        if not isinstance(target, TinyTransformer):
            raise InvalidArgument(f"target must be a TinyTransformer, got {type(target).__name__}")
        if not isinstance(drafter, (TinyTransformer, NGramDrafter)):
            raise InvalidArgument(f"drafter must be a TinyTransformer or NGramDrafter, got {type(drafter).__name__}")
        if drafter.vocab_size != target.vocab_size:
            raise InvalidArgument(f"drafter vocab_size {drafter.vocab_size} != target vocab_size {target.vocab_size}")
        if not isinstance(sampling, SamplingConfig):
            raise InvalidArgument(f"sampling must be a SamplingConfig, got {sampling!r}")
        self.target = target
        self.drafter = drafter
        self.k = check_int("k", k, minimum=1)
        self.sampling = sampling
        self.greedy = bool(greedy)
        self.max_batch = check_int("max_batch", max_batch, minimum=1)
        self.vocab_size = target.vocab_size
        self.device = target.device

    def target_adapter(self) -> TargetAdapter:
        """The target protocol (exact processed conditionals) for this decoder's target and sampling."""
        return TargetAdapter(self.target, self.sampling)

    # ---------------------------------------------------------------- public API (generate: ChunkedGenerate)
    def generate_batch(
        self, prompts: torch.Tensor, max_new_tokens: int, *, generator: torch.Generator, on_step=None
    ) -> DecodeResult:
        """Decode ``max_new_tokens`` new tokens for every row of ``prompts`` (B, T).

        ``on_step(outputs)``, if given, is called after every round with each row's new tokens so
        far (a list of B one-dimensional tensors, at most ``max_new_tokens`` each): a server streams
        or paces its replies with it; it never changes the tokens.
        """
        max_new_tokens = validate_batch_args(prompts, max_new_tokens, generator, self.vocab_size, self.device)
        B, T = prompts.shape
        prompts = prompts.to(self.device).long()
        capacity = T + max_new_tokens + 2 * self.k + 2
        state = _State(
            prompts,
            max_new_tokens,
            self.k,
            self.target.new_cache(B, capacity=capacity),
            self.drafter.new_cache(B, capacity=capacity) if isinstance(self.drafter, TinyTransformer) else None,
        )
        done: dict[int, torch.Tensor] = {}
        while state.rows.numel():
            self._round(state, generator)
            if on_step is not None:
                on_step(_outputs(state, done, B))
            self._retire(state)
        stats = DecodeStats(
            k=self.k,
            rounds=state.rounds,
            row_rounds=state.row_rounds,
            tokens_generated=state.tokens_generated,
            tokens_kept=B * max_new_tokens,
            drafted=tuple(state.drafted.tolist()),
            accepted=tuple(state.accepted.tolist()),
        )
        return DecodeResult(tokens=state.out, stats=stats)

    # ---------------------------------------------------------------- one round
    def _round(self, state: _State, generator: torch.Generator) -> None:
        """Draft K, score K+1 in one target pass, verify, commit, roll back."""
        draft_tokens, draft_probs = self._draft(state, generator)  # (B, K) long, (B, K, V)
        target_probs = self._score(state, draft_tokens)  # (B, K+1, V)
        tokens, num_emitted = self._verify(target_probs, draft_probs, draft_tokens, generator)  # (B, K+1), (B,)
        self._append(state, tokens, num_emitted)
        self._rollback(state)
        self._count(state, num_emitted)

    # ---- 1. drafting
    def _draft_context(self, state: _State) -> tuple[torch.Tensor, torch.Tensor]:
        """The committed tokens the drafter conditions on: ``seq`` (B, L), ``seq_len`` (B,)."""
        return state.seq, state.seq_len

    def _draft(self, state: _State, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        """K draft tokens (B, K) and the laws they were drawn from (B, K, V)."""
        seq, seq_len = self._draft_context(state)  # (B, L), (B,)
        if isinstance(self.drafter, NGramDrafter):
            return self.drafter.propose(seq, seq_len, self.k)  # (B, K), (B, K, V) one-hot
        cache = state.draft_cache
        assert cache is not None  # a model drafter always has a cache
        # Catch up: feed the committed tokens the drafter's cache lacks (ragged, >= 1 per row).
        start = torch.minimum(cache.lengths, seq_len - 1)  # (B,)
        feed, count = _pack(seq, start, seq_len)  # (B, W), (B,)
        logits = self.drafter(feed, cache, num_valid=count, head_at=(count - 1)[:, None])[
            :, 0
        ]  # (B, V) at the last committed token
        tokens = torch.empty(logits.shape[0], self.k, dtype=torch.long, device=logits.device)  # (B, K)
        probs = None  # (B, K, V), filled step by step (no list of K laws and a stacked copy)
        for i in range(self.k):
            history = self._step_history(state, tokens[:, :i])
            token, reported = self._draft_token(logits, generator, history)  # (B,), (B, V)
            if probs is None:
                probs = reported.new_empty(reported.shape[0], self.k, reported.shape[1])
            tokens[:, i], probs[:, i] = token, reported
            del reported
            if i + 1 < self.k:
                logits = self.drafter(token[:, None], cache)[:, 0]  # (B, V)
        assert probs is not None  # k >= 1
        return tokens, probs

    def _draft_probs(self, logits: torch.Tensor, history: History | None = None) -> torch.Tensor:
        """The drafter's processed law from its logits: (B, V) -> (B, V) float64 (in blocks, as the target's),
        written over float64 logits (which the caller no longer needs)."""
        rows = max(1, CHUNK_ROW_ENTRIES // self.vocab_size)
        return logits_to_probs_by_rows(logits, self.sampling, rows=rows, overwrite=True, history=history)

    def _draft_token(
        self, logits: torch.Tensor, generator: torch.Generator, history: History | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Sample one draft token per row; return it (B,) and the law it was drawn from (B, V)."""
        draft_probs = self._draft_probs(logits, history)  # (B, V)
        if self.greedy:
            draft_probs = greedy_probs(draft_probs)  # (B, V) the drafter proposes its argmax
        return sample(draft_probs, generator=generator, check=False), draft_probs

    # ---- 2. one target pass over the last committed token + K drafts
    def _score(self, state: _State, draft_tokens: torch.Tensor) -> torch.Tensor:
        """Processed target conditionals at the K draft positions and the bonus position: (B, K+1, V)."""
        K = self.k
        cache = state.target_cache
        ext = state.seq.clone()  # (B, L) committed tokens, then the drafts written after them
        ext.scatter_(1, state.seq_len[:, None] + torch.arange(K, device=ext.device), draft_tokens)
        # Tokens the cache lacks (normally just the last committed one; the prompt in round 1), then the drafts.
        start = torch.minimum(cache.lengths, state.seq_len - 1)  # (B,)
        feed, count = _pack(ext, start, state.seq_len + K)  # (B, W), (B,)
        first = count - (K + 1)  # (B,) index of the last committed token in the feed
        idx = first[:, None] + torch.arange(K + 1, device=ext.device)  # (B, K+1)
        logits = self.target(feed, cache, num_valid=count, head_at=idx)  # (B, K+1, V)
        history = None
        if self.sampling.needs_history:
            tokens, end = self._history(state, draft_tokens)  # (B, H), (B,)
            history = History(tokens, state.prompt_len, end[:, None] + torch.arange(K + 1, device=end.device))
        return self._target_probs(logits, history)

    # ---- the tokens a penalised law conditions on
    def _history(self, state: _State, drafts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The prompt, the committed output and then ``drafts`` (B, m): tokens (B, H) and where the
        drafts start (B,); the law at draft position i conditions on ``tokens[:, :start + i]``."""
        tokens = state.seq.clone()  # (B, L)
        if drafts.shape[1]:
            tokens.scatter_(1, state.seq_len[:, None] + torch.arange(drafts.shape[1], device=tokens.device), drafts)
        return tokens, state.seq_len

    def _step_history(self, state: _State, drafts: torch.Tensor) -> History | None:
        """The history of the next draft token's law (None without penalties)."""
        if not self.sampling.needs_history:
            return None
        tokens, start = self._history(state, drafts)
        return History(tokens, state.prompt_len, (start + drafts.shape[1])[:, None])

    def _target_probs(self, logits: torch.Tensor, history: History | None = None) -> torch.Tensor:
        """The target's processed conditionals: (B, K+1, V) logits -> (B, K+1, V) float64.

        Processed in blocks of :data:`CHUNK_ROW_ENTRIES` entries, written over float64 logits (the
        same numbers): a batch of generate_batch's own size, as a batch-invariance test asks for,
        then holds one (B, K+1, V) tensor, with the processors' temporaries per block.
        """
        rows = max(1, CHUNK_ROW_ENTRIES // self.vocab_size)
        return logits_to_probs_by_rows(logits, self.sampling, rows=rows, overwrite=True, history=history)

    # ---- 3. verification
    def _verify(self, target_probs, draft_probs, draft_tokens, generator):
        """Canonical chain verification: (B, K+1, V), (B, K, V), (B, K) -> tokens (B, K+1), num_emitted (B,)."""
        if self.greedy:
            return greedy_verify(target_probs, draft_tokens, check=False)
        return verify(target_probs, draft_probs, draft_tokens, generator=generator, check=False)

    # ---- 4. commit
    def _append(self, state: _State, tokens: torch.Tensor, num_emitted: torch.Tensor) -> None:
        """Write the first ``num_emitted[b]`` of ``tokens[b]`` (B, K+1) after each row's committed tokens."""
        idx = state.seq_len[:, None] + torch.arange(self.k + 1, device=tokens.device)  # (B, K+1)
        valid = torch.arange(self.k + 1, device=tokens.device) < num_emitted[:, None]  # (B, K+1)
        state.seq.scatter_(1, idx, torch.where(valid, tokens, state.seq.gather(1, idx)))
        state.seq_len = state.seq_len + num_emitted  # (B,)

    # ---- 5. rollback
    def _rollback(self, state: _State) -> None:
        """Drop cached keys/values of rejected drafts (and of the uncommitted last token)."""
        self._rollback_target(state)
        if state.draft_cache is not None:
            self._rollback_drafter(state)

    def _rollback_target(self, state: _State) -> None:
        cache = state.target_cache
        assert cache is not None  # rollback runs only for a decoder with a target cache
        cache.truncate(torch.minimum(cache.lengths, state.seq_len - 1))

    def _rollback_drafter(self, state: _State) -> None:
        cache = state.draft_cache
        assert cache is not None  # rollback runs only for a decoder with a draft cache
        cache.truncate(torch.minimum(cache.lengths, state.seq_len - 1))

    # ---- 6. bookkeeping
    def _count(self, state: _State, num_emitted: torch.Tensor) -> None:
        num_accepted = num_emitted - 1  # (B,)
        pos = torch.arange(self.k, device=num_emitted.device)  # (K,)
        state.drafted += (num_accepted[:, None] >= pos).sum(0)  # (K,)
        state.accepted += (num_accepted[:, None] > pos).sum(0)  # (K,)
        state.rounds += 1
        state.row_rounds += num_emitted.shape[0]
        state.tokens_generated += int(num_emitted.sum())

    def _retire(self, state: _State) -> None:
        """Copy finished rows' first ``max_new_tokens`` new tokens to the output; drop them from the batch."""
        T, N = state.prompt_len, state.max_new_tokens
        done = state.seq_len - T >= N  # (B,)
        if bool(done.any()):
            state.out[state.rows[done]] = state.seq[done, T : T + N]
            state.select(~done)
