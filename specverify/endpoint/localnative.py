"""The bundled local server's llama-server route: ``POST /completion`` as llama.cpp's server answers it.

What an audit with ``api="llama-server"`` (:mod:`specverify.endpoint.llamaserver`) uses, so that
the dialect is tested end to end without llama.cpp: a token-id ``prompt``, ``n_predict``,
``seed``, llama.cpp's sampler fields (``temperature``, ``top_k`` <= 0 off, ``top_p``, ``min_p``,
``repeat_penalty``, ``repeat_last_n`` (the window over prompt and output, as llama-server feeds the
prompt to its penalties; 0 turns them off), ``frequency_penalty``, ``presence_penalty``, ``logit_bias`` as
``[[id, bias], ...]``), ``return_tokens`` (the reply's ``tokens``), and ``n_probs`` with
``post_sampling_probs = false`` (``completion_probabilities``: each emitted token's raw logprob and
the ``n_probs`` most likely tokens', the server's planted logprob fault applied).  The law served
is llama.cpp's (``engine="llama.cpp"``).  One continuation per request; a grammar, the stages an
audit sets to neutral values (typical, XTC, DRY, mirostat, top-n-sigma) at other values, and fields
the route does not know are refused with HTTP 400, never ignored.
"""

from __future__ import annotations

import reprlib

import torch

from specverify.core.errors import SpecVerifyError
from specverify.endpoint.served_logprobs import reported_laws
from specverify_reference.processors import SamplingConfig

__all__ = ["NativeError", "native_sampling", "native_reply"]

#: Fields the route reads, and the neutral value of each chain stage it does not implement.
NEUTRAL = {"typical_p": 1.0, "top_n_sigma": -1.0, "xtc_probability": 0.0, "dry_multiplier": 0.0, "mirostat": 0}
KNOWN = {
    "prompt", "n_predict", "seed", "temperature", "top_k", "top_p", "min_p", "repeat_penalty", "repeat_last_n",
    "frequency_penalty", "presence_penalty", "logit_bias", "ignore_eos", "return_tokens", "cache_prompt", "stream",
    "n_probs", "post_sampling_probs", "model", *NEUTRAL,
}  # fmt: skip


class NativeError(Exception):
    """A request the route refuses: its HTTP status and message."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


def _number(body: dict, name: str, default: float) -> float:
    value = body.get(name, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise NativeError(400, f"{name} must be a number, got {reprlib.repr(value)}")
    return float(value)


def _count(body: dict, name: str, default: int, minimum: int) -> int:
    value = body.get(name, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise NativeError(400, f"{name} must be an integer >= {minimum}, got {reprlib.repr(value)}")
    return value


def native_sampling(body: dict) -> SamplingConfig:
    """The request's sampling under llama.cpp's law (raises :class:`NativeError` for a field it cannot honour)."""
    unknown = sorted(set(body) - KNOWN)
    if unknown:
        raise NativeError(400, f"fields this route does not implement: {unknown}")
    for name, neutral in NEUTRAL.items():
        if name in body and body[name] != neutral:
            raise NativeError(400, f"{name}={reprlib.repr(body[name])}: this route implements only {neutral}")
    bias = body.get("logit_bias") or []
    if not isinstance(bias, list) or not all(isinstance(e, list) and len(e) == 2 for e in bias):
        raise NativeError(400, f"logit_bias must be a list of [id, bias] pairs, got {reprlib.repr(bias)}")
    last_n = _count(body, "repeat_last_n", 64, 0)
    top_k, top_p, min_p = (
        _count(body, "top_k", 40, -(2**31)),
        _number(body, "top_p", 0.95),
        _number(body, "min_p", 0.05),
    )
    try:
        return SamplingConfig(
            temperature=_number(body, "temperature", 0.8),
            top_k=top_k if top_k > 0 else None,
            top_p=top_p if top_p < 1.0 else None,
            min_p=min_p if min_p > 0.0 else None,
            engine="llama.cpp",
            repetition_penalty=_number(body, "repeat_penalty", 1.0),
            frequency_penalty=_number(body, "frequency_penalty", 0.0),
            presence_penalty=_number(body, "presence_penalty", 0.0),
            logit_bias={int(token): float(value) for token, value in bias},
            penalty_last_n=last_n,
        )
    except (SpecVerifyError, TypeError, ValueError) as error:
        raise NativeError(400, str(error)) from None


def _native_probs(laws: torch.Tensor, tokens: list[int], top: int, fault: str | None) -> list[dict]:
    """llama-server's ``completion_probabilities`` of one continuation from its reported laws (L, V)."""

    def entry(token: int, value: float) -> dict:
        return {"id": token, "token": str(token), "logprob": value, "bytes": []}

    out = []
    for j, token in enumerate(tokens):
        order = torch.sort(-laws[j], stable=True).indices[:top].tolist()  # most likely first, ties by id
        value = 0.0 if fault == "zero" else float(laws[j, token])
        out.append({**entry(token, value), "top_logprobs": [entry(t, float(laws[j, t])) for t in order]})
    return out


def native_reply(server, body: dict) -> dict:
    """llama-server's reply to ``body`` from the local :class:`~specverify.endpoint.localserver.CompletionServer`."""
    prompt = body.get("prompt")
    if not isinstance(prompt, list) or not prompt or not all(type(t) is int for t in prompt):
        raise NativeError(400, "this route takes prompts as a non-empty list of token ids")
    if not all(0 <= t < server.vocab_size for t in prompt):
        raise NativeError(400, f"prompt token ids must be in [0, {server.vocab_size})")
    n_predict = _count(body, "n_predict", 16, 1)
    sampling = native_sampling(body)
    if any(token >= server.vocab_size for token, _ in sampling.logit_bias):
        raise NativeError(400, f"logit_bias token ids must be in [0, {server.vocab_size})")
    seed = _count(body, "seed", 0, 0)
    tokens = server.decoder(sampling).generate(torch.tensor(prompt), num_samples=1, max_new_tokens=n_predict, seed=seed)
    reply = {
        "index": 0,
        "content": " ".join(str(t) for t in tokens[0].tolist()),
        "tokens": tokens[0].tolist() if body.get("return_tokens") else [],
        "stop": True,
        "stop_type": "limit",
        "tokens_predicted": n_predict,
        "tokens_evaluated": len(prompt),
    }
    top = _count(body, "n_probs", 0, 0)
    if top:
        if body.get("post_sampling_probs"):
            raise NativeError(400, "this route reports raw probabilities only (post_sampling_probs=false)")
        laws = reported_laws(server.target, sampling, prompt, tokens, server.logprob_fault)[0]  # (L, V)
        reply["completion_probabilities"] = _native_probs(laws, tokens[0].tolist(), top, server.logprob_fault)
    return reply
