"""Throughput of the tree harness (specverify.verifier.tree.harness) with the reference tree rules.

Emitted tokens per second (wall) and per CPU-second for trees of N = 8, 16, 32, 64 nodes
(branchings 2x3, 4x3, 2x3x4, 4x3x4) and V = 32, 1024, 32768, positional tables (peaked
target, noisy drafter), children drawn i.i.d. (SpecInfer: exact acceptance averaged over
the drafting) or top-k (EAGLE-2/3).  Rows per verifier call are capped so that a call
holds at most 2^24 probabilities.  The load average is printed with the numbers.

Run: ``nice python benchmarks/bench_tree.py [--threads 2] [--repeats 2]``.
"""

from __future__ import annotations

import argparse
import os
import time

import torch

from specverify.core import tables
from specverify.verifier import zoo
from specverify.verifier.tree.drafting import TreeDrafting
from specverify.verifier.tree.harness import run_tree_harness
from specverify_reference.tree_rules import verify_tree

SHAPES = {8: (2, 3), 16: (4, 3), 32: (2, 3, 4), 64: (4, 3, 4)}


def bench(V: int, N: int, mode: str, *, length: int, repeats: int) -> tuple[float, float, float]:
    target = tables.positional(V, length, "peaked", seed=1)
    drafter = zoo.noisy(target, sigma=0.5, seed=2)
    rows = max(16, min(4096, (1 << 24) // ((N + 1) * V)))
    spec = TreeDrafting(mode, SHAPES[N])
    best_wall = best_cpu = float("inf")
    tokens = 0
    for r in range(repeats + 1):  # the first run warms caches (exact acceptance per context)
        gen = torch.Generator().manual_seed(r)
        wall, cpu = time.perf_counter(), time.process_time()
        run = run_tree_harness(verify_tree, target, drafter, spec, batch_size=rows, length=length, generator=gen).run
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        tokens = run.tokens.numel()
        if r:
            best_wall, best_cpu = min(best_wall, wall), min(best_cpu, cpu)
    return tokens / best_wall, tokens / best_cpu, tokens


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--length", type=int, default=8)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {args.threads} threads, {os.cpu_count()} cores, "
          "load {:.2f} {:.2f} {:.2f}".format(*os.getloadavg()))  # fmt: skip
    print(f"{'mode':5s} {'V':>6s} {'N':>3s} {'tokens':>8s} {'tokens/s':>10s} {'tokens/CPU-s':>13s}")
    for mode in ("topk", "iid"):
        for V in (32, 1024, 32768):
            for N in (8, 16, 32, 64):
                wall, cpu, tokens = bench(V, N, mode, length=args.length, repeats=args.repeats)
                print(f"{mode:5s} {V:6d} {N:3d} {tokens:8d} {wall:10,.0f} {cpu:13,.0f}", flush=True)
    print("load {:.2f} {:.2f} {:.2f}".format(*os.getloadavg()))


if __name__ == "__main__":
    main()
