"""Scaling of sharded batteries (specverify.shard): 1 vs 2 workers, local processes vs Ray, merge cost.

Runs the reference verifier's battery (default: the standard tier, 16x the smoke samples; the
deep tier is 32x that) as

* inline: one process, the default plan;
* processes: 2 local worker processes, 4 shards per worker;
* ray: a local Ray instance of 2 CPUs, 4 shards per worker (if ray is installed);

and reports for each the wall time, the time spent collecting shards (harness runs, transfer)
and the driver's time merging the groups' runs and analysing/grading once.  Every
configuration must give the same statistics (checked).  The projection of the deep tier on W
workers assumes collection scales with the groups (32x the standard tier) and divides by W
at the measured 2-worker efficiency, while the merge and analysis stay on the driver and
scale with the data.

Run: python benchmarks/bench_shard.py [--tier standard] [--scenario NAME ...] [--no-ray]
"""

from __future__ import annotations

import argparse
import time

import torch

from reference.rules import verify
from specverify import stats
from specverify.shard import Job
from specverify.shard.collect import collect_runs
from specverify.verifier.battery import scenario_results
from specverify.verifier.scenarios import get_scenarios

DEEP_OVER = {"smoke": 512, "standard": 32, "deep": 1}


def run(tier: str, scenarios, backend: str | None, workers: int) -> dict:
    t0 = time.perf_counter()
    collected = collect_runs(Job("verifier", verify, tier, 0), scenarios, tier=tier, backend=backend, workers=workers)
    t1 = time.perf_counter()
    results = []
    for scenario in scenarios:
        target, drafter = scenario.build()
        run_, error = collected.runs[scenario.name], collected.errors.get(scenario.name)
        results += scenario_results(scenario.name, run_, error, target, drafter, alpha=1e-3, seed=0)[0]
    graded = stats.grade(results, alpha=1e-3)
    t2 = time.perf_counter()
    return {
        "collect": t1 - t0,
        "analyse": t2 - t1,
        "merge": collected.record.get("merge_seconds", float("nan")),
        "wall": t2 - t0,
        "stats": [(r.name, r.scenario, r.position, r.statistic, r.pvalue) for r in graded],
        "record": collected.record,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tier", default="standard", choices=("smoke", "standard", "deep"))
    parser.add_argument("--scenario", action="append")
    parser.add_argument("--no-ray", action="store_true")
    args = parser.parse_args()
    scenarios = get_scenarios(args.scenario)
    torch.set_num_threads(2)
    configs = [("inline", None, 1), ("processes", "processes", 2)]
    if not args.no_ray:
        try:
            import ray  # noqa: F401

            configs.append(("ray", "ray", 2))
        except ImportError:
            print("(ray not installed: skipping the Ray row)")
    rows = {}
    for label, backend, workers in configs:
        rows[label] = run(args.tier, scenarios, backend, workers)
        r = rows[label]
        same = r["stats"] == rows["inline"]["stats"]
        print(
            f"{label:10s} workers={workers}  wall {r['wall']:7.1f} s  collect {r['collect']:7.1f} s  "
            f"merge {r['merge']:5.2f} s  analyse+grade {r['analyse']:6.1f} s  speedup "
            f"{rows['inline']['wall'] / r['wall']:4.2f}x  same statistics: {same}",
            flush=True,
        )
        assert same, f"{label}: statistics differ from the inline run"
    inline = rows["inline"]
    best2 = min((rows[k] for k in rows if k != "inline"), key=lambda r: r["collect"])
    efficiency = inline["collect"] / (2 * best2["collect"])
    scale = DEEP_OVER[args.tier]
    for w in (1, 8):
        collect = inline["collect"] * scale / (w * (efficiency if w > 1 else 1.0))
        analyse = inline["analyse"] * scale
        print(
            f"projected deep tier on {w} worker(s): collect {collect / 60:6.1f} min + merge/analyse "
            f"{analyse / 60:5.1f} min on the driver (2-worker collection efficiency {efficiency:.2f})"
        )


if __name__ == "__main__":
    main()
