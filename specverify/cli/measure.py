"""``specverify measure``: how far a (lossy) verifier or decoder is from the target, and what it buys.

::

    specverify measure --verifier PKG.MOD:NAME [--verifier-option K=V ...] [--scenario NAME]
                       [--tier smoke|standard|deep] [--seed N] [--level 0.95]
                       [--declared-law PKG.MOD:NAME [--declared-option K=V ...]] [--alpha 1e-3]
                       [--out DIR] [--json]
    specverify measure --verifier PKG.MOD:FACTORY --sweep KEY=V1,V2,... [--draft-cost C]
                       [--declared-sweep-key NAME] [... as above]
    specverify measure --tree-verifier PKG.MOD:NAME [--tree-verifier-option K=V ...] [--scenario TREE_SCENARIO]
                       [--tier ...] [--seed N] [--level 0.95] [--out DIR] [--json]
    specverify measure --decoder PKG.MOD:NAME [--decoder-option K=V ...] --target PKG.MOD:NAME
                       [--target-option K=V ...] [--draft PKG.MOD:NAME [--draft-option K=V ...]]
                       [--prompt 1,2,3] [--num-samples N] [--max-new-tokens L] [--positions 1,2]
                       [--declared-law ... (needs --draft)] [--seed N] [--level 0.95] [--out DIR] [--json]

A tree verifier is measured per in-round depth (``depth=j``) and absolute position over a tree
scenario (:func:`specverify.measure.tree.measure_tree_divergence`); a decoder per
absolute position of continuations of one prompt against the target's exact conditionals
(:func:`specverify.measure.decoder.measure_decoder_divergence`; the draft model's
conditionals are needed only for a declared law such as ``w p + (1 - w) q``).

Prints per absolute position (``abs=t``, t from 0, as the verifier battery counts) and per
in-block position from 2 (position 1 is ``abs=0``) the TV estimate inside its confidence
interval, the declared law's exact TV (when there is one: ``--declared-law``, or the
verify callable's ``declared_law`` attribute, as the factories of ``reference.lossy``
provide) and KL, then tokens per target pass.  ``--out DIR`` writes ``measure.json``
and ``measure.txt`` atomically.  Exit status: 0 measured (and conformant to the declared
law, if any), 1 not conformant to the declared law, 2 bad usage or a broken implementation.

``--sweep KEY=V1,V2,...`` measures the factory once per value (``KEY=Vi`` added to the
``--verifier-option``-s; values are Python literals, ``None`` included) with
:func:`specverify.measure.sweep.sweep` and prints the trade-off table (TV with its
interval per position and per token, tokens per target pass, memory-bound speedup at
``--draft-cost``); ``--out DIR`` writes ``sweep.json``, ``sweep.md`` and ``sweep.html``
(with the plot).  The declared law is each verifier's ``declared_law``, or
``--declared-law`` with the swept value passed as ``--declared-sweep-key`` (if given).
Exit status 1 if any value is not conformant to its declared law.

Examples: ``specverify measure --verifier reference.lossy:ensemble --verifier-option weight=0.5``;
``specverify measure --verifier reference.lossy:ensemble --sweep weight=0.1,0.5,1.0 --out DIR``.
"""

from __future__ import annotations

import ast
import functools
import inspect
import json
import shlex
import sys
from pathlib import Path

from specverify.cli.argtypes import nonnegative_float, nonnegative_int, positive_int, probability
from specverify.core.errors import InvalidArgument, SpecVerifyError
from specverify.core.loading import load_object, parse_options

__all__ = ["add_parser", "run", "run_sweep", "build_verify", "parse_sweep"]

EXIT_OK, EXIT_NONCONFORMANT, EXIT_USAGE = 0, 1, 2


def add_parser(subparsers):
    """Add the ``measure`` subcommand to an ``argparse`` subparsers object; returns its parser."""
    parser = subparsers.add_parser(
        "measure", help="measure a chain verifier's distance from the target (TV with confidence bounds, KL)"
    )
    subject = parser.add_mutually_exclusive_group(required=True)
    subject.add_argument("--verifier", metavar="PKG.MOD:NAME", help="verify callable or its factory")
    subject.add_argument("--tree-verifier", metavar="PKG.MOD:NAME", help="verify_tree callable or its factory")
    subject.add_argument("--decoder", metavar="PKG.MOD:NAME", help="decoder (generate) or its factory")
    for role in ("verifier", "tree-verifier", "decoder", "target", "draft"):
        parser.add_argument(f"--{role}-option", action="append", metavar="KEY=VALUE", default=[])
    parser.add_argument("--target", metavar="PKG.MOD:NAME", help="decoder measurement: the target (exact conditionals)")
    parser.add_argument(
        "--draft", metavar="PKG.MOD:NAME", help="decoder measurement: the draft model, for a declared law"
    )
    parser.add_argument("--prompt", default="1,2,3", help="decoder measurement: prompt token ids (default 1,2,3)")
    parser.add_argument(
        "--num-samples", type=positive_int, default=2000, help="decoder measurement: continuations (2000)"
    )
    parser.add_argument("--max-new-tokens", type=positive_int, default=4, help="decoder measurement: tokens each (4)")
    parser.add_argument("--positions", default=None, help="decoder measurement: positions measured, e.g. 1,2 (all)")
    parser.add_argument(
        "--scenario", metavar="NAME", default=None,
        help="battery scenario (default pos8_uniform_k4; tree: markov8_topk_3x2)",
    )  # fmt: skip
    parser.add_argument("--tier", choices=("smoke", "standard", "deep"), default="smoke")
    parser.add_argument("--seed", type=nonnegative_int, default=0)
    parser.add_argument("--level", type=probability, default=0.95, help="level of each TV interval (default 0.95)")
    parser.add_argument(
        "--declared-law",
        metavar="PKG.MOD:NAME",
        help="declared_law(target_rows, draft_rows or None) -> law (default: the verifier's .declared_law)",
    )
    parser.add_argument("--declared-option", action="append", metavar="KEY=VALUE", default=[])
    parser.add_argument("--alpha", type=probability, default=1e-3, help="false-alarm rate of the conformance check")
    parser.add_argument("--out", metavar="DIR", help="write measure.json and measure.txt here")
    parser.add_argument("--json", action="store_true", help="print the JSON result instead of the table")
    parser.add_argument(
        "--sweep", metavar="KEY=V1,V2,...", help="sweep one factory option: trade-off table, sweep.{json,md,html}"
    )
    parser.add_argument(
        "--draft-cost",
        type=nonnegative_float,
        default=None,
        help="drafter pass in target passes, for the speedup (default 0.05)",
    )
    parser.add_argument(
        "--declared-sweep-key", metavar="NAME", help="pass the swept value to --declared-law as NAME=value"
    )
    return parser


def parse_sweep(text: str) -> tuple[str, list]:
    """``KEY=V1,V2,...`` -> (KEY, [V1, V2, ...]); values are Python literals or plain strings."""
    key, sep, rest = (text or "").partition("=")
    parts = [part.strip() for part in rest.split(",")]
    if not sep or not key.isidentifier() or not any(parts) or not all(parts):
        raise InvalidArgument(f"--sweep must look like KEY=V1,V2,... with non-empty values, got {text!r}")
    values = []
    for part in parts:
        try:
            values.append(ast.literal_eval(part))
        except (ValueError, SyntaxError):
            values.append(part)
    return key, values


def _command(args) -> str:
    """The canonical command line of a sweep run (recorded in the report)."""
    role = "tree-verifier" if args.tree_verifier else "verifier"
    words = ["specverify", "measure", f"--{role}", args.tree_verifier or args.verifier]
    for option in args.tree_verifier_option if args.tree_verifier else args.verifier_option:
        words += [f"--{role}-option", option]
    if args.scenario:
        words += ["--scenario", args.scenario]
    words += ["--tier", args.tier, "--seed", str(args.seed), "--level", f"{args.level:g}", "--sweep", args.sweep]
    if args.draft_cost is not None:
        words += ["--draft-cost", f"{args.draft_cost:g}"]
    if args.declared_law:
        words += ["--declared-law", args.declared_law]
        for option in args.declared_option:
            words += ["--declared-option", option]
        if args.declared_sweep_key:
            words += ["--declared-sweep-key", args.declared_sweep_key]
    if args.alpha != 1e-3:
        words += ["--alpha", f"{args.alpha:g}"]
    if args.out:
        words += ["--out", str(args.out)]
    return shlex.join(words)


def _declared(args):
    """None, or ``(law, options)`` from ``--declared-law`` / ``--declared-option``."""
    if not args.declared_law:
        if getattr(args, "declared_sweep_key", None):
            raise InvalidArgument("--declared-sweep-key needs --declared-law")
        return None
    law = load_object(args.declared_law, argument="--declared-law")
    return law, dict(parse_options(args.declared_option, argument="--declared-option"))


def run_sweep(args) -> int:
    """``specverify measure --sweep``: one measurement per value; returns the exit status."""
    from specverify.measure.sweep import DEFAULT_DRAFT_COST, sweep
    from specverify.report.sweep import write_sweep

    try:
        key, values = parse_sweep(args.sweep)
        role = "tree-verifier" if args.tree_verifier else "verifier"
        given = args.tree_verifier_option if args.tree_verifier else args.verifier_option
        options = dict(parse_options(given, argument=f"--{role}-option"))
        if key in options:
            raise InvalidArgument(f"--sweep {key}=... and --{role}-option {key}=... both set {key}")
        declared = _declared(args)
        declared_law = None
        if declared is not None:
            law, law_options = declared

            def declared_law(value):
                extra = {args.declared_sweep_key: value} if args.declared_sweep_key else {}
                return functools.partial(law, **law_options, **extra)

        if args.tree_verifier:
            from specverify.cli.audit import build_verifier

            if declared is not None:
                raise InvalidArgument("--declared-law applies to chain verifiers, not to --tree-verifier")

            def make(value):
                return build_verifier(args.tree_verifier, {**options, key: value}, role="tree_verifier")
        else:

            def make(value):
                return build_verify(args.verifier, {**options, key: value})

        result = sweep(
            make,
            values,
            kind="tree" if args.tree_verifier else "chain",
            scenario=args.scenario,
            tier=args.tier,
            seed=args.seed,
            level=args.level,
            draft_cost=DEFAULT_DRAFT_COST if args.draft_cost is None else args.draft_cost,
            declared_law=declared_law,
            knob=key,
            subject=args.tree_verifier or args.verifier,
            alpha=args.alpha,
            command=_command(args),
            progress=None if args.json else lambda line: print(line, file=sys.stderr),
        )
    except SpecVerifyError as error:
        print(f"specverify: error: {error}", file=sys.stderr)
        return EXIT_USAGE
    print(json.dumps(result.to_dict(), indent=1) if args.json else result.summary())
    if args.out:
        write_sweep(result, args.out)
    return EXIT_NONCONFORMANT if "fail" in result.verdicts else EXIT_OK


def _is_factory(obj) -> bool:
    """A callable that takes no ``generator`` and needs no argument: a factory to call with its defaults."""
    try:
        params = inspect.signature(obj).parameters.values()
    except (TypeError, ValueError):
        return False
    names = {p.name for p in params}
    required = [
        p for p in params if p.default is inspect.Parameter.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
    ]
    return "generator" not in names and not required


def build_verify(spec: str, options):
    """The verify callable named by ``spec``: a function, or a factory called with ``options`` (or its defaults)."""
    obj = load_object(spec, argument="--verifier")
    if not options and _is_factory(obj):
        options = {}
        obj = obj()
    elif options:
        if not callable(obj):
            raise InvalidArgument(f"--verifier {spec}: not a factory, so --verifier-option does not apply")
        try:
            obj = obj(**options)
        except TypeError as error:
            raise InvalidArgument(
                f"--verifier {spec}: calling it with {dict(options)} raised TypeError: {error}"
            ) from None
    if hasattr(obj, "verify") and not callable(getattr(obj, "declared_law", None)):
        return obj.verify
    if not callable(obj):
        raise InvalidArgument(f"--verifier {spec}: not a verify callable (a function, or an object with .verify)")
    return obj


def run(args) -> int:
    """Run ``specverify measure`` for parsed ``args``; returns the exit status."""

    if getattr(args, "sweep", None):
        if args.decoder:
            print("specverify: error: --sweep measures a --verifier or --tree-verifier factory", file=sys.stderr)
            return EXIT_USAGE
        return run_sweep(args)
    if args.tree_verifier or args.decoder:
        return _report(args, _measure_other)
    return _report(args, _measure_verifier)


def _token_list(text: str, argument: str) -> list[int]:
    try:
        values = [int(part) for part in text.split(",")]
    except ValueError:
        raise InvalidArgument(f"{argument} must be comma-separated integers, got {text!r}") from None
    return values


def _measure_other(args):
    """A tree verifier's or a decoder's :class:`~specverify.measure.chain.MeasureResult`."""
    from specverify.cli.audit import build, build_verifier

    if args.tree_verifier:
        from specverify.measure.tree import measure_tree_divergence

        if args.declared_law:
            raise InvalidArgument("--declared-law applies to chain verifiers and decoders, not to --tree-verifier")
        options = parse_options(args.tree_verifier_option, argument="--tree-verifier-option")
        verify_tree = build_verifier(args.tree_verifier, options, role="tree_verifier")
        return measure_tree_divergence(
            verify_tree, scenario=args.scenario, tier=args.tier, seed=args.seed, level=args.level
        )
    from specverify.measure.decoder import measure_decoder_divergence

    if not args.target:
        raise InvalidArgument("--decoder needs --target PKG.MOD:NAME (the exact conditionals)")
    decoder = build(args.decoder, "decoder", parse_options(args.decoder_option, argument="--decoder-option"))
    target = build(args.target, "target", parse_options(args.target_option, argument="--target-option"))
    draft = None
    if args.draft:
        draft = build(args.draft, "target", parse_options(args.draft_option, argument="--draft-option"))
    declared = _declared(args)
    law = None if declared is None else functools.partial(declared[0], **declared[1])
    positions = None if args.positions is None else _token_list(args.positions, "--positions")
    return measure_decoder_divergence(
        decoder, target, draft=draft, prompt=_token_list(args.prompt, "--prompt"), num_samples=args.num_samples,
        max_new_tokens=args.max_new_tokens, seed=args.seed, level=args.level, declared_law=law, alpha=args.alpha,
        name=args.decoder, positions=positions,
    )  # fmt: skip


def _measure_verifier(args):
    from specverify.measure.chain import measure_divergence

    verify = build_verify(args.verifier, parse_options(args.verifier_option, argument="--verifier-option"))
    declared = None  # measure_divergence falls back on the verifier's own declared_law (declared_law_of)
    if args.declared_law:
        declared = load_object(args.declared_law, argument="--declared-law")
        options = parse_options(args.declared_option, argument="--declared-option")
        declared = functools.partial(declared, **options) if options else declared
    return measure_divergence(
        verify,
        scenario=args.scenario,
        tier=args.tier,
        seed=args.seed,
        level=args.level,
        declared_law=declared,
        alpha=args.alpha,
    )


def _report(args, measure) -> int:
    """Measure, print the table (or JSON), write ``--out``; the exit status."""
    from specverify.core.files import atomic_write_text

    try:
        result = measure(args)
    except SpecVerifyError as error:
        print(f"specverify: error: {error}", file=sys.stderr)
        return EXIT_USAGE
    text = json.dumps(result.to_dict(), indent=1)
    print(text if args.json else result.summary())
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        atomic_write_text(out / "measure.json", text + "\n")
        atomic_write_text(out / "measure.txt", result.summary() + "\n")
    return EXIT_NONCONFORMANT if result.conformance_verdict == "fail" else EXIT_OK
