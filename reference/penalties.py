"""Penalties that depend on the tokens before a position: repetition, frequency, presence.

Every engine penalises the logits of tokens already seen, but they differ in which tokens count
(the prompt, the output, a window) and in the formula.  For a token ``t`` with logit ``x``, seen
in the counted repetition set, and ``c`` times in the counted frequency set:

* repetition (CTRL, Keskar et al. 2019): ``x / r`` if ``x > 0`` else ``x * r`` (``r > 1`` lowers
  the token whatever the logit's sign); every engine uses this formula;
* frequency: ``x - f * c``;  presence: ``x - p * [c > 0]`` (OpenAI's API definition).

What each engine counts (``engine`` of :class:`~specverify_reference.processors.SamplingConfig`):

=============  =======================================  ======================================
engine         repetition counts                        frequency and presence count
=============  =======================================  ======================================
``hf``         prompt and output (``input_ids``)        (not offered: must be 0)
``vllm``       prompt and output                        output only
``llama.cpp``  the last ``penalty_last_n`` tokens of    the same window
               prompt and output (default 64)
=============  =======================================  ======================================

Sources: transformers ``RepetitionPenaltyLogitsProcessor`` (``generation/logits_process.py``:
``torch.where(score < 0, score * penalty, score / penalty)`` over ``input_ids``); vLLM
``vllm/model_executor/layers/utils.py`` ``apply_penalties`` (a prompt mask or'ed with an output
mask for repetition, output bin counts for frequency and presence), called by
``vllm/v1/sample/sampler.py`` after the logit bias and before the temperature, with the draft
tokens before a position appended to the output when a speculative position is scored
(``_combine_outputs_with_spec_tokens``); llama.cpp ``src/llama-sampling.cpp``
``llama_sampler_penalties_apply`` (a ring buffer of the last ``penalty_last_n`` accepted tokens;
``logit <= 0 ? logit * repeat : logit / repeat``, then ``logit -= count * freq + (count > 0) *
present``), which llama-server feeds the prompt's tokens too.

The functions here touch only the tokens of the history: memory and time grow with the history's
length, never with the vocabulary.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specverify.core.errors import InvalidArgument

__all__ = ["History", "counted_slots", "penalise"]


@dataclass(frozen=True)
class History:
    """The tokens each law conditions on.

    Parameters
    ----------
    tokens : torch.Tensor
        (B, H) int64: row b's prompt, then its output tokens (entries past a row's end are ignored).
    prompt_len : int
        ``tokens[:, :prompt_len]`` is the prompt (the same length in every row).
    ends : torch.Tensor
        (B, n) int64: law ``j`` of row ``b`` is the next token's after ``tokens[b, :ends[b, j]]``
        (``prompt_len <= ends <= H``).
    """

    tokens: torch.Tensor
    prompt_len: int
    ends: torch.Tensor

    def __post_init__(self):
        tokens, ends = self.tokens, self.ends
        if not isinstance(tokens, torch.Tensor) or tokens.ndim != 2 or tokens.dtype != torch.long:
            raise InvalidArgument(f"History.tokens must be a (B, H) int64 tensor, got {_describe(tokens)}")
        if not isinstance(ends, torch.Tensor) or ends.ndim != 2 or ends.dtype != torch.long:
            raise InvalidArgument(f"History.ends must be a (B, n) int64 tensor, got {_describe(ends)}")
        if ends.shape[0] != tokens.shape[0]:
            raise InvalidArgument(f"History.ends has {ends.shape[0]} rows, tokens {tokens.shape[0]}")
        p = self.prompt_len
        if isinstance(p, bool) or not isinstance(p, int) or not 0 <= p <= tokens.shape[1]:
            raise InvalidArgument(f"History.prompt_len must be an integer in [0, {tokens.shape[1]}], got {p!r}")
        if ends.numel() and (int(ends.min()) < p or int(ends.max()) > tokens.shape[1]):
            raise InvalidArgument(
                f"History.ends must lie in [prompt_len={p}, {tokens.shape[1]}], got [{int(ends.min())}, {int(ends.max())}]"
            )

    @classmethod
    def of_prefixes(cls, prefixes: torch.Tensor, prompt_len: int) -> History:
        """One law per row, after the whole row: ``prefixes`` (B, S), the first ``prompt_len`` the prompt."""
        B, S = prefixes.shape
        return cls(prefixes.long(), prompt_len, torch.full((B, 1), S, dtype=torch.long, device=prefixes.device))


def _describe(value) -> str:
    if isinstance(value, torch.Tensor):
        return f"a {tuple(value.shape)} {value.dtype} tensor"
    return type(value).__name__


def counted_slots(history: History, engine: str, last_n: int | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Which history slots each law counts: (repetition, frequency and presence), each (B, n, H) bool.

    ``last_n`` is llama.cpp's window (None: the whole history; 0: none).
    """
    B, H = history.tokens.shape
    slot = torch.arange(H, device=history.tokens.device)  # (H,)
    ends = history.ends[..., None]  # (B, n, 1)
    before = slot < ends  # (B, n, H) the slots law j conditions on
    output = before & (slot >= history.prompt_len)  # (B, n, H)
    if engine == "hf":
        return before, torch.zeros_like(before)
    if engine == "vllm":
        return before, output
    if engine == "llama.cpp":
        window = before if last_n is None else before & (slot >= ends - last_n)  # (B, n, H)
        return window, window
    raise InvalidArgument(f"engine must be one of 'hf', 'vllm', 'llama.cpp', got {engine!r}")


def penalise(
    logits: torch.Tensor,
    history: History,
    *,
    engine: str,
    repetition: float = 1.0,
    frequency: float = 0.0,
    presence: float = 0.0,
    last_n: int | None = None,
) -> torch.Tensor:
    """Apply the penalties to ``logits`` (B, n, V) in place and return it.

    Only the history's tokens change: each slot's token gets the value its counts give, computed
    from the logit before any change (a token seen in several slots gets the same value from each).
    Counts are exact (float64 sums of 0/1 indicators over at most H slots).
    """
    B, n, V = logits.shape
    if history.ends.shape != (B, n):
        raise InvalidArgument(f"history.ends must have shape {(B, n)} for logits of shape {tuple(logits.shape)}")
    if repetition == 1.0 and frequency == 0.0 and presence == 0.0:
        return logits
    tokens = history.tokens.to(logits.device)  # (B, H)
    rep_slots, freq_slots = counted_slots(history, engine, last_n)  # (B, n, H) each
    same = (tokens[:, :, None] == tokens[:, None, :]).to(torch.float64)  # (B, H, H)
    seen = torch.einsum("bhk,bjk->bjh", same, rep_slots.to(torch.float64)) > 0  # (B, n, H) token of slot h seen
    count = torch.einsum("bhk,bjk->bjh", same, freq_slots.to(torch.float64))  # (B, n, H) its count
    index = tokens[:, None, :].expand(B, n, tokens.shape[1])  # (B, n, H)
    value = logits.gather(-1, index)  # (B, n, H) logits before any change
    scaled = torch.where(value > 0, value / repetition, value * repetition)
    value = torch.where(seen, scaled, value)
    value = value - frequency * count.to(value.dtype) - presence * (count > 0).to(value.dtype)
    return logits.scatter_(-1, index, value)
