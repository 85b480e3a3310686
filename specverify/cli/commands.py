"""The ``specverify`` command line.

::

    specverify audit --verifier PKG.MOD:NAME [--tier smoke|standard|deep] [--seed N] [--out DIR]
    specverify audit --decoder PKG.MOD:FACTORY --target PKG.MOD:FACTORY [--reference PKG.MOD:FACTORY]
    specverify audit --drafter PKG.MOD:FACTORY --target PKG.MOD:FACTORY [--verifier PKG.MOD:NAME]
    specverify selftest [--tier smoke] [--json] [--matrix PATH]
    specverify examples [--out reports]
    specverify demo

Exit status of ``audit``: 0 pass (a "suspicious" verdict warns but passes), 1 fail,
2 bad usage or a broken implementation (it raised, returned bad shapes or
out-of-vocabulary tokens, or was not deterministic for a fixed seed).
"""

from __future__ import annotations

import argparse
import dataclasses
import shlex
import sys
import time
from pathlib import Path

import specverify
from specverify.core.errors import InvalidArgument, SpecVerifyError
from specverify.core.loading import load_object, parse_options

EXIT_PASS, EXIT_FAIL, EXIT_USAGE = 0, 1, 2
TIERS = ("smoke", "standard", "deep")


class Progress:
    """A progress bar on stderr that appears only once a run has taken more than ``delay`` seconds."""

    def __init__(self, stream=None, *, delay: float = 2.0, width: int = 30):
        self.stream = stream if stream is not None else sys.stderr
        self.delay, self.width = delay, width
        self.start = time.perf_counter()
        self.shown = False
        self.interactive = bool(getattr(self.stream, "isatty", lambda: False)())

    def __call__(self, done: int, total: int, name: str = "") -> None:
        elapsed = time.perf_counter() - self.start
        if elapsed < self.delay and done < total:
            return
        if not self.shown and done >= total:
            return  # finished before the bar was worth drawing
        self.shown = True
        filled = int(self.width * done / max(total, 1))
        bar = "#" * filled + "-" * (self.width - filled)
        line = f"[{bar}] {done}/{total} {elapsed:6.1f}s {name}"
        if self.interactive:
            self.stream.write("\r" + line[:120].ljust(120))
            if done >= total:
                self.stream.write("\n")
        else:
            self.stream.write(line + "\n")
        self.stream.flush()


def _instantiate(spec: str, role: str, method: str, options: dict):
    """Load ``spec``; return an object with ``method``, calling it as a factory with ``options`` if needed."""
    obj = load_object(spec, argument=f"--{role}")
    if hasattr(obj, method) and not isinstance(obj, type):
        if options:
            raise InvalidArgument(f"--{role}-option given, but --{role} {spec!r} is an instance, not a factory")
        return obj
    if not callable(obj):
        raise InvalidArgument(f"--{role} {spec!r} is neither a factory nor an object with a .{method} method")
    instance = obj(**options)
    if not hasattr(instance, method):
        raise InvalidArgument(f"--{role} {spec!r} returned {type(instance).__name__}, which has no .{method} method")
    return instance


def _verifier(spec: str, options: dict):
    obj = load_object(spec, argument="--verifier")
    if options:
        obj = obj(**options)
    if hasattr(obj, "verify") and not isinstance(obj, type):
        return obj.verify
    if not callable(obj) or isinstance(obj, type):
        raise InvalidArgument(f"--verifier {spec!r} is not a verify callable")
    return obj


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="specverify",
        description="Statistical verification of speculative-decoding implementations.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Exit status of audit: 0 pass, 1 fail, 2 bad usage or broken implementation.",
    )
    parser.add_argument("--version", action="version", version=f"specverify {specverify.__version__}")
    sub = parser.add_subparsers(dest="command")

    audit = sub.add_parser("audit", help="audit a verifier, a decoder or a drafter and write a report")
    what = audit.add_argument_group("what to audit")
    what.add_argument(
        "--verifier", metavar="PKG.MOD:NAME", help="verify(target_probs, draft_probs, draft_tokens, *, generator)"
    )
    what.add_argument(
        "--decoder",
        metavar="PKG.MOD:FACTORY",
        help="factory of an object with .generate(prompt, *, num_samples, max_new_tokens, seed)",
    )
    what.add_argument(
        "--drafter", metavar="PKG.MOD:FACTORY", help="factory of an object with .draft(prefix, k, *, generator)"
    )
    what.add_argument("--target", metavar="PKG.MOD:FACTORY", help="factory of an object with .next_token_probs(prefix)")
    what.add_argument(
        "--reference",
        metavar="PKG.MOD:FACTORY",
        help="a second decoder (e.g. direct sampling): two-sample tests instead of exact conditionals",
    )
    for role in ("verifier", "decoder", "drafter", "target", "reference"):
        what.add_argument(
            f"--{role}-option",
            action="append",
            metavar="KEY=VALUE",
            default=[],
            help=f"keyword argument for the {role} factory (repeatable)",
        )
    drafting = audit.add_argument_group("drafter audit (efficiency model)")
    drafting.add_argument("--k", type=int, help="draft length K (default: the drafter's .k or 4)")
    drafting.add_argument(
        "--draft-cost", type=float, help="drafter forward cost relative to a target pass (speedup model)"
    )
    drafting.add_argument(
        "--model-params", type=float, help="target parameters, for the memory-bound latency (e.g. 8e9)"
    )
    drafting.add_argument(
        "--bandwidth", type=float, default=3.35e12, help="memory bandwidth in bytes/s (default H100: 3.35e12)"
    )
    drafting.add_argument("--bytes-per-param", type=float, default=2.0, help="bytes per weight (default 2: bf16)")
    audit.add_argument(
        "--greedy",
        action="store_true",
        help="greedy mode: a verifier's or decoder's output must equal the target's argmax continuation",
    )
    audit.add_argument(
        "--scenario",
        action="append",
        metavar="NAME",
        help="verifier audit: run only this scenario (repeatable; see list_scenarios)",
    )
    audit.add_argument("--tier", choices=TIERS, default="smoke")
    audit.add_argument("--seed", type=int, default=0)
    audit.add_argument(
        "--alpha", type=float, default=1e-3, help="family-wise false-alarm rate of the run (default 1e-3)"
    )
    audit.add_argument(
        "--out",
        metavar="DIR",
        default="specverify-report",
        help="directory for report.json/.md/.html (default ./specverify-report)",
    )
    audit.add_argument("--no-plots", action="store_true", help="skip the PNG plots in report.html")
    audit.add_argument("--json", action="store_true", help="print the report JSON instead of the summary")

    selftest = sub.add_parser("selftest", help="mutation score and calibration of the suite itself")
    selftest.add_argument("--tier", choices=TIERS, default="smoke")
    selftest.add_argument("--seed", type=int, default=0)
    selftest.add_argument("--json", action="store_true", help="print the matrix as JSON")
    selftest.add_argument(
        "--matrix", metavar="PATH", help="also write the Markdown mutation matrix (with the peers' tests) to PATH"
    )

    examples = sub.add_parser("examples", help="regenerate the example reports (reports/ in the repository)")
    examples.add_argument("--out", default="reports", metavar="DIR")
    examples.add_argument("--seed", type=int, default=0)
    examples.add_argument("--tier", choices=TIERS, default="smoke")
    examples.add_argument("--skip-hf", action="store_true", help="skip the Hugging Face transformers audit")
    examples.add_argument("--skip-matrix", action="store_true", help="skip the mutation matrix (selftest + peers)")

    sub.add_parser("demo", help="run the canonical rule against an adversarial drafter and print the emitted law")
    return parser


def _run_examples(args) -> int:
    from specverify.cli.examples.basic import generate_basic_reports

    out = Path(args.out)
    rows = generate_basic_reports(out, seed=args.seed, tier=args.tier)
    status = EXIT_PASS
    if not args.skip_hf:
        try:
            import transformers  # noqa: F401
        except ImportError:
            print("transformers is not installed: skipping the HF audit (pip install 'specverify[hf]')")
        else:
            from specverify.cli.examples.hf import generate_hf_reports

            generate_hf_reports(out / "hf-transformers", seed=args.seed, tier=args.tier)
    if not args.skip_matrix:
        from specverify.selftest import main as selftest_main

        status = selftest_main(
            tier=args.tier, seed=args.seed, as_json=False, matrix_path=str(out / "mutation-matrix.md")
        )
    expected = {name: report.verdict for name, _, report, _ in rows}
    print("example verdicts: " + ", ".join(f"{k}={v}" for k, v in expected.items()))
    return status


def _run_audit(args, argv: list[str]) -> int:
    options = {
        role: dict(parse_options(getattr(args, f"{role}_option"), argument=f"--{role}-option"))
        for role in ("verifier", "decoder", "drafter", "target", "reference")
    }
    common = dict(tier=args.tier, seed=args.seed, alpha=args.alpha, progress=Progress())
    if args.drafter:
        if not args.target:
            raise InvalidArgument("--drafter needs --target PKG.MOD:FACTORY")
        verifier = _verifier(args.verifier, options["verifier"]) if args.verifier else None
        drafter = _instantiate(args.drafter, "drafter", "draft", options["drafter"])
        target = _instantiate(args.target, "target", "next_token_probs", options["target"])
        from specverify.drafter import audit_drafter

        report = audit_drafter(
            drafter,
            target,
            verifier=verifier,
            k=args.k,
            draft_cost=args.draft_cost,
            model_params=args.model_params,
            bandwidth=args.bandwidth,
            bytes_per_param=args.bytes_per_param,
            **common,
        )
    elif args.decoder:
        if not args.target and not args.reference:
            raise InvalidArgument(
                "--decoder needs --target PKG.MOD:FACTORY (exact conditionals) or --reference PKG.MOD:FACTORY (two-sample)"
            )
        decoder = _instantiate(args.decoder, "decoder", "generate", options["decoder"])
        target = _instantiate(args.target, "target", "next_token_probs", options["target"]) if args.target else None
        reference = (
            _instantiate(args.reference, "reference", "generate", options["reference"]) if args.reference else None
        )
        from specverify.decoder import check_decoder

        report = check_decoder(decoder, target, reference=reference, greedy=True if args.greedy else None, **common)
    elif args.verifier:
        verify = _verifier(args.verifier, options["verifier"])
        from specverify.verifier.battery import check_verifier

        report = check_verifier(verify, greedy=args.greedy, scenarios=args.scenario, **common)
    else:
        raise InvalidArgument("audit needs one of --verifier, --decoder or --drafter")

    spec, role = (
        (args.drafter, "drafter")
        if args.drafter
        else (args.decoder, "decoder")
        if args.decoder
        else (args.verifier, "verifier")
    )
    named = spec + ("(" + ", ".join(f"{k}={v!r}" for k, v in options[role].items()) + ")" if options[role] else "")
    report = dataclasses.replace(
        report, implementation=named, command="specverify " + " ".join(shlex.quote(a) for a in argv)
    )
    from specverify.report import write_report

    paths = write_report(report, Path(args.out), plots=not args.no_plots)
    print(report.to_json() if args.json else report.summary())
    if not args.json:
        print(f"report: {paths.get('html', paths.get('json'))}")
    if report.errors:
        return EXIT_USAGE
    return EXIT_PASS if report.passed else EXIT_FAIL


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        if args.command == "audit":
            return _run_audit(args, argv)
        if args.command == "selftest":
            from specverify.selftest import main as selftest_main

            return selftest_main(tier=args.tier, seed=args.seed, as_json=args.json, matrix_path=args.matrix)
        if args.command == "examples":
            return _run_examples(args)
        if args.command == "demo":
            from specverify.cli.demo import main as demo_main

            return demo_main()
    except SpecVerifyError as error:
        print(f"specverify: error: {error}", file=sys.stderr)
        return EXIT_USAGE
    parser.print_help()
    return EXIT_PASS


if __name__ == "__main__":
    sys.exit(main())
