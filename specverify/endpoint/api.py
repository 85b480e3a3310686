"""The OpenAI-compatible completions API as an audit uses it: request bodies and the replies' token ids and logprobs.

Two requests, both ``POST /v1/completions`` with the prompt as a list of token ids:

* **sampling** (:func:`completion_body`): ``n`` continuations of ``max_tokens`` tokens with the
  audit's temperature, top-k, top-p and seed, ``ignore_eos`` (every continuation has its full
  length) and ``return_token_ids`` (the continuation's token ids: ``choices[i].token_ids``, as
  vLLM returns them; a reply whose ``logprobs.tokens`` read ``token_id:N`` -- vLLM's
  ``--return-tokens-as-token-ids`` -- is read too);
* **teacher forcing** (:func:`teacher_forcing_body`): a whole sequence as the prompt with
  ``prompt_logprobs = -1`` and ``max_tokens = 1``: the reply's ``choices[0].prompt_logprobs[i]``
  is the law of token ``i`` given tokens ``0..i-1`` over the whole vocabulary (vLLM serves
  it when started with ``--max-logprobs -1``).  These are the model's *raw* log-probabilities
  (vLLM's default ``--logprobs-mode raw_logprobs``); the audit applies the sampling parameters
  to them with the reference processors (:func:`processed_laws`), so the law it tests is the
  processed one the sampler should draw from.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from reference.processors import SamplingConfig, logits_to_probs
from specverify.core.errors import InvalidArgument
from specverify.endpoint.http import EndpointError

__all__ = [
    "Sampling",
    "completion_body",
    "teacher_forcing_body",
    "continuations",
    "prompt_logprob_rows",
    "processed_laws",
    "LOGPROB_MASS_TOL",
    "CAP_HINT",
]

#: How far the total probability of a full-vocabulary logprob row may be from 1 (float32 logits, JSON).
LOGPROB_MASS_TOL = 1e-3
#: What lifts a server's cap on logprobs (named in the error when the cap is met).
CAP_HINT = "start the server with --max-logprobs -1 (vLLM) so that prompt_logprobs=-1 returns the whole vocabulary"


@dataclass(frozen=True)
class Sampling:
    """The sampling parameters of an audit, sent to the server and applied to its raw logprobs.

    ``top_k=None`` and ``top_p=None`` are off (not sent).  Temperature 0 is greedy.
    """

    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None

    def __post_init__(self):
        self.config()  # validates (InvalidArgument naming the parameter)

    def config(self) -> SamplingConfig:
        return SamplingConfig(temperature=self.temperature, top_k=self.top_k, top_p=self.top_p)

    def fields(self) -> dict:
        out: dict = {"temperature": float(self.temperature)}
        if self.top_k is not None:
            out["top_k"] = int(self.top_k)
        if self.top_p is not None:
            out["top_p"] = float(self.top_p)
        return out


def completion_body(
    model: str, prompt: list[int], *, n: int, max_tokens: int, sampling: Sampling, seed: int | None
) -> dict:
    """The body of a sampling request: ``n`` continuations of ``max_tokens`` tokens of ``prompt``."""
    body = {
        "model": model,
        "prompt": [int(t) for t in prompt],
        "n": int(n),
        "max_tokens": int(max_tokens),
        **sampling.fields(),
        "ignore_eos": True,
        "return_token_ids": True,
        "stream": False,
    }
    if seed is not None:
        body["seed"] = int(seed)
    return body


def teacher_forcing_body(model: str, sequence: list[int]) -> dict:
    """The body of a teacher-forcing request: full-vocabulary logprobs of every token of ``sequence``."""
    return {
        "model": model,
        "prompt": [int(t) for t in sequence],
        "max_tokens": 1,
        "prompt_logprobs": -1,
        "temperature": 1.0,
        "stream": False,
    }


def _choices(reply, what: str) -> list:
    choices = reply.get("choices") if isinstance(reply, dict) else None
    if not isinstance(choices, list) or not choices:
        raise EndpointError(f"the {what} reply has no choices: {str(reply)[:120]}")
    return sorted(choices, key=lambda c: c.get("index", 0) if isinstance(c, dict) else 0)


def _token_ids(choice: dict) -> list[int] | None:
    ids = choice.get("token_ids")
    if isinstance(ids, list):
        return [int(t) for t in ids]
    tokens = (choice.get("logprobs") or {}).get("tokens") if isinstance(choice.get("logprobs"), dict) else None
    if isinstance(tokens, list) and tokens and all(isinstance(t, str) and t.startswith("token_id:") for t in tokens):
        return [int(t.split(":", 1)[1]) for t in tokens]
    return None


def continuations(reply, *, n: int, max_tokens: int) -> list[list[int]]:
    """The ``n`` continuations' token ids of a sampling reply, each exactly ``max_tokens`` long.

    Raises
    ------
    EndpointError
        No choices, no token ids (the server does not return them), the wrong number of
        choices, or a continuation of another length (the server stopped early).
    """
    choices = _choices(reply, "completion")
    if len(choices) != n:
        raise EndpointError(f"the completion reply has {len(choices)} choices, {n} were asked (n={n})")
    out = []
    for choice in choices:
        ids = _token_ids(choice)
        if ids is None:
            raise EndpointError(
                "the completion reply holds no token ids: the audit needs a server that returns them "
                "(vLLM does for the request field return_token_ids, which is sent, or with --return-tokens-as-token-ids)"
            )
        if len(ids) != max_tokens:
            raise EndpointError(
                f"a continuation has {len(ids)} tokens, {max_tokens} were asked "
                f"(finish_reason={choice.get('finish_reason')!r}): the server must honour ignore_eos"
            )
        out.append(ids)
    return out


def _logprob(value) -> float:
    if isinstance(value, dict):
        value = value.get("logprob")
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise EndpointError(f"a prompt logprob is not a number: {value!r}")
    return float(value)


def prompt_logprob_rows(reply, sequence: list[int], vocab_size: int | None) -> np.ndarray:
    """Dense raw log-probability rows of a teacher-forcing reply: (S - 1, V) float64.

    Row ``i - 1`` is the law of ``sequence[i]`` given ``sequence[:i]``.  Entries the server
    clamps (vLLM writes ``-inf`` as -9999) stay as sent: their probability is 0 in float64.

    Raises
    ------
    EndpointError
        No ``prompt_logprobs``; a row that does not cover the vocabulary (its size differs from
        ``vocab_size`` or from the first row, or its probabilities do not sum to 1 within
        :data:`LOGPROB_MASS_TOL`: the server capped the logprobs); a token id outside it.
    """
    choice = _choices(reply, "teacher-forcing")[0]
    laws = choice.get("prompt_logprobs") if isinstance(choice, dict) else None
    if not isinstance(laws, list) or len(laws) != len(sequence):
        raise EndpointError(
            "the teacher-forcing reply holds no prompt_logprobs for every prompt token "
            f"(got {type(laws).__name__}{'' if not isinstance(laws, list) else f' of length {len(laws)}'}, "
            f"expected {len(sequence)}): the server must support the request field prompt_logprobs; {CAP_HINT}"
        )
    rows = []
    V = vocab_size
    for i in range(1, len(sequence)):
        entry = laws[i]
        if not isinstance(entry, dict) or not entry:
            raise EndpointError(f"prompt_logprobs[{i}] is {str(entry)[:60]}, not a map of token ids to logprobs")
        size = len(entry)
        if V is None:
            V = size
        if size != V:
            raise EndpointError(
                f"prompt_logprobs[{i}] covers {size} tokens, the vocabulary has {V}: logprobs capped below the vocabulary; "
                + CAP_HINT
            )
        row = np.full(V, -math.inf)
        for key, value in entry.items():
            token = int(key)
            if not 0 <= token < V:
                raise EndpointError(f"prompt_logprobs[{i}] names token {token}, outside the vocabulary [0, {V})")
            row[token] = _logprob(value)
        mass = math.fsum(np.exp(row).tolist())
        if abs(mass - 1.0) > LOGPROB_MASS_TOL:
            raise EndpointError(
                f"prompt_logprobs[{i}] sums to probability {mass:.4g}, not 1: logprobs capped below the vocabulary "
                f"or not normalised; {CAP_HINT}"
            )
        rows.append(row)
    return np.stack(rows) if rows else np.zeros((0, V or 0))


def processed_laws(raw_logprobs: np.ndarray, sampling: Sampling) -> torch.Tensor:
    """The sampler's law from raw log-probabilities (..., V): the reference processors in float64."""
    if not isinstance(sampling, Sampling):
        raise InvalidArgument(f"sampling must be a Sampling, got {sampling!r}")
    logits = torch.as_tensor(np.asarray(raw_logprobs, dtype=np.float64))
    logits = torch.where(torch.isfinite(logits), logits, torch.full_like(logits, -math.inf))
    return logits_to_probs(logits, sampling.config())
