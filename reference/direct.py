"""Plain autoregressive target sampling, and the target's exact processed conditionals.

* :class:`DirectSampler` -- samples the target token by token (KV cache, one
  forward per token) with the same processors and generator contract as the
  speculative decoder: the baseline for speed and the reference law for
  two-sample tests.
* :class:`TargetAdapter` -- the design's target protocol: ``next_token_probs``
  and the batched, teacher-forced ``conditionals`` (one forward pass gives the
  processed conditional at every position of every row, which is what an exact
  goodness-of-fit test needs at each sampled prefix).

Shapes: B batch rows, T prompt tokens, L new tokens, V vocabulary.
"""

from __future__ import annotations

import torch

from specverify.core.errors import InvalidArgument
from specverify.core.sampling import sample
from specverify.core.validation import check_generator, check_int, check_shape, check_tokens
from specverify_reference.models import TinyTransformer
from specverify_reference.processors import History, SamplingConfig, logits_to_probs

__all__ = [
    "ChunkedGenerate",
    "DirectSampler",
    "TargetAdapter",
    "validate_generate_args",
    "validate_batch_args",
    "generate_in_chunks",
]


def validate_generate_args(prompt, num_samples, max_new_tokens, seed, vocab_size: int):
    """Validate the decoder protocol's ``generate`` arguments; return them normalised."""
    check_shape("prompt", prompt, (None,))
    check_tokens("prompt", prompt, vocab_size)
    if prompt.shape[0] < 1:
        raise InvalidArgument(f"prompt must hold at least one token, got shape {tuple(prompt.shape)}")
    return (
        prompt,
        check_int("num_samples", num_samples, minimum=1),
        check_int("max_new_tokens", max_new_tokens, minimum=1),
        check_int("seed", seed, minimum=0),
    )


def _check_model(model, sampling) -> None:
    if not isinstance(model, TinyTransformer):
        raise InvalidArgument(f"target must be a TinyTransformer, got {type(model).__name__}")
    if not isinstance(sampling, SamplingConfig):
        raise InvalidArgument(f"sampling must be a SamplingConfig, got {sampling!r}")


class TargetAdapter:
    """The target protocol for a model plus its sampling configuration.

    Parameters
    ----------
    model : TinyTransformer
    sampling : SamplingConfig
    max_batch : int
        Rows per forward pass (memory bound); results do not depend on it.
    """

    def __init__(self, model: TinyTransformer, sampling: SamplingConfig = SamplingConfig(), *, max_batch: int = 16384):
        _check_model(model, sampling)
        self.model = model
        self.sampling = sampling
        self.vocab_size = model.vocab_size
        self.max_batch = check_int("max_batch", max_batch, minimum=1)

    def next_token_probs(self, prefix: torch.Tensor, *, prompt_len: int | None = None) -> torch.Tensor:
        """Processed conditional of the next token after each row of ``prefix`` (B, T): (B, V) float64.

        With penalties, ``prefix[:, :prompt_len]`` is the prompt and the rest the output (default:
        the whole prefix is the prompt).
        """
        check_shape("prefix", prefix, (None, None))
        if prefix.shape[1] < 1:
            raise InvalidArgument(f"prefix must hold at least one token, got shape {tuple(prefix.shape)}")
        check_tokens("prefix", prefix, self.vocab_size)
        T = prefix.shape[1]
        prompt_len = T if prompt_len is None else check_int("prompt_len", prompt_len, minimum=0, maximum=T)
        return self._probs(prefix, T - 1, prompt_len)[:, -1]  # (B, V)

    def conditionals(self, sequences: torch.Tensor, start: int) -> torch.Tensor:
        """Teacher-forced processed conditionals of tokens ``start..S-1`` of ``sequences`` (B, S).

        Entry ``[b, j]`` is the law of ``sequences[b, start + j]`` given
        ``sequences[b, :start + j]``; returns (B, S - start, V) float64 from one
        forward pass (per ``max_batch`` rows).  With penalties ``sequences[:, :start]`` is the
        prompt (the decoder harness asks for the laws of the new tokens after a prompt).
        """
        check_shape("sequences", sequences, (None, None))
        check_tokens("sequences", sequences, self.vocab_size)
        S = sequences.shape[1]
        start = check_int("start", start, minimum=1, maximum=max(1, S - 1))
        if S < 2:
            raise InvalidArgument(f"sequences must hold at least 2 tokens, got shape {tuple(sequences.shape)}")
        return self._probs(sequences[:, :-1], start - 1, start)  # (B, S - start, V)

    def _probs(self, tokens: torch.Tensor, first: int, prompt_len: int) -> torch.Tensor:
        """Laws after ``tokens[:, :h + 1]`` for h = first .. S - 1, the first ``prompt_len`` the prompt."""
        tokens = tokens.to(self.model.device).long()
        B, S = tokens.shape
        step = rows_per_chunk(self.max_batch, self.vocab_size, S - first, PASS_ENTRIES)
        heads = torch.arange(first, S, device=tokens.device)  # (n,) positions whose laws are returned
        out = []
        for i in range(0, B, step):
            rows = tokens[i : i + step]  # (b, S)
            logits = self.model(rows, head_at=heads.expand(rows.shape[0], -1))  # (b, n, V)
            history = None
            if self.sampling.needs_history:
                history = History(rows, prompt_len, (heads + 1).expand(rows.shape[0], -1))
            out.append(logits_to_probs(logits, self.sampling, history=history))
        if not out:
            return torch.zeros(0, tokens.shape[1] - first, self.vocab_size, dtype=torch.float64, device=tokens.device)
        return torch.cat(out)  # (B, n, V)


#: Rows x vocabulary of one decoding chunk: a chunk's law at one position, (rows, V) float64, holds at
#: most 2^22 entries (32 MiB), so a decoder's memory grows with V and K, not with num_samples x V.
#: At V <= 64 this is the 65,536-row cap (the chunking, hence the tokens, of every smaller vocabulary).
CHUNK_ROW_ENTRIES = 1 << 22
#: Rows x positions x vocabulary of one teacher-forced pass of :class:`TargetAdapter` (128 MiB float64).
PASS_ENTRIES = 1 << 24


def rows_per_chunk(max_batch: int, vocab_size: int, positions: int = 1, budget: int = CHUNK_ROW_ENTRIES) -> int:
    """Rows of one chunk: at most ``max_batch``, and at most ``budget`` entries of ``positions`` laws over V."""
    return max(1, min(max_batch, budget // (vocab_size * positions)))


def validate_batch_args(prompts, max_new_tokens, generator, vocab_size: int, device) -> int:
    """Check ``generate_batch``'s arguments (prompts (B, T) in-vocabulary, B, T >= 1; a generator
    on the models' device); return ``max_new_tokens`` as an int."""
    check_shape("prompts", prompts, (None, None))
    check_tokens("prompts", prompts, vocab_size)
    if prompts.shape[0] < 1 or prompts.shape[1] < 1:
        raise InvalidArgument(f"prompts must have shape (B, T) with B, T >= 1, got {tuple(prompts.shape)}")
    max_new_tokens = check_int("max_new_tokens", max_new_tokens, minimum=1)
    check_generator("generator", generator)
    if generator.device.type != torch.device(device).type:
        raise InvalidArgument(f"generator is on {generator.device}, the model on {device}")
    return max_new_tokens


def generate_in_chunks(
    generate_batch,
    prompt: torch.Tensor,
    *,
    num_samples: int,
    max_new_tokens: int,
    seed: int,
    vocab_size: int,
    device,
    max_batch: int,
) -> torch.Tensor:
    """The decoder protocol on top of a batched decoder: validate, seed one generator, decode in chunks.

    ``generate_batch(prompts (B, T), max_new_tokens, *, generator)`` returns the new tokens
    (B, max_new_tokens) (or an object with ``.tokens``); rows of all chunks share one generator,
    so the output depends only on ``seed``, ``max_batch`` and ``vocab_size`` (chunks hold at most
    :data:`CHUNK_ROW_ENTRIES` row-vocabulary entries: :func:`rows_per_chunk`).
    """
    prompt, num_samples, max_new_tokens, seed = validate_generate_args(
        prompt, num_samples, max_new_tokens, seed, vocab_size
    )
    generator = torch.Generator(device=device).manual_seed(seed)
    prompt = prompt.to(device).long()
    max_batch = rows_per_chunk(max_batch, vocab_size)
    chunks = []
    for start in range(0, num_samples, max_batch):
        B = min(max_batch, num_samples - start)
        out = generate_batch(prompt.expand(B, -1), max_new_tokens, generator=generator)
        chunks.append(getattr(out, "tokens", out))  # (B, max_new_tokens)
    return torch.cat(chunks)  # (num_samples, max_new_tokens)


class ChunkedGenerate:
    """The decoder protocol's ``generate`` over a class's ``generate_batch``, in chunks of ``max_batch`` rows.

    The class provides ``generate_batch(prompts, max_new_tokens, *, generator)``, ``vocab_size``,
    ``device`` and ``max_batch``.
    """

    vocab_size: int
    device: torch.device
    max_batch: int

    def generate(self, prompt: torch.Tensor, *, num_samples: int, max_new_tokens: int, seed: int) -> torch.Tensor:
        """Decoder protocol: ``num_samples`` continuations of ``prompt`` (T,) -> (num_samples, max_new_tokens) long."""
        return generate_in_chunks(
            self.generate_batch,  # type: ignore[attr-defined]
            prompt,
            num_samples=num_samples,
            max_new_tokens=max_new_tokens,
            seed=seed,
            vocab_size=self.vocab_size,
            device=self.device,
            max_batch=self.max_batch,
        )

    #: One generator serves a batch of requests: a request's tokens depend on its neighbours.
    per_request_seeds = False

    def generate_requests(self, prompts, *, num_samples, max_new_tokens: int, seeds) -> list[torch.Tensor]:
        """Several requests decoded as one batch of rows (chunks of ``max_batch``): one (n_i, L) tensor each.

        Prompts must share one length; the batch's one generator is seeded from the first
        request's seed (0 when it is None).  Used by the batch-invariance tests of
        ``specverify.decoder.invariance``.
        """
        if not prompts or len(num_samples) != len(prompts) or len(seeds) != len(prompts):
            raise InvalidArgument(
                f"prompts, num_samples and seeds must be non-empty and of one length, got {len(prompts)}, "
                f"{len(num_samples)} and {len(seeds)}"
            )
        rows = []
        for prompt, n in zip(prompts, num_samples):
            prompt, n, max_new_tokens, _ = validate_generate_args(prompt, n, max_new_tokens, 0, self.vocab_size)
            rows.append(prompt.long()[None].expand(n, -1))
        if len({r.shape[1] for r in rows}) != 1:
            raise InvalidArgument(f"prompts must have one length, got {sorted({r.shape[1] for r in rows})}")
        seed = 0 if seeds[0] is None else seeds[0]
        generator = torch.Generator(device=self.device).manual_seed(seed)
        batch = torch.cat(rows).to(self.device)  # (sum n, T)
        step = rows_per_chunk(self.max_batch, self.vocab_size)
        chunks = []
        for start in range(0, batch.shape[0], step):
            out = self.generate_batch(batch[start : start + step], max_new_tokens, generator=generator)  # type: ignore[attr-defined]
            chunks.append(getattr(out, "tokens", out).cpu())
        return list(torch.cat(chunks).split([r.shape[0] for r in rows]))


class DirectSampler(ChunkedGenerate):
    """Autoregressive sampling of the processed target law (one target pass per token)."""

    def __init__(self, target: TinyTransformer, sampling: SamplingConfig = SamplingConfig(), *, max_batch: int = 65536):
        _check_model(target, sampling)
        self.target = target
        self.sampling = sampling
        self.vocab_size = target.vocab_size
        self.device = target.device
        self.max_batch = check_int("max_batch", max_batch, minimum=1)

    def target_adapter(self) -> TargetAdapter:
        return TargetAdapter(self.target, self.sampling)

    def generate_batch(
        self, prompts: torch.Tensor, max_new_tokens: int, *, generator: torch.Generator, on_step=None
    ) -> torch.Tensor:
        """``max_new_tokens`` new tokens for every row of ``prompts`` (B, T): (B, max_new_tokens) long.

        ``on_step(outputs)``, if given, is called after every token with each row's new tokens so
        far (a list of B one-dimensional tensors), as :meth:`SpeculativeDecoder.generate_batch` does.
        """
        max_new_tokens = validate_batch_args(prompts, max_new_tokens, generator, self.vocab_size, self.device)
        B, T = prompts.shape
        cache = self.target.new_cache(B, capacity=T + max_new_tokens)
        last = torch.full((B, 1), T - 1, device=self.device)  # (B, 1) the prefill's one read position
        logits = self.target(prompts.to(self.device).long(), cache, head_at=last)[:, 0]  # (B, V) prefill
        seq = torch.cat([prompts.to(self.device).long(), prompts.new_zeros(B, max_new_tokens)], dim=1)  # (B, T + L)
        out = []
        for i in range(max_new_tokens):
            history = (
                History(seq, T, torch.full((B, 1), T + i, device=seq.device)) if self.sampling.needs_history else None
            )
            target_probs = logits_to_probs(logits, self.sampling, history=history)  # (B, V)
            token = sample(target_probs, generator=generator, check=False)  # (B,)
            seq[:, T + i] = token
            out.append(token)
            if on_step is not None:
                on_step(list(seq[:, T : T + i + 1]))
            if i + 1 < max_new_tokens:
                logits = self.target(token[:, None], cache)[:, 0]  # (B, V)
        return torch.stack(out, dim=1)  # (B, max_new_tokens)
