"""The ``specverify`` command line.

::

    specverify audit --verifier PKG.MOD:NAME [--tier smoke|standard|deep] [--seed N] [--out DIR]
    specverify audit --tree-verifier PKG.MOD:NAME [--mode iid|wor|topk|any] [--scenario NAME]
    specverify audit --decoder PKG.MOD:FACTORY --target PKG.MOD:FACTORY [--reference PKG.MOD:FACTORY]
    specverify audit --drafter PKG.MOD:FACTORY --target PKG.MOD:FACTORY [--verifier PKG.MOD:NAME]
    (factories take --ROLE-option KEY=VALUE; --debug shows tracebacks)
    specverify measure --verifier PKG.MOD:NAME [--verifier-option K=V] [--scenario NAME] [--level 0.95]
    specverify selftest [--tier smoke] [--json] [--matrix PATH] [--workers N]
    specverify demo

Exit status of ``audit``: 0 pass (a "suspicious" verdict warns but passes), 1 fail (a test
failed, whether or not other scenarios hit implementation errors), 2 bad usage or the verdict
"error": the implementation could not be tested (it raised, returned bad shapes or
out-of-vocabulary tokens, or was not deterministic for a fixed seed).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import math
import shlex
import sys
import time
import traceback
from pathlib import Path

from specverify.cli import bench as bench_command
from specverify.cli import measure as measure_command
from specverify.cli.argtypes import (
    Parser,
    nonnegative_float,
    nonnegative_int,
    positive_float,
    positive_int,
    probability,
)
from specverify.cli.audit import DEFAULT_ALPHA, DEFAULT_BANDWIDTH, DEFAULT_BYTES_PER_PARAM, run_audit
from specverify.cli.endpoint import add_arguments as endpoint_arguments
from specverify.core.errors import InvalidArgument, SpecVerifyError
from specverify.core.loading import put_on_import_path
from specverify.core.version import __version__

EXIT_PASS, EXIT_FAIL, EXIT_USAGE = 0, 1, 2
EXIT_INTERRUPTED = 130  # 128 + SIGINT, as a shell reports a process stopped by Ctrl-C
TIERS = ("smoke", "standard", "deep")


class Progress:
    """A progress bar on stderr: work done, scenarios done, elapsed time and ETA.

    It appears once a run has taken more than ``delay`` seconds (a fast run prints nothing).
    On a terminal it redraws one line (at most every ``redraw`` seconds); otherwise (a CI
    log) it writes a line at most every ``interval`` seconds, and the last one.  The batteries
    call :meth:`update` with a :class:`~specverify.core.progress.ProgressState` as their groups
    finish; :meth:`__call__` takes the plain ``(done, total, name)`` form.
    """

    def __init__(self, stream=None, *, delay: float = 2.0, width: int = 24, redraw: float = 0.1, interval: float = 5.0):
        self.stream = stream if stream is not None else sys.stderr
        self.delay, self.width, self.redraw, self.interval = delay, width, redraw, interval
        self.start = time.perf_counter()
        self.shown = self.closed = False
        self.last = -math.inf
        self.interactive = bool(getattr(self.stream, "isatty", lambda: False)())

    def __call__(self, done: int, total: int, name: str = "") -> None:
        from specverify.core.progress import ProgressState

        elapsed = time.perf_counter() - self.start
        self.update(ProgressState(done, total, "done", 0, 0, name, elapsed))

    def update(self, state) -> None:
        """Draw a :class:`~specverify.core.progress.ProgressState`."""
        finished = state.done >= state.total
        if self.closed or (state.elapsed < self.delay and not finished):
            return
        if not self.shown and finished:
            return  # finished before the bar was worth drawing
        now = time.perf_counter()
        if not finished and now - self.last < (self.redraw if self.interactive else self.interval):
            return
        self.shown, self.last, self.closed = True, now, finished
        filled = int(self.width * state.done / max(state.total, 1))
        bar = "#" * filled + "-" * (self.width - filled)
        line = f"[{bar}] {state.describe()} {state.current}".rstrip()
        if self.interactive:
            self.stream.write("\r" + line[:150].ljust(150))
            if finished:
                self.stream.write("\n")
        else:
            self.stream.write(line + "\n")
        self.stream.flush()


def build_parser() -> argparse.ArgumentParser:
    """The ``specverify`` argument parser (also what :func:`parse_command` reads recorded commands with)."""
    parser = Parser(
        prog="specverify",
        description="Statistical verification of speculative-decoding implementations.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Exit status of audit: 0 pass, 1 fail, 2 bad usage or broken implementation.",
    )
    parser.add_argument("--version", action="version", version=f"specverify {__version__}")
    sub = parser.add_subparsers(dest="command")

    _add_audit(sub)
    measure_command.add_parser(sub)
    bench_command.add_parser(sub)
    _add_others(sub)
    return parser


def _add_audit(sub) -> None:
    """The ``audit`` subcommand: what to audit, factory options, drafter cost model, sample sizes, run."""
    audit = sub.add_parser("audit", help="audit a verifier, a tree verifier, a decoder or a drafter; write a report")
    what = audit.add_argument_group("what to audit")
    what.add_argument(
        "--verifier", metavar="PKG.MOD:NAME", help="verify(target_probs, draft_probs, draft_tokens, *, generator)"
    )
    what.add_argument(
        "--tree-verifier",
        metavar="PKG.MOD:NAME",
        help="verify_tree(target_probs, draft_probs, tokens, parents, *, mode, generator): the tree battery",
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
    for role in ("verifier", "tree-verifier", "decoder", "drafter", "target", "reference"):
        what.add_argument(
            f"--{role}-option",
            action="append",
            metavar="KEY=VALUE",
            default=[],
            help=f"keyword argument for the {role} factory (repeatable)",
        )
    drafting = audit.add_argument_group("drafter audit (efficiency model)")
    drafting.add_argument("--k", type=positive_int, help="draft length K (default: the drafter's .k or 4)")
    drafting.add_argument(
        "--draft-cost", type=nonnegative_float, help="drafter forward cost relative to a target pass (speedup model)"
    )
    drafting.add_argument(
        "--model-params", type=positive_float, help="target parameters, for the memory-bound latency (e.g. 8e9)"
    )
    drafting.add_argument(
        "--bandwidth",
        type=positive_float,
        default=DEFAULT_BANDWIDTH,
        help="memory bandwidth in bytes/s (default H100: 3.35e12)",
    )
    drafting.add_argument(
        "--bytes-per-param",
        type=positive_float,
        default=DEFAULT_BYTES_PER_PARAM,
        help="bytes per weight (default 2: bf16)",
    )
    sizes = audit.add_argument_group("decoder audit (sample sizes)")
    sizes.add_argument(
        "--num-samples", type=positive_int, metavar="N", help="samples per prompt (default: the tier's plan)"
    )
    sizes.add_argument(
        "--max-new-tokens", type=positive_int, metavar="L", help="new tokens per sample (default: the tier's plan)"
    )
    audit.add_argument(
        "--greedy",
        action="store_true",
        help="greedy mode: a verifier's or decoder's output must equal the target's argmax continuation",
    )
    audit.add_argument(
        "--scenario",
        action="append",
        metavar="NAME",
        help="verifier / tree-verifier audit: run only this scenario (repeatable; see list_scenarios)",
    )
    audit.add_argument(
        "--mode",
        action="append",
        choices=("iid", "wor", "topk", "any"),
        help="tree-verifier audit: only scenarios whose children are drawn this way (repeatable)",
    )
    audit.add_argument(
        "--gate-conformance",
        action="store_true",
        help="verifier, tree-verifier and drafter audits: rule conformance (acceptance against the declared "
        "rule, graded under its own budget) also gates the verdict; by default the verdict is the law's and "
        "conformance is reported on its own line",
    )
    audit.add_argument("--tier", choices=TIERS, default="smoke")
    audit.add_argument("--seed", type=nonnegative_int, default=0)
    audit.add_argument(
        "--alpha",
        type=probability,
        default=DEFAULT_ALPHA,
        help="family-wise false-alarm rate of the run (default 1e-3)",
    )
    audit.add_argument(
        "--device",
        metavar="DEVICE",
        help="where the implementation runs and gets its inputs and generator: cpu (default), cuda:0, ...",
    )
    audit.add_argument(
        "--dtype",
        choices=("float32", "bfloat16", "float16"),
        help="dtype of the probabilities handed to a verifier (verifier, tree-verifier, drafter audits; default float32)",
    )
    shards = audit.add_argument_group("sharded runs (verifier and tree-verifier audits; statistics never change)")
    shards.add_argument(
        "--workers",
        type=positive_int,
        default=None,
        metavar="N",
        help="run shards in N workers (default: smoke in this process, larger tiers one process per CPU)",
    )
    shards.add_argument(
        "--backend",
        choices=("inline", "threads", "processes", "ray"),
        help="inline (1 worker), threads (N threads of this process; a thread-safe implementation), "
        "processes (default for N > 1), ray",
    )
    shards.add_argument("--shards", type=positive_int, metavar="S", help="shards in the plan (default 4 per worker)")
    shards.add_argument("--ray-address", metavar="ADDR", help="an existing Ray cluster (default: start a local one)")
    shards.add_argument(
        "--until-decisive",
        action="store_true",
        help="anytime stopping: stop at the first decisive e-process (10%% of alpha; the battery gets 90%%)",
    )
    endpoint_arguments(audit)
    audit.add_argument(
        "--out",
        metavar="DIR",
        default="specverify-report",
        help="directory for report.json/.md/.html (default ./specverify-report)",
    )
    audit.add_argument("--no-plots", action="store_true", help="skip the PNG plots in report.html")
    audit.add_argument("--json", action="store_true", help="print the report JSON instead of the summary")
    audit.add_argument(
        "--debug",
        action="store_true",
        help="show the traceback when an implementation cannot be built or the run stops",
    )


def _add_others(sub) -> None:
    """The ``selftest`` and ``demo`` subcommands."""
    selftest = sub.add_parser("selftest", help="mutation score and calibration of the suite itself")
    selftest.add_argument("--tier", choices=TIERS, default="smoke")
    selftest.add_argument("--seed", type=nonnegative_int, default=0)
    selftest.add_argument("--json", action="store_true", help="print the matrix as JSON")
    selftest.add_argument(
        "--matrix", metavar="PATH", help="also write the Markdown mutation matrix (with the peers' tests) to PATH"
    )
    selftest.add_argument(
        "--workers",
        type=positive_int,
        default=1,
        help="worker processes, one core each (the same rows for any number; default 1)",
    )

    sub.add_parser("demo", help="run the canonical rule against an adversarial drafter and print the emitted law")


def _run_audit(args) -> int:
    if args.endpoint:
        from specverify.cli.endpoint import run_endpoint_audit

        report = run_endpoint_audit(args)
    else:
        report = run_audit(args, progress=Progress())
    from specverify.report import terminal_summary, write_report  # after the run: a bad spec fails fast

    paths = write_report(report, Path(args.out), plots=not args.no_plots)
    print(report.to_json() if args.json else terminal_summary(report))
    if not args.json:
        print(f"report: {paths.get('html', paths.get('json'))}")
    if report.verdict == "error":  # the implementation could not be tested
        return EXIT_USAGE
    fidelity = report.extra.get("logprob_fidelity") if isinstance(report.extra, dict) else None
    if getattr(args, "gate_logprobs", False) and isinstance(fidelity, dict) and fidelity.get("verdict") == "fail":
        return EXIT_FAIL  # the law may pass: the reported logprobs were asked to gate too
    return EXIT_PASS if report.passed else EXIT_FAIL


def parse_command(command: str) -> argparse.Namespace:
    """Parse a recorded ``specverify ...`` command line with this CLI's own parser.

    Raises
    ------
    InvalidArgument
        If ``command`` is not a ``specverify`` command line or the parser rejects it.
    """
    argv = shlex.split(command)
    if not argv or argv[0] != "specverify":
        raise InvalidArgument(f"command must start with 'specverify', got {command!r}")
    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr):
            return build_parser().parse_args(argv[1:])
    except SystemExit:
        message = " ".join(stderr.getvalue().split()[-30:])
        raise InvalidArgument(f"the specverify parser rejected {command!r}: {message}") from None


def audit_report(argv: list[str], *, progress=None):
    """Run ``specverify audit ARGV`` in-process (no files written) and return its Report.

    The arguments go through this CLI's own parser, so the report's ``command`` is the
    canonical line of exactly this run.
    """
    args = parse_command("specverify audit " + shlex.join(argv))
    return run_audit(args, progress=progress)


def _print_error(error: BaseException, debug: bool) -> None:
    cause = error.__cause__ if isinstance(error, SpecVerifyError) else error
    if debug and cause is not None:
        traceback.print_exception(type(cause), cause, cause.__traceback__, file=sys.stderr)
    if isinstance(error, SpecVerifyError):
        print(f"specverify: error: {error}", file=sys.stderr)
    else:
        message = " ".join(str(error).split()) or "(no message)"
        hint = "" if debug else " (--debug shows the traceback)"
        print(f"specverify: error: the run stopped: {type(error).__name__}: {message}{hint}", file=sys.stderr)


def console_main() -> int:
    """The ``specverify`` executable and ``python -m specverify``: :func:`main`, in a process whose large
    freed blocks are reused (:func:`specverify.core.allocator.reuse_large_blocks`; the process is the
    command's own, unlike an in-process call of :func:`main`) -- except an endpoint audit's."""
    return main(own_process=True)


def reuses_large_blocks(args: argparse.Namespace) -> bool:
    """Whether the command's process keeps large freed blocks for reuse: every command but an endpoint
    audit.  An endpoint audit's client holds what its worker threads parse between the (rows, V)
    blocks it checks, so a heap that is never trimmed only grows (measured at V = 8,192: client peak
    1.07 GB with the blocks kept, 0.58 GB without)."""
    return not (args.command == "audit" and getattr(args, "endpoint", None))


def main(argv: list[str] | None = None, *, own_process: bool = False) -> int:
    """Run the ``specverify`` command line; return its exit status (0 pass, 1 fail, 2 usage or broken implementation).

    Errors are one line on stderr; ``audit --debug`` adds the traceback of what raised.  Ctrl-C is one
    line too (an endpoint audit says how many replies it stored and that the same command resumes),
    exit 130.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    args = parser.parse_args(argv)
    if own_process and reuses_large_blocks(args):
        from specverify.core.allocator import reuse_large_blocks

        reuse_large_blocks()
    put_on_import_path()  # as python -m does: PKG.MOD specs resolve from the working directory
    debug = bool(getattr(args, "debug", False))
    try:
        if args.command == "audit":
            return _run_audit(args)
        if args.command == "measure":
            return measure_command.run(args)
        if args.command == "bench":
            return bench_command.run(args, argv)
        if args.command == "selftest":
            from specverify.selftest import main as selftest_main

            return selftest_main(
                tier=args.tier, seed=args.seed, as_json=args.json, matrix_path=args.matrix, workers=args.workers
            )
        if args.command == "demo":
            from specverify.cli.demo import main as demo_main

            return demo_main()
    except KeyboardInterrupt as stop:  # Ctrl-C: one line, the shell's 128 + SIGINT
        line = stop.line() if callable(getattr(stop, "line", None)) else "interrupted"
        print(f"specverify: {line}", file=sys.stderr, flush=True)
        return EXIT_INTERRUPTED
    except SpecVerifyError as error:
        _print_error(error, debug)
        return EXIT_USAGE
    except Exception as error:  # an implementation that breaks the run outside the audit's own checks
        if args.command not in ("audit", "measure", "bench"):
            raise
        _print_error(error, debug)
        return EXIT_USAGE
    parser.print_help()
    return EXIT_PASS


if __name__ == "__main__":
    sys.exit(main())
