"""Wall time of the README's audit command under the default parallelism and its alternatives, idle and with a core busy.

Each configuration runs ``specverify audit --verifier reference.rules:verify --tier TIER`` as a
whole process (start-up included) ``--runs`` times and prints the median wall time:

* ``default``            -- no sharding flag (smoke: in this process; larger tiers: one worker
  process per CPU);
* ``inline, 1 thread``   -- ``--workers 1``: this process, on one torch thread;
* ``2 processes``        -- ``--workers 2``.

The figures before this default (inline on torch's own 2 threads) come from running the same
command on the previous commit (benchmarks/README.md gives both).

``--busy`` runs the same with a Python busy loop holding one core (another job on a shared
machine).  The numbers behind :func:`specverify.shard.backends.default_parallelism` are in
benchmarks/README.md ("Default parallelism").

Run: python benchmarks/bench_defaults.py [--tier smoke|standard] [--runs 3] [--busy]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

from specverify.core.machine import describe_machine

AUDIT = [
    os.path.join(os.path.dirname(sys.executable), "specverify"),
    "audit",
    "--verifier",
    "reference.rules:verify",
    "--no-plots",
]
CONFIGS = {
    "default": [],
    "inline, 1 thread": ["--workers", "1"],
    "2 processes": ["--workers", "2"],
}


def wall(argv: list[str]) -> float:
    with tempfile.TemporaryDirectory() as out:
        start = time.perf_counter()
        subprocess.run([*argv, "--out", out], check=True, capture_output=True)
        return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tier", default="smoke", choices=("smoke", "standard"))
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--busy", action="store_true", help="hold one core with a busy loop meanwhile")
    args = parser.parse_args()
    print(f"# {describe_machine()} before the first run")
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if args.busy else None
    try:
        for name, extra in CONFIGS.items():
            times = [wall([*AUDIT, "--tier", args.tier, *extra]) for _ in range(args.runs)]
            print(
                f"{args.tier:9s} {'busy' if args.busy else 'idle'}  {name:18s} median {statistics.median(times):6.1f} s  (runs: {', '.join(f'{t:.1f}' for t in times)})"
            )
    finally:
        if busy is not None:
            busy.kill()


if __name__ == "__main__":
    main()
