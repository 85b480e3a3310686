"""llama.cpp's ``llama-server`` native completion API (``POST /completion``) as an audit uses it.

llama-server's OpenAI route (``/v1/completions``) returns neither token ids nor prompt
logprobs, and refuses ``echo``; its native route returns what the audit needs:

* **sampling** (:func:`sampling_body`): ``n_predict`` tokens of a token-id ``prompt`` with the
  audit's options under llama.cpp's names, ``ignore_eos``, ``return_tokens`` (the reply's
  ``tokens``) and the ``seed``; one continuation per request.  Every stage of llama.cpp's default
  chain is set explicitly (the server's own defaults are ``top_k`` 40, ``top_p`` 0.95, ``min_p``
  0.05, T 0.8): an option the audit leaves off is sent at its neutral value, so the law tested is
  the one named, not the server's defaults.  The penalty window is :data:`PENALTY_WINDOW` tokens
  (llama-server refuses ``repeat_last_n = -1`` on a request), longer than any prompt and
  continuation an audit sends, so it holds the whole context (llama-server feeds the prompt's tokens
  to its penalties too): the law of :mod:`specverify_reference.penalties` for ``engine="llama.cpp"``
  with ``penalty_last_n=None``.
* **a law** (:func:`law_body`): the prefix as the prompt, one token, ``n_probs`` = the vocabulary
  (or the top ``M``) and ``post_sampling_probs = false``: the reply's
  ``completion_probabilities[0].top_logprobs`` is the model's *raw* next-token law after the prefix
  (llama-server's ``get_token_probabilities``: the softmax of the logits before any sampler), one
  request per prefix (the server has no prompt logprobs).  The audit applies llama.cpp's chain
  to it (:func:`specverify.endpoint.api.processed_laws` with ``engine="llama.cpp"``).

``ignore_eos`` is llama-server's ban of the end-of-generation tokens: it adds a logit bias of -inf on
each (``server-schema.cpp``), which the reply's ``generation_settings.logit_bias`` lists
(``{"token": id, "bias": null}``, JSON's rendering of -inf); :func:`banned_tokens` reads them, and
the law the audit tests has them at probability 0 (the bias is the chain's first stage).

With ``n_probs = L`` on a sampling request each emitted token's entry holds its raw logprob and
the ``L`` most likely tokens' (:func:`reported_logprobs`), the values the logprob-fidelity check
compares with the teacher-forced laws.

Read in llama.cpp ``tools/server/server-context.cpp`` (``populate_token_probs``,
``init_sampler``), ``server-schema.cpp`` (the request fields) and ``server-task.cpp``
(``to_json_non_oaicompat``, ``probs_vector_to_json``).
"""

from __future__ import annotations

import json

import numpy as np

from specverify.core.errors import InvalidArgument
from specverify.endpoint import api
from specverify.endpoint.api import (
    MAX_VOCAB,
    REPLY_BASE_BYTES,
    Sampling,
    _logprob,
    _preview,
    _token_id,
)
from specverify.endpoint.http import EndpointError, server_text

__all__ = [
    "PATH",
    "PENALTY_WINDOW",
    "sampling_fields",
    "sampling_body",
    "continuations",
    "reported_logprobs",
    "law_body",
    "law_row",
    "law_reply_bytes",
    "banned_tokens",
    "sampling_reply_bytes",
]

#: The native completion route (from the server's root, not under ``/v1``).
PATH = "/completion"
#: ``repeat_last_n`` sent: the penalties' window, longer than any prompt plus continuation of an audit
#: (a ring buffer of this many token ids per request: 256 KiB).
PENALTY_WINDOW = 1 << 16
#: Bytes a law or logprob entry may hold: ``{"id":151935,"token":"...","logprob":-1.2345,"bytes":[...]}``
#: (a token's text and its bytes, up to a few dozen bytes each).
BYTES_PER_ENTRY = 512


def sampling_fields(sampling: Sampling) -> dict:
    """The request fields of ``sampling`` under llama-server's names, every chain stage set (see the module docstring).

    Raises
    ------
    InvalidArgument
        ``sampling`` does not follow llama.cpp's law (``engine`` other than ``"llama.cpp"``), or asks
        for a regular-expression grammar (llama-server takes a JSON schema or GBNF text).
    """
    if sampling.engine != "llama.cpp":
        raise InvalidArgument(f"llama-server follows llama.cpp's law: sampling.engine must be 'llama.cpp', "
                              f"got {sampling.engine!r}")  # fmt: skip
    out: dict = {
        "temperature": float(sampling.temperature),
        "top_k": int(sampling.top_k) if sampling.top_k is not None else 0,
        "top_p": float(sampling.top_p) if sampling.top_p is not None else 1.0,
        "min_p": float(sampling.min_p) if sampling.min_p is not None else 0.0,
        "typical_p": 1.0,
        "top_n_sigma": -1.0,
        "xtc_probability": 0.0,
        "dry_multiplier": 0.0,
        "mirostat": 0,
        "repeat_penalty": float(sampling.repetition_penalty),
        "repeat_last_n": PENALTY_WINDOW,
        "frequency_penalty": float(sampling.frequency_penalty),
        "presence_penalty": float(sampling.presence_penalty),
    }
    if sampling.logit_bias:
        out["logit_bias"] = [[int(token), float(bias)] for token, bias in sampling.logit_bias]
    grammar = sampling.grammar
    if grammar is not None:
        if grammar.kind == "json_schema":
            out["json_schema"] = json.loads(grammar.source)
        elif grammar.kind == "ebnf":
            out["grammar"] = grammar.source  # GBNF text
        else:
            raise InvalidArgument(f"llama-server takes a JSON schema or a GBNF grammar, not a {grammar.kind!r}")
    return out


def sampling_body(prompt: list[int], *, max_tokens: int, sampling: Sampling, seed: int | None,
                  logprobs: int | None = None) -> dict:  # fmt: skip
    """The body of one sampling request: ``max_tokens`` tokens of ``prompt`` (with each token's raw
    logprob and its ``logprobs`` most likely tokens' when that is not None)."""
    if len(prompt) + int(max_tokens) > PENALTY_WINDOW:
        raise InvalidArgument(f"a prompt of {len(prompt)} tokens and {max_tokens} new tokens exceed llama-server's "
                              f"penalty window as the audit sends it ({PENALTY_WINDOW} tokens)")  # fmt: skip
    body = {
        "prompt": [int(t) for t in prompt],
        "n_predict": int(max_tokens),
        **sampling_fields(sampling),
        "ignore_eos": True,
        "return_tokens": True,
        "cache_prompt": True,
        "stream": False,
    }
    if seed is not None:
        body["seed"] = int(seed)
    if logprobs is not None:
        body.update(n_probs=int(logprobs), post_sampling_probs=False)
    return body


def sampling_reply_bytes(max_tokens: int, logprobs: int | None = None) -> int:
    """The most bytes a reply of one continuation of ``max_tokens`` tokens may hold."""
    return api.sampling_reply_bytes(1, max_tokens, logprobs, per_entry=BYTES_PER_ENTRY)


def _result(reply, what: str) -> dict:
    """The one result of a native reply (a list of one result is read too)."""
    if isinstance(reply, list) and len(reply) == 1:
        reply = reply[0]
    if not isinstance(reply, dict):
        raise EndpointError(f"the {what} reply is not one completion object: {server_text(_preview(reply), limit=120)}")
    return reply


def continuations(reply, *, max_tokens: int, vocab_size: int | None = None) -> list[list[int]]:
    """The continuation's token ids of a sampling reply (``tokens``), exactly ``max_tokens`` of them: [[ids]].

    Raises
    ------
    EndpointError
        No ``tokens`` list (the server ignored ``return_tokens``), an id that is not an integer in
        ``[0, vocab_size)``, or a continuation of another length (the server stopped early).
    """
    result = _result(reply, "completion")
    tokens = result.get("tokens")
    if not isinstance(tokens, list):
        raise EndpointError("the completion reply holds no token ids: llama-server returns them as 'tokens' "
                            "for the request field return_tokens, which is sent")  # fmt: skip
    upper = MAX_VOCAB if vocab_size is None else int(vocab_size)
    ids = [_token_id(t, upper, "the completion reply's tokens") for t in tokens]
    if len(ids) != max_tokens:
        stop = server_text(_preview(result.get("stop_type")), limit=40)
        raise EndpointError(f"a continuation has {len(ids)} tokens, {max_tokens} were asked (stop_type={stop}): "
                            "the server must honour ignore_eos")  # fmt: skip
    return [ids]


def _entries(value, where: str, upper: int, limit: int) -> list[list]:
    """``[{"id", "logprob", ...}, ...]`` as sorted ``[[id, logprob], ...]`` (distinct ids, at most ``limit``)."""
    if not isinstance(value, list) or len(value) > limit:
        raise EndpointError(f"{where} is not a list of at most {limit} entries")
    out = {}
    for j, entry in enumerate(value):
        if not isinstance(entry, dict):
            raise EndpointError(f"{where}[{j}] is {server_text(_preview(entry), limit=60)}, not an object")
        token = _token_id(entry.get("id"), upper, f"{where}[{j}].id")
        if token in out:
            raise EndpointError(f"{where} lists token {token} twice")
        out[token] = _logprob(entry.get("logprob"), f"{where}[{j}].logprob")
    return sorted([t, v] for t, v in out.items())


def _probabilities(result: dict, count: int, where: str) -> list:
    probs = result.get("completion_probabilities")
    if not isinstance(probs, list) or len(probs) != count or not all(isinstance(p, dict) for p in probs):
        raise EndpointError(f"{where} holds no completion_probabilities of {count} tokens "
                            "(n_probs and post_sampling_probs=false were sent)")  # fmt: skip
    return probs


def reported_logprobs(reply, *, max_tokens: int, top: int, vocab_size: int | None) -> list[list[list]]:
    """The continuation's reported raw logprobs: ``[[[logprob, [[id, logprob], ...]] per token]]``, the form of
    :func:`specverify.endpoint.fidelity.reported_logprobs` (``completion_probabilities[j]``: ``logprob``
    and ``top_logprobs``)."""
    result = _result(reply, "completion")
    where = "the completion reply's completion_probabilities"
    upper = MAX_VOCAB if vocab_size is None else int(vocab_size)
    rows = []
    for j, entry in enumerate(_probabilities(result, max_tokens, "the completion reply")):
        listed = _entries(entry.get("top_logprobs", []), f"{where}[{j}].top_logprobs", upper, max(int(top), 0) + 1)
        rows.append([_logprob(entry.get("logprob"), f"{where}[{j}].logprob"), listed])
    return [rows]


def law_body(prefix: list[int], *, top: int) -> dict:
    """The body of the request for the raw law after ``prefix``: its ``top`` most likely tokens' raw logprobs
    (``top`` = the vocabulary size for the whole law)."""
    return {
        "prompt": [int(t) for t in prefix],
        "n_predict": 1,
        "n_probs": int(top),
        "post_sampling_probs": False,
        "temperature": 1.0,
        "top_k": 0,
        "top_p": 1.0,
        "min_p": 0.0,
        "seed": 0,
        "ignore_eos": True,
        "return_tokens": True,
        "cache_prompt": True,
        "stream": False,
    }


def law_reply_bytes(entries: int) -> int:
    """The most bytes a law reply of ``entries`` listed tokens may hold."""
    return REPLY_BASE_BYTES + (int(entries) + 1) * BYTES_PER_ENTRY


def law_row(reply, *, vocab_size: int | None, top: int | None) -> np.ndarray | tuple[np.ndarray, np.ndarray]:
    """The raw law after the prefix of a :func:`law_body` request.

    ``top`` None: the whole vocabulary, a dense (V,) float64 row of log-probabilities (every id of
    ``[0, V)`` listed once; V is the count listed when ``vocab_size`` is None).  ``top = M``: the
    ``M`` most likely tokens, ``(ids, values)`` sorted by decreasing value.

    Raises
    ------
    EndpointError
        No ``completion_probabilities``, ids outside the vocabulary or repeated, a value that is not a
        log-probability, fewer entries than the vocabulary (a cap), or rows not in decreasing order.
    """
    result = _result(reply, "law")
    (entry,) = _probabilities(result, 1, "the law reply")
    upper = MAX_VOCAB if vocab_size is None else int(vocab_size)
    wanted = upper if top is None else int(top)
    where = "the law reply's completion_probabilities[0].top_logprobs"
    listed = entry.get("top_logprobs")
    pairs = _entries(listed, where, upper, wanted)
    if top is not None:
        ids = np.array([t for t, _ in pairs], dtype=np.int64)
        values = np.array([v for _, v in pairs], dtype=np.float64)
        order = np.argsort(-values, kind="stable")
        if len(pairs) < min(wanted, upper):
            raise EndpointError(f"{where} lists {len(pairs)} tokens, {wanted} were asked (n_probs)")
        return ids[order], values[order]
    if vocab_size is not None and len(pairs) != vocab_size:
        raise EndpointError(f"{where} lists {len(pairs)} tokens, not the vocabulary's {vocab_size}: the law is "
                            "incomplete (does the server cap n_probs?)")  # fmt: skip
    V = len(pairs)
    if [t for t, _ in pairs] != list(range(V)):
        raise EndpointError(f"{where} does not list every token id of [0, {V}) once")
    return np.array([v for _, v in pairs], dtype=np.float64)


def banned_tokens(reply, sampling: Sampling, vocab_size: int | None = None) -> tuple[int, ...]:
    """The token ids the server banned on its own (a bias of -inf, JSON ``null``, on a token the request
    did not bias): the end-of-generation tokens ``ignore_eos`` bans, read from a sampling reply's
    ``generation_settings.logit_bias``.  () when the reply lists none."""
    settings = _result(reply, "completion").get("generation_settings")
    listed = settings.get("logit_bias") if isinstance(settings, dict) else None
    if listed is None:
        return ()
    if not isinstance(listed, list) or len(listed) > MAX_VOCAB:
        raise EndpointError("the completion reply's generation_settings.logit_bias is not a list of entries")
    sent = {token for token, _ in sampling.logit_bias}
    upper = MAX_VOCAB if vocab_size is None else int(vocab_size)
    out = set()
    for j, entry in enumerate(listed):
        if not isinstance(entry, dict):
            raise EndpointError(f"generation_settings.logit_bias[{j}] is not an object")
        token = _token_id(entry.get("token"), upper, f"generation_settings.logit_bias[{j}].token")
        bias = entry.get("bias")
        if token not in sent and (bias is None or bias == float("-inf")):
            out.add(token)
    return tuple(sorted(out))
