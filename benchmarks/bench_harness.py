"""Throughput of the table-model harness (specverify.verifier.harness.run_harness) with the canonical rule.

Prints emitted tokens per second (wall) and per CPU-second (``time.process_time``,
all threads of this process) for a positional (gather-only) target and a Markov
target, V=32, K=4, large B, with the verifier called without input validation
(``check=False``, a trusted hot loop) and with full checks.  Target on 2 CPU
cores: >= 4 M tokens/s.  The machine is often shared: the load average is printed
with the numbers; wall time under load says little, CPU time is the robust figure
(with one thread, tokens per CPU-second is the single-core rate).

With full checks it runs every drafter of the zoo on both targets and names the slowest;
``--profile NAME`` prints a cProfile of one run instead.

Run: ``nice python benchmarks/bench_harness.py [--batch 65536] [--threads 2] [--zoo-only] [--profile noisy]``.
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
    parser.add_argument("--zoo-only", action="store_true", help="only the full-check runs over the zoo")
    parser.add_argument("--profile", metavar="DRAFTER", help="cProfile one full-check run (positional target)")
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
    if args.profile:
        import cProfile
        import pstats

        profiler = cProfile.Profile()
        profiler.enable()
        bench(
            f"PROFILE positional, {args.profile}", pos, zoo.make_drafter(args.profile, pos), verifier=verify, **common
        )
        profiler.disable()
        pstats.Stats(profiler).sort_stats("tottime").print_stats(25)
        return
    if not args.zoo_only:
        print("-- reference.rules.verify (check=False)")
        bench("positional target, noisy drafter", pos, zoo.noisy(pos, 0.5), verifier=fast_verify, **common)
        bench("positional target, uniform drafter", pos, zoo.uniform(pos), verifier=fast_verify, **common)
        bench("markov target, temperature drafter", mk, zoo.temperature(mk, 1.5), verifier=fast_verify, **common)
    print("-- reference.rules.verify (full checks), every zoo drafter")
    rates = {}
    for target_name, target in (("positional", pos), ("markov", mk)):
        for name in zoo.ZOO:
            wall, cpu = bench(f"{target_name} target, {name} drafter", target, zoo.make_drafter(name, target),
                              verifier=verify, **common)  # fmt: skip
            rates[f"{target_name}/{name}"] = cpu
    worst = min(rates, key=rates.get)
    print(f"slowest: {worst} at {rates[worst] / 1e6:.2f} M tokens/CPU-s  [{load()}]")


if __name__ == "__main__":
    main()
