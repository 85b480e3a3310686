"""Wall time of what a new user runs first: usage errors, ``--help``, the smoke audit and the self-test.

Each command runs as a whole process (interpreter start and imports included), ``--runs`` times,
and the median wall time is printed with the machine it ran on (CPU model, CPUs this process may
use, the load average before the first run):

* usage errors, which must answer well under a second: ``--help``, a module that does not exist,
  a negative seed, an alpha outside (0, 1), an unknown tier;
* with ``--journeys``: the README's smoke audit (``specverify audit --verifier
  reference.rules:verify --tier smoke``) and ``specverify selftest --tier smoke`` (one run: it is
  long), the figures the README states.

``--source DIR`` times the command of another checkout (``PYTHONPATH=DIR``; e.g. a ``git worktree``
of an older commit, for before/after figures); the default is this checkout.

Run: python benchmarks/bench_cli.py [--runs 5] [--journeys] [--source DIR]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from specverify.core.machine import describe_machine

ROOT = Path(__file__).resolve().parents[1]
USAGE_ERRORS = {
    "--help": ["--help"],
    "module not found": ["audit", "--verifier", "nosuch.mod:verify"],
    "negative seed": ["audit", "--verifier", "reference.rules:verify", "--seed", "-1"],
    "alpha outside (0, 1)": ["audit", "--verifier", "reference.rules:verify", "--alpha", "2"],
    "unknown tier": ["audit", "--verifier", "reference.rules:verify", "--tier", "huge"],
}
JOURNEYS = {
    "smoke audit (README)": ["audit", "--verifier", "reference.rules:verify", "--tier", "smoke", "--no-plots"],
    "selftest --tier smoke": ["selftest", "--tier", "smoke"],
}
#: The ``specverify`` command of the checkout on ``PYTHONPATH`` (a console script would import this one).
COMMAND = [sys.executable, "-c", "import sys; from specverify.cli import main; sys.exit(main())"]


def wall(argv: list[str], source: Path, out: Path) -> float:
    env = {**os.environ, "PYTHONPATH": str(source)}
    start = time.perf_counter()
    subprocess.run([*COMMAND, *argv], cwd=out, env=env, capture_output=True, check=False)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--journeys", action="store_true", help="also the smoke audit and the smoke self-test")
    parser.add_argument("--source", type=Path, default=ROOT, help="checkout to time (default: this one)")
    args = parser.parse_args()
    print(f"# {describe_machine()} before the first run; source {args.source}")
    print("| command | median wall s | runs |")
    print("|---|---|---|")
    commands = {**USAGE_ERRORS, **(JOURNEYS if args.journeys else {})}
    with tempfile.TemporaryDirectory() as out:
        for name, argv in commands.items():
            runs = 1 if name.startswith("selftest") else args.runs
            times = [wall(argv, args.source.resolve(), Path(out)) for _ in range(runs)]
            print(f"| {name} | {statistics.median(times):.2f} | {runs} |", flush=True)


if __name__ == "__main__":
    main()
