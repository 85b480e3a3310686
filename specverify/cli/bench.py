"""``specverify bench``: a speculative configuration against its baseline, the same requests, interleaved.

::

    specverify bench --endpoint URL --baseline-endpoint URL --model NAME [--baseline-model NAME]
                     [--api-key-env VAR] [--send-key-over-http] [--request-timeout S]
    specverify bench --decoder PKG.MOD:NAME [--decoder-option K=V ...]
                     --baseline-decoder PKG.MOD:NAME [--baseline-decoder-option K=V ...]
        [--prompts FILE | --random-prompts N --prompt-length T --vocab-size V]
        [--max-tokens 64] [--temperature T] [--top-k K] [--top-p P]
        [--concurrency 1 4 16] [--pairs 8] [--warmup-pairs 1] [--requests-per-client 2]
        [--audit-report DIR/report.json] [--accelerator NAME --bandwidth B/S --target-params N --draft-params N]
        [--seed 0] [--level 0.95] [--out DIR] [--json]

Rounds alternate between the two arms (:mod:`specverify.bench.runner`); every speedup is a ratio
with its paired-bootstrap interval (:mod:`specverify.bench.analysis`); acceptance is read from
the engine (vLLM's ``/metrics``, llama-server's reply timings, the in-process decoders'
counters) or marked unavailable.  ``--audit-report`` puts an audit's verdict and detectable TV
in the same headline (:mod:`specverify.bench.output`), and the cost model's prediction on the
named accelerator sits beside the measurement.  ``--prompts FILE``: a JSON list of prompts, each
a string or a list of token ids.  Exit status 0 (measured), 2 (bad usage or a server that failed).
"""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path

from specverify.cli.argtypes import nonnegative_float, nonnegative_int, positive_float, positive_int, probability
from specverify.core.errors import InvalidArgument
from specverify.core.loading import parse_options

__all__ = ["add_parser", "run", "load_prompts"]


def add_parser(subparsers):
    """Add the ``bench`` subcommand; returns its parser."""
    parser = subparsers.add_parser(
        "bench", help="speedup of a speculative configuration over its baseline, with intervals"
    )
    served = parser.add_argument_group("served endpoints")
    served.add_argument("--endpoint", metavar="URL", help="the speculative server (OpenAI-compatible /v1)")
    served.add_argument("--baseline-endpoint", metavar="URL", help="the same model served without speculation")
    served.add_argument("--model", help="the served model's name")
    served.add_argument("--baseline-model", help="the baseline's model name (default --model)")
    served.add_argument("--api-key-env", metavar="VAR", help="environment variable holding the API key (both servers)")
    served.add_argument("--send-key-over-http", action="store_true", help="allow the key over plain http off-host")
    served.add_argument("--request-timeout", type=positive_float, default=600.0, metavar="S",
                        help="seconds one streamed reply may take (default 600)")  # fmt: skip
    local = parser.add_argument_group("in-process decoders")
    local.add_argument("--decoder", metavar="PKG.MOD:NAME", help="the speculative decoder or its factory")
    local.add_argument("--baseline-decoder", metavar="PKG.MOD:NAME", help="the baseline decoder or its factory")
    local.add_argument("--decoder-option", action="append", default=[], metavar="KEY=VALUE")
    local.add_argument("--baseline-decoder-option", action="append", default=[], metavar="KEY=VALUE")
    work = parser.add_argument_group("workload")
    work.add_argument("--prompts", metavar="FILE", help="JSON list of prompts (strings or token-id lists)")
    work.add_argument("--random-prompts", type=positive_int, default=16, metavar="N",
                      help="without --prompts: N prompts of random token ids (default 16)")  # fmt: skip
    work.add_argument("--prompt-length", type=positive_int, default=8, metavar="T")
    work.add_argument("--vocab-size", type=positive_int, default=64, metavar="V", help="random prompts' id range")
    work.add_argument("--max-tokens", type=positive_int, default=64, help="tokens per reply (default 64)")
    work.add_argument("--temperature", type=float, default=None)
    work.add_argument("--top-k", type=int, default=None)
    work.add_argument("--top-p", type=float, default=None)
    design = parser.add_argument_group("design")
    design.add_argument("--concurrency", type=positive_int, nargs="+", default=[1, 4, 16])
    design.add_argument("--pairs", type=positive_int, default=8, help="measured pairs of rounds per concurrency (8)")
    design.add_argument("--warmup-pairs", type=nonnegative_int, default=1)
    design.add_argument("--requests-per-client", type=positive_int, default=2)
    design.add_argument("--seed", type=nonnegative_int, default=0, help="prompts, request seeds and resamples")
    design.add_argument("--level", type=probability, default=0.95, help="confidence of each interval (0.95)")
    answers = parser.add_argument_group("answers beside the speedup")
    answers.add_argument("--audit-report", metavar="FILE", help="an audit's report.json: its verdict and detectable TV")
    answers.add_argument("--accelerator", default="H100 SXM", help="the cost model's accelerator name")
    answers.add_argument("--bandwidth", type=positive_float, default=3.35e12, metavar="B/S", help="bytes per second")
    answers.add_argument("--target-params", type=positive_float, default=8e9, metavar="N")
    answers.add_argument("--draft-params", type=nonnegative_float, default=1e9, metavar="N",
                         help="the drafter's parameters (0: an n-gram drafter)")  # fmt: skip
    answers.add_argument("--bytes-per-param", type=positive_float, default=2.0)
    parser.add_argument("--out", metavar="DIR", help="write bench.json, bench.md and bench.html")
    parser.add_argument("--json", action="store_true", help="print the JSON report")
    return parser


def load_prompts(path: str | None, *, count: int, length: int, vocab_size: int, seed: int) -> list:
    """The prompts: a file's JSON list (strings or token-id lists), else ``count`` random id lists."""
    if path is None:
        import torch

        from specverify.core.seeds import derive_seed

        generator = torch.Generator().manual_seed(derive_seed(seed, 1))
        return torch.randint(0, vocab_size, (count, length), generator=generator).tolist()
    try:
        prompts = json.loads(Path(path).read_text())
    except (OSError, ValueError) as error:
        raise InvalidArgument(f"--prompts {path!r}: {error}") from None
    ok = isinstance(prompts, list) and prompts and all(
        (isinstance(p, str) and p) or (isinstance(p, list) and p and all(type(t) is int and t >= 0 for t in p))
        for p in prompts
    )  # fmt: skip
    if not ok:
        raise InvalidArgument(f"--prompts {path!r} must hold a non-empty JSON list of strings or token-id lists")
    return prompts


def _subjects(args, sampling: dict) -> tuple[dict, dict]:
    from specverify.bench.timed import DecoderSubject, EndpointSubject

    served = args.endpoint or args.baseline_endpoint
    local = args.decoder or args.baseline_decoder
    if bool(served) == bool(local):
        raise InvalidArgument("give --endpoint and --baseline-endpoint, or --decoder and --baseline-decoder")
    if served:
        from specverify.endpoint.http import HttpClient, Limits, key_variable

        if not (args.endpoint and args.baseline_endpoint and args.model):
            raise InvalidArgument("a served bench needs --endpoint, --baseline-endpoint and --model")
        if args.endpoint.rstrip("/") == args.baseline_endpoint.rstrip("/"):
            raise InvalidArgument("--endpoint and --baseline-endpoint are the same server: nothing would be compared")
        limits = Limits(read_timeout=min(120.0, args.request_timeout), request_timeout=args.request_timeout, retries=0)
        made = {}
        for arm, url, model in (("speculative", args.endpoint, args.model),
                                ("baseline", args.baseline_endpoint, args.baseline_model or args.model)):  # fmt: skip
            client = HttpClient(url, key_env=key_variable(args.api_key_env), limits=limits,
                                send_key_over_http=args.send_key_over_http)  # fmt: skip
            made[arm] = EndpointSubject(
                client, model=model, max_tokens=args.max_tokens, sampling=sampling, seed=args.seed
            )
        return made, {"speculative": args.endpoint, "baseline": args.baseline_endpoint}
    from specverify.cli.audit import build

    if not (args.decoder and args.baseline_decoder):
        raise InvalidArgument("an in-process bench needs --decoder and --baseline-decoder")
    made = {
        "speculative": build(args.decoder, "decoder", parse_options(args.decoder_option, argument="--decoder-option")),
        "baseline": build(
            args.baseline_decoder,
            "decoder",
            parse_options(args.baseline_decoder_option, argument="--baseline-decoder-option"),
        ),  # fmt: skip
    }
    subjects = {arm: DecoderSubject(d, max_tokens=args.max_tokens, seed=args.seed, name=arm) for arm, d in made.items()}
    return subjects, {"speculative": args.decoder, "baseline": args.baseline_decoder}


def run(args, argv: list[str] | None = None) -> int:
    """Run ``specverify bench``; exit status 0 when measured."""
    from specverify.bench.analysis import summarise
    from specverify.bench.output import Accelerator, BenchReport, audit_answer, predict, write
    from specverify.bench.runner import run_levels

    sampling = {name: value for name, value in (("temperature", args.temperature), ("top_k", args.top_k),
                                                ("top_p", args.top_p)) if value is not None}  # fmt: skip
    audit = audit_answer(args.audit_report) if args.audit_report else None
    accelerator = Accelerator(args.accelerator, args.bandwidth, args.target_params, args.draft_params,
                              args.bytes_per_param)  # fmt: skip
    prompts = load_prompts(args.prompts, count=args.random_prompts, length=args.prompt_length,
                           vocab_size=args.vocab_size, seed=args.seed)  # fmt: skip
    subjects, names = _subjects(args, sampling)

    def progress(done: int, total: int, what: str) -> None:
        print(f"\rbench: round {done}/{total} ({what})".ljust(72), end="", file=sys.stderr, flush=True)

    levels = run_levels(subjects, prompts, concurrency=tuple(args.concurrency), pairs=args.pairs,
                        warmup_pairs=args.warmup_pairs, requests_per_client=args.requests_per_client,
                        progress=progress if sys.stderr.isatty() else None)  # fmt: skip
    summaries = tuple(summarise(level, seed=args.seed, level_of_confidence=args.level) for level in levels)
    settings = {
        "command": "specverify " + shlex.join(argv if argv is not None else sys.argv[1:]),
        **names,
        "max_tokens": args.max_tokens,
        "sampling": sampling,
        "prompts": args.prompts
        or f"{args.random_prompts} random id lists of {args.prompt_length} over {args.vocab_size}",
        "concurrency": list(args.concurrency),
        "pairs": args.pairs,
        "warmup_pairs": args.warmup_pairs,
        "requests_per_client": args.requests_per_client,
        "seed": args.seed,
        "level": args.level,
    }
    report = BenchReport(settings, summaries, audit, accelerator,
                         tuple(predict(s.counters, accelerator) for s in summaries))  # fmt: skip
    if args.out:
        write(report, args.out)
    print(json.dumps(report.as_dict(), indent=2) if args.json else report.markdown())
    return 0
