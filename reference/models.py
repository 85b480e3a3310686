"""Tiny causal transformers with a ragged KV cache, target/drafter pairs, an n-gram drafter.

The reference decoder needs real models, not tables: a transformer whose
conditionals depend on the whole context and on positions (so a stale KV cache
or a wrong position changes the output law), small enough that two CPU cores
decode thousands of sequences in seconds, and identical on CUDA.

* :class:`TinyTransformer` -- pre-norm GPT (learned positions, multi-head
  attention, GELU MLP, untied unembedding) whose logits are scaled so that the
  conditionals are far from uniform.  Weights come from a CPU
  ``torch.Generator`` only (never the global RNG), as uniforms with each
  weight's variance made by exact arithmetic, so a seed gives the same weights to
  the bit on every device and CPU (``torch.randn`` in float32 does not: its
  vectorised Box-Muller differs between AVX-512, AVX2 and scalar code).
* :class:`KVCache` -- per-layer keys/values with a *per-row* length: row b's
  next token is written at slot ``lengths[b]`` with position id ``lengths[b]``,
  so rows advance independently and rollback is ``truncate(lengths)``.
* :func:`make_pair` -- a target and a real drafter: its first layers with the
  shared embeddings and head (early exit / self-speculative, as in LayerSkip,
  Elhoushi et al. 2024), or a shallow model sharing embeddings and unembedding.
* :class:`NGramDrafter` -- prompt lookup (Saxena 2023): deterministic, its law
  is one-hot on the token it proposes.
* :class:`ModelDrafter` -- the design's drafter protocol around a model.

Shapes: B batch, n tokens fed in one call, C cache capacity, H heads, Dh head
dimension, d model width, V vocabulary, k draft length.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F
from torch import nn

from specverify.core.errors import InvalidArgument
from specverify.core.sampling import sample
from specverify.core.validation import check_generator, check_int, check_shape, check_tokens
from specverify_reference.processors import History, SamplingConfig, logits_to_probs

__all__ = ["ModelConfig", "KVCache", "TinyTransformer", "make_pair", "NGramDrafter", "ModelDrafter"]


@dataclass(frozen=True)
class ModelConfig:
    """Architecture of a :class:`TinyTransformer`.

    ``logit_scale`` multiplies the logits (larger: peakier conditionals);
    ``attn_scale`` multiplies the query/key init (larger: sharper attention,
    so the context matters more); ``residual_scale`` multiplies the output
    projections' init (smaller: later layers change the early-exit law less).
    """

    vocab_size: int = 64
    d_model: int = 64
    n_layers: int = 4
    n_heads: int = 4
    max_seq_len: int = 4096
    logit_scale: float = 4.0
    attn_scale: float = 2.5
    residual_scale: float = 0.3

    def __post_init__(self):
        check_int("vocab_size", self.vocab_size, minimum=2)
        check_int("d_model", self.d_model, minimum=1)
        check_int("n_layers", self.n_layers, minimum=1)
        check_int("n_heads", self.n_heads, minimum=1)
        check_int("max_seq_len", self.max_seq_len, minimum=1)
        if self.d_model % self.n_heads:
            raise InvalidArgument(f"d_model ({self.d_model}) must be divisible by n_heads ({self.n_heads})")


class KVCache:
    """Keys and values of every layer, ``(B, C, H, Dh)`` each, with per-row lengths ``(B,)``.

    Slots ``>= lengths[b]`` of row b are garbage: they are masked out and
    overwritten by the next write.  Capacity grows on demand.
    """

    def __init__(
        self,
        num_layers: int,
        batch: int,
        num_heads: int,
        head_dim: int,
        *,
        capacity: int = 64,
        device=None,
        dtype=torch.float32,
    ):
        shape = (batch, max(1, capacity), num_heads, head_dim)
        self.keys = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(num_layers)]
        self.values = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(num_layers)]
        self.lengths = torch.zeros(batch, dtype=torch.long, device=device)  # (B,)

    @property
    def capacity(self) -> int:
        return self.keys[0].shape[1]

    @property
    def batch_size(self) -> int:
        return self.lengths.shape[0]

    def reserve(self, needed: int) -> None:
        """Grow the capacity to at least ``needed`` slots (doubling)."""
        if needed <= self.capacity:
            return
        new_cap = max(needed, 2 * self.capacity)
        for store in (self.keys, self.values):
            for i, t in enumerate(store):
                grown = t.new_zeros(t.shape[0], new_cap, t.shape[2], t.shape[3])  # (B, C', H, Dh)
                grown[:, : t.shape[1]] = t
                store[i] = grown

    def truncate(self, lengths) -> None:
        """Drop everything past ``lengths`` (an int for all rows, or a (B,) tensor per row).

        Truncation only shrinks: a requested length above a row's current length raises.
        """
        if isinstance(lengths, torch.Tensor):
            check_shape("lengths", lengths, (self.batch_size,))
            new = lengths.to(device=self.lengths.device, dtype=torch.long)
        else:
            new = torch.full_like(self.lengths, check_int("lengths", lengths, minimum=0))
        if bool(((new < 0) | (new > self.lengths)).any()):
            raise InvalidArgument(
                f"lengths must be in [0, current length] per row, got {new.tolist()} "
                f"for current lengths {self.lengths.tolist()}"
            )
        self.lengths = new

    def select(self, rows: torch.Tensor) -> None:
        """Keep only the given batch rows (a (B',) long index), in that order."""
        self.keys = [t.index_select(0, rows) for t in self.keys]
        self.values = [t.index_select(0, rows) for t in self.values]
        self.lengths = self.lengths.index_select(0, rows)


def _randn(gen: torch.Generator, *shape: int, std: float) -> nn.Parameter:
    """Seeded weights of mean 0 and standard deviation ``std``, equal to the bit on every CPU.

    Uniform on [-sqrt(3) std, sqrt(3) std): ``torch.rand`` in float64 is an integer stream scaled by
    2^-53, ``2u - 1`` is exact, and the one multiplication is correctly rounded everywhere.
    """
    uniform = torch.rand(shape, generator=gen, dtype=torch.float64)
    return nn.Parameter((uniform * 2 - 1) * (std * math.sqrt(3.0)), requires_grad=False)


class Embedding(nn.Module):
    """Token plus learned position embeddings."""

    def __init__(self, cfg: ModelConfig, gen: torch.Generator):
        super().__init__()
        self.max_seq_len = cfg.max_seq_len
        self.token = _randn(gen, cfg.vocab_size, cfg.d_model, std=1.0)
        self.position = _randn(gen, cfg.max_seq_len, cfg.d_model, std=0.5)

    def forward(self, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        # tokens, positions: (B, n) -> (B, n, d)
        return self.token[tokens] + self.position[positions]


class Block(nn.Module):
    """Pre-norm transformer block: x + attn(ln(x)), then x + mlp(ln(x))."""

    def __init__(self, cfg: ModelConfig, gen: torch.Generator):
        super().__init__()
        d = cfg.d_model
        self.n_heads = cfg.n_heads
        self.ln1 = nn.LayerNorm(d)
        self.ln2 = nn.LayerNorm(d)
        self.w_q = _randn(gen, d, d, std=cfg.attn_scale / math.sqrt(d))
        self.w_k = _randn(gen, d, d, std=cfg.attn_scale / math.sqrt(d))
        self.w_v = _randn(gen, d, d, std=1.0 / math.sqrt(d))
        self.w_o = _randn(gen, d, d, std=cfg.residual_scale / math.sqrt(d))
        self.w_in = _randn(gen, d, 4 * d, std=1.0 / math.sqrt(d))
        self.w_out = _randn(gen, 4 * d, d, std=cfg.residual_scale / math.sqrt(4 * d))

    def _heads(self, x: torch.Tensor) -> torch.Tensor:
        B, n, d = x.shape
        return x.view(B, n, self.n_heads, d // self.n_heads).transpose(1, 2)  # (B, H, n, Dh)

    def forward(self, x, mask, cache: KVCache | None, layer: int, slots):
        # x: (B, n, d); mask: (B, 1, n, Lk) bool, True = may attend; slots: (B, n) cache slots
        B, n, d = x.shape
        h = self.ln1(x)  # (B, n, d)
        q, k, v = self._heads(h @ self.w_q), self._heads(h @ self.w_k), self._heads(h @ self.w_v)  # (B, H, n, Dh)
        if cache is not None:
            rows = torch.arange(B, device=x.device)[:, None]  # (B, 1)
            cache.keys[layer][rows, slots] = k.transpose(1, 2)  # (B, n, H, Dh) written at each row's slots
            cache.values[layer][rows, slots] = v.transpose(1, 2)
            Lk = mask.shape[-1]
            k = cache.keys[layer][:, :Lk].transpose(1, 2)  # (B, H, Lk, Dh)
            v = cache.values[layer][:, :Lk].transpose(1, 2)  # (B, H, Lk, Dh)
        att = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)  # (B, H, n, Dh)
        x = x + att.transpose(1, 2).reshape(B, n, d) @ self.w_o  # (B, n, d)
        return x + F.gelu(self.ln2(x) @ self.w_in) @ self.w_out  # (B, n, d)


class Head(nn.Module):
    """Final norm and (untied, scaled) unembedding."""

    def __init__(self, cfg: ModelConfig, gen: torch.Generator):
        super().__init__()
        self.ln_f = nn.LayerNorm(cfg.d_model)
        self.unembed = _randn(gen, cfg.d_model, cfg.vocab_size, std=cfg.logit_scale / math.sqrt(cfg.d_model))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.ln_f(x) @ self.unembed  # (B, n, V)


class TinyTransformer(nn.Module):
    """A small causal LM; ``forward(tokens, cache)`` returns logits ``(B, n, V)``.

    Build with :meth:`from_seed` (or :func:`make_pair`).  Without a cache the
    forward pass is a plain teacher-forced pass over positions ``0..n-1``; with
    a cache, row b's tokens go to slots/positions ``lengths[b] .. lengths[b]+n-1``
    and the cache then advances by ``num_valid[b]`` (default n: pass
    ``num_valid`` when rows carry right padding).
    """

    def __init__(self, cfg: ModelConfig, embed: Embedding, blocks, head: Head):
        super().__init__()
        self.config = cfg
        self.embed = embed
        self.blocks = nn.ModuleList(blocks)
        self.head = head

    @classmethod
    def from_seed(cls, cfg: ModelConfig, *, seed: int, device=None, dtype=torch.float32) -> TinyTransformer:
        gen = torch.Generator().manual_seed(check_int("seed", seed, minimum=0))
        blocks = [Block(cfg, gen) for _ in range(cfg.n_layers)]
        model = cls(cfg, Embedding(cfg, gen), blocks, Head(cfg, gen))
        return model.to(device=device, dtype=dtype).eval()

    @property
    def vocab_size(self) -> int:
        return self.config.vocab_size

    @property
    def device(self) -> torch.device:
        return self.head.unembed.device

    @property
    def dtype(self) -> torch.dtype:
        return self.head.unembed.dtype

    def early_exit(self, num_layers: int) -> TinyTransformer:
        """The model made of the first ``num_layers`` blocks plus the shared embeddings and head."""
        check_int("num_layers", num_layers, minimum=1, maximum=len(self.blocks))
        cfg = replace(self.config, n_layers=num_layers)
        return TinyTransformer(cfg, self.embed, list(self.blocks[:num_layers]), self.head).eval()

    def new_cache(self, batch: int, *, capacity: int = 64) -> KVCache:
        cfg = self.config
        return KVCache(
            len(self.blocks),
            batch,
            cfg.n_heads,
            cfg.d_model // cfg.n_heads,
            capacity=capacity,
            device=self.device,
            dtype=self.dtype,
        )

    @torch.no_grad()  # not inference_mode: callers may overwrite the logits with laws in place
    def forward(
        self,
        tokens: torch.Tensor,
        cache: KVCache | None = None,
        *,
        num_valid: torch.Tensor | None = None,
        head_at: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Logits (B, n, V) at every fed position, or (B, m, V) at the positions ``head_at`` (B, m) only.

        ``head_at`` keeps the unembedding, the one O(V) step, to the positions a caller reads:
        memory and time of a pass then grow with m V, not n V (a prefill feeds the whole prompt).
        """
        B, n = tokens.shape
        device = tokens.device
        offsets = torch.arange(n, device=device)  # (n,)
        if cache is None:
            positions = offsets.expand(B, n)  # (B, n)
            Lk = n
        else:
            positions = cache.lengths[:, None] + offsets  # (B, n) slot = position id
            Lk = int(positions[:, -1].max()) + 1
            cache.reserve(Lk)
        if Lk > self.config.max_seq_len:
            raise InvalidArgument(f"sequence length {Lk} exceeds max_seq_len={self.config.max_seq_len}")
        mask = torch.arange(Lk, device=device) <= positions[:, :, None]  # (B, n, Lk) causal per row
        x = self.embed(tokens, positions)  # (B, n, d)
        for layer, block in enumerate(self.blocks):
            x = block(x, mask[:, None], cache, layer, positions)  # (B, n, d)
        if head_at is not None:
            x = x.gather(1, head_at[:, :, None].expand(-1, -1, x.shape[-1]))  # (B, m, d)
        logits = self.head(x)  # (B, n or m, V)
        if cache is not None:
            cache.lengths = cache.lengths + (n if num_valid is None else num_valid)  # (B,)
        return logits


def make_pair(
    *,
    vocab_size: int = 64,
    seed: int = 0,
    device=None,
    dtype=torch.float32,
    d_model: int = 64,
    n_layers: int = 4,
    n_heads: int = 4,
    drafter: str = "early_exit",
    draft_layers: int = 1,
    **config,
) -> tuple[TinyTransformer, TinyTransformer]:
    """A seeded target and a drafter over the same vocabulary.

    ``drafter="early_exit"``: the target's first ``draft_layers`` blocks with its
    embeddings and head (self-speculative).  ``drafter="shallow"``: a separate
    ``draft_layers``-block model (its own seeded blocks) sharing the target's
    embeddings and unembedding.  Extra keywords go to :class:`ModelConfig`.
    """
    cfg = ModelConfig(vocab_size=vocab_size, d_model=d_model, n_layers=n_layers, n_heads=n_heads, **config)
    target = TinyTransformer.from_seed(cfg, seed=seed, device=device, dtype=dtype)
    if drafter == "early_exit":
        return target, target.early_exit(check_int("draft_layers", draft_layers, minimum=1, maximum=n_layers))
    if drafter == "shallow":
        check_int("draft_layers", draft_layers, minimum=1)
        gen = torch.Generator().manual_seed(check_int("seed", seed, minimum=0) + 1_000_003)
        blocks = [Block(cfg, gen).to(device=device, dtype=dtype) for _ in range(draft_layers)]
        return target, TinyTransformer(replace(cfg, n_layers=draft_layers), target.embed, blocks, target.head).eval()
    raise InvalidArgument(f"drafter must be 'early_exit' or 'shallow', got {drafter!r}")


class NGramDrafter:
    """Prompt-lookup drafter: propose what followed the latest earlier occurrence of the suffix.

    For each drafted token, the last ``n`` tokens of the context (n from
    ``max_ngram`` down to ``min_ngram``) are searched among earlier windows;
    the token that followed the latest match is proposed.  With no match the
    last token is repeated.  Deterministic, so the reported law is one-hot on
    the proposed token (honest for the verifier).  Vectorised over rows.
    """

    def __init__(self, vocab_size: int, *, max_ngram: int = 3, min_ngram: int = 1):
        self.vocab_size = check_int("vocab_size", vocab_size, minimum=1)
        self.max_ngram = check_int("max_ngram", max_ngram, minimum=1)
        self.min_ngram = check_int("min_ngram", min_ngram, minimum=1, maximum=max_ngram)

    def _next(self, seq: torch.Tensor, seq_len: torch.Tensor) -> torch.Tensor:
        # seq: (B, L) right-padded tokens; seq_len: (B,) valid lengths >= 1 -> proposal (B,)
        B, L = seq.shape
        rows = torch.arange(B, device=seq.device)  # (B,)
        proposal = seq[rows, seq_len - 1]  # (B,) fallback: repeat the last token
        found = torch.zeros(B, dtype=torch.bool, device=seq.device)  # (B,)
        for n in range(min(self.max_ngram, L - 1), self.min_ngram - 1, -1):
            windows = seq.unfold(1, n, 1)[:, : L - n]  # (B, L-n, n) windows that have a follower
            suffix_idx = (seq_len[:, None] - n + torch.arange(n, device=seq.device)).clamp_min(0)  # (B, n)
            suffix = seq.gather(1, suffix_idx)  # (B, n)
            starts = torch.arange(L - n, device=seq.device)  # (L-n,)
            match = (windows == suffix[:, None, :]).all(-1)  # (B, L-n)
            match &= (starts[None] + n < seq_len[:, None]) & (seq_len[:, None] > n)  # (B, L-n) follower inside
            last = torch.where(match, starts[None], -1).amax(-1)  # (B,) latest matching start or -1
            use = (last >= 0) & ~found  # (B,)
            follower = seq[rows, (last + n).clamp(0, L - 1)]  # (B,)
            proposal = torch.where(use, follower, proposal)
            found |= use
        return proposal

    def propose(self, seq: torch.Tensor, seq_len: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Draft ``k`` tokens for right-padded ``seq`` (B, L) with lengths ``seq_len`` (B,)."""
        B = seq.shape[0]
        rows = torch.arange(B, device=seq.device)  # (B,)
        work = torch.cat([seq, seq.new_zeros(B, k)], dim=1)  # (B, L+k)
        length = seq_len.clone()  # (B,)
        tokens = []
        for _ in range(k):
            nxt = self._next(work, length)  # (B,)
            work[rows, length] = nxt
            length = length + 1
            tokens.append(nxt)
        draft_tokens = torch.stack(tokens, dim=1)  # (B, k)
        draft_probs = F.one_hot(draft_tokens, self.vocab_size).to(torch.float64)  # (B, k, V)
        return draft_tokens, draft_probs

    def draft(self, prefix: torch.Tensor, k: int, *, generator: torch.Generator | None = None):
        """Drafter protocol: ``prefix`` (B, T) -> (tokens (B, k) long, probs (B, k, V) one-hot)."""
        check_shape("prefix", prefix, (None, None))
        check_tokens("prefix", prefix, self.vocab_size)
        check_int("k", k, minimum=1)
        if prefix.shape[1] < 1:
            raise InvalidArgument(f"prefix must hold at least one token, got shape {tuple(prefix.shape)}")
        B, T = prefix.shape
        return self.propose(prefix.long(), torch.full((B,), T, dtype=torch.long, device=prefix.device), k)


class ModelDrafter:
    """Drafter protocol around a :class:`TinyTransformer` and a :class:`SamplingConfig`.

    ``draft(prefix, k, generator=g)`` samples k tokens autoregressively from the
    processed drafter law and returns that law: honest by construction.
    """

    def __init__(self, model: TinyTransformer, sampling: SamplingConfig = SamplingConfig()):
        if not isinstance(sampling, SamplingConfig):
            raise InvalidArgument(f"sampling must be a SamplingConfig, got {sampling!r}")
        self.model = model
        self.sampling = sampling
        self.vocab_size = model.vocab_size

    def draft(self, prefix: torch.Tensor, k: int, *, generator: torch.Generator):
        check_shape("prefix", prefix, (None, None))
        check_tokens("prefix", prefix, self.vocab_size)
        check_int("k", k, minimum=1)
        check_generator("generator", generator)
        B, T = prefix.shape
        cache = self.model.new_cache(B, capacity=T + k)
        last = torch.full((B, 1), T - 1, device=self.model.device)  # (B, 1) the prefill's one read position
        logits = self.model(prefix.to(self.model.device).long(), cache, head_at=last)[:, 0]  # (B, V)
        tokens: list[torch.Tensor] = []
        probs: list[torch.Tensor] = []
        for i in range(k):
            history = None  # with penalties: the prefix is the prompt, the drafts so far the output
            if self.sampling.needs_history:
                seq = torch.cat([prefix.to(logits.device).long(), *[t[:, None] for t in tokens]], dim=1)  # (B, T + i)
                history = History.of_prefixes(seq, T)
            draft_probs = logits_to_probs(logits, self.sampling, history=history)  # (B, V)
            token = sample(draft_probs, generator=generator, check=False)  # (B,)
            tokens.append(token)
            probs.append(draft_probs)
            if i + 1 < k:
                logits = self.model(token[:, None], cache)[:, -1]  # (B, V)
        return torch.stack(tokens, 1), torch.stack(probs, 1)  # (B, k), (B, k, V)
