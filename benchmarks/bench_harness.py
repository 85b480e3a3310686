"""Throughput of the table-model harness (specverify.verifier.harness.run_harness) with the canonical rule.

Prints emitted tokens per second (wall) and per CPU-second (``time.process_time``,
all threads of this process) for a positional (gather-only) target and a Markov
target, V=32, K=4, large B, with the verifier called without input validation
(``check=False``, a trusted hot loop) and with full checks.  Target on 2 CPU
cores: >= 4 M tokens/s.  The machine is often shared: the load average is printed
with the numbers; wall time under load says little, CPU time is the robust figure
(with one thread, tokens per CPU-second is the single-core rate).

Run: ``nice python benchmarks/bench_harness.py [--batch 65536] [--threads 1]``.
"""

from __future__ import annotations

import argparse
import os
import time

import torch

from reference.rules import verify
from specverify.core import tables
from specverify.verifier import zoo
from specverify.verifier.harness import run_harness


def fast_verify(target_probs, draft_probs, draft_tokens, *, generator):
    """The canonical rule without input validation (what a trusted hot loop would call)."""
    return verify(target_probs, draft_probs, draft_tokens, generator=generator, check=False)


def load() -> str:
    return "load {:.2f} {:.2f} {:.2f}".format(*os.getloadavg())


def bench(name, target, drafter, *, batch, length, k, repeats, verifier):
    gen = torch.Generator().manual_seed(0)
    run_harness(verifier, target, drafter, k=k, batch_size=min(batch, 4096), length=length, generator=gen)  # warm-up
    best_wall = best_cpu = float("inf")
    for _ in range(repeats):
        w0, c0 = time.perf_counter(), time.process_time()
        run = run_harness(verifier, target, drafter, k=k, batch_size=batch, length=length, generator=gen)
        best_wall = min(best_wall, time.perf_counter() - w0)
        best_cpu = min(best_cpu, time.process_time() - c0)
    acc = run.trial_accepted.double().mean().item()
    print(
        f"{name:<36} {run.num_tokens / 1e6:.2f} M tokens, {run.num_calls} calls, acceptance {acc:.3f}: "
        f"wall {best_wall:.3f} s = {run.num_tokens / best_wall / 1e6:.2f} M tokens/s; "
        f"CPU {best_cpu:.3f} s = {run.num_tokens / best_cpu / 1e6:.2f} M tokens/CPU-s  [{load()}]",
        flush=True,
    )
    return run.num_tokens / best_wall, run.num_tokens / best_cpu


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=65536)
    parser.add_argument("--length", type=int, default=32)
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch intra-op threads (1: serial, the robust setting on a shared machine)",
    )
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, {os.cpu_count()} CPUs, B={args.batch} "
        f"L={args.length} K={args.k} V={args.vocab}, best of {args.repeats}  [{load()}]"
    )
    V = args.vocab
    pos = tables.positional(V, args.length, "peaked", seed=1)
    mk = tables.markov(V, "peaked", seed=2)
    common = dict(batch=args.batch, length=args.length, k=args.k, repeats=args.repeats)
    for label, verifier in (("check=False", fast_verify), ("full checks", verify)):
        print(f"-- reference.rules.verify ({label})")
        bench("positional target, noisy drafter", pos, zoo.noisy(pos, 0.5), verifier=verifier, **common)
        bench("positional target, uniform drafter", pos, zoo.uniform(pos), verifier=verifier, **common)
        bench("markov target, temperature drafter", mk, zoo.temperature(mk, 1.5), verifier=verifier, **common)


if __name__ == "__main__":
    main()
