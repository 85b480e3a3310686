"""Where an endpoint audit's wall time goes, against the local server: waiting on the server, the client, the battery.

Starts ``python -m specverify.endpoint.localserver`` (the reference decoder, speculative, V = 64)
as a process on 127.0.0.1 and runs ``check_endpoint`` in exact-conditional mode at the smoke tier
(2 prompts, L = 8) for each ``--num-samples`` and ``--samples-per-request``, with a fresh store
each time.  From the audit's ledger (``report.extra["endpoint"]``):

* ``waiting``: wall time with at least one request in flight;
* ``client``: wall time inside the client with no request in flight (building requests, reading the
  store, planning the prefix trie, parsing and storing replies that did not overlap a request);
* ``rest``: everything else of the audit's wall time: the decoder battery's statistics and the
  target laws' processing, the same work an in-process audit does.

Run: python benchmarks/bench_endpoint.py [--num-samples 1000 4000] [--samples-per-request 1 50] [--concurrency 8]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time

from specverify.core.machine import describe_machine
from specverify.endpoint.checks import check_endpoint


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--num-samples", type=int, nargs="+", default=[1000, 4000])
    parser.add_argument("--samples-per-request", type=int, nargs="+", default=[1, 50])
    parser.add_argument("--concurrency", type=int, default=8)
    args = parser.parse_args()
    server = subprocess.Popen(
        [sys.executable, "-m", "specverify.endpoint.localserver", "--port", "0", "--max-logprobs", "-1"],
        stdout=subprocess.PIPE,
        text=True,
    )
    url = server.stdout.readline().split()[1]
    print(f"# {describe_machine()}; server {url}, concurrency {args.concurrency}")
    print("| N per prompt | n per request | requests | audit wall s | waiting s | client s (share) | rest s (share) |")
    print("|---|---|---|---|---|---|---|")
    try:
        for n in args.num_samples:
            for per in args.samples_per_request:
                with tempfile.TemporaryDirectory() as out:
                    t0 = time.perf_counter()
                    report = check_endpoint(url, "tiny-reference", num_samples=n, samples_per_request=per,
                                            concurrency=args.concurrency, out_dir=out)  # fmt: skip
                    wall = time.perf_counter() - t0
                e = report.extra["endpoint"]
                client = e["client_overhead_seconds"]
                rest = wall - e["fetch_seconds"]
                print(f"| {n} | {per} | {sum(e['requests_sent'].values())} | {wall:.1f} | {e['waiting_seconds']:.1f} | "
                      f"{client:.2f} ({client / wall:.1%}) | {rest:.1f} ({rest / wall:.1%}) |", flush=True)  # fmt: skip
    finally:
        server.terminate()
        server.wait()


if __name__ == "__main__":
    main()
