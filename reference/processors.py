"""Sampling processors: temperature, top-k, top-p (nucleus), min-p, greedy.

Pure functions on logits / probabilities that return normalised probability
rows (float64 by default).  The pipeline :func:`logits_to_probs` applies, in
this order (the order of Hugging Face ``generate`` and vLLM):

1. temperature: ``softmax(logits / T)``; ``T == 0`` means greedy, a one-hot row
   on ``argmax(logits)`` (ties to the lowest token id, like ``torch.argmax``),
   and the other processors are then irrelevant;
2. top-k: keep the tokens whose probability is >= the k-th largest (ties at
   the boundary are all kept, so the result does not depend on sort order);
   computed from the k+1 largest logits of each row (a softmax over k values,
   scattered into zeros), the full-vocabulary softmax only for rows with a
   near-tie at the boundary;
3. top-p: keep the smallest prefix of the tokens sorted by decreasing
   probability whose mass reaches ``p`` (the token that crosses ``p`` is kept);
4. min-p: keep the tokens with probability >= ``min_p * max(probs)``;

each step renormalising.  The same :class:`SamplingConfig` must be applied to
the target and to the drafter; the drafter then reports the processed law it
sampled from.

Engines differ in that order and in what comes before it (``SamplingConfig.engine``; each
engine's law as its source states it):

* ``hf`` (the default; transformers ``generate``): repetition penalty over the whole input, then
  the order above;
* ``vllm`` (``vllm/v1/sample/sampler.py``): logit bias, then the penalties
  (:mod:`specverify_reference.penalties`), temperature, min-p (an argmax-invariant logits
  processor, applied before the sampler's top-k and top-p), top-k, top-p;
* ``llama.cpp`` (``common/sampling.cpp``'s default chain ``penalties; dry; top_n_sigma; top_k;
  typ_p; top_p; min_p; xtc; temperature``, the logit bias first): logit bias, penalties over the
  last ``penalty_last_n`` tokens, then top-k, top-p and min-p computed on the *untempered*
  softmax, and only then the temperature, applied to the kept tokens.

Min-p keeps a prefix of the sorted order whose threshold is relative to the largest probability,
so min-p before top-k equals min-p after it: ``vllm`` is computed as temperature, top-k, min-p,
top-p.

References: Holtzman et al., "The Curious Case of Neural Text Degeneration"
(ICLR 2020) for top-p; Nguyen et al., "Turning Up the Heat: Min-p Sampling"
(2024) for min-p; Fan et al. (2018) for top-k; Keskar et al., "CTRL" (2019) for the
repetition penalty.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import torch

from specverify.core.errors import InvalidArgument
from specverify_reference.grammar import Grammar, mask_logits_
from specverify_reference.penalties import History, penalise

__all__ = [
    "ENGINES",
    "Grammar",
    "adjust_logits",
    "History",
    "SamplingConfig",
    "GREEDY",
    "logits_to_probs",
    "logits_to_probs_by_rows",
    "temperature_probs",
    "greedy_probs",
    "top_k_probs",
    "top_p_probs",
    "min_p_probs",
]


@dataclass(frozen=True)
class SamplingConfig:
    """A sampling configuration (validated on construction).

    Parameters
    ----------
    temperature : float
        >= 0; 0 means greedy (one-hot argmax).
    top_k : int or None
        Keep the k most likely tokens (k >= 1); None disables it.
    top_p : float or None
        Nucleus mass in (0, 1]; None disables it.
    min_p : float or None
        Relative threshold in [0, 1]; None disables it.
    engine : str
        Whose law (see the module docstring): ``"hf"`` (default), ``"vllm"`` or ``"llama.cpp"``.
    repetition_penalty : float
        > 0; 1 is off (:mod:`specverify_reference.penalties` says what each engine counts).
    frequency_penalty, presence_penalty : float
        Finite; 0 is off (not offered by ``"hf"``).
    logit_bias : tuple of (int, float)
        Added to the logits of the listed token ids before the penalties (``"vllm"``,
        ``"llama.cpp"``); a mapping is accepted and stored sorted by id.  ``-inf`` bans a token.
    penalty_last_n : int or None
        ``"llama.cpp"`` only: the window of the penalties (llama-server's default is 64; None is
        the whole history, ``-1`` in llama.cpp).
    grammar : Grammar or None
        A structured-output constraint (:mod:`specverify_reference.grammar`): before every other
        processor, the tokens the grammar does not allow after the output so far get logit
        ``-inf`` (vLLM's order; the mask is lifted once the grammar has terminated).
    """

    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None
    min_p: float | None = None
    engine: str = "hf"
    repetition_penalty: float = 1.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    logit_bias: tuple = ()
    penalty_last_n: int | None = None
    grammar: Grammar | None = None

    def __post_init__(self):
        self._check_cuts()
        self._check_penalties()
        if self.grammar is not None and not isinstance(self.grammar, Grammar):
            raise InvalidArgument(f"grammar must be None or a Grammar, got {self.grammar!r}")

    def _check_cuts(self):
        t = self.temperature
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t) or t < 0:
            raise InvalidArgument(f"temperature must be a finite number >= 0, got {t!r}")
        k = self.top_k
        if k is not None and (isinstance(k, bool) or not isinstance(k, int) or k < 1):
            raise InvalidArgument(f"top_k must be None or an integer >= 1, got {k!r}")
        p = self.top_p
        if p is not None and (isinstance(p, bool) or not isinstance(p, (int, float)) or not 0.0 < p <= 1.0):
            raise InvalidArgument(f"top_p must be None or a number in (0, 1], got {p!r}")
        m = self.min_p
        if m is not None and (isinstance(m, bool) or not isinstance(m, (int, float)) or not 0.0 <= m <= 1.0):
            raise InvalidArgument(f"min_p must be None or a number in [0, 1], got {m!r}")

    def _check_penalties(self):
        if self.engine not in ENGINES:
            raise InvalidArgument(f"engine must be one of {', '.join(map(repr, ENGINES))}, got {self.engine!r}")
        r = self.repetition_penalty
        if not _is_number(r) or not math.isfinite(r) or r <= 0:
            raise InvalidArgument(f"repetition_penalty must be a finite number > 0, got {r!r}")
        for name in ("frequency_penalty", "presence_penalty"):
            value = getattr(self, name)
            if not _is_number(value) or not math.isfinite(value):
                raise InvalidArgument(f"{name} must be a finite number, got {value!r}")
            if value != 0 and self.engine == "hf":
                raise InvalidArgument(f"{name} is not a transformers generate option (engine 'hf'), got {value!r}")
        object.__setattr__(self, "logit_bias", _bias_pairs(self.logit_bias))
        if self.logit_bias and self.engine == "hf":
            raise InvalidArgument("logit_bias is not a transformers generate option (engine 'hf')")
        n = self.penalty_last_n
        if n is not None:
            if self.engine != "llama.cpp":
                raise InvalidArgument(f"penalty_last_n is llama.cpp's window (engine 'llama.cpp'), got {n!r}")
            if isinstance(n, bool) or not isinstance(n, int) or n < 0:
                raise InvalidArgument(f"penalty_last_n must be None or an integer >= 0, got {n!r}")

    @property
    def greedy(self) -> bool:
        """True when the configuration is deterministic (temperature 0)."""
        return self.temperature == 0

    @property
    def needs_history(self) -> bool:
        """True when a law depends on the tokens before it (a penalty or a grammar is on)."""
        return self.penalised or self.grammar is not None

    @property
    def penalised(self) -> bool:
        """True when a repetition, frequency or presence penalty is on."""
        return self.repetition_penalty != 1.0 or self.frequency_penalty != 0.0 or self.presence_penalty != 0.0

    @property
    def adjusts_logits(self) -> bool:
        """True when logits change before the temperature (a penalty, a grammar or a logit bias)."""
        return self.needs_history or bool(self.logit_bias)

    def cuts(self) -> SamplingConfig:
        """The same configuration without its grammar, penalties and logit bias (what follows them)."""
        return dataclasses.replace(
            self, repetition_penalty=1.0, frequency_penalty=0.0, presence_penalty=0.0, logit_bias=(),
            penalty_last_n=None, grammar=None,
        )  # fmt: skip


#: The engines whose law :func:`logits_to_probs` computes.
ENGINES = ("hf", "vllm", "llama.cpp")


def _is_number(value) -> bool:
    return not isinstance(value, bool) and isinstance(value, (int, float))


def _bias_pairs(bias) -> tuple:
    """``logit_bias`` as a tuple of (id, bias) pairs sorted by id (from a mapping or pairs)."""
    items = bias.items() if isinstance(bias, dict) else bias
    try:
        pairs = [(token, value) for token, value in items]
    except (TypeError, ValueError):
        raise InvalidArgument(f"logit_bias must map token ids to numbers, got {bias!r}") from None
    for token, value in pairs:
        if isinstance(token, bool) or not isinstance(token, int) or token < 0:
            raise InvalidArgument(f"logit_bias ids must be integers >= 0, got {token!r}")
        if not _is_number(value) or math.isnan(value) or value == math.inf:
            raise InvalidArgument(f"logit_bias values must be finite numbers or -inf, got {value!r} for id {token}")
    ids = [token for token, _ in pairs]
    if len(set(ids)) != len(ids):
        raise InvalidArgument(f"logit_bias lists an id twice: {sorted(ids)}")
    return tuple(sorted((int(token), float(value)) for token, value in pairs))


#: Temperature 0: every row becomes one-hot on its argmax.
GREEDY = SamplingConfig(temperature=0.0)


def _renormalise(weights: torch.Tensor) -> torch.Tensor:
    """Rows divided by their sums, in place (``weights`` is a fresh tensor of the caller's)."""
    return weights.div_(weights.sum(-1, keepdim=True))


def greedy_probs(logits: torch.Tensor, *, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """One-hot rows on ``argmax(logits)`` (lowest id on ties), shape of ``logits``."""
    idx = logits.argmax(-1, keepdim=True)  # (..., 1)
    return torch.zeros(logits.shape, dtype=dtype, device=logits.device).scatter_(-1, idx, 1.0)


def temperature_probs(logits: torch.Tensor, temperature: float, *, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """``softmax(logits / temperature)`` computed in ``dtype``; temperature 0 is greedy."""
    if temperature == 0:
        return greedy_probs(logits, dtype=dtype)
    scaled = logits.to(dtype)  # a copy unless logits already have dtype
    scaled = scaled / temperature if scaled is logits else scaled.div_(temperature)  # x / 1 is x: bits kept
    return torch.softmax(scaled, dim=-1)


def top_k_probs(probs: torch.Tensor, k: int) -> torch.Tensor:
    """Keep tokens with probability >= the k-th largest of their row; renormalise."""
    V = probs.shape[-1]
    if k >= V:
        return probs
    kth = probs.topk(k, dim=-1).values[..., -1:]  # (..., 1)
    return _renormalise(probs.masked_fill(probs < kth, 0.0))


def top_p_probs(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """Keep the most likely tokens until their mass reaches ``top_p``; renormalise.

    A token is kept iff the mass of the tokens sorted strictly before it (by
    decreasing probability, stable on ties) is < ``top_p``; the most likely
    token is therefore always kept.
    """
    if top_p >= 1.0:
        return probs
    sorted_probs, order = probs.sort(dim=-1, descending=True, stable=True)  # (..., V)
    cumulative = sorted_probs.cumsum(-1)  # (..., V)
    mass_before = torch.cat([torch.zeros_like(cumulative[..., :1]), cumulative[..., :-1]], dim=-1)  # (..., V) exclusive
    keep_sorted = mass_before < top_p  # (..., V)
    keep = torch.zeros_like(keep_sorted).scatter_(-1, order, keep_sorted)  # (..., V) back to token order
    return _renormalise(probs.masked_fill(~keep, 0.0))


def min_p_probs(probs: torch.Tensor, min_p: float) -> torch.Tensor:
    """Keep tokens with probability >= ``min_p * max(probs)`` of their row; renormalise."""
    if min_p <= 0.0:
        return probs
    threshold = min_p * probs.amax(-1, keepdim=True)  # (..., 1)
    return _renormalise(probs.masked_fill(probs < threshold, 0.0))


#: A row takes the fast top-k law only when its k-th largest tempered logit exceeds the
#: (k+1)-th by more than this much (relative): exp then cannot round the two to one
#: probability, so the kept set is exactly the dense path's (ties at the boundary all kept).
TOP_K_GAP = 1e-9


def _top_k_law(
    logits: torch.Tensor, temperature: float, k: int, dtype: torch.dtype, out: torch.Tensor | None = None
) -> torch.Tensor | None:
    """Temperature then top-k, from the k+1 largest logits of each row; None when k >= V.

    ``softmax(logits / T)`` masked to its top k and renormalised equals the softmax of the k
    largest tempered logits scattered into a row of zeros: one topk pass and one zeroed row
    instead of a full-vocabulary exp, mask and renormalisation (the same law; the bits differ
    by an ulp).  A row whose k-th and (k+1)-th logits are tied, closer than
    :data:`TOP_K_GAP`, or not finite takes the dense path (:func:`temperature_probs`, then
    :func:`top_k_probs`), row by row, so that a row's bits never depend on its batch.
    ``out`` (the shape of ``logits``, ``dtype``; it may be ``logits`` itself) receives the law:
    no fresh full-vocabulary tensor (at V = 151,936 a fresh one costs page faults per call).
    """
    V = logits.shape[-1]
    if k >= V:
        return None
    vals, idx = logits.topk(k + 1, dim=-1)  # (..., k+1), decreasing
    tempered = vals.to(dtype) / temperature  # (..., k+1)
    kth, next_ = tempered[..., k - 1], tempered[..., k]  # (...,)
    fast = ((kth - next_) > TOP_K_GAP * torch.clamp(kth.abs(), min=1.0)) & torch.isfinite(kth)  # (...,) False on nan
    top = torch.softmax(tempered[..., :k], dim=-1)  # (..., k)
    dense = None if bool(fast.all()) else ~fast  # (...,)
    dense_rows = None if dense is None else top_k_probs(temperature_probs(logits[dense], temperature, dtype=dtype), k)
    if out is None:
        out = torch.zeros(logits.shape, dtype=dtype, device=logits.device)  # (..., V)
    else:
        out.zero_()  # after the reads of logits above: out may be logits
    out.scatter_(-1, idx[..., :k], top)
    if dense_rows is not None:
        out[dense] = dense_rows  # (n, V)
    return out


def adjust_logits(
    logits: torch.Tensor, config: SamplingConfig, history: History | None = None, *, in_place: bool = False
) -> torch.Tensor:
    """The logits after ``config``'s grammar mask, logit bias and penalties, float64 (..., V).

    ``history`` says which tokens each law conditions on (needed when a penalty or a grammar is on; its
    ``ends`` (B, n) must match ``logits`` (B, n, V) or (B, V) with n = 1).  ``in_place`` writes
    over float64 contiguous ``logits``; otherwise a copy is made (only when something changes).
    """
    if not config.adjusts_logits:
        return logits
    if config.needs_history and not isinstance(history, History):
        raise InvalidArgument(
            f"penalties and grammars need the history each law conditions on (a History), got {history!r}"
        )
    V = logits.shape[-1]
    own = in_place and logits.dtype == torch.float64 and logits.is_contiguous()
    adjusted = logits if own else logits.to(torch.float64, copy=True).contiguous()
    if config.logit_bias:
        ids = torch.tensor([token for token, _ in config.logit_bias], device=logits.device)  # (m,)
        if int(ids.max()) >= V:
            raise InvalidArgument(f"logit_bias lists id {int(ids.max())}, outside the vocabulary of {V} tokens")
        bias = torch.tensor([value for _, value in config.logit_bias], dtype=torch.float64, device=logits.device)
        adjusted[..., ids] += bias
    if config.needs_history:
        assert history is not None  # checked above
        B, n = history.ends.shape
        if adjusted.numel() != B * n * V:
            raise InvalidArgument(f"history.ends {(B, n)} does not match logits of shape {tuple(logits.shape)}")
        penalise(
            adjusted.view(B, n, V), history, engine=config.engine, repetition=config.repetition_penalty,
            frequency=config.frequency_penalty, presence=config.presence_penalty, last_n=config.penalty_last_n,
        )  # fmt: skip
        if config.grammar is not None:  # -inf stays -inf under the bias and the penalties: the order is vLLM's
            mask_logits_(adjusted.view(B, n, V), config.grammar, history)
    return adjusted


def _cut_probs(logits: torch.Tensor, config: SamplingConfig, dtype: torch.dtype, out: torch.Tensor | None):
    """The law after temperature and the cuts, in ``config.engine``'s order (no penalties, no bias)."""
    if config.greedy:
        return greedy_probs(logits, dtype=dtype)
    if config.engine == "llama.cpp" and config.temperature != 1.0:
        # the cuts on the untempered softmax, then the temperature over the kept tokens
        kept = _cut_probs(logits, dataclasses.replace(config, temperature=1.0), dtype, None) > 0  # (..., V)
        return _renormalise(temperature_probs(logits, config.temperature, dtype=dtype).masked_fill_(~kept, 0.0))
    law = None if config.top_k is None else _top_k_law(logits, config.temperature, config.top_k, dtype, out=out)
    # no top-k, or k >= V (top-k then keeps every token): the tempered softmax
    probs = temperature_probs(logits, config.temperature, dtype=dtype) if law is None else law
    if config.engine == "vllm" and config.min_p is not None:
        probs = min_p_probs(probs, config.min_p)
    if config.top_p is not None:
        probs = top_p_probs(probs, config.top_p)
    if config.engine != "vllm" and config.min_p is not None:
        probs = min_p_probs(probs, config.min_p)
    return probs


def logits_to_probs(
    logits: torch.Tensor,
    config: SamplingConfig,
    *,
    dtype: torch.dtype = torch.float64,
    out: torch.Tensor | None = None,
    history: History | None = None,
) -> torch.Tensor:
    """Apply the whole processor pipeline of ``config`` to ``logits`` (shape (..., V)).

    Returns normalised probability rows in ``dtype`` (float64 or float32), same shape: ``out``
    when given (a tensor of that shape and dtype, possibly ``logits`` itself), written in place.
    ``history`` is needed when ``config`` has a penalty (:func:`adjust_logits`).
    """
    if not isinstance(config, SamplingConfig):
        raise InvalidArgument(f"config must be a SamplingConfig, got {config!r}")
    if not isinstance(logits, torch.Tensor) or not logits.is_floating_point():
        raise InvalidArgument(f"logits must be a floating torch.Tensor, got {getattr(logits, 'dtype', type(logits))}")
    if dtype not in (torch.float32, torch.float64):
        raise InvalidArgument(f"dtype must be torch.float32 or torch.float64, got {dtype}")
    if out is not None and (out.shape != logits.shape or out.dtype != dtype):
        raise InvalidArgument(
            f"out must have shape {tuple(logits.shape)} and dtype {dtype}, got {tuple(out.shape)} {out.dtype}"
        )
    cut_out = out  # where the cuts may write: not over logits that the adjustment copied away from
    if config.adjusts_logits:
        adjusted = adjust_logits(logits, config, history, in_place=out is logits)
        if out is logits and adjusted is not logits:
            cut_out = None  # the law is copied into ``out`` below
        logits, config = adjusted, config.cuts()
    probs = _cut_probs(logits, config, dtype, cut_out)
    if out is None or probs is out:
        return probs
    return out.copy_(probs)


def logits_to_probs_by_rows(
    logits: torch.Tensor,
    config: SamplingConfig,
    *,
    rows: int,
    overwrite: bool = False,
    history: History | None = None,
) -> torch.Tensor:
    """:func:`logits_to_probs` of ``logits`` (..., V) applied to blocks of at most ``rows`` rows of V.

    Every processor works row by row, so the numbers are those of one call; what changes is the
    memory: the processors' temporaries (the tempered copy, the softmax, the masks) exist for one
    block at a time, beside the logits and the float64 result, instead of at the whole size.
    ``overwrite=True`` writes the laws over float64 contiguous ``logits`` (which the caller no
    longer needs): no second tensor of the whole size.  The logit bias and the penalties
    (``history``) touch a few entries per row and are applied to the whole tensor first.
    """
    if not isinstance(rows, int) or isinstance(rows, bool) or rows < 1:
        raise InvalidArgument(f"rows must be an integer >= 1, got {rows!r}")
    if not isinstance(config, SamplingConfig):
        raise InvalidArgument(f"config must be a SamplingConfig, got {config!r}")
    if config.adjusts_logits:
        logits = adjust_logits(logits, config, history, in_place=overwrite)
        config, overwrite = config.cuts(), True  # the adjusted logits are this call's own
    V = logits.shape[-1]
    flat = logits.reshape(-1, V)  # (R, V)
    if flat.shape[0] <= rows and not overwrite:
        return logits_to_probs(logits, config)
    in_place = overwrite and logits.dtype == torch.float64 and logits.is_contiguous()
    out = flat if in_place else torch.empty(flat.shape, dtype=torch.float64, device=logits.device)  # (R, V)
    for start in range(0, flat.shape[0], rows):
        logits_to_probs(flat[start : start + rows], config, out=out[start : start + rows])
    return out.reshape(logits.shape)
