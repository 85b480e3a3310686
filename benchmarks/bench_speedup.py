"""specverify bench against a known answer, and the bench client's own cost.

Two paced local servers (``python -m specverify.endpoint.localserver --pace-pass P --pace-draft d``):
the speculative one (K = 3, the reference's early-exit drafter, or ``--perfect-drafter``: the
target drafting for itself, every draft accepted) and the plain one.  Their true saving per reply
is ``L P - R (K d + P)`` (``specverify.endpoint.localpace``), R read from the server's counters.
For each drafter and concurrency this prints the saving's closed form beside the bench's
interval, the end-to-end and time-per-output-token speedups, the paced steps that outlasted
their pace (where there are any, the closed form does not apply), and the client's CPU time
over the wall time (``time.process_time`` of this process, every client thread included): the
bench client's own overhead.

    python benchmarks/bench_speedup.py [--pairs 8] [--concurrency 1 4 16] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
import urllib.request

from specverify.bench.analysis import summarise
from specverify.bench.runner import run_levels
from specverify.bench.timed import EndpointSubject
from specverify.endpoint.http import HttpClient, Limits
from specverify.endpoint.localpace import Pace, paced_saving, paced_speedup

PASS, DRAFT, K, L = 0.05, 0.005, 3, 12


def start(*options: str) -> tuple[subprocess.Popen, str]:
    process = subprocess.Popen(
        [sys.executable, "-m", "specverify.endpoint.localserver", "--port", "0", "--k", str(K),
         "--pace-pass", str(PASS), "--pace-draft", str(DRAFT), *options],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    return process, process.stdout.readline().split()[1]


def overruns(url: str) -> float:
    with urllib.request.urlopen(url.removesuffix("/v1") + "/metrics", timeout=10) as reply:
        text = reply.read().decode()
    return sum(float(x.split()[-1]) for x in text.splitlines() if x.startswith("specverify_paced_step_overruns"))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pairs", type=int, default=8)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    prompts = [[1, 2, 3], [4, 5, 6, 7], [9, 9], [10, 11, 12, 13, 14]]
    rows = []
    baseline, base_url = start("--no-speculation")
    try:
        for drafter, options in (("reference", ()), ("perfect", ("--perfect-drafter",))):
            server, url = start(*options)
            try:
                time.sleep(2)  # the servers' start-up work (imports, the hostile modes' payloads) done
                subjects = {
                    arm: EndpointSubject(
                        HttpClient(u, limits=Limits(retries=0)),
                        model="tiny-reference",
                        max_tokens=L,
                        sampling={},
                        seed=0,
                    )  # fmt: skip
                    for arm, u in (("speculative", url), ("baseline", base_url))
                }
                for c in args.concurrency:
                    before = overruns(url) + overruns(base_url)
                    wall, cpu = time.perf_counter(), time.process_time()
                    (level,) = run_levels(subjects, prompts, concurrency=(c,), pairs=args.pairs, warmup_pairs=1,
                                          requests_per_client=2)  # fmt: skip
                    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
                    summary = summarise(level, seed=0)
                    rounds = level.counters.drafts / summary.speculative.requests
                    row = {
                        "drafter": drafter,
                        "concurrency": c,
                        "rounds_per_reply": rounds,
                        "saving_ms_closed_form": 1e3
                        * paced_saving(Pace(PASS, DRAFT), k=K, max_tokens=L, rounds_per_request=rounds),  # fmt: skip
                        "saving_ms": summary.saved_ms.as_dict(),
                        "speedup_steps_closed_form": paced_speedup(
                            Pace(PASS, DRAFT), k=K, max_tokens=L, rounds_per_request=rounds
                        ),  # fmt: skip
                        "speedup_latency_mean": summary.speedups["latency_mean"].as_dict(),
                        "speedup_tpot_mean": summary.speedups["tpot_mean"].as_dict(),
                        "overruns": overruns(url) + overruns(base_url) - before,
                        "client_cpu_s": cpu,
                        "wall_s": wall,
                        "client_cpu_share": cpu / wall,
                    }
                    rows.append(row)
                    saving = summary.saved_ms
                    print(f"{drafter:9s} c={c:2d}: saving {row['saving_ms_closed_form']:.1f} ms closed form, "
                          f"{saving.text(1)} measured ({'covered' if saving.covers(row['saving_ms_closed_form']) else 'NOT covered'}); "
                          f"speedup e2e {summary.speedups['latency_mean'].text()} (steps' {row['speedup_steps_closed_form']:.2f}), "
                          f"tpot {summary.speedups['tpot_mean'].text()}; overruns {row['overruns']:.0f}; "
                          f"client CPU {cpu:.2f} s of {wall:.1f} s = {100 * cpu / wall:.2f}%", flush=True)  # fmt: skip
            finally:
                server.kill()
                server.wait()
    finally:
        baseline.kill()
        baseline.wait()
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"pace": {"pass": PASS, "draft": DRAFT, "k": K, "max_tokens": L}, "rows": rows}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
