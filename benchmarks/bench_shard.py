"""Scaling of sharded batteries (specverify.shard): 1 vs 2 workers, local processes vs Ray, merge cost.

Runs the reference verifier's battery (default: the standard tier, 16x the smoke samples; the
deep tier is 32x that) as

* inline: one process, one torch thread (the baseline: what one worker does; inline sampling
  always runs on one torch thread since the default-parallelism change, bench_defaults.py);
* processes: 2 local worker processes, 4 shards per worker;
* ray: a local Ray instance of 2 CPUs, 4 shards per worker (if ray is installed);

and reports for each the wall time, the driver's CPU time and its merge time (scenarios split
across shards are merged and analysed in the driver; whole ones are analysed in their worker).
Every configuration must give the same statistics (checked).  The projection of the deep tier
on W workers scales the best 1-process wall time by the groups (32x the standard tier) and
divides by W at the measured 2-worker efficiency.

Run: python benchmarks/bench_shard.py [--tier standard] [--scenario NAME ...] [--no-ray]
"""

from __future__ import annotations

import argparse
import time

import torch

import specverify as sv
from specverify.verifier.scenarios import get_scenarios
from specverify_reference.rules import verify

DEEP_OVER = {"smoke": 512, "standard": 32, "deep": 1}


def run(tier: str, scenarios, backend: str | None, workers: int, threads: int) -> dict:
    """One audit; its wall time, CPU time of this process, the driver's merge time and the statistics."""
    torch.set_num_threads(threads)  # the driver's (inline: the harness's); worker processes use 1 each
    t0, c0 = time.perf_counter(), time.process_time()
    report = sv.check_verifier(verify, tier=tier, seed=0, scenarios=scenarios, backend=backend, workers=workers)
    wall = time.perf_counter() - t0
    record = report.extra.get("sharding", {})
    return {
        "wall": wall,
        "driver_cpu": time.process_time() - c0,
        "merge": record.get("merge_seconds", float("nan")),
        "stats": [(r.name, r.scenario, r.position, r.statistic, r.pvalue) for r in report.results],
        "record": record,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tier", default="standard", choices=("smoke", "standard", "deep"))
    parser.add_argument("--scenario", action="append")
    parser.add_argument("--no-ray", action="store_true")
    args = parser.parse_args()
    scenarios = [s.name for s in get_scenarios(args.scenario)]
    configs = [("inline", "inline", 1, 1), ("processes", "processes", 2, 1)]
    if not args.no_ray:
        try:
            import ray  # noqa: F401

            configs.append(("ray", "ray", 2, 1))
        except ImportError:
            print("(ray not installed: skipping the Ray row)")
    rows: dict = {}
    for key, backend, workers, threads in configs:
        rows[key] = r = run(args.tier, scenarios, backend, workers, threads)
        same = r["stats"] == rows["inline"]["stats"]
        print(
            f"{key:16s} workers={workers}  wall {r['wall']:7.1f} s  driver CPU {r['driver_cpu']:6.1f} s  "
            f"merge {r['merge']:5.2f} s  speedup {rows['inline']['wall'] / r['wall']:4.2f}x  same statistics: {same}",
            flush=True,
        )
        assert same, f"{key}: statistics differ from the inline run"
    inline = rows["inline"]["wall"]  # one process, one thread: the work one worker does
    two = min(r["wall"] for k, r in rows.items() if not k.startswith("inline"))
    efficiency = inline / (2 * two)
    scale = DEEP_OVER[args.tier]
    for w in (1, 8):
        projected = inline * scale / (w * (efficiency if w > 1 else 1.0))
        print(f"projected deep tier on {w} worker(s): {projected / 60:6.1f} min (2-worker efficiency {efficiency:.2f})")


if __name__ == "__main__":
    main()
