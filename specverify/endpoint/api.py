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

  With ``top > 0`` (``prompt_logprobs = top``) each entry holds only the ``top`` most likely tokens
  and the prompt token's own (vLLM's semantics): :func:`prompt_logprob_tops` reads such a reply
  into sparse rows, whose processed law is exact whenever the sampler's cut lies inside them
  (:func:`top_resolves`; see docs/large-vocabularies.md).
"""

from __future__ import annotations

import json
import math
import re
import reprlib
from dataclasses import dataclass

import numpy as np
import torch

from specverify.core.errors import InvalidArgument
from specverify.endpoint.http import EndpointError, server_text
from specverify_reference.grammar import Grammar
from specverify_reference.processors import History, SamplingConfig, adjust_logits, logits_to_probs

__all__ = [
    "Sampling",
    "completion_body",
    "teacher_forcing_body",
    "continuations",
    "prompt_logprob_rows",
    "prompt_logprob_tops",
    "top_resolves",
    "densify",
    "processed_laws",
    "LOGPROB_MASS_TOL",
    "LOGPROB_POSITIVE_TOL",
    "MAX_VOCAB",
    "CAP_HINT",
    "sampling_reply_bytes",
    "teacher_forcing_reply_bytes",
]

#: How far the total probability of a full-vocabulary logprob row may be from 1 (float32 logits, JSON).
LOGPROB_MASS_TOL = 1e-3
#: How far above 0 a log-probability may be (float32 rounding of a probability of 1); beyond it the reply is refused.
LOGPROB_POSITIVE_TOL = 1e-6
#: The largest vocabulary the client accepts: 2^20 tokens (the largest served today has 262,144).
MAX_VOCAB = 1 << 20
#: Bytes any reply may hold beyond what its request asks for (ids, usage, fields the audit ignores).
REPLY_BASE_BYTES = 1 << 20
#: Bytes a sampling reply may hold per sampled token (its id, text and whatever else a server adds).
BYTES_PER_TOKEN = 1 << 10
#: Bytes a teacher-forcing reply may hold per logprob entry (vLLM: ``"12345":{"logprob":-1.2,"rank":7,"decoded_token":"ab"}``).
BYTES_PER_LOGPROB = 128
_DECIMAL = re.compile(r"0|[1-9][0-9]*")
#: What lifts a server's cap on logprobs (named in the error when the cap is met).
CAP_HINT = "start the server with --max-logprobs -1 (vLLM) so that prompt_logprobs=-1 returns the whole vocabulary"


@dataclass(frozen=True)
class Sampling:
    """The sampling parameters of an audit, sent to the server and applied to its raw logprobs.

    ``top_k``, ``top_p`` and ``min_p`` None, penalties at their neutral values and an empty
    ``logit_bias`` are off (not sent).  Temperature 0 is greedy.  ``engine`` names whose law the
    server documents (:data:`specverify_reference.processors.ENGINES`; vLLM's by default: the
    order of the cuts, what the penalties count); it is not sent.  ``logit_bias`` is sent as
    OpenAI's ``{"id": bias}``.  ``grammar`` is sent as vLLM's ``structured_outputs`` (``json``,
    ``regex`` or ``grammar``); the teacher-forced laws then apply its mask per prefix, over the
    token strings of :func:`~specverify_reference.grammar.synthetic_vocabulary` (the local
    server's), or of the served model's tokenizer when the grammar names one (``--grammar-tokenizer``);
    two-sample mode needs no token strings.
    """

    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None
    min_p: float | None = None
    repetition_penalty: float = 1.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    logit_bias: tuple = ()
    engine: str = "vllm"
    grammar: Grammar | None = None

    def __post_init__(self):
        object.__setattr__(self, "logit_bias", self.config().logit_bias)  # validates (InvalidArgument naming it)
        for token, bias in self.logit_bias:
            if not math.isfinite(bias):
                raise InvalidArgument(
                    f"logit_bias values sent to a server must be finite (JSON), got {bias} for id {token}"
                )

    def config(self) -> SamplingConfig:
        return SamplingConfig(
            temperature=self.temperature, top_k=self.top_k, top_p=self.top_p, min_p=self.min_p, engine=self.engine,
            repetition_penalty=self.repetition_penalty, frequency_penalty=self.frequency_penalty,
            presence_penalty=self.presence_penalty, logit_bias=self.logit_bias, grammar=self.grammar,
        )  # fmt: skip

    def record(self) -> dict:
        """What a report and a store header record: temperature, top-k and top-p always (None when off),
        the other options only when on (so that a store written before they existed still matches)."""
        out: dict = {"temperature": self.temperature, "top_k": self.top_k, "top_p": self.top_p}
        out.update({k: v for k, v in self.fields().items() if k not in out})
        if self.engine != "vllm":
            out["engine"] = self.engine
        if self.grammar is not None:
            out["grammar"] = self.grammar.record()
            del out["structured_outputs"]
        return out

    def fields(self) -> dict:
        out: dict = {"temperature": float(self.temperature)}
        for name in ("top_k", "top_p", "min_p"):
            if getattr(self, name) is not None:
                out[name] = getattr(self, name)
        for name, neutral in (("repetition_penalty", 1.0), ("frequency_penalty", 0.0), ("presence_penalty", 0.0)):
            if getattr(self, name) != neutral:
                out[name] = float(getattr(self, name))
        if self.logit_bias:
            out["logit_bias"] = {str(token): bias for token, bias in self.logit_bias}
        if self.grammar is not None:
            out["structured_outputs"] = structured_outputs(self.grammar)
        return out


#: vLLM's ``structured_outputs`` field of each grammar kind.
STRUCTURED_FIELDS = {"json_schema": "json", "regex": "regex", "ebnf": "grammar"}


def structured_outputs(grammar: Grammar) -> dict:
    """vLLM's ``structured_outputs`` request field for ``grammar``: ``{"json": schema}``, ``{"regex": ...}``
    or ``{"grammar": ebnf}``."""
    value = json.loads(grammar.source) if grammar.kind == "json_schema" else grammar.source
    return {STRUCTURED_FIELDS[grammar.kind]: value}


def completion_body(
    model: str,
    prompt: list[int],
    *,
    n: int,
    max_tokens: int,
    sampling: Sampling,
    seed: int | None,
    logprobs: int | None = None,
) -> dict:
    """The body of a sampling request: ``n`` continuations of ``max_tokens`` tokens of ``prompt``
    (with each token's logprob and its ``logprobs`` most likely tokens' when that is not None)."""
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
    if logprobs is not None:
        body["logprobs"] = int(logprobs)
    return body


def teacher_forcing_body(model: str, sequence: list[int], *, top: int = -1) -> dict:
    """The body of a teacher-forcing request: logprobs of every token of ``sequence``, over the whole
    vocabulary (``top=-1``) or of the ``top`` most likely tokens and the token's own."""
    return {
        "model": model,
        "prompt": [int(t) for t in sequence],
        "max_tokens": 1,
        "prompt_logprobs": int(top),
        "temperature": 1.0,
        "stream": False,
    }


def sampling_reply_bytes(n: int, max_tokens: int, logprobs: int | None = None, *,
                         per_entry: int = BYTES_PER_LOGPROB) -> int:  # fmt: skip
    """The most bytes a reply of ``n`` continuations of ``max_tokens`` tokens may hold (with
    ``logprobs``: each token's logprob and top list, ``logprobs + 1`` entries of ``per_entry`` bytes, on top)."""
    per_token = BYTES_PER_TOKEN + (0 if logprobs is None else (int(logprobs) + 1) * int(per_entry))
    return REPLY_BASE_BYTES + int(n) * int(max_tokens) * per_token


def teacher_forcing_reply_bytes(length: int, vocab_size: int | None, top: int = -1) -> int:
    """The most bytes a reply of the prompt logprobs of a ``length``-token prompt may hold.

    Its ``length - 1`` rows (the first token has no law) of ``vocab_size`` entries each
    (:data:`MAX_VOCAB` while the vocabulary is not known), or of ``top + 1`` entries with ``top > 0``.
    """
    entries = (MAX_VOCAB if vocab_size is None else int(vocab_size)) if top == -1 else int(top) + 1
    return REPLY_BASE_BYTES + max(int(length) - 1, 1) * entries * BYTES_PER_LOGPROB


def _choices(reply, what: str, limit: int) -> list:
    """The reply's choices in index order: a list of at most ``limit`` objects with distinct integer indices."""
    choices = reply.get("choices") if isinstance(reply, dict) else None
    if not isinstance(choices, list) or not choices:
        raise EndpointError(f"the {what} reply has no choices: {server_text(_preview(reply), limit=120)}")
    if len(choices) > limit:
        raise EndpointError(f"the {what} reply has {len(choices)} choices, {limit} were asked")
    if not all(isinstance(c, dict) for c in choices):
        raise EndpointError(f"the {what} reply has a choice that is not an object")
    indices = [c.get("index") for c in choices]
    if all(i is None for i in indices):
        return choices
    if not all(_is_int(i) and 0 <= i < len(choices) for i in indices) or len(set(indices)) != len(indices):
        shown = server_text(_preview(indices), limit=80)
        raise EndpointError(f"the {what} reply's choices have indices {shown}: not 0..{len(choices) - 1} once each")
    return sorted(choices, key=lambda c: c["index"])


def _preview(value) -> str:
    """A short repr of a (possibly huge) decoded JSON value, built without walking all of it."""
    return reprlib.repr(value)


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _token_id(value, upper: int, where: str) -> int:
    """A token id of a reply: an integer in [0, upper) (``token_id:N`` strings of vLLM's option are read too)."""
    if isinstance(value, str) and value.startswith("token_id:") and _DECIMAL.fullmatch(value[9:]):
        value = int(value[9:])
    if not _is_int(value):
        raise EndpointError(f"{where} holds {server_text(_preview(value), limit=60)}, not an integer token id")
    if not 0 <= value < upper:
        shown = str(value) if value.bit_length() < 64 else f"an integer of {len(str(value))} digits"
        raise EndpointError(f"{where} holds token {shown}, outside the vocabulary [0, {upper})")
    return value


def _token_ids(choice: dict, upper: int, where: str) -> list[int] | None:
    ids = choice.get("token_ids")
    if ids is None:
        logprobs = choice.get("logprobs")
        tokens = logprobs.get("tokens") if isinstance(logprobs, dict) else None
        if (
            isinstance(tokens, list)
            and tokens
            and all(isinstance(t, str) and t.startswith("token_id:") for t in tokens)
        ):
            ids = tokens
    if ids is None:
        return None
    if not isinstance(ids, list):
        raise EndpointError(f"{where}.token_ids is {type(ids).__name__}, not a list of token ids")
    return [_token_id(t, upper, f"{where}.token_ids") for t in ids]


def continuations(reply, *, n: int, max_tokens: int, vocab_size: int | None = None) -> list[list[int]]:
    """The ``n`` continuations' token ids of a sampling reply, each exactly ``max_tokens`` long.

    Raises
    ------
    EndpointError
        No choices, no token ids (the server does not return them), the wrong number of
        choices or duplicate indices, a token id that is not an integer in ``[0, vocab_size)``
        (``[0, MAX_VOCAB)`` when the vocabulary is not known), or a continuation of another
        length (the server stopped early).
    """
    choices = _choices(reply, "completion", n)
    if len(choices) != n:
        raise EndpointError(f"the completion reply has {len(choices)} choices, {n} were asked (n={n})")
    upper = MAX_VOCAB if vocab_size is None else int(vocab_size)
    out = []
    for i, choice in enumerate(choices):
        ids = _token_ids(choice, upper, f"the completion reply's choices[{i}]")
        if ids is None:
            raise EndpointError(
                "the completion reply holds no token ids: the audit needs a server that returns them "
                "(vLLM does for the request field return_token_ids, which is sent, or with --return-tokens-as-token-ids)"
            )
        if len(ids) != max_tokens:
            finish = server_text(_preview(choice.get("finish_reason")), limit=40)
            raise EndpointError(
                f"a continuation has {len(ids)} tokens, {max_tokens} were asked "
                f"(finish_reason={finish}): the server must honour ignore_eos"
            )
        out.append(ids)
    return out


def _logprob(value, where: str) -> float:
    if isinstance(value, dict):
        value = value.get("logprob")
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise EndpointError(f"{where} is {server_text(_preview(value), limit=60)}, not a number")
    if isinstance(value, int) and abs(value) > 1e300:
        raise EndpointError(f"{where} is an integer of {len(str(value))} digits, not a log-probability")
    value = float(value)
    if math.isnan(value) or value > LOGPROB_POSITIVE_TOL:
        raise EndpointError(f"{where} is {value!r}: a log-probability is at most 0")
    return value


def prompt_logprob_rows(reply, sequence: list[int], vocab_size: int | None) -> np.ndarray:
    """Dense raw log-probability rows of a teacher-forcing reply: (S - 1, V) float64.

    Row ``i - 1`` is the law of ``sequence[i]`` given ``sequence[:i]``.  Entries the server
    clamps (vLLM writes ``-inf`` as -9999) stay as sent: their probability is 0 in float64.

    Raises
    ------
    EndpointError
        No ``prompt_logprobs``; a row that does not cover the vocabulary (its size differs from
        ``vocab_size`` or from the first row, or its probabilities do not sum to 1 within
        :data:`LOGPROB_MASS_TOL`: the server capped the logprobs); a key that is not a token id
        written in decimal, or names a token outside the vocabulary; a log-probability that is
        not a number, NaN, or above 0 (beyond :data:`LOGPROB_POSITIVE_TOL`).
    """
    rows = []
    V = vocab_size
    for _, where, entry in _prompt_logprob_entries(reply, sequence):
        size = len(entry)
        if V is None:
            if size > MAX_VOCAB:
                raise EndpointError(f"{where} covers {size:,} tokens, more than the {MAX_VOCAB:,} the client accepts")
            V = size
        if size != V:
            raise EndpointError(
                f"{where} covers {size} tokens, the vocabulary has {V}: logprobs capped below the vocabulary; "
                + CAP_HINT
            )
        row = np.full(V, -math.inf)
        for key, value in entry.items():
            if vocab_size is None and _DECIMAL.fullmatch(key) and (len(key) >= 20 or int(key) >= V):
                raise EndpointError(  # ids beyond the row's size: a sparse (capped) row
                    f"{where} names token {server_text(key, limit=40)} but covers only {V} tokens: logprobs capped "
                    f"below the vocabulary; {CAP_HINT}"
                )
            row[_entry_token(key, V, where)] = _logprob(value, f"{where}[{key}]")
        mass = math.fsum(np.exp(row).tolist())
        if abs(mass - 1.0) > LOGPROB_MASS_TOL:
            raise EndpointError(
                f"{where} sums to probability {mass:.4g}, not 1: logprobs capped below the vocabulary "
                f"or not normalised; {CAP_HINT}"
            )
        rows.append(row)
    return np.stack(rows) if rows else np.zeros((0, V or 0))


def _prompt_logprob_entries(reply, sequence: list[int]):
    """(i, where, entry) for every token ``i >= 1`` of ``sequence``: its law's map of token ids to logprobs."""
    choice = _choices(reply, "teacher-forcing", 1)[0]
    laws = choice.get("prompt_logprobs")
    if not isinstance(laws, list) or len(laws) != len(sequence):
        raise EndpointError(
            "the teacher-forcing reply holds no prompt_logprobs for every prompt token "
            f"(got {type(laws).__name__}{'' if not isinstance(laws, list) else f' of length {len(laws)}'}, "
            f"expected {len(sequence)}): the server must support the request field prompt_logprobs; {CAP_HINT}"
        )
    for i in range(1, len(sequence)):
        entry = laws[i]
        where = f"the teacher-forcing reply's prompt_logprobs[{i}]"
        if not isinstance(entry, dict) or not entry:
            raise EndpointError(
                f"{where} is {server_text(_preview(entry), limit=60)}, not a map of token ids to logprobs"
            )
        yield i, where, entry


def _entry_token(key: str, V: int, where: str) -> int:
    """The token id a logprob map's key names: canonical decimal, in [0, V)."""
    if not _DECIMAL.fullmatch(key):
        raise EndpointError(f"{where} has the key {server_text(key, limit=40)!r}, not a token id in decimal")
    token = int(key) if len(key) < 20 else V
    if not 0 <= token < V:
        raise EndpointError(f"{where} names token {server_text(key, limit=40)}, outside the vocabulary [0, {V})")
    return token


def prompt_logprob_tops(reply, sequence: list[int], top: int, vocab_size: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """Sparse raw log-probability rows of a ``prompt_logprobs = top`` reply: for each token ``i >= 1``
    of ``sequence``, the ids (int64) and log-probabilities (float64) of the ``min(top, V)`` most
    likely tokens given ``sequence[:i]``, most likely first (ties by id).

    The prompt token's own entry, which the server adds when it is not among them, is checked
    and dropped: its log-probability may not exceed the least of the listed ones (a server whose
    ranking contradicts its own numbers is refused).  What is not listed is bounded by the last
    listed log-probability; :func:`top_resolves` says when that fixes the processed law.

    Raises
    ------
    EndpointError
        No ``prompt_logprobs``; an entry with fewer than ``min(top, V)`` or more than ``top + 1``
        tokens, without the prompt token's own, or with a prompt token ranked above a listed one;
        a key that is not a token id in decimal or is outside ``[0, vocab_size)``; a log-probability
        that is not a number, NaN, or above 0; listed probabilities that sum to more than 1 (beyond
        :data:`LOGPROB_MASS_TOL`).
    """
    V = int(vocab_size)
    want = min(int(top), V)
    rows = []
    for i, where, entry in _prompt_logprob_entries(reply, sequence):
        if not want <= len(entry) <= want + 1:
            raise EndpointError(
                f"{where} lists {len(entry)} tokens, {want} were asked (prompt_logprobs={top}) and the prompt "
                f"token's own: the server capped the logprobs; start vLLM with --max-logprobs {top} or more"
            )
        ids, values = [], []
        for key, value in entry.items():
            ids.append(_entry_token(key, V, where))
            values.append(_logprob(value, f"{where}[{key}]"))
        if sequence[i] not in ids:
            raise EndpointError(f"{where} does not list the prompt token {sequence[i]}'s own log-probability")
        mass = math.fsum(math.exp(v) for v in values)
        if mass > 1.0 + LOGPROB_MASS_TOL:
            raise EndpointError(f"{where} lists tokens of total probability {mass:.4g}, more than 1")
        order = sorted(range(len(ids)), key=lambda j: (-values[j], ids[j]))
        if len(ids) == want + 1:  # the prompt token is the extra one: it may not outrank a listed token
            own = ids.index(sequence[i])
            order = [j for j in order if j != own]
            if values[own] > values[order[-1]]:
                raise EndpointError(
                    f"{where} lists {want + 1} tokens but the prompt token {sequence[i]} (logprob {values[own]!r}) "
                    f"is above the least likely of the others: the server's top {top} are not its most likely tokens"
                )
        rows.append((np.array([ids[j] for j in order], dtype=np.int64), np.array([values[j] for j in order])))
    return rows


def top_resolves(
    logprobs: np.ndarray,
    vocab_size: int,
    sampling: Sampling,
    *,
    ids: np.ndarray | None = None,
    history: History | None = None,
) -> bool:
    """Whether the ``top`` listed raw log-probabilities (descending) fix the processed law exactly.

    They do when the row lists the whole vocabulary, or when the sampler's cut (top-k's k-th
    largest; greedy's largest) lies strictly above the least listed value: every unlisted token
    is then below the cut and has processed probability 0, whatever its value.  Without top-k
    (or greedy) the law needs every token's value and they never fix it.

    With a logit bias or penalties (``ids``, the listed tokens, and ``history``, the prefix, are
    then needed) the cut is the k-th largest *adjusted* listed value, and an unlisted token's
    adjusted value is at most its adjustment of the least listed value (each adjustment is
    increasing in the logit): the list fixes the law when that cut lies strictly above every such
    bound.
    """
    if len(logprobs) >= vocab_size:
        return True
    k = 1 if sampling.temperature == 0 else sampling.top_k
    if k is None or k > len(logprobs):
        return False
    config = sampling.config()
    if not config.adjusts_logits:
        return bool(logprobs[k - 1] > logprobs[-1])
    if ids is None:
        raise InvalidArgument("top_resolves needs the listed ids when a logit bias or a penalty is on")
    listed = np.zeros(int(vocab_size), dtype=bool)
    listed[ids] = True
    rows = np.full((2, int(vocab_size)), -math.inf)
    rows[1, ~listed] = logprobs[-1]  # every unlisted token at the least listed value: its bound
    rows[:, ids] = logprobs
    adjusted = adjust_logits(torch.as_tensor(rows)[:, None], config, _twice(history)).numpy()[:, 0]  # (2, V)
    cut = np.sort(adjusted[0, ids])[::-1][k - 1]
    return bool(cut > adjusted[1, ~listed].max())


def _twice(history: History | None) -> History | None:
    """``history`` (one row) for two rows of laws."""
    if history is None:
        return None
    return History(history.tokens.expand(2, -1), history.prompt_len, history.ends.expand(2, -1))


def densify(ids: np.ndarray, logprobs: np.ndarray, vocab_size: int) -> np.ndarray:
    """A (V,) raw row with ``logprobs`` at ``ids`` and -inf elsewhere (probability 0 after processing)."""
    row = np.full(int(vocab_size), -math.inf)
    row[ids] = logprobs
    return row


def processed_laws(raw_logprobs: np.ndarray, sampling: Sampling, history: History | None = None) -> torch.Tensor:
    """The sampler's law from raw log-probabilities (B, V): the reference processors in float64.

    ``history`` (one law per row: ``ends`` (B, 1)) gives the tokens before each law, needed
    when a penalty is on.
    """
    if not isinstance(sampling, Sampling):
        raise InvalidArgument(f"sampling must be a Sampling, got {sampling!r}")
    logits = torch.as_tensor(np.asarray(raw_logprobs, dtype=np.float64))
    logits = torch.where(torch.isfinite(logits), logits, torch.full_like(logits, -math.inf))
    return logits_to_probs(logits, sampling.config(), history=history)
