"""``check_endpoint``: audit a running OpenAI-compatible server with the decoder battery, over HTTP.

Two modes:

* **exact-conditional** (default): continuations sampled from the endpoint under test; the
  target's law after every sampled prefix from teacher forcing -- the endpoint's own prompt
  logprobs, or a reference endpoint's (same weights, no speculation) -- memoised over the prefix
  trie; then the decoder battery (per position, per context node, directed tests, support,
  one error budget).
* **two-sample** (``two_sample=True``): the endpoint against a reference endpoint with the same
  sampling parameters (4 reference samples per sample), the battery's two-sample tests on the
  prefix trie.

Before anything is sent, the endpoints are checked (model served, token ids returned, logprobs
over the whole vocabulary, the same vocabulary on both); each problem is one
:class:`~specverify.endpoint.http.EndpointError`.  Every reply is kept in ``OUT/samples.jsonl``
(:mod:`specverify.endpoint.store`): an interrupted audit run again with the same options
continues where it stopped and gives the same statistics.
"""

from __future__ import annotations

import dataclasses
import json
import math
import tempfile
import time
from pathlib import Path

from specverify import stats
from specverify.core.errors import InvalidArgument
from specverify.core.repro import python_repro
from specverify.core.validation import check_int
from specverify.decoder.battery import TIER_PLANS, check_decoder
from specverify.decoder.conditionals import ExactPlan
from specverify.endpoint import llamaserver
from specverify.endpoint.api import (
    MAX_VOCAB,
    Sampling,
    prompt_logprob_rows,
    teacher_forcing_body,
    teacher_forcing_reply_bytes,
)
from specverify.endpoint.fidelity import LOGPROB_TOLERANCE, MAX_TOP_LOGPROBS, check_logprob_fidelity
from specverify.endpoint.http import EndpointError, HttpClient, Limits, key_variable, server_text
from specverify.endpoint.invariance import SCENARIO as INVARIANCE_SCENARIO
from specverify.endpoint.invariance import batch_invariance as batch_invariance_tests
from specverify.endpoint.pool import Fetcher
from specverify.endpoint.prompt_fidelity import check_prompt_logprob_fidelity, combined
from specverify.endpoint.store import SampleStore
from specverify.endpoint.subjects import (
    EndpointDecoder,
    EndpointTarget,
    check_api,
    check_exact_options,
    check_top_logprobs,
    law_request,
    sampling_request,
)
from specverify.mutants.decoder import VISIBILITY
from specverify_reference.grammar import Grammar

__all__ = ["check_endpoint", "EndpointPlan", "AuditInterrupted", "declared_fault", "plan_requests", "TOLERANCE_NOTE"]

#: What the report says about the float tolerance between the server's logprobs and its sampler.
TOLERANCE_NOTE = (
    "The target's law is the server's raw log-probabilities (float32 logits, as JSON) processed in float64 with "
    "the audit's temperature / top-k / top-p; the sampler's own probabilities differ from it by float32 rounding "
    "(about 1e-6 relative), far below what the binned tests can see at these sample sizes (a deviation of TV 1e-6 "
    "needs about 1e12 samples). A support failure is a token sampled where that law is exactly 0 (outside top-k / "
    "top-p): a real fault unless the token's probability ties the cut within float32 rounding; the report names it."
)


@dataclasses.dataclass(frozen=True)
class EndpointPlan:
    """What an audit will send at most: requests and tokens, per role."""

    prompts: int
    samples: int
    max_new_tokens: int
    sampling_requests: int
    reference_requests: int
    teacher_forcing_requests: int  # an upper bound: distinct prefixes are fewer
    tokens: int
    invariance_requests: int = 0

    @property
    def requests(self) -> int:
        """Every request the plan may send (an upper bound: teacher forcing asks each distinct prefix once)."""
        return (
            self.sampling_requests + self.reference_requests + self.teacher_forcing_requests + self.invariance_requests
        )

    def summary(self, stored: int = 0) -> str:
        parts = [f"{self.sampling_requests:,} sampling requests"]
        if self.reference_requests:
            parts.append(f"{self.reference_requests:,} reference sampling requests")
        if self.invariance_requests:
            parts.append(f"{self.invariance_requests:,} batch-invariance requests")
        if self.teacher_forcing_requests:
            parts.append(
                f"at most {self.teacher_forcing_requests:,} teacher-forcing requests (one per distinct prefix)"
            )
        line = (
            f"will send {', '.join(parts)}: {self.prompts} prompts x {self.samples:,} samples x "
            f"{self.max_new_tokens} new tokens, {self.tokens:,} sampled tokens"
        )
        if stored:
            line += (
                f"; {stored:,} replies already stored (resumed), at most {max(self.requests - stored, 0):,} "
                "requests still to send"
            )
        return line


class AuditInterrupted(KeyboardInterrupt):
    """An endpoint audit stopped by the user (Ctrl-C): what was stored, of how much, and where."""

    def __init__(self, stored: int, planned: int, store: str | None):
        super().__init__(f"{stored} of at most {planned} requests stored")
        self.stored, self.planned, self.store = stored, planned, store

    def line(self) -> str:
        """The one line the command prints."""
        if self.store is None:
            return "interrupted: nothing was kept (no --out: the replies were in a temporary store)"
        return (
            f"interrupted: {self.stored:,} of at most {self.planned:,} requests stored in "
            f"{Path(self.store).parent}; the same command resumes"
        )


def plan_requests(*, tier: str, mode: str, num_prompts: int, num_samples: int | None, max_new_tokens: int | None,
                  samples_per_request: int, batch_invariance: int = 0, per_prefix: bool = False) -> EndpointPlan:  # fmt: skip
    """Requests and tokens an audit of ``tier`` sends at most (the store's replies are not sent again).
    ``per_prefix``: one teacher-forcing request per prefix (llama-server), not per longest prefix."""
    plan = TIER_PLANS[tier]
    N = num_samples or plan.num_samples
    L = max_new_tokens or plan.max_new_tokens
    per = math.ceil(N / samples_per_request) + 2 * math.ceil(plan.determinism_samples / samples_per_request)
    reference = 0
    teacher = 0
    if mode == "two_sample":
        reference = num_prompts * math.ceil(plan.reference_factor * N / samples_per_request)
    else:
        teacher = num_prompts * N * (L if per_prefix else 1) + 1
    tokens = num_prompts * (N + 2 * plan.determinism_samples) * L
    if mode == "two_sample":
        tokens += num_prompts * plan.reference_factor * N * L
    # batch invariance: M alone, M in a crowd, the M alone seeds again, 2 M distractors of 4 samples
    invariance = 5 * batch_invariance
    tokens += (3 * batch_invariance + 8 * batch_invariance) * L
    return EndpointPlan(num_prompts, N, L, num_prompts * per, reference, teacher, tokens, invariance)


def _served_models(client: HttpClient) -> dict[str, dict] | None:
    """The served models' entries by name (None when the server has no model listing)."""
    try:
        reply = client.get("models", retries=min(client.limits.retries, 2))  # first contact: fail fast
    except EndpointError as error:
        if error.status == 404:
            return None  # no model listing: the completion probe will say
        raise
    data = reply.get("data") if isinstance(reply, dict) else None
    if not isinstance(data, list):
        return None
    return {m["id"]: m for m in data if isinstance(m, dict) and isinstance(m.get("id"), str)}


def _check_model(client: HttpClient, model: str) -> dict:
    """The served model's entry in the listing ({} when there is none); EndpointError when it is not served."""
    served = _served_models(client)
    if served is not None and model not in served:
        names = list(served)
        shown = ", ".join(server_text(name, limit=80, secrets=client.secrets()) for name in names[:20])
        more = f" and {len(names) - 20:,} more" if len(names) > 20 else ""
        raise EndpointError(f"{client.base_url} does not serve model {model!r}; it serves: {shown or '(none)'}{more}")
    return served.get(model, {}) if served is not None else {}


def declared_fault(entry: dict, sampling: Sampling) -> dict | None:
    """A planted fault the served model declares (the local server's ``--mutant``), and whether ``sampling`` reaches it.

    None when the model declares none, or one this catalogue does not know.
    """
    declared = entry.get("specverify") if isinstance(entry, dict) else None
    name = declared.get("mutant") if isinstance(declared, dict) else None
    if not isinstance(name, str) or name not in VISIBILITY:
        return None
    seen = VISIBILITY[name]
    reachable = bool(seen.visible(sampling.config()))
    note = (
        f"the server declares a planted fault (mutant {name}) that shows with {seen.when}"
        + (
            "; this audit's options reach it"
            if reachable
            else "; this audit's options cannot reach it, so its verdict says nothing of that fault"
        )
        + (f" (audit with {' '.join(seen.audit_with)})" if not reachable and seen.audit_with else "")
    )
    return {"mutant": name, "shows_with": seen.when, "audit_with": list(seen.audit_with), "reachable": reachable,
            "note": note}  # fmt: skip


def _probe_sampling(served: _Served, sampling: Sampling, prompt: list[int]) -> tuple[int, ...]:
    """One short sampling request: the server takes token-id prompts and returns token ids; the tokens the
    server bans on its own (llama-server's ``ignore_eos``: :func:`~specverify.endpoint.llamaserver.banned_tokens`)."""
    client, model = served.client, served.model
    request = sampling_request("probe", model, sampling, prompt, n=1, max_tokens=2, seed=0, api=served.api)
    try:
        reply = client.post(request.path, request.body, max_bytes=request.max_bytes)
    except EndpointError as error:
        if error.status == 400 and "prompt" in error.body.lower():
            raise EndpointError(f"{client.base_url} does not take token-id prompts: {error.body}") from None
        raise
    request.parse(reply)
    return llamaserver.banned_tokens(reply, sampling) if served.api == "llama-server" else ()


def _probe_vocab(served: _Served) -> int:
    """The vocabulary size, from one whole-vocabulary law."""
    client, model = served.client, served.model
    if served.api == "llama-server":
        request = law_request("probe", [0], None, None)  # n_probs = MAX_VOCAB: the server lists all V
        return len(request.parse(client.post(request.path, request.body, max_bytes=request.max_bytes))[0])
    sequence = [0, 0]
    try:
        reply = client.post(
            "completions", teacher_forcing_body(model, sequence), max_bytes=teacher_forcing_reply_bytes(2, None)
        )
    except EndpointError as error:
        if error.status == 400 and "logprob" in error.body.lower():
            raise EndpointError(
                f"{client.base_url} caps logprobs below the vocabulary ({error.body}): start the server with "
                "--max-logprobs -1 (vLLM) so that prompt_logprobs=-1 returns the whole vocabulary"
            ) from None
        raise
    return int(prompt_logprob_rows(reply, sequence, None).shape[1])


def _load_prompts(prompts) -> list | None:
    if prompts is None or not isinstance(prompts, (str, Path)):
        return prompts
    path = Path(prompts)
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise InvalidArgument(f"prompts file {str(path)!r} does not exist") from None
    except ValueError as error:
        raise InvalidArgument(f"prompts file {str(path)!r} is not JSON: {error}") from None
    if not isinstance(data, list) or not data or not all(isinstance(p, list) and p for p in data):
        raise InvalidArgument(f"prompts file {str(path)!r} must hold a JSON list of token-id lists, e.g. [[1, 2, 3]]")
    return data


@dataclasses.dataclass(frozen=True)
class _Served:
    """A served model: its client, name and completion API (:data:`~specverify.endpoint.subjects.APIS`)."""

    client: HttpClient
    model: str
    api: str = "openai"

    @property
    def label(self) -> str:
        return f"{self.model} at {self.client.base_url}"


def _preflight(
    under_test: _Served,
    ref: _Served | None,
    mode: str,
    sampling: Sampling,
    prompt: list[int],
    vocab_size: int | None = None,
) -> tuple[int | None, dict | None, tuple[int, ...]]:
    """Check the endpoints before anything is collected; the vocabulary size (exact mode), a declared fault,
    and the tokens the server under test bans on its own.

    A ``vocab_size`` given by the user is taken as it is (no whole-vocabulary probe is sent).
    """
    entry = _check_model(under_test.client, under_test.model)
    if ref is not None:
        _check_model(ref.client, ref.model)
    declared = declared_fault(entry, sampling)
    banned = _probe_sampling(under_test, sampling, prompt)
    if mode == "two_sample":
        assert ref is not None
        _probe_sampling(ref, sampling, prompt)
        return None, declared, banned
    if vocab_size is not None:
        return vocab_size, declared, _within(banned, vocab_size, under_test)
    target_side = ref or under_test
    vocab = _probe_vocab(target_side)
    if ref is not None:
        try:
            own = _probe_vocab(under_test)
        except EndpointError:
            own = None  # the endpoint under test need not serve logprobs
        if own is not None and own != vocab:
            raise EndpointError(
                f"vocabulary size mismatch: {under_test.client.base_url} has {own} tokens, "
                f"{ref.client.base_url} has {vocab}"
            )
    return vocab, declared, _within(banned, vocab, under_test)


def _within(banned: tuple[int, ...], vocab: int, served: _Served) -> tuple[int, ...]:
    """``banned``, each id inside the vocabulary (EndpointError otherwise)."""
    if banned and max(banned) >= vocab:
        raise EndpointError(f"{served.client.base_url} bans token {max(banned)}, outside its vocabulary of {vocab}")
    return banned


def _describe(under_test: _Served, ref: _Served | None, mode: str, sampling: Sampling) -> dict:
    return {
        "url": under_test.client.base_url,
        "model": under_test.model,
        "reference_url": ref.client.base_url if ref else None,
        "reference_model": ref.model if ref else None,
        "mode": mode,
        "sampling": sampling.record(),
        **({} if under_test.api == "openai" else {"api": under_test.api}),
    }


def _with_batch_invariance(report, fetcher, model, sampling, samples, *, tier, seed, alpha, vocab, api="openai"):
    """The report with the batch-invariance tests added to its results and graded with them."""
    prompts = [list(s["prompt"]) for s in report.scenarios]
    plan = TIER_PLANS[tier]
    exact_plan = ExactPlan(max_nodes=plan.max_nodes, min_node_visits=plan.min_node_visits, alpha=alpha)
    L = int(report.scenarios[0]["max_new_tokens"])
    results, summary = batch_invariance_tests(fetcher, model, sampling, prompts[0], prompts[1:], samples=samples,
                                              max_new_tokens=L, seed=seed, vocab_size=vocab, plan=exact_plan, api=api)  # fmt: skip
    ungraded = [r.replace(grade=None, adjusted_pvalue=None) for r in report.results] + results
    graded, verdict = stats.grade_run(ungraded, report.errors, alpha=alpha)
    scenario = {
        "name": INVARIANCE_SCENARIO,
        "mode": "two_sample",
        "n": samples,
        "max_new_tokens": L,
        "prompt": prompts[0],
        "description": f"{samples} continuations sent one at a time vs {samples} among concurrent requests",
    }
    return dataclasses.replace(
        report, results=graded, verdict=verdict, scenarios=(*report.scenarios, scenario)
    ), summary


def _run_battery(fetcher, under_test, target_side, mode, sampling, vocab, prompt_lists, *, tier, seed, alpha,
                 num_samples, max_new_tokens, samples_per_request, check_determinism, batch_invariance, greedy,
                 top_logprobs=None, logprobs=None, logprob_tolerance=LOGPROB_TOLERANCE, banned=()):  # fmt: skip
    """The decoder battery on the endpoint's subjects (and the batch-invariance tests): report, target, summary,
    and the logprob fidelity (None when no logprobs were asked)."""
    decoder = EndpointDecoder(fetcher, under_test.model, sampling, samples_per_request=samples_per_request,
                              vocab_size=vocab, label=under_test.label, repeat_from_store=not check_determinism,
                              logprobs=logprobs, api=under_test.api)  # fmt: skip
    target = None
    if mode == "exact":
        target = EndpointTarget(fetcher, target_side.model, sampling, vocab_size=vocab, top_logprobs=top_logprobs,
                                api=target_side.api, banned=banned)  # fmt: skip
    reference = None
    if mode == "two_sample":
        reference = EndpointDecoder(fetcher, target_side.model, sampling, role="reference", api=target_side.api,
                                    samples_per_request=samples_per_request, label=target_side.label)  # fmt: skip
    report = check_decoder(
        decoder,
        target,
        reference=reference,
        tier=tier,
        seed=seed,
        alpha=alpha,
        prompts=prompt_lists,
        greedy=True if greedy and target is not None else None,
        num_samples=num_samples,
        max_new_tokens=max_new_tokens,
    )
    invariance = None
    if batch_invariance and report.verdict != "error" and fetcher.failure is None:
        report, invariance = _with_batch_invariance(
            report, fetcher, under_test.model, sampling, batch_invariance, tier=tier, seed=seed, alpha=alpha,
            vocab=vocab, api=under_test.api,
        )  # fmt: skip
    fidelity = None
    if logprobs is not None and target is not None and report.verdict != "error":
        sampled = check_logprob_fidelity(decoder.reported, target.raw.get, top=logprobs, tolerance=logprob_tolerance)
        prompt = None
        # a reference endpoint gives the laws; llama-server has no prompt logprobs to compare
        if target_side is not under_test and fetcher.failure is None and under_test.api == "openai":
            prompt = check_prompt_logprob_fidelity(fetcher, under_test.model, decoder.reported, target.raw.get,
                                                   top=logprobs, vocab_size=target.vocab_size, tolerance=logprob_tolerance)  # fmt: skip
        fidelity = combined(sampled, prompt)
    return report, target, invariance, fidelity


def check_endpoint(
    url: str,
    model: str,
    *,
    reference_url: str | None = None,
    reference_model: str | None = None,
    two_sample: bool = False,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    min_p: float | None = None,
    repetition_penalty: float = 1.0,
    frequency_penalty: float = 0.0,
    presence_penalty: float = 0.0,
    logit_bias=(),
    engine: str | None = None,
    grammar=None,
    api: str = "openai",
    prompts=None,
    tier: str = "smoke",
    seed: int = 0,
    alpha: float = 1e-3,
    num_samples: int | None = None,
    max_new_tokens: int | None = None,
    out_dir=None,
    concurrency: int = 8,
    samples_per_request: int = 1,
    key_env: str | None = None,
    timeout: float = 600.0,
    read_timeout: float = 120.0,
    retries: int = 6,
    verify_tls: bool = True,
    send_key_over_http: bool = False,
    batch_invariance: int = 0,
    check_determinism: bool = True,
    top_logprobs: int | None = None,
    vocab_size: int | None = None,
    logprobs: int | None = None,
    logprob_tolerance: float = LOGPROB_TOLERANCE,
    progress=None,
    announce=None,
):
    """Audit a running OpenAI-compatible completions server (see the module docstring).

    Parameters
    ----------
    url, model : str
        The endpoint under test (``http(s)://host:port[/v1]``) and its served model name.
    reference_url, reference_model : str, optional
        A reference endpoint (same weights, speculation off): the target's laws come from it
        (exact-conditional mode) or its samples are compared (``two_sample=True``).  The model
        name defaults to ``model``.
    two_sample : bool
        Two-sample mode (needs ``reference_url``).
    temperature, top_k, top_p, min_p, repetition_penalty, frequency_penalty, presence_penalty, logit_bias :
        sampling parameters sent with every sampling request (the penalties at 1, 0 and 0 and an empty
        ``logit_bias``, a mapping of token ids to biases, are off)
    engine : str, optional
        Whose documented law the server follows (``"vllm"``, ``"llama.cpp"``; ``"hf"``): the order of
        the cuts and what the penalties count (:mod:`specverify_reference.penalties`); the laws
        after each prefix are processed with it, the prompt's tokens and the output's told apart.
        None (default): ``"vllm"``, or ``"llama.cpp"`` with ``api="llama-server"``.
    grammar : Grammar or its record ``{"kind", "source"}``, optional
        A structured-output constraint (:class:`specverify_reference.grammar.Grammar`), sent as vLLM's
        ``structured_outputs``; exact mode masks each teacher-forced law with it, over the local
        server's :func:`~specverify_reference.grammar.synthetic_vocabulary` or, when it names one
        (``tokenizer``), the served model's tokenizer.
    api : {"openai", "llama-server"}
        The completion API of both endpoints: OpenAI's ``/v1/completions`` with vLLM's
        ``prompt_logprobs`` (default), or llama.cpp's ``llama-server`` native ``/completion``
        (:mod:`specverify.endpoint.llamaserver`: one continuation and one prefix law per request;
        a grammar only in two-sample mode, where llama.cpp's grammar law is not needed; no prompt
        logprob fidelity).
    prompts : list of token-id lists, or a path to a JSON file holding one, optional
        Default: prompts derived from ``seed`` and the vocabulary.
    tier, seed, alpha, num_samples, max_new_tokens : as :func:`specverify.check_decoder`.
    out_dir : path, optional
        Where the sample store lives (``samples.jsonl``); default: a store is not kept on disk
        but in a temporary directory.
    concurrency : int
        Requests in flight at most.
    samples_per_request : int
        Continuations per sampling request (``n``).
    key_env : str or None
        Environment variable holding the API key (never recorded).  None: ``SPECVERIFY_API_KEY``,
        which may be unset (no key is sent); a named variable must be set and not empty.
    timeout : float
        Seconds one request may take, connecting to the last byte of its reply.
    read_timeout : float
        Seconds the server may stay silent, before the first byte of a reply and between bytes.
    retries, verify_tls, send_key_over_http : the HTTP client's (see :class:`~specverify.endpoint.http.HttpClient`);
        a transient failure (HTTP 408, 429, 5xx, a timeout, a dropped connection) is retried
        ``retries`` times.
    batch_invariance : int
        When > 0: this many continuations of the first prompt sent alone and as many in a crowd of
        concurrent requests, compared with two-sample tests under the run's error budget
        (:mod:`specverify.endpoint.invariance`); 0 (default): not checked.
    check_determinism : bool
        True (default): the battery sends one call twice with the same seed and different tokens
        are an implementation error (verdict ERROR, the law untested).  False: the repeat is
        answered from the store, so the law is tested on a server whose seeded outputs are not
        reproducible; the report says determinism was not checked.
    top_logprobs : int, optional
        Exact-conditional mode: teacher forcing asks for the ``top_logprobs`` most likely tokens of
        every position (``prompt_logprobs = top_logprobs``) instead of the whole vocabulary, so
        replies, the store and memory grow with it, not with V.  It fixes the law only under
        ``top_k`` < ``top_logprobs`` (or temperature 0); a law whose cut ties the least listed
        value is asked again over the whole vocabulary (``extra.endpoint.memo``).  None (default):
        the whole vocabulary.
    vocab_size : int, optional
        The served vocabulary (the model's head width), taken as given: no whole-vocabulary law is
        asked to learn it, so with ``top_logprobs`` a server capped at ``top_logprobs`` logprobs
        (vLLM's default ``--max-logprobs 20``) can be audited.  None (default): probed.
    progress : callable, optional
        ``progress(state)`` with a :class:`~specverify.endpoint.pool.FetchProgress` as replies
        arrive: the batch, and the run's requests of the plan's upper bound, tokens, time, ETA.
    announce : callable, optional
        Called with one line: the plan (requests, tokens; on a resumed audit, the replies already
        stored and how many requests remain at most) before anything is sent.

    Returns
    -------
    Report
        The decoder battery's report, with ``extra["endpoint"]``: the endpoints, the sampling
        parameters, the plan, what was sent and taken from the store, the prefix-trie
        memoisation, the client's time, and the tolerance statement.

    Raises
    ------
    InvalidArgument
        Bad arguments.
    EndpointError
        An endpoint cannot be audited (unreachable, model not served, no token ids, capped
        logprobs, vocabularies that differ, a reply that is not JSON), or failed for good in the
        middle of the run (what was stored stays stored: the same call resumes).
    AuditInterrupted
        Ctrl-C (a ``KeyboardInterrupt``): the requests in flight were abandoned; it says how
        many replies are stored, of how many at most, and where.
    """
    started = time.perf_counter()
    api = check_api(api)
    if engine is None:
        engine = "llama.cpp" if api == "llama-server" else "vllm"
    sampling = Sampling(
        temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p, repetition_penalty=repetition_penalty,
        frequency_penalty=frequency_penalty, presence_penalty=presence_penalty, logit_bias=logit_bias, engine=engine,
        grammar=Grammar.of(grammar),
    )  # fmt: skip
    concurrency = check_int("concurrency", concurrency, minimum=1)
    samples_per_request = check_int("samples_per_request", samples_per_request, minimum=1)
    if tier not in TIER_PLANS:
        raise InvalidArgument(f"tier must be one of {sorted(TIER_PLANS)}, got {tier!r}")
    if two_sample and not reference_url:
        raise InvalidArgument("two_sample=True needs reference_url (the same model served without speculation)")
    if not two_sample:
        check_exact_options(sampling)
    if api == "llama-server":
        llamaserver.sampling_fields(sampling)  # llama.cpp's law, a grammar it takes (InvalidArgument)
        if samples_per_request != 1:
            raise InvalidArgument(f"llama-server's native API returns one continuation per request: "
                                  f"samples_per_request must be 1, got {samples_per_request}")  # fmt: skip
        if sampling.grammar is not None and not two_sample:
            raise InvalidArgument("a grammar on llama-server is audited in two-sample mode (--two-sample): its law "
                                  "(sample, check the grammar, resample from the masked chain) is not the "
                                  "mask-first law exact mode applies")  # fmt: skip
    if logprobs is not None:
        logprobs = check_int("logprobs", logprobs, minimum=0, maximum=MAX_TOP_LOGPROBS)
        if two_sample:
            raise InvalidArgument("logprobs are checked against teacher-forced laws: exact-conditional mode only")
    if not (isinstance(logprob_tolerance, (int, float)) and 0 < logprob_tolerance < 1):
        raise InvalidArgument(f"logprob_tolerance must be a number in (0, 1), got {logprob_tolerance!r}")
    if top_logprobs is not None:
        if two_sample:
            raise InvalidArgument("top_logprobs is for exact-conditional mode; two_sample=True asks for no logprobs")
        check_top_logprobs(top_logprobs, sampling, MAX_VOCAB)
    if vocab_size is not None:
        vocab_size = check_int("vocab_size", vocab_size, minimum=2, maximum=MAX_VOCAB)
    key_env = key_variable(key_env)
    mode = "two_sample" if two_sample else "exact"
    prompt_lists = _load_prompts(prompts)
    limits = Limits(read_timeout=min(read_timeout, timeout), request_timeout=timeout, retries=retries)

    def client(base_url: str) -> HttpClient:
        return HttpClient(base_url, key_env=key_env, limits=limits, verify_tls=verify_tls,
                          send_key_over_http=send_key_over_http)  # fmt: skip

    under_test = _Served(client(url), model, api)
    ref = _Served(client(reference_url), reference_model or model, api) if reference_url else None
    n_prompts = len(prompt_lists) if prompt_lists else TIER_PLANS[tier].num_prompts
    plan = plan_requests(tier=tier, mode=mode, num_prompts=n_prompts, num_samples=num_samples,
                         max_new_tokens=max_new_tokens, samples_per_request=samples_per_request,
                         batch_invariance=batch_invariance, per_prefix=api == "llama-server")  # fmt: skip
    header = {
        **_describe(under_test, ref, mode, sampling),
        "tier": tier,
        "seed": seed,
        "num_samples": num_samples,
        "max_new_tokens": max_new_tokens,
        "prompts": prompt_lists,
        "samples_per_request": samples_per_request,
        **({} if check_determinism else {"check_determinism": False}),
        **({} if top_logprobs is None else {"top_logprobs": top_logprobs}),
        **({} if vocab_size is None else {"vocab_size": vocab_size}),
        **({} if logprobs is None else {"logprobs": logprobs}),
    }
    scratch = tempfile.TemporaryDirectory() if out_dir is None else None
    try:
        # the store first: its lock refuses a second audit of the same --out before anything is sent
        with SampleStore(out_dir if out_dir is not None else scratch.name, header) as store:  # type: ignore[union-attr]
            target_side = ref or under_test
            clients = {"decoder": under_test.client, "reference": target_side.client, "target": target_side.client}
            fetcher = Fetcher(clients, store, concurrency=concurrency, progress=progress, planned=plan.requests)
            try:
                vocab, declared, banned = _preflight(under_test, ref, mode, sampling,
                                                     prompt_lists[0] if prompt_lists else [0], vocab_size)  # fmt: skip
                if announce is not None:
                    if declared is not None and not declared["reachable"]:
                        announce("warning: " + declared["note"])
                    announce(plan.summary(stored=store.loaded))
                report, target, invariance, fidelity = _run_battery(
                    fetcher, under_test, target_side, mode, sampling, vocab, prompt_lists,
                    tier=tier, seed=seed, alpha=alpha, num_samples=num_samples, max_new_tokens=max_new_tokens,
                    samples_per_request=samples_per_request, check_determinism=check_determinism,
                    batch_invariance=batch_invariance, greedy=temperature == 0, top_logprobs=top_logprobs,
                    logprobs=logprobs, logprob_tolerance=logprob_tolerance, banned=banned,
                )  # fmt: skip
            except KeyboardInterrupt:
                fetcher.abort()
                kept = str(store.path) if out_dir is not None else None
                raise AuditInterrupted(len(store.replies), plan.requests, kept) from None
            except BaseException:
                fetcher.abort()
                raise
            if fetcher.failure is not None:  # the server failed for good: no verdict on what was collected
                raise fetcher.failure
    finally:
        if scratch is not None:
            scratch.cleanup()
    total = time.perf_counter() - started
    ledger = fetcher.ledger.as_dict()
    endpoint = {
        **_describe(under_test, ref, mode, sampling),
        "plan": dataclasses.asdict(plan),
        **ledger,
        "requests_in_store_at_start": store.loaded,
        "client_overhead_fraction": round(ledger["client_overhead_seconds"] / total, 4) if total > 0 else None,
        "memo": target.memo() if target is not None else None,
        "declared_fault": declared,
        **({"banned_by_server": list(banned)} if banned else {}),
        "batch_invariance": invariance,
        "determinism": "checked" if check_determinism else "not checked: repeated seeded calls answered from the store",
        "tolerance": TOLERANCE_NOTE if mode == "exact" else None,
        "store": str(store.path) if out_dir is not None else None,
    }
    command = python_repro(
        "specverify.endpoint:check_endpoint",
        {"url": url, "model": model},
        dict(reference_url=reference_url, reference_model=reference_model, two_sample=two_sample or None,
             temperature=temperature, top_k=top_k, top_p=top_p, prompts=prompts, tier=tier, seed=seed, alpha=alpha,
             num_samples=num_samples, max_new_tokens=max_new_tokens, samples_per_request=samples_per_request,
             batch_invariance=batch_invariance or None, check_determinism=None if check_determinism else False,
             top_logprobs=top_logprobs, vocab_size=vocab_size, logprobs=logprobs,
             logprob_tolerance=None if logprob_tolerance == LOGPROB_TOLERANCE else logprob_tolerance,
             min_p=min_p, repetition_penalty=None if repetition_penalty == 1.0 else repetition_penalty,
             frequency_penalty=frequency_penalty or None, presence_penalty=presence_penalty or None,
             logit_bias=dict(sampling.logit_bias) or None,
             engine=None if engine == ("llama.cpp" if api == "llama-server" else "vllm") else engine,
             grammar=None if sampling.grammar is None else sampling.grammar.record(),
             api=None if api == "openai" else api),
    )  # fmt: skip
    extra = {**report.extra, "endpoint": endpoint}
    if fidelity is not None:
        extra["logprob_fidelity"] = fidelity
    return dataclasses.replace(report, implementation=under_test.label, command=command, extra=extra)
