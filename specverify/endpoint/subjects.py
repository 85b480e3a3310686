"""A served model as the decoder battery's subjects: a decoder that samples over HTTP, a target from logprobs.

:class:`EndpointDecoder` is the decoder protocol (``generate(prompt, *, num_samples,
max_new_tokens, seed)``) on top of a completions endpoint: ``num_samples`` continuations in
requests of ``samples_per_request`` each, request ``j`` seeded ``seed + j * samples_per_request``
(mod 2^31; vLLM seeds the ``n`` samples of a request ``seed + i``, so no two samples share a
seed).  A call repeated with the same arguments -- the battery's determinism check -- is sent
again, not answered from the store (unless ``repeat_from_store``).

:class:`EndpointTarget` is the target protocol (``next_token_probs``, ``conditionals``) from
teacher-forcing requests (:func:`specverify.endpoint.api.teacher_forcing_body`), memoised over
the prefix trie: the law after each distinct prefix is asked once.  The laws a batch of
sequences needs are the nodes ``seq[:m]``; one request of ``seq[:S-1] + [0]`` returns the laws
after all of its prefixes, so the requests are the distinct longest needed prefixes (taken in
sorted order; each keeps only the laws no earlier request covered, which makes the store's
contents a function of the samples).  The laws are the server's raw log-probabilities,
processed with the audit's sampling parameters (:func:`specverify.endpoint.api.processed_laws`).

With ``top_logprobs=M`` the requests ask for the ``M`` most likely tokens of every position
instead of the whole vocabulary, and the target keeps only those (ids and values): replies,
store and memory then grow with M, not with V.  Under top-k (k < M) or greedy sampling they fix
the processed law exactly (:func:`specverify.endpoint.api.top_resolves`); a law whose cut ties
the least listed value is asked again over the whole vocabulary.
"""

from __future__ import annotations

import bisect
import math
from collections import Counter

import numpy as np
import torch

from specverify.core.errors import InvalidArgument
from specverify.core.validation import check_int
from specverify.endpoint import llamaserver
from specverify.endpoint.api import (
    LOGPROB_POSITIVE_TOL,
    MAX_VOCAB,
    Sampling,
    completion_body,
    continuations,
    processed_laws,
    prompt_logprob_rows,
    prompt_logprob_tops,
    sampling_reply_bytes,
    teacher_forcing_body,
    teacher_forcing_reply_bytes,
    top_resolves,
)
from specverify.endpoint.fidelity import reported_logprobs
from specverify.endpoint.http import EndpointError
from specverify.endpoint.pool import Fetcher, Request
from specverify_reference.processors import History

__all__ = [
    "EndpointDecoder", "EndpointTarget", "SEED_MODULUS", "sampling_request", "teacher_forcing_request",
    "check_top_logprobs", "check_exact_options", "APIS", "check_api",
]  # fmt: skip

#: The completion APIs an audit speaks: OpenAI's (``POST /v1/completions``; vLLM, SGLang, the local
#: server) and llama-server's native one (``POST /completion``: :mod:`specverify.endpoint.llamaserver`).
APIS = ("openai", "llama-server")

SEED_MODULUS = 2**31


def check_api(api) -> str:
    """``api`` validated: one of :data:`APIS`."""
    if api not in APIS:
        raise InvalidArgument(f"api must be one of {', '.join(APIS)}, got {api!r}")
    return api


#: Top-M laws an audit asks again over the whole vocabulary (a tie at the cut) before it stops: a
#: server cannot turn a top-M audit into a whole-vocabulary one (64 laws: 134 MB at V = 262,144).
MAX_FALLBACKS = 64


class EndpointDecoder:
    """The decoder protocol over a completions endpoint (see the module docstring).

    Parameters
    ----------
    fetcher : Fetcher
    model : str
        The served model's name.
    sampling : Sampling
    role : {"decoder", "reference"}
        Which client of ``fetcher`` answers.
    samples_per_request : int
        Continuations per request (``n``).
    seeded : bool
        Send a seed with every request (the determinism check needs one).
    repeat_from_store : bool
        A call repeated with the same arguments is answered with the first call's replies (from the
        store) instead of being sent again: the battery's determinism check then cannot fail, and
        the law is tested on a server whose seeded outputs are not reproducible (say so in the report).
    vocab_size : int, optional
    logprobs : int, optional
        Ask each token's logprob and its ``logprobs`` most likely tokens' (OpenAI's field); what
        the server reports is kept in :attr:`reported` (prompt -> [(continuation, per-token
        ``[logprob, [[id, logprob], ...]]``), ...]) for :mod:`specverify.endpoint.fidelity`.
    api : {"openai", "llama-server"}
        The completion API (:data:`APIS`); llama-server's returns one continuation per request.
    """

    def __init__(
        self,
        fetcher: Fetcher,
        model: str,
        sampling: Sampling,
        *,
        role: str = "decoder",
        samples_per_request: int = 1,
        seeded: bool = True,
        vocab_size: int | None = None,
        label: str = "",
        repeat_from_store: bool = False,
        logprobs: int | None = None,
        api: str = "openai",
    ):
        if samples_per_request < 1:
            raise InvalidArgument(f"samples_per_request must be >= 1, got {samples_per_request!r}")
        self.api = check_api(api)
        if api == "llama-server" and samples_per_request != 1:
            raise InvalidArgument(f"llama-server's native API returns one continuation per request: "
                                  f"samples_per_request must be 1, got {samples_per_request!r}")  # fmt: skip
        self.fetcher, self.model, self.sampling, self.role = fetcher, model, sampling, role
        self.samples_per_request = int(samples_per_request)
        self.seeded = bool(seeded)
        if vocab_size is not None:
            self.vocab_size = int(vocab_size)
        self.label = label or model
        self.repeat_from_store = bool(repeat_from_store)
        self.logprobs = logprobs
        self.reported: dict[tuple, list] = {}
        self._calls: Counter = Counter()

    def __repr__(self) -> str:
        return f"EndpointDecoder({self.label!r}, role={self.role!r})"

    def generate(self, prompt, *, num_samples: int, max_new_tokens: int, seed: int) -> torch.Tensor:
        """``num_samples`` continuations of ``prompt`` (T,) from the server: (num_samples, max_new_tokens) long."""
        ids = [int(t) for t in torch.as_tensor(prompt).tolist()]
        call = (tuple(ids), int(num_samples), int(max_new_tokens), int(seed))
        occurrence = 0 if self.repeat_from_store else self._calls[call]
        self._calls[call] += 1
        n = self.samples_per_request
        requests = []
        for j in range(math.ceil(num_samples / n)):
            request_seed = (int(seed) + j * n) % SEED_MODULUS if self.seeded else None
            requests.append(
                sampling_request(self.role, self.model, self.sampling, ids, n=min(n, num_samples - j * n),
                                 max_tokens=max_new_tokens, seed=request_seed, occurrence=occurrence,
                                 extra={} if self.seeded else {"index": j}, vocab_size=getattr(self, "vocab_size", None),
                                 logprobs=self.logprobs, api=self.api)
            )  # fmt: skip
        replies = self.fetcher.fetch(requests, what=f"{self.role} samples")
        if self.logprobs is not None:
            if occurrence == 0:  # a repeated call (the determinism check) would only repeat the values
                kept = self.reported.setdefault(tuple(ids), [])
                kept.extend((tuple(row), values) for reply in replies for row, values in zip(reply[0], reply[1]))
            replies = [reply[0] for reply in replies]
        rows = [row for reply in replies for row in reply]
        return torch.tensor(rows, dtype=torch.long).reshape(num_samples, max_new_tokens)


def sampling_request(role: str, model: str, sampling: Sampling, prompt: list[int], *, n: int, max_tokens: int,
                     seed: int | None, occurrence: int = 0, extra: dict | None = None,
                     vocab_size: int | None = None, logprobs: int | None = None, api: str = "openai") -> Request:  # fmt: skip
    """The request for ``n`` continuations of ``prompt``; its reply is read as their token ids (and,
    with ``logprobs``, as ``[token ids, reported logprobs]``: :func:`~specverify.endpoint.fidelity.reported_logprobs`).
    ``api``: OpenAI's completions, or llama-server's native route (``n`` must be 1)."""
    upper = MAX_VOCAB if vocab_size is None else int(vocab_size)
    native = check_api(api) == "llama-server"
    if native and n != 1:
        raise InvalidArgument(f"llama-server's native API returns one continuation per request, got n={n}")

    def parse(reply):
        if native:
            rows = llamaserver.continuations(reply, max_tokens=max_tokens, vocab_size=vocab_size)
            if logprobs is None:
                return rows
            return [rows, llamaserver.reported_logprobs(reply, max_tokens=max_tokens, top=logprobs,
                                                        vocab_size=vocab_size)]  # fmt: skip
        rows = continuations(reply, n=n, max_tokens=max_tokens, vocab_size=vocab_size)
        if logprobs is None:
            return rows
        return [rows, reported_logprobs(reply, n=n, max_tokens=max_tokens, top=logprobs, vocab_size=vocab_size)]

    def rows_ok(stored) -> bool:
        return (
            isinstance(stored, list)
            and len(stored) == n
            and all(isinstance(row, list) and len(row) == max_tokens for row in stored)
            and all(type(t) is int and 0 <= t < upper for row in stored for t in row)
        )

    def check(stored) -> bool:
        if logprobs is None:
            return rows_ok(stored)
        return (isinstance(stored, list) and len(stored) == 2 and rows_ok(stored[0])
                and isinstance(stored[1], list) and len(stored[1]) == n
                and all(isinstance(r, list) and len(r) == max_tokens for r in stored[1]))  # fmt: skip

    if native:
        body = llamaserver.sampling_body(prompt, max_tokens=max_tokens, sampling=sampling, seed=seed, logprobs=logprobs)
        return Request(role, body, parse=parse, occurrence=occurrence, extra=extra or {}, tokens=max_tokens,
                       max_bytes=llamaserver.sampling_reply_bytes(max_tokens, logprobs), check=check,
                       path=llamaserver.PATH)  # fmt: skip
    body = completion_body(model, prompt, n=n, max_tokens=max_tokens, sampling=sampling, seed=seed, logprobs=logprobs)
    return Request(role, body, parse=parse, occurrence=occurrence, extra=extra or {}, tokens=n * max_tokens,
                   max_bytes=sampling_reply_bytes(n, max_tokens, logprobs), check=check)  # fmt: skip


def _kept_tops(sequence: list[int], keep: list[int], top: int, vocab_size: int):
    def parse(reply):
        rows = prompt_logprob_tops(reply, sequence, top, vocab_size)  # S - 1 sparse rows
        return [[rows[m - 1][0].tolist(), rows[m - 1][1].tolist()] for m in keep]

    return parse


def _tops_check(count: int, top: int, vocab_size: int):
    def check(stored) -> bool:
        if not isinstance(stored, list) or len(stored) != count:
            return False
        for row in stored:
            if not (isinstance(row, list) and len(row) == 2 and isinstance(row[0], list) and isinstance(row[1], list)):
                return False
            ids, values = row
            if not 0 < len(ids) == len(values) <= min(top, vocab_size) or len(set(ids)) != len(ids):
                return False
            if not all(type(t) is int and 0 <= t < vocab_size for t in ids):
                return False
            lp = np.asarray(values, dtype=np.float64)
            if np.isnan(lp).any() or (lp > LOGPROB_POSITIVE_TOL).any() or (np.diff(lp) > 0).any():
                return False
        return True

    return check


def _kept_rows(sequence: list[int], keep: list[int], vocab_size: int | None):
    def parse(reply):
        rows = prompt_logprob_rows(reply, sequence, vocab_size)  # (S - 1, V): row m - 1 is the law after seq[:m]
        return [rows[m - 1].tolist() for m in keep]

    return parse


def _rows_check(count: int, vocab_size: int | None):
    def check(stored) -> bool:
        if not isinstance(stored, list) or len(stored) != count:
            return False
        rows = [np.asarray(row, dtype=np.float64) for row in stored]
        V = vocab_size if vocab_size is not None else rows[0].shape[-1]
        return all(r.shape == (V,) and not np.isnan(r).any() and bool((r <= LOGPROB_POSITIVE_TOL).all()) for r in rows)

    return check


def teacher_forcing_request(
    role: str, model: str, sequence: list[int], keep: list[int], top: int | None, vocab_size: int | None
) -> Request:
    """The prompt-logprobs request of ``sequence`` keeping the raw laws after ``sequence[:m]``, m in ``keep``:
    whole-vocabulary rows (``top`` None) or the ``top`` most likely tokens' ``[ids, values]`` (needs ``vocab_size``)."""
    if top is None:
        parse, check = _kept_rows(sequence, keep, vocab_size), _rows_check(len(keep), vocab_size)
    else:
        assert vocab_size is not None  # check_top_logprobs
        parse, check = _kept_tops(sequence, keep, top, vocab_size), _tops_check(len(keep), top, vocab_size)
    return Request(role, teacher_forcing_body(model, sequence, top=-1 if top is None else top),
                   parse=parse, extra={"keep": keep}, tokens=len(sequence),
                   max_bytes=teacher_forcing_reply_bytes(len(sequence), vocab_size, -1 if top is None else top),
                   check=check)  # fmt: skip


def law_request(role: str, prefix: list[int], top: int | None, vocab_size: int | None) -> Request:
    """llama-server's request for the raw law after ``prefix`` (one prefix per request: it has no prompt
    logprobs), read as one kept row as :func:`teacher_forcing_request`'s (``[row]`` or ``[[ids, values]]``)."""
    if top is None:
        entries = MAX_VOCAB if vocab_size is None else int(vocab_size)
        check = _rows_check(1, vocab_size)
    else:
        assert vocab_size is not None  # check_top_logprobs
        entries, check = int(top), _tops_check(1, top, vocab_size)

    def parse(reply):
        law = llamaserver.law_row(reply, vocab_size=vocab_size, top=top)
        return [law.tolist()] if top is None else [[law[0].tolist(), law[1].tolist()]]

    return Request(role, llamaserver.law_body(prefix, top=entries), parse=parse, tokens=len(prefix),
                   max_bytes=llamaserver.law_reply_bytes(entries), check=check, path=llamaserver.PATH)  # fmt: skip


class EndpointTarget:
    """The target protocol from a server's full-vocabulary prompt logprobs (see the module docstring).

    Parameters
    ----------
    fetcher : Fetcher
    model : str
    sampling : Sampling
        Applied to the raw logprobs: the law the sampler should draw from.
    vocab_size : int, optional
        Known V (every row must cover it); otherwise taken from the first reply.
    role : str
        Which client of ``fetcher`` answers (default ``"target"``).
    top_logprobs : int, optional
        Ask for the ``top_logprobs`` most likely tokens per position instead of the whole
        vocabulary (needs ``vocab_size``, and top-k with k < ``top_logprobs`` or greedy sampling:
        the only laws a top-M list fixes; see the module docstring).
    api : {"openai", "llama-server"}
        OpenAI's completions with vLLM's ``prompt_logprobs`` (one request per longest prefix), or
        llama-server's native route (one request per prefix: :func:`law_request`).
    banned : tuple of int
        Tokens the sampling server bans on its own (llama-server's ``ignore_eos``: a logit bias of -inf,
        the first stage of its chain): probability 0 in every law.  The raw laws kept stay raw.
    """

    def __init__(
        self,
        fetcher: Fetcher,
        model: str,
        sampling: Sampling,
        *,
        vocab_size: int | None = None,
        role="target",
        top_logprobs: int | None = None,
        api: str = "openai",
        banned: tuple = (),
    ):
        self.fetcher, self.model, self.sampling, self.role = fetcher, model, sampling, role
        self.api = check_api(api)
        self.banned = np.asarray(sorted({int(t) for t in banned}), dtype=np.int64)
        check_exact_options(sampling)
        self.vocab_size = vocab_size
        self.top = None if top_logprobs is None else check_top_logprobs(top_logprobs, sampling, vocab_size)
        self.raw: dict[tuple, np.ndarray | tuple[np.ndarray, np.ndarray]] = {}  # prefix -> (V,) row or (ids, values)
        self.requests = 0  # teacher-forcing requests planned (sent or from the store)
        self.laws_asked = 0  # prefix laws the battery asked for (with repeats)
        self.dense_fallbacks = 0  # sparse laws asked again over the whole vocabulary (a tie at the cut)

    def _ensure(self, prefixes: list[tuple]) -> None:
        """Make the raw law after every prefix in ``prefixes`` known, one request per longest new prefix."""
        needed = sorted({p for p in prefixes if p not in self.raw})
        if not needed:
            return
        requests, plans = self._plan(needed)
        for (leaf, keep), rows in zip(plans, self._fetch(requests, "target laws")):
            for m, row in zip(keep, rows):
                if self.top is None:
                    self.raw[leaf[:m]] = np.asarray(row, dtype=np.float64)
                else:
                    self.raw[leaf[:m]] = (np.asarray(row[0], dtype=np.int64), np.asarray(row[1], dtype=np.float64))
        if self.vocab_size is None:
            self.vocab_size = len(next(iter(self.raw.values())))

    def _plan(self, needed: list[tuple]) -> tuple[list[Request], list[tuple[tuple, list[int]]]]:
        """The requests that give the laws after ``needed`` (sorted) and, per request, (sequence, kept lengths)."""
        if self.api == "llama-server":  # no prompt logprobs: one request per prefix
            return [self._request(list(p), [len(p)], self.top) for p in needed], [(p, [len(p)]) for p in needed]
        wanted, planned = set(needed), set[tuple]()
        requests, plans = [], []
        for leaf in [p for p in needed if not _has_extension(p, needed)]:
            keep = [m for m in range(1, len(leaf) + 1) if leaf[:m] in wanted and leaf[:m] not in planned]
            if keep:
                planned.update(leaf[:m] for m in keep)
                requests.append(self._request(list(leaf) + [0], keep, self.top))
                plans.append((leaf, keep))
        return requests, plans

    def _resolve(self, prefixes: list[tuple], prompt_len: int) -> None:
        """Ask again over the whole vocabulary every top-M law in ``prefixes`` whose list does not fix
        the processed law (:func:`top_resolves`: the cut ties the least listed value, or an adjusted
        unlisted token could pass it)."""
        unresolved = []
        for prefix in dict.fromkeys(prefixes):
            law = self.raw[prefix]
            if not isinstance(law, tuple):
                continue
            history = _history([prefix], prompt_len) if self.sampling.config().adjusts_logits else None
            kept = ~np.isin(law[0], self.banned)  # a banned token is out of the law before the cuts
            if not top_resolves(law[1][kept], self.vocab_size, self.sampling, ids=law[0][kept], history=history):  # type: ignore[arg-type]
                unresolved.append(prefix)
        if self.dense_fallbacks + len(unresolved) > MAX_FALLBACKS:
            error = EndpointError(
                f"{self.dense_fallbacks + len(unresolved)} top-{self.top} laws tie the sampler's cut at their least "
                f"listed value, more than the {MAX_FALLBACKS} the audit asks again over the whole vocabulary: "
                "raise --top-logprobs"
            )
            self.fetcher.failure = error  # the run ends as for a server that failed for good
            raise error
        tail = [] if self.api == "llama-server" else [0]
        dense = [self._request([*prefix, *tail], [len(prefix)], None) for prefix in unresolved]
        self.dense_fallbacks += len(dense)
        for prefix, rows in zip(unresolved, self._fetch(dense, "target laws (whole vocabulary)")):
            self.raw[prefix] = np.asarray(rows[0], dtype=np.float64)

    def _request(self, sequence: list[int], keep: list[int], top: int | None) -> Request:
        """The teacher-forcing request of ``sequence`` keeping the laws after ``sequence[:m]``, m in ``keep``
        (llama-server: the law after ``sequence`` itself, ``keep == [len(sequence)]``)."""
        if self.api == "llama-server":
            return law_request(self.role, sequence, top, self.vocab_size)
        return teacher_forcing_request(self.role, self.model, sequence, keep, top, self.vocab_size)

    def _fetch(self, requests: list[Request], what: str) -> list:
        self.requests += len(requests)
        return self.fetcher.fetch(requests, what=what) if requests else []

    def _laws(self, prefixes: list[tuple], prompt_len: int) -> torch.Tensor:
        """The processed laws after ``prefixes``, whose first ``prompt_len`` tokens are the prompt."""
        self.laws_asked += len(prefixes)
        self._ensure(prefixes)
        if self.top is not None:
            self._resolve(prefixes, prompt_len)
        assert self.vocab_size is not None  # _ensure read it from the first law
        raw = np.full((len(prefixes), self.vocab_size), -math.inf)  # (B, V), filled in place: no row copies
        for i, prefix in enumerate(prefixes):
            law = self.raw[prefix]
            if isinstance(law, tuple):
                raw[i, law[0]] = law[1]
            else:
                raw[i] = law
        if self.banned.size:
            raw[:, self.banned] = -math.inf
        history = _history(prefixes, prompt_len) if self.sampling.config().needs_history else None
        return processed_laws(raw, self.sampling, history)

    def next_token_probs(self, prefix: torch.Tensor) -> torch.Tensor:
        """The processed law after each row of ``prefix`` (B, T): (B, V) float64 (the prefix is the prompt)."""
        rows = [tuple(int(t) for t in row) for row in torch.as_tensor(prefix).tolist()]
        return self._laws(rows, len(rows[0]) if rows else 0)

    def conditionals(self, sequences: torch.Tensor, *, start: int) -> torch.Tensor:
        """Teacher-forced processed laws of tokens ``start..S-1`` of ``sequences`` (B, S): (B, S - start, V)
        (``sequences[:, :start]`` is the prompt, for the penalties)."""
        seqs = [tuple(int(t) for t in row) for row in torch.as_tensor(sequences).tolist()]
        S = len(seqs[0]) if seqs else start
        prefixes = [row[:m] for row in seqs for m in range(start, S)]
        laws = self._laws(prefixes, start)  # (B * (S - start), V)
        return laws.reshape(len(seqs), S - start, -1)

    def memo(self) -> dict:
        """How much the prefix trie saved: distinct laws obtained, requests, laws asked for (and, with
        ``top_logprobs``, the entries per law and the laws asked again over the whole vocabulary)."""
        out = {
            "distinct_prefix_laws": len(self.raw),
            "teacher_forcing_requests": self.requests,
            "laws_asked": self.laws_asked,
            "laws_per_request": round(len(self.raw) / self.requests, 3) if self.requests else None,
        }
        if self.top is not None:
            out.update(top_logprobs=self.top, whole_vocabulary_fallbacks=self.dense_fallbacks)
        return out


#: Why a repetition penalty cannot be audited against teacher-forced log-probabilities.
REPETITION_NEEDS_LOGITS = (
    "a repetition penalty divides positive logits and multiplies negative ones, so the law needs the raw "
    "logits, which log-probabilities do not carry (a logprob is the logit minus an unknown constant per "
    "row); audit it with two_sample=True (--two-sample) against the same server without speculation"
)


def check_exact_options(sampling: Sampling) -> None:
    """Refuse options whose law teacher-forced log-probabilities cannot give (InvalidArgument)."""
    if sampling.repetition_penalty != 1.0:
        raise InvalidArgument(f"repetition_penalty={sampling.repetition_penalty:g} in exact-conditional mode: "
                              + REPETITION_NEEDS_LOGITS)  # fmt: skip


def check_top_logprobs(top_logprobs, sampling: Sampling, vocab_size: int | None) -> int:
    """``top_logprobs`` validated against the sampling parameters it must fix the law of."""
    top = check_int("top_logprobs", top_logprobs, minimum=2)
    if vocab_size is None:
        raise InvalidArgument("top_logprobs needs vocab_size (the sparse rows are read against it)")
    k = 1 if sampling.temperature == 0 else sampling.top_k
    if k is None or k >= top:
        raise InvalidArgument(
            f"top_logprobs={top} fixes the law only under top-k with k < top_logprobs or greedy sampling "
            f"(got top_k={sampling.top_k}, temperature={sampling.temperature:g}): without a cut every token's "
            "value is needed, so ask for the whole vocabulary"
        )
    return top


def _history(prefixes: list[tuple], prompt_len: int) -> History:
    """One law after each prefix (each at least ``prompt_len`` long), padded into one (B, H) history."""
    width = max(len(p) for p in prefixes)
    tokens = torch.zeros(len(prefixes), width, dtype=torch.long)  # (B, H)
    for b, prefix in enumerate(prefixes):
        tokens[b, : len(prefix)] = torch.tensor(prefix, dtype=torch.long)
    ends = torch.tensor([[len(p)] for p in prefixes], dtype=torch.long)  # (B, 1)
    return History(tokens, prompt_len, ends)


def _has_extension(prefix: tuple, sorted_prefixes: list[tuple]) -> bool:
    """Whether a longer prefix in ``sorted_prefixes`` extends ``prefix`` (the next one in sorted order would)."""
    i = bisect.bisect_right(sorted_prefixes, prefix)
    return i < len(sorted_prefixes) and sorted_prefixes[i][: len(prefix)] == prefix
