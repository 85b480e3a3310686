"""mistral.rs's CPU sampler, re-implemented in torch float64 (engine-free).

mistral.rs samples every token with ``Sampler::sample`` (``mistralrs-core/src/sampler.rs``).  On
CPU (no CUDA or Metal fast path) it takes the row's float32 logits and, in order:

1. **penalties** (``apply_penalties`` -> ``apply_freq_pres_rep_penalty``, only when one of them is
   set): with ``c_j`` the count of token j among the *generated* tokens and ``seen_j`` whether j
   occurs anywhere in the context (prompt included), ``l_j -= c_j * frequency + [c_j > 0] *
   presence``, then, if ``seen_j``, ``l_j = l_j / r if l_j > 0 else l_j * r`` (repetition
   penalty ``r``; applied to the already reduced logit);
2. **temperature**: ``None`` or below 1e-7 (``Sampler::new``) is greedy: ``argmax_f32``, the first
   maximum (lowest id).  Otherwise ``probs = softmax(l / T)``;
3. **truncation** (``sample_top_kp_min_p``; skipped when top-k <= 0, top-p not in (0, 1) and
   min-p not in (0, 1)): the top-k probabilities by a partial sort (``partial_sort_top_k``), the
   rest zeroed; **top-p on the temperature-scaled probabilities** renormalised over the top-k set
   (``top_p_cutoff = top_p * sum(top-k probs)``): walking the top-k in descending order a token is
   zeroed once the kept mass before it is ``>= cutoff`` (the shortest prefix reaching the cutoff
   is kept); **min-p** zeroes every top-k token with ``max_p * min_p >= p`` (``max_p`` the
   largest temperature-scaled probability);
4. **draw**: ``rand``'s ``WeightedIndex`` over the unnormalised kept probabilities, from the
   engine's one ``Isaac64Rng``.

:func:`processed_probs` applies steps 1-3 in float64 and normalises (ties in the sort are broken
by token id; mistral.rs's unstable sort breaks them arbitrarily, which matters only for exactly
equal probabilities).  Differences of float32 rounding at a top-p or min-p boundary are not
modelled (they need a kept mass within ~1e-7 of the cutoff).  Read in mistral.rs master
``9e922623f`` (``mistralrs-core/src/sampler.rs``: ``Sampler::new``, ``Sampler::sample``,
``sample_top_kp_min_p``, ``top_p_cutoff``, ``apply_freq_pres_rep_penalty``); the 0.9.5 wheel's
behaviour matches it on the tiny models (``reports/mistralrs``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from specverify.core.errors import InvalidArgument
from specverify.core.validation import check_float, check_int

__all__ = ["DEFAULTS", "GREEDY_BELOW", "SamplerOptions", "sampler_options", "apply_penalties", "processed_probs"]

#: The options and their "off" values (temperature 1: the model's own law).
DEFAULTS: dict[str, float] = dict(
    temperature=1.0,
    top_k=0,
    top_p=1.0,
    min_p=0.0,
    repetition_penalty=1.0,
    frequency_penalty=0.0,
    presence_penalty=0.0,
)
#: ``Sampler::new``: a temperature below this (or none) is greedy.
GREEDY_BELOW = 1e-7


@dataclass(frozen=True)
class SamplerOptions:
    """Request sampling options of mistral.rs (see the module docstring).

    ``temperature`` below :data:`GREEDY_BELOW` is greedy; ``top_k`` 0, ``top_p`` 1 and ``min_p`` 0
    are off; penalties are off at ``repetition_penalty=1``, ``frequency_penalty=0``,
    ``presence_penalty=0``.
    """

    temperature: float = DEFAULTS["temperature"]
    top_k: int = DEFAULTS["top_k"]
    top_p: float = DEFAULTS["top_p"]
    min_p: float = DEFAULTS["min_p"]
    repetition_penalty: float = DEFAULTS["repetition_penalty"]
    frequency_penalty: float = DEFAULTS["frequency_penalty"]
    presence_penalty: float = DEFAULTS["presence_penalty"]

    @property
    def greedy(self) -> bool:
        """Whether the engine takes the argmax (``Sampler::is_argmax``)."""
        return self.temperature < GREEDY_BELOW

    @property
    def penalised(self) -> bool:
        """Whether a penalty is set (the request then passes it; unset ones stay ``None``)."""
        return self.repetition_penalty != 1.0 or self.frequency_penalty != 0.0 or self.presence_penalty != 0.0

    def request_kwargs(self) -> dict:
        """Keyword arguments of ``mistralrs.CompletionRequest``: every option that is on, the rest ``None``.

        The temperature is always passed: an unset temperature is greedy in mistral.rs.
        """
        return dict(
            temperature=float(self.temperature),
            top_k=self.top_k if self.top_k > 0 else None,
            top_p=self.top_p if self.top_p < 1.0 else None,
            min_p=self.min_p if self.min_p > 0.0 else None,
            repetition_penalty=self.repetition_penalty if self.repetition_penalty != 1.0 else None,
            frequency_penalty=self.frequency_penalty if self.frequency_penalty != 0.0 else None,
            presence_penalty=self.presence_penalty if self.presence_penalty != 0.0 else None,
        )

    def __str__(self) -> str:
        changed = {k: getattr(self, k) for k, v in DEFAULTS.items() if getattr(self, k) != v}
        return "sampler(" + ", ".join(f"{k}={v}" for k, v in changed.items()) + ")"


def _number(name: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidArgument(f"{name} must be an int or a float, got {value!r}")
    return check_float(name, value)


def sampler_options(**options) -> SamplerOptions:
    """Validated :class:`SamplerOptions` (unknown names raise :class:`InvalidArgument`; missing ones are off).

    temperature >= 0, top_k an int >= 0, top_p in (0, 1], min_p in [0, 1), repetition_penalty > 0,
    frequency and presence penalties finite.
    """
    unknown = sorted(set(options) - set(DEFAULTS))
    if unknown:
        raise InvalidArgument(f"unknown sampler option(s) {unknown}; known: {sorted(DEFAULTS)}")
    o = {**DEFAULTS, **options}
    temperature = _number("temperature", o["temperature"])
    if temperature < 0:
        raise InvalidArgument(f"temperature must be >= 0, got {temperature}")
    top_p = _number("top_p", o["top_p"])
    if not 0.0 < top_p <= 1.0:
        raise InvalidArgument(f"top_p must be in (0, 1], got {top_p}")
    min_p = _number("min_p", o["min_p"])
    if not 0.0 <= min_p < 1.0:
        raise InvalidArgument(f"min_p must be in [0, 1), got {min_p}")
    repetition = _number("repetition_penalty", o["repetition_penalty"])
    if repetition <= 0:
        raise InvalidArgument(f"repetition_penalty must be > 0, got {repetition}")
    return SamplerOptions(
        temperature=temperature,
        top_k=check_int("top_k", o["top_k"], minimum=0),
        top_p=top_p,
        min_p=min_p,
        repetition_penalty=repetition,
        frequency_penalty=_number("frequency_penalty", o["frequency_penalty"]),
        presence_penalty=_number("presence_penalty", o["presence_penalty"]),
    )


def apply_penalties(logits: torch.Tensor, context: torch.Tensor, prompt_len: int, o: SamplerOptions) -> torch.Tensor:
    """``apply_freq_pres_rep_penalty`` on (B, V) logits given the (B, H) context, of which the first
    ``prompt_len`` tokens are the prompt; float64 out."""
    x = logits.to(torch.float64).clone()  # (B, V)
    if not o.penalised:
        return x
    B, V = x.shape
    generated = torch.zeros((B, V), dtype=torch.float64)  # (B, V) counts of generated tokens
    seen = torch.zeros((B, V), dtype=torch.bool)  # (B, V)
    ctx = context.to(torch.long)
    if ctx.shape[1]:
        seen.scatter_(1, ctx, True)
        gen = ctx[:, prompt_len:]  # (B, H - prompt_len)
        generated.scatter_add_(1, gen, torch.ones(gen.shape, dtype=torch.float64))
    x = x - generated * o.frequency_penalty - (generated > 0).to(torch.float64) * o.presence_penalty
    if o.repetition_penalty != 1.0:
        r = o.repetition_penalty
        x = torch.where(seen, torch.where(x > 0, x / r, x * r), x)
    return x


def _argmax_one_hot(x: torch.Tensor) -> torch.Tensor:
    out = torch.zeros_like(x, dtype=torch.float64)  # (B, V)
    out.scatter_(1, x.argmax(-1, keepdim=True), 1.0)  # torch.argmax returns the first maximum
    return out


def processed_probs(
    logits: torch.Tensor, o: SamplerOptions, *, context: torch.Tensor | None = None, prompt_len: int = 0
) -> torch.Tensor:
    """The law mistral.rs samples from, (B, V) float64, given (B, V) raw logits (module docstring).

    Parameters
    ----------
    logits : (B, V) float tensor
        Raw logits of the position.
    o : SamplerOptions
        The request's options.
    context : (B, H) long tensor, optional
        Every token before the position (prompt and generated); needed only with penalties.
    prompt_len : int
        How many leading tokens of ``context`` are the prompt.
    """
    if o.penalised:
        if context is None or context.shape[1] == 0:
            raise InvalidArgument("penalties need the context (mistral.rs refuses an empty one)")
        x = apply_penalties(logits, context, prompt_len, o)  # (B, V)
    else:
        x = logits.to(torch.float64)  # (B, V)
    if o.greedy:
        return _argmax_one_hot(x)
    probs = torch.softmax(x / o.temperature, dim=-1)  # (B, V)
    truncating = o.top_k > 0 or 0.0 < o.top_p < 1.0 or 0.0 < o.min_p < 1.0
    if not truncating:
        return probs
    B, V = probs.shape
    # descending probability, ties by id: sort by id first, then a stable sort by -p
    order = torch.sort(-probs, dim=-1, stable=True).indices  # (B, V)
    sorted_p = probs.gather(1, order)  # (B, V)
    k = o.top_k if o.top_k > 0 else V
    keep_sorted = torch.arange(V).expand(B, V) < k  # (B, V)
    if 0.0 < o.top_p < 1.0:
        kept = sorted_p * keep_sorted  # (B, V)
        cutoff = o.top_p * kept.sum(-1, keepdim=True)  # (B, 1)
        before = torch.cumsum(kept, -1) - kept  # (B, V) kept mass before each token
        keep_sorted = keep_sorted & (before < cutoff)
    if 0.0 < o.min_p < 1.0:
        threshold = sorted_p[:, :1] * o.min_p  # (B, 1)
        keep_sorted = keep_sorted & ~(threshold >= sorted_p)
    keep = torch.zeros((B, V), dtype=torch.bool).scatter(1, order, keep_sorted)  # (B, V)
    out = torch.where(keep, probs, torch.zeros_like(probs))  # (B, V)
    total = out.sum(-1, keepdim=True)
    if not bool((total > 0).all()) or not math.isfinite(float(total.sum())):
        raise InvalidArgument("every token was truncated away")
    return out / total
