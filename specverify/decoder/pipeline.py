"""A plain speculative decoder assembled from the design's protocol objects only.

:class:`ProtocolDecoder` glues a drafter (``draft(prefix (B, T), k, *, generator) ->
(tokens (B, k), probs (B, k, V))``), a target (``next_token_probs(prefix (B, T)) ->
(B, V)``) and a verifier (``verify(target_probs (B, K+1, V), draft_probs (B, K, V),
draft_tokens (B, K), *, generator) -> (tokens (B, K+1), num_emitted (B,))``) into a
decoder with the design's ``generate(prompt (T,), *, num_samples, max_new_tokens,
seed) -> (num_samples, max_new_tokens)`` protocol, so that a drafter can be audited
end to end with :func:`specverify.decoder.check_decoder` (Leviathan, Kalman &
Matias, ICML 2023, Algorithm 1; Chen et al. 2023, Algorithm 2).

No KV cache: every round recomputes the target's K+1 conditionals from the full
prefixes -- K+1 calls of ``next_token_probs``, or one call of the optional batched
extension ``conditionals(sequences (B, S), start) -> (B, S - start, V)`` (the law of
token j given tokens before j, as :func:`specverify.decoder.check_decoder`
uses it) when the target has one.  Rows advance
independently, each keeping its own committed length.  The protocols take
rectangular prefixes, so each sweep groups the active rows by committed length and
runs one round per group, groups in increasing length, one generator for the whole
call: the same seed gives the same output.

While decoding it records what the efficiency analysis needs (:class:`PipelineStats`):
per in-block position the drafts that reached verification and those accepted, the
exact per-trial acceptance probability ``sum_x min(p(x), q(x))`` of every trial (from
the drafter's *reported* q and the target's p), the law of the accepted length of
each round given its drafts (``prod_{i<j} r_i (1 - r_j)`` with
``r_i = min(1, p_i(x_i) / q_i(x_i))``), accepted-length counts and target passes.

Accepted drafts are counted as the leading emitted tokens equal to the drafts (at
most K and at most ``num_emitted``): for the canonical rule that is
``num_emitted - 1`` (its residual never re-emits the rejected token, which has
residual mass 0), and it stays right for verifiers that emit no bonus token.

Shapes: N samples, B rows of a group, K draft length, V vocabulary, T prefix tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from specverify.core.devices import check_device, check_prob_dtype
from specverify.core.errors import ImplementationError, InvalidArgument, raised
from specverify.core.validation import check_int, check_tokens
from specverify_reference.rules import verify as canonical_verify

__all__ = [
    "ProtocolDecoder",
    "PipelineStats",
    "PipelineResult",
    "merge_stats",
    "check_drafter_output",
    "acceptance_overlap",
    "length_law",
]


@dataclass(frozen=True)
class PipelineStats:
    """Counters of one or more decoding calls (see the module docstring).

    Attributes
    ----------
    k : int
        Draft length K.
    rounds : int
        Per-row target passes (one verification round of one row = one target pass).
    tokens_generated : int
        Tokens emitted by the verifier over all rounds (before truncation to ``max_new_tokens``).
    tokens_kept : int
        Output tokens (``num_samples * max_new_tokens``).
    drafted, accepted : tuple of int (K,)
        Drafts at in-block position i (0-based) that reached verification, and those accepted.
    accept_probs : tuple of ndarray (K,)
        Position i: the exact acceptance probability ``sum_x min(p, q)`` of every trial at i.
    length_counts : tuple of int (K+1,)
        Rounds that accepted 0..K drafts.
    length_probs_sum : tuple of float (K+1,)
        Sum over rounds of the law of the accepted length given the round's drafts.
    """

    k: int
    rounds: int = 0
    tokens_generated: int = 0
    tokens_kept: int = 0
    drafted: tuple = ()
    accepted: tuple = ()
    accept_probs: tuple = ()
    length_counts: tuple = ()
    length_probs_sum: tuple = ()

    @property
    def acceptance_rate(self) -> tuple[float, ...]:
        """Observed P(draft i accepted | drafts before it accepted), per in-block position."""
        return tuple(a / d if d else float("nan") for a, d in zip(self.accepted, self.drafted))

    @property
    def expected_acceptance_rate(self) -> tuple[float, ...]:
        """Mean of the exact per-trial acceptance probabilities, per in-block position."""
        return tuple(float(p.mean()) if p.size else float("nan") for p in self.accept_probs)

    @property
    def mean_accepted(self) -> float:
        """Observed mean number of accepted drafts per round."""
        return sum(self.accepted) / self.rounds if self.rounds else float("nan")

    @property
    def expected_mean_accepted(self) -> float:
        """Compensator of :attr:`mean_accepted`: sum of the exact trial probabilities per round."""
        return sum(float(p.sum()) for p in self.accept_probs) / self.rounds if self.rounds else float("nan")

    @property
    def tokens_per_pass(self) -> float:
        """Tokens emitted per target pass (before truncation)."""
        return self.tokens_generated / self.rounds if self.rounds else float("nan")

    @property
    def target_passes_per_token(self) -> float:
        """Target passes per kept output token (1.0 for plain autoregressive decoding)."""
        return self.rounds / self.tokens_kept if self.tokens_kept else float("nan")


def merge_stats(parts) -> PipelineStats:
    """Sum the counters of several :class:`PipelineStats` with the same K."""
    parts = list(parts)
    if not parts:
        raise InvalidArgument("parts must hold at least one PipelineStats, got none")
    k = parts[0].k
    if any(p.k != k for p in parts):
        raise InvalidArgument(f"parts must share one draft length, got {[p.k for p in parts]}")
    return PipelineStats(
        k=k,
        rounds=sum(p.rounds for p in parts),
        tokens_generated=sum(p.tokens_generated for p in parts),
        tokens_kept=sum(p.tokens_kept for p in parts),
        drafted=tuple(int(sum(p.drafted[i] for p in parts)) for i in range(k)),
        accepted=tuple(int(sum(p.accepted[i] for p in parts)) for i in range(k)),
        accept_probs=tuple(np.concatenate([p.accept_probs[i] for p in parts]) for i in range(k)),
        length_counts=tuple(int(sum(p.length_counts[j] for p in parts)) for j in range(k + 1)),
        length_probs_sum=tuple(float(sum(p.length_probs_sum[j] for p in parts)) for j in range(k + 1)),
    )


@dataclass(frozen=True)
class PipelineResult:
    """``tokens`` (N, max_new_tokens) long and the call's :class:`PipelineStats`."""

    tokens: torch.Tensor
    stats: PipelineStats


def _check_prompt(name: str, prompt) -> torch.Tensor:
    prompt = torch.as_tensor(prompt)
    if prompt.ndim != 1 or prompt.numel() == 0 or prompt.is_floating_point() or prompt.dtype == torch.bool:
        raise InvalidArgument(
            f"{name} must be a non-empty 1-D integer tensor, got shape {tuple(prompt.shape)} and dtype {prompt.dtype}"
        )
    return prompt


def check_drafter_output(output, rows: int, k: int, vocab_size: int):
    """Validate a drafter's ``(tokens (B, k), probs (B, k, V))``; ImplementationError otherwise."""
    if not (isinstance(output, (tuple, list)) and len(output) == 2):
        raise ImplementationError(f"drafter.draft returned {type(output).__name__}, expected (tokens, probs)")
    tokens, probs = (torch.as_tensor(x) for x in output)
    if tuple(tokens.shape) != (rows, k) or tokens.is_floating_point() or tokens.dtype == torch.bool:
        raise ImplementationError(
            f"drafter.draft returned tokens of shape {tuple(tokens.shape)} and dtype "
            f"{tokens.dtype}, expected integer ({rows}, {k})"
        )
    if tuple(probs.shape) != (rows, k, vocab_size) or not probs.is_floating_point():
        raise ImplementationError(
            f"drafter.draft returned probs of shape {tuple(probs.shape)} and dtype "
            f"{probs.dtype}, expected floating ({rows}, {k}, {vocab_size})"
        )
    try:
        check_tokens("draft tokens", tokens, vocab_size)
    except InvalidArgument as error:
        raise ImplementationError(f"drafter.draft returned {error}") from None
    if not bool(torch.isfinite(probs).all()) or bool((probs < 0).any()):
        raise ImplementationError("drafter.draft returned NaN, infinite or negative probabilities")
    return tokens.long(), probs


def acceptance_overlap(target_probs: torch.Tensor, draft_probs: torch.Tensor) -> torch.Tensor:
    """Exact acceptance probability ``sum_x min(p(x), q(x))`` per row, float64 (rows renormalised)."""
    p = target_probs.double()
    q = draft_probs.double()
    p = p / p.sum(-1, keepdim=True)
    q = q / q.sum(-1, keepdim=True).clamp_min(1e-300)
    return torch.minimum(p, q).sum(-1)


def length_law(target_probs: torch.Tensor, draft_probs: torch.Tensor, draft_tokens: torch.Tensor) -> torch.Tensor:
    """Law (B, K+1) of the accepted length under the canonical rule given the drafts (float64)."""
    K = draft_tokens.shape[1]
    p_x = target_probs[:, :K].double().gather(-1, draft_tokens[..., None]).squeeze(-1)  # (B, K)
    q_x = draft_probs.double().gather(-1, draft_tokens[..., None]).squeeze(-1)  # (B, K)
    ratio = torch.where(q_x > 0, torch.clamp(p_x / q_x.clamp_min(1e-300), max=1.0), (p_x > 0).double())  # (B, K)
    reach = torch.cat([torch.ones_like(ratio[:, :1]), ratio.cumprod(-1)], 1)  # (B, K+1) P(A >= j)
    stop = torch.cat([1.0 - ratio, torch.ones_like(ratio[:, :1])], 1)  # (B, K+1)
    return reach * stop


class ProtocolDecoder:
    """Speculative decoder from a drafter, a target and a verifier (see the module docstring).

    Parameters
    ----------
    drafter : object with ``draft(prefix, k, *, generator)``
    target : object with ``next_token_probs(prefix)``
    k : int
        Draft length K >= 1.
    verify : callable, default :func:`reference.rules.verify`
        The verifier protocol.
    device : str or torch.device, optional
        Where ``verify`` runs (default the CPU): its probabilities and drafts are copied
        there in one transfer per round, it gets a generator of that device (seeded from
        the call's seed), and its output comes back in one transfer.
    dtype : torch.dtype or str, optional
        dtype of the probabilities handed to ``verify`` (default: as the target returns them;
        with neither argument the rows are handed over untouched).

    Notes
    -----
    ``generate`` returns the tokens and keeps the call's counters in ``last_stats``;
    :meth:`decode` returns both.  A drafter or verifier that returns malformed output
    raises :class:`~specverify.core.errors.ImplementationError`.
    """

    def __init__(self, drafter, target, *, k: int, verify=canonical_verify, device=None, dtype=None):
        if not callable(getattr(drafter, "draft", None)):
            raise InvalidArgument(
                f"drafter must have a .draft(prefix, k, *, generator) method, got {type(drafter).__name__}"
            )
        if not callable(getattr(target, "next_token_probs", None)):
            raise InvalidArgument(f"target must have a .next_token_probs(prefix) method, got {type(target).__name__}")
        if not callable(verify):
            raise InvalidArgument(f"verify must be callable, got {verify!r}")
        self.drafter, self.target, self.verify = drafter, target, verify
        self.k = check_int("k", k, minimum=1)
        self.device = check_device("device", device)
        self.dtype = None if dtype is None else check_prob_dtype("dtype", dtype)
        self.last_stats: PipelineStats | None = None
        # The optional batched target extension (as used by specverify.decoder): one call gives all K+1 rows.
        self._batched = callable(getattr(target, "conditionals", None))
        size = getattr(target, "vocab_size", None)
        if isinstance(size, int) and size >= 1:
            self.vocab_size = size

    def __repr__(self) -> str:
        name = getattr(self.verify, "__qualname__", repr(self.verify))
        return f"ProtocolDecoder(drafter={self.drafter!r}, target={self.target!r}, k={self.k}, verify={name})"

    def generate(self, prompt, *, num_samples: int, max_new_tokens: int, seed: int) -> torch.Tensor:
        """Decoder protocol: ``(num_samples, max_new_tokens)`` long new tokens after ``prompt``."""
        return self.decode(prompt, num_samples=num_samples, max_new_tokens=max_new_tokens, seed=seed).tokens

    #: One random stream serves the whole batch: a request's tokens depend on its neighbours.
    per_request_seeds = False

    def generate_requests(self, prompts, *, num_samples, max_new_tokens: int, seeds) -> list[torch.Tensor]:
        """Several requests in one batch (:mod:`specverify.decoder.compositions`): one ``(n_i, L)`` tensor each.

        Prompts must have one length (rows of equal length are verified together).  The batch
        has one generator, seeded from the first request's seed (0 when it is ``None``).
        """
        prompts = [_check_prompt(f"prompts[{i}]", p) for i, p in enumerate(prompts)]
        if not prompts or len(num_samples) != len(prompts) or len(seeds) != len(prompts):
            raise InvalidArgument(
                f"prompts, num_samples and seeds must be non-empty and of one length, got {len(prompts)}, "
                f"{len(num_samples)} and {len(seeds)}"
            )
        if len({p.numel() for p in prompts}) != 1:
            raise InvalidArgument(f"prompts must have one length, got {sorted({p.numel() for p in prompts})}")
        counts = [check_int(f"num_samples[{i}]", n, minimum=1) for i, n in enumerate(num_samples)]
        seed = 0 if seeds[0] is None else check_int("seeds[0]", seeds[0], minimum=0)
        rows = torch.cat([p[None].expand(n, -1) for p, n in zip(prompts, counts)])  # (sum n, T)
        tokens = self._decode_rows(rows, max_new_tokens, seed).tokens
        return list(tokens.split(counts))

    def decode(self, prompt, *, num_samples: int, max_new_tokens: int, seed: int) -> PipelineResult:
        """Like :meth:`generate`, returning the tokens and the call's :class:`PipelineStats`."""
        prompt = _check_prompt("prompt", prompt)
        N = check_int("num_samples", num_samples, minimum=1)
        return self._decode_rows(prompt[None].expand(N, -1), max_new_tokens, seed)

    def _decode_rows(self, prompts: torch.Tensor, max_new_tokens: int, seed: int) -> PipelineResult:
        """Decode every row of ``prompts`` (N, T) in one batch."""
        N = prompts.shape[0]
        L = check_int("max_new_tokens", max_new_tokens, minimum=1)
        seed = check_int("seed", seed, minimum=0)
        K = self.k
        generator = torch.Generator().manual_seed(seed)
        verify_gen = generator  # on the CPU: one stream
        if self.device.type != "cpu":
            verify_gen = torch.Generator(device=self.device).manual_seed(seed ^ 0x5DEECE66D)
        T = prompts.shape[1]
        seq = torch.zeros(N, T + L + K + 1, dtype=torch.long)  # (N, T + L + K + 1)
        seq[:, :T] = prompts.long()
        length = torch.full((N,), T, dtype=torch.long)  # (N,) committed lengths
        drafted = np.zeros(K, dtype=np.int64)
        accepted = np.zeros(K, dtype=np.int64)
        probs_at = [[] for _ in range(K)]
        length_counts = np.zeros(K + 1, dtype=np.int64)
        length_sum = torch.zeros(K + 1, dtype=torch.float64)
        rounds = generated = 0
        V = None
        active = torch.ones(N, dtype=torch.bool)
        while bool(active.any()):
            for ell in torch.unique(length[active]).tolist():  # ascending lengths
                rows = (active & (length == ell)).nonzero().squeeze(1)  # (B,)
                B = rows.numel()
                prefix = seq[rows, :ell]  # (B, ell)
                if V is None:
                    V = self._target(prefix[:1], None).shape[-1]
                try:
                    output = self.drafter.draft(prefix.clone(), K, generator=generator)
                except Exception as error:
                    raise raised(f"drafter.draft(prefix of shape {tuple(prefix.shape)}, {K})", error) from error
                draft_tokens, draft_probs = check_drafter_output(output, B, K, V)
                target_probs = self._target_block(prefix, draft_tokens, V)  # (B, K+1, V)
                tokens, num_emitted = self._verify(target_probs, draft_probs, draft_tokens, verify_gen)
                match = (tokens[:, :K] == draft_tokens) & (torch.arange(K)[None] < num_emitted[:, None])  # (B, K)
                num_accepted = match.long().cumprod(-1).sum(-1)  # (B,)
                overlap = acceptance_overlap(target_probs[:, :K], draft_probs)  # (B, K)
                for i in range(K):
                    reached = num_accepted >= i  # (B,)
                    drafted[i] += int(reached.sum())
                    accepted[i] += int((num_accepted > i).sum())
                    probs_at[i].append(overlap[reached, i].numpy())
                length_counts += np.bincount(num_accepted.numpy(), minlength=K + 1)
                length_sum += length_law(target_probs, draft_probs, draft_tokens).sum(0)
                rounds += B
                generated += int(num_emitted.sum())
                seq[rows, ell : ell + K + 1] = tokens  # entries past num_emitted are overwritten later
                length[rows] += num_emitted
            active = length - T < L
        out = seq[:, T : T + L].clone()  # (N, L)
        stats = PipelineStats(
            k=K,
            rounds=rounds,
            tokens_generated=generated,
            tokens_kept=N * L,
            drafted=tuple(int(x) for x in drafted),
            accepted=tuple(int(x) for x in accepted),
            accept_probs=tuple(np.concatenate(p) if p else np.zeros(0) for p in probs_at),
            length_counts=tuple(int(x) for x in length_counts),
            length_probs_sum=tuple(float(x) for x in length_sum),
        )
        self.last_stats = stats
        return PipelineResult(out, stats)

    # ------------------------------------------------------------------ calls under test
    def _target(self, prefix: torch.Tensor, V: int | None) -> torch.Tensor:
        try:
            rows = self.target.next_token_probs(prefix.clone())
        except Exception as error:
            raise raised(f"target.next_token_probs(prefix of shape {tuple(prefix.shape)})", error) from error
        rows = torch.as_tensor(rows)
        want = (prefix.shape[0], V if V is not None else (rows.shape[-1] if rows.ndim == 2 else -1))
        if tuple(rows.shape) != want or not rows.is_floating_point():
            raise ImplementationError(
                f"target.next_token_probs returned shape {tuple(rows.shape)} and dtype "
                f"{rows.dtype}, expected floating {want}"
            )
        return rows.detach().cpu()

    def _target_block(self, prefix: torch.Tensor, draft_tokens: torch.Tensor, V: int) -> torch.Tensor:
        """The target's K+1 conditionals after ``prefix`` + drafts[:j], j = 0..K: (B, K+1, V)."""
        B, ell = prefix.shape
        K = draft_tokens.shape[1]
        extended = torch.cat([prefix, draft_tokens, torch.zeros_like(draft_tokens[:, :1])], 1)  # (B, ell + K + 1)
        if self._batched:
            try:
                rows = self.target.conditionals(extended.clone(), start=ell)
            except Exception as error:
                raise raised(
                    f"target.conditionals(sequences of shape {tuple(extended.shape)}, start={ell})", error
                ) from error
            rows = torch.as_tensor(rows)
            if tuple(rows.shape) != (B, K + 1, V) or not rows.is_floating_point():
                raise ImplementationError(
                    f"target.conditionals returned shape {tuple(rows.shape)} and dtype "
                    f"{rows.dtype}, expected floating {(B, K + 1, V)}"
                )
            return rows.detach().cpu()
        return torch.stack([self._target(extended[:, : ell + j], V) for j in range(K + 1)], 1)  # (B, K+1, V)

    def _inputs(self, target_probs, draft_probs, draft_tokens):
        """The verifier's inputs on ``self.device`` in ``self.dtype`` (the tensors themselves by default)."""
        if self.device.type == "cpu" and self.dtype is None:
            return target_probs, draft_probs, draft_tokens
        dtype = self.dtype or target_probs.dtype
        B, K1, V = target_probs.shape
        probs = torch.cat([target_probs.reshape(-1), draft_probs.to(target_probs.dtype).reshape(-1)])  # (B*(2K+1)*V,)
        probs = probs.to(device=self.device, dtype=dtype)  # one transfer
        n = B * K1 * V
        return probs[:n].view(B, K1, V), probs[n:].view(B, K1 - 1, V), draft_tokens.to(self.device)

    def _verify(self, target_probs, draft_probs, draft_tokens, generator):
        B, K = draft_tokens.shape
        try:
            output = self.verify(*self._inputs(target_probs, draft_probs, draft_tokens), generator=generator)
        except InvalidArgument as error:
            raise ImplementationError(f"verify rejected the drafter's/target's rows: {error}") from error
        except Exception as error:
            raise raised("verify", error) from error
        if not (isinstance(output, (tuple, list)) and len(output) == 2):
            raise ImplementationError(f"verify returned {type(output).__name__}, expected (tokens, num_emitted)")
        tokens, num_emitted = (torch.as_tensor(x) for x in output)
        if (
            tuple(tokens.shape) != (B, K + 1)
            or tuple(num_emitted.shape) != (B,)
            or tokens.is_floating_point()
            or num_emitted.is_floating_point()
        ):
            raise ImplementationError(
                f"verify returned tokens {tuple(tokens.shape)} / num_emitted "
                f"{tuple(num_emitted.shape)}, expected integer ({B}, {K + 1}) / ({B},)"
            )
        if num_emitted.device.type != "cpu":  # one transfer back
            packed = torch.cat([tokens.reshape(-1).long(), num_emitted.long()]).cpu()  # (B*(K+1) + B,)
            tokens, num_emitted = packed[: B * (K + 1)].view(B, K + 1), packed[B * (K + 1) :]
        num_emitted = num_emitted.long().cpu()
        if bool(((num_emitted < 1) | (num_emitted > K + 1)).any()):
            raise ImplementationError(f"verify returned num_emitted outside [1, {K + 1}]: {num_emitted.tolist()[:8]}")
        tokens = tokens.long().cpu()
        V = target_probs.shape[-1]
        valid = torch.arange(K + 1)[None] < num_emitted[:, None]  # (B, K+1)
        bad = valid & ((tokens < 0) | (tokens >= V))
        if bool(bad.any()):
            row, col = (int(i) for i in bad.nonzero()[0])
            raise ImplementationError(
                f"verify emitted token {int(tokens[row, col])} (row {row}, position {col + 1}), "
                f"outside the vocabulary [0, {V})",
                row=row,
            )
        return torch.where(valid, tokens, 0), num_emitted
