"""Table models: targets and drafters whose conditionals are known exactly.

Every model here is a deterministic finite-state machine over *contexts*: the
context after a prefix is a function of the prefix (``context_ids``), the
conditional law of the next token is one float64 row of a table
(``table[context]``), and appending a token moves the context on
(``next_context(context, token)``).  That one abstraction covers

* :class:`PositionalCategorical` -- context-free, one categorical per absolute
  position (rows differ across positions, so a verifier reading the wrong row
  of ``target_probs`` shows), the last row repeating after the table ends;
* :class:`NGramTable` -- the law of the next token depends on the last
  ``order - 1`` tokens (a begin-of-sequence symbol pads short prefixes);
* :class:`MarkovTable` -- the first-order case (``order = 2``) built from an
  initial law and a ``(V, V)`` transition matrix;
* :class:`FSMTable` -- any explicit transition table (used e.g. by the stale
  drafter of :mod:`specverify.verifier.zoo`).

Because contexts are finite, the exact law of the token at every absolute
position is computable by propagating the context distribution forward
(:meth:`TableModel.context_marginals`); the harness tracks contexts
incrementally so that a speculative-decoding round costs only gathers.

The models implement the design's protocols: target
``next_token_probs(prefix (B, T)) -> (B, V)`` and drafter
``draft(prefix (B, T), k, *, generator) -> (tokens (B, k), probs (B, k, V))``
(tokens drawn exactly with :func:`specverify.core.sampling.sample` from the reported rows).

Shapes: B batch, T tokens, V vocabulary, C contexts, L sequence length.
"""

from __future__ import annotations

import torch

from specverify.core import portable
from specverify.core.errors import InvalidArgument
from specverify.core.sampling import sample
from specverify.core.validation import check_generator, check_int, check_probs, check_shape, check_tokens

__all__ = [
    "TableModel",
    "PositionalCategorical",
    "NGramTable",
    "MarkovTable",
    "FSMTable",
    "make_rows",
    "ROW_KINDS",
]

#: Row-sum tolerance for tables given by users (rows are renormalised in float64 afterwards).
TABLE_ATOL = 1e-6


def _as_table(name: str, table) -> torch.Tensor:
    table = torch.as_tensor(table)
    check_probs(name, table, atol=TABLE_ATOL)
    if table.ndim != 2:
        raise InvalidArgument(f"{name} must have shape (contexts, V), got {tuple(table.shape)}")
    return portable.normalise(table.to(torch.float64))


class TableModel:
    """A finite-state table model (base class; see the module docstring).

    Subclasses define ``next_context`` and ``initial_context``; ``table`` is the
    ``(C, V)`` float64 table of conditionals, one row per context.
    """

    #: True when the context never depends on the tokens (only on the position).
    token_independent: bool = False
    kind: str = "table"

    def __init__(self, table, *, initial_context: int = 0, name: str = ""):
        self.table = _as_table("table", table)  # (C, V) float64, rows sum to 1
        self.table32 = self.table.to(torch.float32)  # (C, V) what verifiers under test see
        self.initial_context = check_int("initial_context", initial_context, minimum=0, maximum=self.table.shape[0] - 1)
        self.name = name or self.kind

    # ------------------------------------------------------------------ structure
    @property
    def vocab_size(self) -> int:
        return self.table.shape[1]

    @property
    def num_contexts(self) -> int:
        return self.table.shape[0]

    def next_context(self, contexts: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """Context after appending ``tokens`` to prefixes whose context is ``contexts`` (same shape)."""
        raise NotImplementedError

    def with_table(self, table, *, name: str = "") -> TableModel:
        """The same context structure with another table of conditionals."""
        raise NotImplementedError

    def config(self) -> dict:
        """A JSON-able description (kind, sizes, name)."""
        return {"kind": self.kind, "name": self.name, "vocab_size": self.vocab_size, "num_contexts": self.num_contexts}

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r}, V={self.vocab_size}, contexts={self.num_contexts})"

    # ------------------------------------------------------------------ queries
    def context_ids(self, tokens: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """Context id after the first ``lengths[b]`` tokens of row ``b``.

        Parameters
        ----------
        tokens : Tensor, shape (B, Lmax), integer
        lengths : Tensor, shape (B,), integer in [0, Lmax]

        Returns
        -------
        Tensor, shape (B,), long
        """
        tokens, lengths = self._check_prefix(tokens, lengths)
        contexts = torch.full((tokens.shape[0],), self.initial_context, dtype=torch.long)  # (B,)
        for t in range(int(lengths.max()) if lengths.numel() else 0):
            moved = self.next_context(contexts, tokens[:, t])
            contexts = torch.where(t < lengths, moved, contexts)
        return contexts

    def probs_at(self, tokens: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """Conditional law ``(B, V)`` (float64) of the token after the first ``lengths[b]`` tokens of row ``b``."""
        return self.table[self.context_ids(tokens, lengths)]

    def next_token_probs(self, prefix: torch.Tensor) -> torch.Tensor:
        """Target protocol: the conditional ``(B, V)`` after the whole ``prefix`` ``(B, T)``."""
        prefix = check_shape("prefix", torch.as_tensor(prefix), (None, None))
        lengths = torch.full((prefix.shape[0],), prefix.shape[1], dtype=torch.long)
        return self.probs_at(prefix, lengths)

    def draft(self, prefix: torch.Tensor, k: int, *, generator: torch.Generator):
        """Drafter protocol: ``k`` tokens per row drawn exactly from this model after ``prefix``.

        Returns
        -------
        tokens : Tensor, shape (B, k), long
        probs : Tensor, shape (B, k, V), float64 -- the rows the tokens were drawn from
        """
        prefix = check_shape("prefix", torch.as_tensor(prefix), (None, None))
        k = check_int("k", k, minimum=1)
        check_generator("generator", generator)
        lengths = torch.full((prefix.shape[0],), prefix.shape[1], dtype=torch.long)
        contexts = self.context_ids(prefix, lengths)  # (B,)
        tokens, probs = [], []
        for _ in range(k):
            row = self.table[contexts]  # (B, V)
            token = sample(row, generator=generator, check=False)  # (B,)
            tokens.append(token)
            probs.append(row)
            contexts = self.next_context(contexts, token)
        return torch.stack(tokens, 1), torch.stack(probs, 1)  # (B, k), (B, k, V)

    def context_marginals(self, length: int) -> torch.Tensor:
        """Exact law ``(length, C)`` of the context before the token at positions 0..length-1."""
        length = check_int("length", length, minimum=1)
        C, V = self.table.shape
        dist = torch.zeros(C, dtype=torch.float64)
        dist[self.initial_context] = 1.0
        out = [dist]
        all_tokens = torch.arange(V)
        for _ in range(length - 1):
            live = dist.nonzero().squeeze(-1)  # (c,)
            mass = dist[live, None] * self.table[live]  # (c, V)
            nxt = self.next_context(live[:, None].expand(-1, V), all_tokens.expand(live.numel(), V))  # (c, V)
            dist = torch.zeros(C, dtype=torch.float64).index_add_(0, nxt.reshape(-1), mass.reshape(-1))
            out.append(dist)
        return torch.stack(out)  # (length, C)

    def token_marginals(self, length: int) -> torch.Tensor:
        """Exact law ``(length, V)`` of the token at absolute positions 0..length-1 (float64)."""
        return self.context_marginals(length) @ self.table

    # ------------------------------------------------------------------ helpers
    def _check_prefix(self, tokens, lengths):
        tokens = check_shape("tokens", torch.as_tensor(tokens), (None, None))
        check_tokens("tokens", tokens, self.vocab_size)
        lengths = check_shape("lengths", torch.as_tensor(lengths), (tokens.shape[0],))
        if lengths.is_floating_point() or lengths.dtype == torch.bool:
            raise InvalidArgument(f"lengths must have an integer dtype, got {lengths.dtype}")
        if lengths.numel() and (int(lengths.min()) < 0 or int(lengths.max()) > tokens.shape[1]):
            raise InvalidArgument(f"lengths must lie in [0, {tokens.shape[1]}], got {lengths.tolist()[:8]}")
        return tokens.long(), lengths.long()


class PositionalCategorical(TableModel):
    """Context-free model: the token at absolute position t is ~ ``table[min(t, P-1)]``.

    Parameters
    ----------
    table : array-like, shape (P, V)
        One categorical per position; the last row repeats for positions >= P-1.
    """

    token_independent = True
    kind = "positional"

    def __init__(self, table, *, name: str = ""):
        super().__init__(table, initial_context=0, name=name)

    def next_context(self, contexts, tokens):
        return (contexts + 1).clamp_(max=self.num_contexts - 1)

    def with_table(self, table, *, name: str = ""):
        return PositionalCategorical(table, name=name)

    def context_ids(self, tokens, lengths):
        tokens, lengths = self._check_prefix(tokens, lengths)
        return lengths.clamp(max=self.num_contexts - 1)


class NGramTable(TableModel):
    """n-gram model: the next token's law depends on the last ``order - 1`` tokens.

    Contexts are the last ``order - 1`` tokens written in base ``V + 1`` (most
    recent last), the digit ``V`` standing for begin-of-sequence padding, so
    ``num_contexts = (V + 1) ** (order - 1)`` and the empty prefix has context
    ``num_contexts - 1``.

    Parameters
    ----------
    table : array-like, shape ((V+1) ** (order-1), V)
    order : int >= 2
    """

    kind = "ngram"

    def __init__(self, table, *, order: int, name: str = ""):
        self.order = check_int("order", order, minimum=2)
        table = torch.as_tensor(table)
        V = table.shape[-1]
        want = (V + 1) ** (self.order - 1)
        if table.ndim != 2 or table.shape[0] != want:
            raise InvalidArgument(f"table must have shape ({want}, {V}) for order {order}, got {tuple(table.shape)}")
        super().__init__(table, initial_context=want - 1, name=name)

    def next_context(self, contexts, tokens):
        return (contexts * (self.vocab_size + 1) + tokens) % self.num_contexts

    def with_table(self, table, *, name: str = ""):
        return NGramTable(table, order=self.order, name=name)

    def context_ids(self, tokens, lengths):
        tokens, lengths = self._check_prefix(tokens, lengths)
        V1, n1 = self.vocab_size + 1, self.order - 1
        ids = torch.zeros_like(lengths)
        for back in range(n1, 0, -1):  # oldest digit first
            where = lengths - back  # (B,)
            digit = (
                tokens.gather(1, where.clamp(min=0)[:, None]).squeeze(1) if tokens.shape[1] else torch.zeros_like(where)
            )
            ids = ids * V1 + torch.where(where >= 0, digit, torch.full_like(digit, V1 - 1))
        return ids

    def config(self):
        return {**super().config(), "order": self.order}

    def context_tokens(self, contexts: torch.Tensor) -> torch.Tensor:
        """The ``order - 1`` tokens of each context (``V`` = padding), oldest first: ``(..., order-1)``."""
        V1 = self.vocab_size + 1
        digits = [(contexts // V1**i) % V1 for i in range(self.order - 2, -1, -1)]
        return torch.stack(digits, -1)


class MarkovTable(NGramTable):
    """First-order Markov chain: ``initial`` (V,) for position 0, then ``transition[prev]`` (V, V)."""

    kind = "markov"

    def __init__(self, initial, transition, *, name: str = ""):
        initial = torch.as_tensor(initial, dtype=torch.float64)
        transition = torch.as_tensor(transition, dtype=torch.float64)
        if initial.ndim != 1 or transition.ndim != 2 or transition.shape != (initial.shape[0], initial.shape[0]):
            raise InvalidArgument(
                f"initial must be (V,) and transition (V, V), got {tuple(initial.shape)} and {tuple(transition.shape)}"
            )
        super().__init__(torch.cat([transition, initial[None]]), order=2, name=name)

    @classmethod
    def from_table(cls, table, *, name: str = "") -> MarkovTable:
        table = torch.as_tensor(table, dtype=torch.float64)
        return cls(table[-1], table[:-1], name=name)

    def with_table(self, table, *, name: str = ""):
        return MarkovTable.from_table(table, name=name)


class FSMTable(TableModel):
    """Explicit finite-state model: ``transition[c, x]`` is the context after token x in context c.

    Parameters
    ----------
    table : array-like, shape (C, V)
    transition : Tensor, shape (C, V), integer in [0, C)
    initial_context : int
    """

    kind = "fsm"

    def __init__(self, table, transition, *, initial_context: int = 0, name: str = ""):
        super().__init__(table, initial_context=initial_context, name=name)
        transition = check_shape("transition", torch.as_tensor(transition), tuple(self.table.shape))
        check_tokens("transition", transition, self.num_contexts)
        self.transition = transition.long()

    def next_context(self, contexts, tokens):
        return self.transition[contexts, tokens]

    def with_table(self, table, *, name: str = ""):
        return FSMTable(table, self.transition, initial_context=self.initial_context, name=name)


# ---------------------------------------------------------------------- row makers
ROW_KINDS = ("flat", "peaked", "onehot", "zipf", "topk", "topp", "dirichlet", "lm")


def hot_ids(vocab_size: int, size: int) -> torch.Tensor:
    """The ``size`` ids (sorted) a reduced draft vocabulary keeps, scattered over [0, vocab_size).

    Fixed by the two sizes alone (a seeded permutation), as a drafter's hot set or d2t map is fixed
    by its checkpoint; the ids are not a prefix of the vocabulary, so a draft-to-target map that is
    wrong moves probabilities to other tokens.
    """
    check_int("size", size, minimum=1, maximum=vocab_size)
    perm = torch.randperm(vocab_size, generator=torch.Generator().manual_seed(vocab_size * 1_000_003 + size))
    return perm[:size].sort().values


def lm_rows(
    num_rows: int,
    vocab_size: int,
    *,
    generator: torch.Generator,
    real_vocab: int | None = None,
    hot: int | None = None,
    head: int = 48,
    scale: float = 2.0,
    tail_mass: tuple[float, float] = (0.03, 0.10),
    exponent: float = 1.0,
) -> torch.Tensor:
    """Rows shaped like a trained LM's next-token law over a real vocabulary: (num_rows, V) float64.

    A peaked head of ``head`` tokens (softmax of ``scale``-scaled normals) holds 1 - t of the mass;
    a Zipf tail (rank r + 1)^-``exponent`` over every other real token holds t, drawn per row
    uniformly in ``tail_mass``.  Ids are a random permutation per row.  ``real_vocab`` < V makes
    ids >= real_vocab padding (probability exactly 0: a head wider than its tokenizer);
    ``hot`` puts the head tokens among the ``hot`` ids of :func:`hot_ids` (a reduced draft
    vocabulary of the frequent tokens, as EAGLE-3 / FR-Spec drafters keep).  With the defaults at V ~ 150k: entropy
    ~2.3-3.2 nats, top token ~0.2-0.6, mass beyond the top 1,000 tokens ~0.02-0.08
    (``docs/large-vocabularies.md`` gives the published figures this is matched to).
    """
    f64 = torch.float64
    V = vocab_size
    real = V if real_vocab is None else check_int("real_vocab", real_vocab, minimum=2, maximum=V)
    hot = real if hot is None else check_int("hot", hot, minimum=1, maximum=real)
    head = min(check_int("head", head, minimum=1), hot, real - 1)
    lo, hi = tail_mass
    if not 0 < lo <= hi < 1:
        raise InvalidArgument(f"tail_mass must be (lo, hi) with 0 < lo <= hi < 1, got {tail_mass!r}")
    head_w = portable.softmax(scale * torch.randn(num_rows, head, generator=generator, dtype=f64))  # (N, h)
    head_w = head_w.sort(-1, descending=True).values
    tail_w = portable.normalise(
        portable.power(torch.arange(1, real - head + 1, dtype=f64), -exponent)[None]
    )  # (1, R-h)
    t = lo + (hi - lo) * torch.rand(num_rows, 1, generator=generator, dtype=f64)  # (N, 1)
    by_rank = torch.cat([(1 - t) * head_w, t * tail_w.expand(num_rows, -1)], dim=1)  # (N, R)
    hot_pool = hot_ids(real, hot)  # (hot,) the ids a reduced draft vocabulary keeps
    pick = torch.argsort(torch.rand(num_rows, hot, generator=generator), dim=-1, stable=True)[:, :head]  # (N, h)
    head_ids = hot_pool[pick]  # (N, h)
    rest = torch.ones(num_rows, real, dtype=torch.bool).scatter_(1, head_ids, False)  # (N, R)
    others = torch.argsort(torch.rand(num_rows, real, generator=generator) + 2.0 * (~rest), dim=-1, stable=True)
    ids = torch.cat([head_ids, others[:, : real - head]], dim=1)  # (N, R) token id of each rank
    rows = torch.zeros(num_rows, V, dtype=f64).scatter_(1, ids, by_rank)  # (N, V) padding ids stay 0
    return portable.normalise(rows)


def make_rows(
    num_rows: int, vocab_size: int, kind: str = "peaked", *, generator: torch.Generator, **options
) -> torch.Tensor:
    """``(num_rows, vocab_size)`` float64 probability rows of a given shape.

    kinds: ``flat`` (near uniform), ``peaked`` (softmax of ``scale``-scaled normals,
    default 2.0), ``onehot`` (temperature 0: a point mass on a random token),
    ``zipf`` (p_k ~ (k + 2.7)^-s over a random permutation, s=``exponent`` 1.1),
    ``topk`` (peaked, truncated to the ``top_k`` largest, default V//4, renormalised),
    ``topp`` (peaked, truncated to the smallest set of mass >= ``top_p``, default 0.8),
    ``dirichlet`` (Dirichlet(``concentration``), with exact zeros where a Gamma underflows
    replaced by nothing: rows can be near-degenerate), ``lm`` (a trained LM's shape over a real
    vocabulary, padding and a hot set: :func:`lm_rows`).
    """
    num_rows = check_int("num_rows", num_rows, minimum=1)
    V = check_int("vocab_size", vocab_size, minimum=1)
    check_generator("generator", generator)
    f64 = torch.float64
    if kind == "flat":
        logits = options.get("scale", 0.3) * torch.randn(num_rows, V, generator=generator, dtype=f64)
        return portable.softmax(logits)
    if kind in ("peaked", "topk", "topp"):
        logits = options.get("scale", 2.0) * torch.randn(num_rows, V, generator=generator, dtype=f64)
        rows = portable.softmax(logits)  # (N, V)
        if kind == "topk":
            top_k = min(V, max(1, options.get("top_k", max(1, V // 4))))
            keep = rows >= rows.topk(top_k, -1).values[:, -1:]
            rows = torch.where(keep, rows, torch.zeros_like(rows))
        elif kind == "topp":
            top_p = options.get("top_p", 0.8)
            sorted_rows, order = rows.sort(dim=-1, descending=True, stable=True)
            before = sorted_rows.cumsum(-1) - sorted_rows  # mass strictly before each token
            keep_sorted = before < top_p
            keep = torch.zeros_like(keep_sorted).scatter_(-1, order, keep_sorted)
            rows = torch.where(keep, rows, torch.zeros_like(rows))
        return portable.normalise(rows)
    if kind == "onehot":
        hot = torch.randint(V, (num_rows,), generator=generator)
        return torch.nn.functional.one_hot(hot, V).to(f64)
    if kind == "zipf":
        s = options.get("exponent", 1.1)
        base = portable.power(torch.arange(V, dtype=f64) + 2.7, -s)
        perms = torch.argsort(torch.rand(num_rows, V, generator=generator), dim=-1, stable=True)  # (N, V)
        return portable.normalise(base[perms])
    if kind == "lm":
        return lm_rows(num_rows, V, generator=generator, **options)
    if kind == "dirichlet":
        conc = options.get("concentration", 0.5)
        gamma = torch._standard_gamma(torch.full((num_rows, V), float(conc), dtype=f64), generator=generator)
        gamma[portable.row_sums(gamma) <= 0, 0] = 1.0
        return portable.normalise(gamma)
    raise InvalidArgument(f"kind must be one of {ROW_KINDS}, got {kind!r}")


def positional(vocab_size: int, positions: int, kind: str = "peaked", *, seed: int, name: str = "", **options):
    """A :class:`PositionalCategorical` with ``positions`` rows of ``kind`` (seeded)."""
    gen = torch.Generator().manual_seed(seed)
    return PositionalCategorical(
        make_rows(positions, vocab_size, kind, generator=gen, **options), name=name or f"positional-{kind}"
    )


def markov(vocab_size: int, kind: str = "peaked", *, seed: int, name: str = "", **options):
    """A :class:`MarkovTable` whose V+1 rows are of ``kind`` (seeded)."""
    gen = torch.Generator().manual_seed(seed)
    return MarkovTable.from_table(
        make_rows(vocab_size + 1, vocab_size, kind, generator=gen, **options), name=name or f"markov-{kind}"
    )


def ngram(vocab_size: int, order: int, kind: str = "peaked", *, seed: int, name: str = "", **options):
    """An :class:`NGramTable` of ``order`` whose rows are of ``kind`` (seeded)."""
    gen = torch.Generator().manual_seed(seed)
    rows = (vocab_size + 1) ** (order - 1)
    if rows * vocab_size > 1 << 24:
        raise InvalidArgument(f"an order-{order} table over V={vocab_size} has {rows} rows: too large")
    return NGramTable(
        make_rows(rows, vocab_size, kind, generator=gen, **options), order=order, name=name or f"ngram{order}-{kind}"
    )


__all__ += ["positional", "markov", "ngram"]
