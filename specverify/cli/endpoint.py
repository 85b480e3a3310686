"""``specverify audit --endpoint URL --model NAME``: the audit of a running OpenAI-compatible server.

The arguments (an "endpoint audit" group of ``audit``), their checks, the run through
:func:`specverify.endpoint.check_endpoint`, and the canonical command a report records (the
API key is never part of it: only the name of the variable that holds it).
"""

from __future__ import annotations

import dataclasses
import shlex
import sys

from specverify.cli.argtypes import nonnegative_float, nonnegative_int, positive_float, positive_int, probability
from specverify.core.errors import InvalidArgument

__all__ = ["add_arguments", "run_endpoint_audit", "endpoint_command", "CONFLICTS"]

#: Flags of the in-process audits that an endpoint audit does not take.
CONFLICTS = ("verifier", "tree_verifier", "decoder", "drafter", "target", "reference", "workers", "backend",
             "shards", "ray_address", "device", "dtype", "scenario", "mode")  # fmt: skip


#: The engines whose documented law an endpoint audit can apply (``specverify_reference.processors.ENGINES``,
#: named here so that parsing arguments does not import torch).
LAWS = ("vllm", "llama.cpp", "hf")
#: The completion APIs an endpoint audit speaks (``specverify.endpoint.subjects.APIS``, named here for the same reason).
APIS = ("openai", "llama-server")


def add_arguments(audit) -> None:
    """The endpoint group of ``specverify audit``."""
    group = audit.add_argument_group("endpoint audit (a running OpenAI-compatible server, over HTTP)")
    group.add_argument("--endpoint", metavar="URL", help="the server under test, http(s)://host:port[/v1]")
    group.add_argument("--model", metavar="NAME", help="the served model's name (as in /v1/models)")
    group.add_argument(
        "--reference-endpoint",
        metavar="URL",
        help="the same weights served without speculation: the target's laws come from it (or its samples, --two-sample)",
    )
    group.add_argument("--reference-model", metavar="NAME", help="the reference's model name (default --model)")
    group.add_argument(
        "--two-sample", action="store_true", help="compare samples with --reference-endpoint instead of exact laws"
    )
    group.add_argument("--temperature", type=nonnegative_float, default=1.0)
    group.add_argument("--top-k", type=positive_int, metavar="K", help="top-k of every request (default: off)")
    group.add_argument("--top-p", type=probability, metavar="P", help="top-p of every request (default: off)")
    group.add_argument("--min-p", type=probability, metavar="P", help="min-p of every request (default: off)")
    group.add_argument("--repetition-penalty", type=positive_float, default=1.0, metavar="R",
                       help="repetition penalty of every request (default 1: off)")  # fmt: skip
    group.add_argument("--frequency-penalty", type=float, default=0.0, metavar="F",
                       help="frequency penalty of every request (default 0: off)")  # fmt: skip
    group.add_argument("--presence-penalty", type=float, default=0.0, metavar="P",
                       help="presence penalty of every request (default 0: off)")  # fmt: skip
    group.add_argument("--logit-bias", action="append", metavar="ID=BIAS", default=[],
                       help="a logit bias of every request (repeatable; sent as OpenAI's logit_bias)")  # fmt: skip
    group.add_argument("--logprobs", type=nonnegative_int, metavar="L",
                       help="ask each emitted token's logprob and its L most likely tokens', and check them against "
                       "the teacher-forced raw laws (logprob fidelity, on its own line; exact-conditional mode)")  # fmt: skip
    group.add_argument("--logprob-tolerance", type=positive_float, default=None, metavar="TOL",
                       help="absolute tolerance of the logprob fidelity check (default 1e-3)")  # fmt: skip
    group.add_argument("--gate-logprobs", action="store_true",
                       help="exit 1 when logprob fidelity fails, even if the law passes (needs --logprobs)")  # fmt: skip
    group.add_argument("--json-schema", metavar="SCHEMA", dest="json_schema",
                       help="structured output: a JSON schema (its JSON text) every request's output must follow, "
                       "sent as vLLM's structured_outputs; the laws apply its mask per prefix (xgrammar)")  # fmt: skip
    group.add_argument("--regex", metavar="PATTERN", help="structured output: a regular expression (as --json-schema)")
    group.add_argument("--ebnf", metavar="GRAMMAR", help="structured output: an EBNF grammar, root rule 'root' "
                       "(as --json-schema)")  # fmt: skip
    group.add_argument("--grammar-tokenizer", metavar="DIR", dest="grammar_tokenizer",
                       help="the served model's tokenizer (a Hugging Face tokenizer directory): the grammar's masks "
                       "over its token strings, read as vLLM reads them (default: the tiny models' synthetic "
                       "vocabulary)")  # fmt: skip
    group.add_argument("--law-of", choices=LAWS, default=None, dest="law_of",
                       help="whose documented sampling law the server follows: the cuts' order and what the "
                       "penalties count (default vllm; llama.cpp with --api llama-server)")  # fmt: skip
    group.add_argument("--api", choices=APIS, default="openai",
                       help="the servers' completion API: openai (/v1/completions, vLLM's prompt_logprobs; "
                       "default) or llama-server (llama.cpp's native /completion)")  # fmt: skip
    group.add_argument("--prompts", metavar="FILE", help="JSON list of token-id lists (default: derived from --seed)")
    group.add_argument("--concurrency", type=positive_int, default=8, help="requests in flight (default 8)")
    group.add_argument(
        "--samples-per-request", type=positive_int, default=1, metavar="N", help="continuations per request (n)"
    )
    group.add_argument(
        "--api-key-env",
        metavar="VAR",
        help="environment variable holding the API key, which must be set (never recorded; default: "
        "SPECVERIFY_API_KEY if set, else no key)",
    )
    group.add_argument(
        "--send-key-over-http",
        action="store_true",
        help="allow the key over plain http to a host that is not this machine (refused by default)",
    )
    group.add_argument(
        "--request-timeout",
        type=positive_float,
        default=600.0,
        metavar="S",
        help="seconds one request may take, connect to last byte (default 600)",
    )
    group.add_argument(
        "--read-timeout",
        type=positive_float,
        default=120.0,
        metavar="S",
        help="seconds the server may stay silent before a reply and between its bytes (default 120)",
    )
    group.add_argument(
        "--retries", type=nonnegative_int, default=6, help="retries of a transient failure (429, 5xx, timeout)"
    )
    group.add_argument(
        "--skip-determinism",
        action="store_true",
        help="do not resend a seeded call to check it reproduces: test the law of a server whose seeded outputs "
        "vary (the report says so)",
    )
    group.add_argument(
        "--top-logprobs",
        type=positive_int,
        metavar="M",
        help="teacher forcing asks for the M most likely tokens per position, not the whole vocabulary (exact mode, "
        "needs --top-k below M or --temperature 0; for vocabularies of 100k+ tokens: replies and store grow with M)",
    )
    group.add_argument(
        "--vocab-size",
        type=positive_int,
        metavar="V",
        help="the served vocabulary (head width), taken as given instead of probed with one whole-vocabulary law "
        "(with --top-logprobs, a server capped at M logprobs can then be audited)",
    )
    group.add_argument(
        "--batch-invariance",
        type=positive_int,
        metavar="M",
        help="also send M continuations of the first prompt alone and M among concurrent requests, and test that "
        "their laws agree (default: off)",
    )


def _check(args) -> None:
    if args.api_key_env is not None:  # a named variable must hold a key (checked before torch is imported)
        from specverify.endpoint.http import key_variable

        key_variable(args.api_key_env)
    if not args.model:
        raise InvalidArgument("--endpoint needs --model NAME (the served model's name)")
    given = [f"--{name.replace('_', '-')}" for name in CONFLICTS if getattr(args, name, None) not in (None, False, [])]
    if given:
        raise InvalidArgument(f"--endpoint audits a server; it does not take {', '.join(given)}")
    if args.two_sample and not args.reference_endpoint:
        raise InvalidArgument("--two-sample needs --reference-endpoint URL (the same model without speculation)")
    if args.greedy:
        raise InvalidArgument("--endpoint: ask for greedy decoding with --temperature 0")
    if args.gate_logprobs and args.logprobs is None:
        raise InvalidArgument("--gate-logprobs needs --logprobs L (the logprobs to check)")
    grammar(args)  # at most one, and it parses


def grammar(args):
    """The audit's grammar (a :class:`~specverify_reference.grammar.Grammar`) or None: the options
    ``--json-schema``, ``--regex`` and ``--ebnf`` are named after the grammar kinds."""
    from specverify_reference.grammar import GRAMMAR_KINDS, Grammar

    given = [kind for kind in GRAMMAR_KINDS if getattr(args, kind, None) is not None]
    if len(given) > 1:
        raise InvalidArgument(f"give at most one of {', '.join('--' + n.replace('_', '-') for n in given)}")
    tokenizer = getattr(args, "grammar_tokenizer", None)
    if tokenizer is not None and not given:
        raise InvalidArgument("--grammar-tokenizer needs a grammar (--json-schema, --regex or --ebnf)")
    return Grammar(given[0], getattr(args, given[0]), tokenizer) if given else None


def logit_bias(pairs: list[str]) -> dict[int, float]:
    """``--logit-bias ID=BIAS`` values as a mapping (InvalidArgument naming a bad one)."""
    out: dict[int, float] = {}
    for pair in pairs:
        token, sep, value = pair.partition("=")
        try:
            if not sep or not token.strip().isdigit():
                raise ValueError
            out[int(token)] = float(value)
        except ValueError:
            raise InvalidArgument(
                f"--logit-bias must look like ID=BIAS (a token id and a number), got {pair!r}"
            ) from None
    return out


def endpoint_argv(args) -> list[str]:
    """The canonical arguments of an endpoint audit (no output options, never the key itself)."""
    argv = ["--endpoint", args.endpoint, "--model", args.model]
    if args.reference_endpoint:
        argv += ["--reference-endpoint", args.reference_endpoint]
    if args.reference_model:
        argv += ["--reference-model", args.reference_model]
    if args.two_sample:
        argv.append("--two-sample")
    argv += ["--temperature", f"{args.temperature:g}"]
    if args.top_k is not None:
        argv += ["--top-k", str(args.top_k)]
    if args.top_p is not None:
        argv += ["--top-p", f"{args.top_p:g}"]
    if args.min_p is not None:
        argv += ["--min-p", f"{args.min_p:g}"]
    for flag, neutral in (("repetition_penalty", 1.0), ("frequency_penalty", 0.0), ("presence_penalty", 0.0)):
        if getattr(args, flag) != neutral:
            argv += ["--" + flag.replace("_", "-"), f"{getattr(args, flag):g}"]
    for token, bias in sorted(logit_bias(args.logit_bias).items()):
        argv += ["--logit-bias", f"{token}={bias:g}"]
    constraint = grammar(args)
    if constraint is not None:
        argv += ["--" + constraint.kind.replace("_", "-"), constraint.source]
        if constraint.tokenizer is not None:
            argv += ["--grammar-tokenizer", constraint.tokenizer]
    if args.api != "openai":
        argv += ["--api", args.api]
    if args.law_of is not None and args.law_of != ("llama.cpp" if args.api == "llama-server" else "vllm"):
        argv += ["--law-of", args.law_of]
    if args.logprobs is not None:
        argv += ["--logprobs", str(args.logprobs)]
    if args.logprob_tolerance is not None:
        argv += ["--logprob-tolerance", f"{args.logprob_tolerance:g}"]
    if args.gate_logprobs:
        argv.append("--gate-logprobs")
    if args.prompts:
        argv += ["--prompts", args.prompts]
    for flag in ("num_samples", "max_new_tokens"):
        if getattr(args, flag, None) is not None:
            argv += ["--" + flag.replace("_", "-"), str(getattr(args, flag))]
    if args.samples_per_request != 1:
        argv += ["--samples-per-request", str(args.samples_per_request)]
    if args.batch_invariance:
        argv += ["--batch-invariance", str(args.batch_invariance)]
    if args.skip_determinism:
        argv.append("--skip-determinism")
    if args.top_logprobs is not None:
        argv += ["--top-logprobs", str(args.top_logprobs)]
    if args.vocab_size is not None:
        argv += ["--vocab-size", str(args.vocab_size)]
    if args.api_key_env is not None:
        argv += ["--api-key-env", args.api_key_env]
    if args.send_key_over_http:
        argv.append("--send-key-over-http")
    argv += ["--tier", args.tier, "--seed", str(args.seed), "--alpha", f"{args.alpha:g}"]
    return argv


def endpoint_command(args) -> str:
    return "specverify audit " + " ".join(shlex.quote(a) for a in endpoint_argv(args))


def run_endpoint_audit(args, *, stream=None):
    """Run the endpoint audit of parsed ``audit`` arguments; the Report (its ``command`` the canonical line)."""
    _check(args)
    from specverify.endpoint.pool import TerminalProgress

    stream = stream if stream is not None else sys.stderr
    progress = TerminalProgress(stream)

    def announce(line: str) -> None:
        progress.close_line()
        print(line, file=stream, flush=True)

    try:
        report = _check_endpoint(args, progress, announce)
    finally:
        progress.close_line()  # an error or an interruption is printed on a line of its own
    return dataclasses.replace(report, command=endpoint_command(args))


def _check_endpoint(args, progress, announce):
    from specverify.endpoint.checks import check_endpoint

    return check_endpoint(
        args.endpoint,
        args.model,
        reference_url=args.reference_endpoint,
        reference_model=args.reference_model,
        two_sample=args.two_sample,
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        min_p=args.min_p,
        repetition_penalty=args.repetition_penalty,
        frequency_penalty=args.frequency_penalty,
        presence_penalty=args.presence_penalty,
        logit_bias=logit_bias(args.logit_bias),
        engine=args.law_of,
        grammar=grammar(args),
        api=args.api,
        logprobs=args.logprobs,
        **({} if args.logprob_tolerance is None else {"logprob_tolerance": args.logprob_tolerance}),
        prompts=args.prompts,
        tier=args.tier,
        seed=args.seed,
        alpha=args.alpha,
        num_samples=args.num_samples,
        max_new_tokens=args.max_new_tokens,
        out_dir=args.out,
        concurrency=args.concurrency,
        samples_per_request=args.samples_per_request,
        key_env=args.api_key_env,
        timeout=args.request_timeout,
        read_timeout=args.read_timeout,
        retries=args.retries,
        send_key_over_http=args.send_key_over_http,
        batch_invariance=args.batch_invariance or 0,
        check_determinism=not args.skip_determinism,
        top_logprobs=args.top_logprobs,
        vocab_size=args.vocab_size,
        progress=progress,
        announce=announce,
    )
