"""Throughput of the table-model harness (specverify.harness.run_harness) with the canonical rule.

Prints emitted tokens per second for a positional (gather-only) target and a
Markov target, V=32, K=4, large B.  Target on 2 CPU cores: >= 4 M tokens/s.
Run: ``nice python benchmarks/bench_harness.py [--batch 65536] [--threads 2]``.
"""

from __future__ import annotations

import argparse
import time

import torch

from reference.rules import verify
from specverify import drafters, models
from specverify.harness import run_harness


def fast_verify(target_probs, draft_probs, draft_tokens, *, generator):
    """The canonical rule without input validation (what a trusted hot loop would call)."""
    return verify(target_probs, draft_probs, draft_tokens, generator=generator, check=False)


def bench(name, target, drafter, *, batch, length, k, repeats, verifier):
    gen = torch.Generator().manual_seed(0)
    run_harness(verifier, target, drafter, k=k, batch_size=min(batch, 4096), length=length, generator=gen)  # warm-up
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        run = run_harness(verifier, target, drafter, k=k, batch_size=batch, length=length, generator=gen)
        best = min(best, time.perf_counter() - t0)
    rate = run.num_tokens / best
    acc = run.trial_accepted.double().mean().item()
    print(f"{name:<40} B={batch} L={length} K={k} V={target.vocab_size}: {run.num_tokens / 1e6:.2f} M tokens in "
          f"{best:.3f} s = {rate / 1e6:.2f} M tokens/s ({run.num_calls} verify calls, acceptance {acc:.3f})")
    return rate


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=65536)
    parser.add_argument("--length", type=int, default=32)
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    V = args.vocab
    pos = models.positional(V, args.length, "peaked", seed=1)
    mk = models.markov(V, "peaked", seed=2)
    common = dict(batch=args.batch, length=args.length, k=args.k, repeats=args.repeats)
    for label, verifier in (("reference.rules.verify (check=False)", fast_verify), ("reference.rules.verify (checked)", verify)):
        print(f"-- verifier: {label}")
        bench("positional target, noisy drafter", pos, drafters.noisy(pos, 0.5), verifier=verifier, **common)
        bench("positional target, uniform drafter", pos, drafters.uniform(pos), verifier=verifier, **common)
        bench("markov target, temperature drafter", mk, drafters.temperature(mk, 1.5), verifier=verifier, **common)


if __name__ == "__main__":
    main()
