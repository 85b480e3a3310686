"""``specverify measure``: how far a (lossy) chain verifier is from the target, and what it buys.

::

    specverify measure --verifier PKG.MOD:NAME [--verifier-option K=V ...] [--scenario NAME]
                       [--tier smoke|standard|deep] [--seed N] [--level 0.95]
                       [--declared-law PKG.MOD:NAME [--declared-option K=V ...]] [--alpha 1e-3]
                       [--out DIR] [--json]

Prints per in-block and per absolute position the bias-corrected TV with its confidence
interval, the declared law's exact TV (when there is one: ``--declared-law``, or the
verify callable's ``declared_law`` attribute, as the factories of ``reference.lossy``
provide) and KL, then tokens per target pass.  ``--out DIR`` writes ``measure.json``
and ``measure.txt`` atomically.  Exit status: 0 measured (and conformant to the declared
law, if any), 1 not conformant to the declared law, 2 bad usage or a broken implementation.

Example: ``specverify measure --verifier reference.lossy:ensemble --verifier-option weight=0.5``.
"""

from __future__ import annotations

import functools
import json
import sys
from pathlib import Path

from specverify.core.errors import InvalidArgument, SpecVerifyError
from specverify.core.loading import load_object, parse_options

__all__ = ["add_parser", "run", "build_verify"]

EXIT_OK, EXIT_NONCONFORMANT, EXIT_USAGE = 0, 1, 2


def add_parser(subparsers):
    """Add the ``measure`` subcommand to an ``argparse`` subparsers object; returns its parser."""
    parser = subparsers.add_parser(
        "measure", help="measure a chain verifier's distance from the target (TV with confidence bounds, KL)"
    )
    parser.add_argument("--verifier", metavar="PKG.MOD:NAME", required=True, help="verify callable or its factory")
    parser.add_argument("--verifier-option", action="append", metavar="KEY=VALUE", default=[])
    parser.add_argument("--scenario", metavar="NAME", default=None, help="battery scenario (default pos8_uniform_k4)")
    parser.add_argument("--tier", choices=("smoke", "standard", "deep"), default="smoke")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--level", type=float, default=0.95, help="level of each TV interval (default 0.95)")
    parser.add_argument(
        "--declared-law",
        metavar="PKG.MOD:NAME",
        help="declared_law(target_rows, draft_rows or None) -> law (default: the verifier's .declared_law)",
    )
    parser.add_argument("--declared-option", action="append", metavar="KEY=VALUE", default=[])
    parser.add_argument("--alpha", type=float, default=1e-3, help="false-alarm rate of the conformance check")
    parser.add_argument("--out", metavar="DIR", help="write measure.json and measure.txt here")
    parser.add_argument("--json", action="store_true", help="print the JSON result instead of the table")
    return parser


def build_verify(spec: str, options):
    """The verify callable named by ``spec``: a function, or a factory called with ``options``."""
    obj = load_object(spec, argument="--verifier")
    if options:
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
    from specverify.report.io import atomic_write_text
    from specverify.verifier.measure import measure_divergence

    try:
        verify = build_verify(args.verifier, parse_options(args.verifier_option, argument="--verifier-option"))
        declared = getattr(verify, "declared_law", None)
        if args.declared_law:
            declared = load_object(args.declared_law, argument="--declared-law")
            options = parse_options(args.declared_option, argument="--declared-option")
            declared = functools.partial(declared, **options) if options else declared
        result = measure_divergence(
            verify,
            scenario=args.scenario,
            tier=args.tier,
            seed=args.seed,
            level=args.level,
            declared_law=declared,
            alpha=args.alpha,
        )
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
