"""Throughput of the reference sampler and verifier on CPU (a script, not a test).

Prints draws/s of ``reference.sampling.sample`` next to ``torch.multinomial`` at
V=32, and verified blocks/s of ``reference.rules.verify`` at B=200,000, K=4,
V=32 (with and without input validation), each the median of a few repeats with
``torch.set_num_threads(2)``.  Timings on a shared machine are noisy.

Usage: python benchmarks/bench_rules.py [--repeats 5] [--threads 2]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from reference.rules import verify
from reference.sampling import sample


def median_seconds(fn, repeats: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def random_probs(generator: torch.Generator, *shape: int, dtype=torch.float32) -> torch.Tensor:
    return torch.softmax(2.0 * torch.randn(*shape, generator=generator), -1).to(dtype)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    generator = torch.Generator().manual_seed(0)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, median of {args.repeats} repeats")

    V, N = 32, 2_000_000
    probs = random_probs(generator, N, V)  # (N, V)
    t = median_seconds(lambda: sample(probs, generator=generator, check=False), args.repeats)
    print(f"sample            V={V} N={N:,}: {N / t / 1e6:7.2f} M draws/s ({t * 1e3:.0f} ms)")
    t = median_seconds(lambda: sample(probs, generator=generator), args.repeats)
    print(f"sample (checked)  V={V} N={N:,}: {N / t / 1e6:7.2f} M draws/s ({t * 1e3:.0f} ms)")
    t = median_seconds(lambda: torch.multinomial(probs, 1, generator=generator), args.repeats)
    print(f"torch.multinomial V={V} N={N:,}: {N / t / 1e6:7.2f} M draws/s ({t * 1e3:.0f} ms)")

    B, K = 200_000, 4
    target_probs = random_probs(generator, B, K + 1, V)  # (B, K+1, V)
    draft_probs = random_probs(generator, B, K, V)  # (B, K, V)
    draft_tokens = sample(draft_probs, generator=generator)  # (B, K)
    for check in (False, True):
        t = median_seconds(
            lambda: verify(target_probs, draft_probs, draft_tokens, generator=generator, check=check), args.repeats
        )
        label = "verify (checked)" if check else "verify          "
        print(f"{label}  B={B:,} K={K} V={V} float32: {B / t / 1e6:7.2f} M blocks/s ({t * 1e3:.0f} ms)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
