"""llama-cpp-python's sampler chain, re-implemented in torch float64 (engine-free).

``Llama.generate`` builds one llama.cpp sampler chain per call (``Llama._init_sampler``) and
samples every token with ``llama_sampler_sample``, which applies the chain to the token's raw
logits and then *accepts* the sampled token into every stateful stage.  With temperature > 0
and mirostat off the chain is, in order::

    penalties(last_n_tokens_size, repeat, frequency, presence)
    -> grammar (if given) -> top_k(k) -> typical(1.0: off) -> top_p(p, min_keep=1)
    -> min_p(p, min_keep=1) -> temp(T) -> dist(seed)

with ``generate``'s defaults ``temp=0.8, top_k=40, top_p=0.95, min_p=0.05``, no penalties
(``repeat_penalty=1``, ``frequency_penalty=0``, ``presence_penalty=0``) and
``Llama(last_n_tokens_size=64)``.  ``temp == 0`` replaces everything after the grammar by
``greedy`` (argmax).  Read in llama.cpp ``src/llama-sampler.cpp`` (vendored by
llama-cpp-python 0.3.36):

* penalties: for each token with count c > 0 in the ring buffer of the last ``last_n`` accepted
  tokens, ``l = l * r if l <= 0 else l / r`` then ``l -= c * freq + presence``.  Only tokens
  passed to ``llama_sampler_accept`` enter the buffer; ``generate`` never accepts the prompt, so
  the window holds generated tokens only;
* grammar: a token the grammar cannot take next gets logit -inf; an end-of-generation token is
  allowed only when the grammar is complete; a token with an empty piece (a control token) never;
* top_k: the k largest logits (k <= 0: off);
* top_p: softmax of the current logits (at temperature 1: temperature comes later), sorted
  descending; keep the shortest prefix whose cumulative probability is >= p (p >= 1: off);
* min_p: keep tokens with ``logit >= max_logit + log(p)``, i.e. ``p_i >= p * p_max`` (p <= 0: off);
* temp: logits / T; dist: softmax and one draw.

:func:`processed_probs` applies that chain to float logits; the grammar's allowed-token mask comes
from :class:`CharGrammar` (a character DFA of a regular GBNF grammar, run over token pieces).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch

from specverify.core.errors import InvalidArgument
from specverify.core.validation import check_float, check_int

__all__ = [
    "DEFAULTS",
    "SamplerOptions",
    "sampler_options",
    "apply_penalties",
    "truncate",
    "processed_probs",
    "CharGrammar",
    "WORD_GRAMMAR",
]

#: ``Llama.generate``'s sampling defaults and ``Llama(last_n_tokens_size=64)`` (llama-cpp-python 0.3.36).
DEFAULTS = dict(
    temperature=0.8,
    top_k=40,
    top_p=0.95,
    min_p=0.05,
    repeat_penalty=1.0,
    frequency_penalty=0.0,
    presence_penalty=0.0,
    last_n=64,
)


@dataclass(frozen=True)
class SamplerOptions:
    """The options of llama-cpp-python's default sampler chain (see the module docstring).

    ``temperature`` 0 is greedy; ``top_k`` <= 0, ``top_p`` >= 1 and ``min_p`` <= 0 are off; the
    penalties are off at ``repeat_penalty=1``, ``frequency_penalty=0``, ``presence_penalty=0``;
    ``last_n`` is ``Llama(last_n_tokens_size=...)``, the penalty window (0: penalties off).
    """

    temperature: float = DEFAULTS["temperature"]
    top_k: int = DEFAULTS["top_k"]
    top_p: float = DEFAULTS["top_p"]
    min_p: float = DEFAULTS["min_p"]
    repeat_penalty: float = DEFAULTS["repeat_penalty"]
    frequency_penalty: float = DEFAULTS["frequency_penalty"]
    presence_penalty: float = DEFAULTS["presence_penalty"]
    last_n: int = DEFAULTS["last_n"]

    @property
    def penalised(self) -> bool:
        """Whether the penalties stage changes anything (llama.cpp's ``is_disabled`` negated)."""
        return self.last_n != 0 and (
            self.repeat_penalty != 1.0 or self.frequency_penalty != 0.0 or self.presence_penalty != 0.0
        )

    def generate_kwargs(self) -> dict:
        """The keyword arguments of ``Llama.generate`` for these options (``last_n`` goes to ``Llama``)."""
        return dict(
            temp=self.temperature,
            top_k=self.top_k,
            top_p=self.top_p,
            min_p=self.min_p,
            repeat_penalty=self.repeat_penalty,
            frequency_penalty=self.frequency_penalty,
            presence_penalty=self.presence_penalty,
        )


def _number(name: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidArgument(f"{name} must be an int or a float, got {value!r}")
    return check_float(name, value)


def sampler_options(**options) -> SamplerOptions:
    """Validated :class:`SamplerOptions` (unknown names raise; missing ones take :data:`DEFAULTS`).

    temperature >= 0, top_k an int (<= 0 off), top_p in (0, 1], min_p in [0, 1), repeat_penalty > 0,
    frequency and presence penalties finite, last_n an int >= 0.
    """
    unknown = sorted(set(options) - set(DEFAULTS))
    if unknown:
        raise InvalidArgument(f"unknown sampler options {unknown}; known: {sorted(DEFAULTS)}")
    o = {**DEFAULTS, **options}
    for name in ("temperature", "top_p", "min_p", "repeat_penalty", "frequency_penalty", "presence_penalty"):
        o[name] = _number(name, o[name])
    check_float("temperature", o["temperature"], minimum=0.0)
    check_float("top_p", o["top_p"], minimum=0.0, maximum=1.0, exclusive_minimum=True)
    check_float("min_p", o["min_p"], minimum=0.0, maximum=1.0)
    if o["min_p"] >= 1.0:
        raise InvalidArgument(f"min_p must be < 1, got {o['min_p']!r}")
    check_float("repeat_penalty", o["repeat_penalty"], minimum=0.0, exclusive_minimum=True)
    o["top_k"] = check_int("top_k", o["top_k"])
    o["last_n"] = check_int("last_n", o["last_n"], minimum=0)
    return SamplerOptions(**o)


def apply_penalties(logits: torch.Tensor, history: torch.Tensor, options: SamplerOptions) -> torch.Tensor:
    """Repeat / frequency / presence penalties over the last ``options.last_n`` tokens of ``history``.

    ``logits`` (B, V) float; ``history`` (B, H) long: the tokens accepted so far, oldest first
    (generated tokens only, for ``Llama.generate``).  Returns new (B, V) logits.
    """
    if not options.penalised or history.shape[1] == 0:
        return logits.clone()
    window = history[:, -options.last_n :]  # (B, h)
    counts = torch.zeros(logits.shape, dtype=logits.dtype, device=logits.device)  # (B, V)
    counts.scatter_add_(1, window, torch.ones(window.shape, dtype=logits.dtype, device=logits.device))
    seen = counts > 0  # (B, V)
    repeated = torch.where(logits <= 0, logits * options.repeat_penalty, logits / options.repeat_penalty)  # (B, V)
    penalised = repeated - counts * options.frequency_penalty - seen.to(logits.dtype) * options.presence_penalty
    return torch.where(seen, penalised, logits)  # (B, V)


def truncate(logits: torch.Tensor, options: SamplerOptions) -> torch.Tensor:
    """top_k, then top_p (at temperature 1), then min_p: dropped tokens get -inf.  (B, V) -> (B, V)."""
    out = logits.clone()
    B, V = out.shape
    order = torch.argsort(out, dim=1, descending=True, stable=True)  # (B, V)
    rank = torch.empty_like(order)
    rank.scatter_(1, order, torch.arange(V, device=out.device).expand(B, V))  # (B, V): rank of each token
    if 0 < options.top_k < V:
        out = out.masked_fill(rank >= options.top_k, -math.inf)
    if options.top_p < 1.0:
        sorted_probs = torch.softmax(torch.gather(out, 1, order), dim=1)  # (B, V), descending
        cumulative = sorted_probs.cumsum(1)  # (B, V)
        reached = cumulative >= options.top_p  # (B, V)
        # the first index reaching p is kept (min_keep = 1); none reached (rounding): keep all
        first = torch.where(reached.any(1), reached.to(torch.int64).argmax(1), torch.full((B,), V - 1))  # (B,)
        out = out.masked_fill(rank > first[:, None], -math.inf)
    if options.min_p > 0.0:
        cutoff = out.max(1, keepdim=True).values + math.log(options.min_p)  # (B, 1)
        out = out.masked_fill(out < cutoff, -math.inf)
    return out


def processed_probs(
    logits: torch.Tensor,
    options: SamplerOptions,
    *,
    history: torch.Tensor | None = None,
    allowed: torch.Tensor | None = None,
) -> torch.Tensor:
    """The law ``llama_sampler_sample`` draws from: (B, V) raw logits -> (B, V) float64 probabilities.

    Parameters
    ----------
    logits : (B, V) float
        The model's raw next-token logits (computed in float64 here).
    options : SamplerOptions
    history : (B, H) long, optional
        Tokens accepted into the chain so far (the penalty window's source).
    allowed : (B, V) bool, optional
        The grammar's allowed-token mask (:meth:`CharGrammar.mask`).

    Returns
    -------
    (B, V) float64; at temperature 0 the one-hot argmax of the penalised, grammar-masked logits
    (lowest id on ties, as llama.cpp's greedy sampler).
    """
    x = logits.to(torch.float64)
    if history is not None:
        x = apply_penalties(x, history.to(torch.int64), options)
    if allowed is not None:
        x = x.masked_fill(~allowed, -math.inf)
    if options.temperature == 0.0:
        return torch.nn.functional.one_hot(x.argmax(1), x.shape[1]).to(torch.float64)  # (B, V)
    x = truncate(x, options)
    return torch.softmax(x / options.temperature, dim=1)  # (B, V)


@dataclass(frozen=True)
class CharGrammar:
    """A regular grammar as a character DFA, and the GBNF text llama.cpp compiles for it.

    llama.cpp's grammar sampler allows a token iff every character of its piece can be consumed
    from the current state (a token may end mid-word); it never allows a token with an empty
    piece, and allows an end-of-generation token only when the grammar is complete, which a
    grammar without accepting states never is.

    Parameters
    ----------
    gbnf : str
        The grammar given to ``LlamaGrammar.from_string``.
    transitions : tuple of (state, char, next_state)
        The DFA; state 0 is the start; a missing transition rejects.
    accepting : frozenset of int
        States in which the grammar is complete (end-of-generation allowed).
    """

    gbnf: str
    transitions: tuple[tuple[int, str, int], ...]
    accepting: frozenset[int] = frozenset()

    @functools.cached_property
    def _table(self) -> dict[tuple[int, str], int]:
        return {(s, c): t for s, c, t in self.transitions}

    def step(self, state: int, piece: str) -> int | None:
        """The state after ``piece`` from ``state``, or None if the grammar rejects it (or it is empty)."""
        if not piece:
            return None
        table = self._table
        for char in piece:
            nxt = table.get((state, char))
            if nxt is None:
                return None
            state = nxt
        return state

    def states(self, tokens: torch.Tensor, pieces: list[str]) -> list[int | None]:
        """The state after each row of ``tokens`` (B, H), from the start; None once a token was rejected."""
        out: list[int | None] = []
        for row in tokens.tolist():
            state: int | None = 0
            for token in row:
                state = None if state is None else self.step(state, pieces[token])
            out.append(state)
        return out

    def mask(self, states: list[int | None], pieces: list[str], eog: frozenset[int]) -> torch.Tensor:
        """Allowed next tokens (B, V) bool for each state.

        A None state (an earlier token broke the grammar: probability 0 under the law, which the
        tests flag at that position) allows every token, so that later rows stay a distribution.
        """
        cache: dict[int | None, list[bool]] = {}
        rows = []
        for state in states:
            if state not in cache:
                cache[state] = [
                    state is None
                    or (token in eog and state in self.accepting)
                    or (token not in eog and self.step(state, p) is not None)
                    for token, p in enumerate(pieces)
                ]
            rows.append(cache[state])
        return torch.tensor(rows, dtype=torch.bool).reshape(len(states), len(pieces))  # (B, V)


#: Words separated by single spaces, forever: ``word ::= "a" [bc]* | "ba"``.  Which tokens may
#: come next depends on the state (start of a word, inside ``a[bc]*``, after ``b``, after ``ba``);
#: the grammar never completes, so end-of-generation is never allowed.
WORD_GRAMMAR = CharGrammar(
    gbnf='root ::= word " " root\nword ::= "a" [bc]* | "ba"\n',
    transitions=(
        (0, "a", 1),
        (0, "b", 2),
        (1, "b", 1),
        (1, "c", 1),
        (1, " ", 0),
        (2, "a", 3),
        (3, " ", 0),
    ),
)
