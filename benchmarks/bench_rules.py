"""Throughput of the reference sampler, verifier and probability check on CPU (a script, not a test).

Prints draws/s of ``specverify.core.sampling.sample`` next to ``torch.multinomial`` at
V=32, verified blocks/s of ``reference.rules.verify`` at B=200,000, K=4, V=32
(with and without input validation) and rows/s of
``specverify.core.validation.check_probs`` on the verifier's ``target_probs``, each the
median of a few repeats, as wall time and CPU time (``time.process_time``, all
threads).  Timings on a shared machine are noisy: the load average is printed.

Usage: python benchmarks/bench_rules.py [--repeats 5] [--threads 2]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

from specverify.core.sampling import sample
from specverify.core.validation import check_probs
from specverify_reference.rules import verify


def median_seconds(fn, repeats: int) -> tuple[float, float]:
    """Median wall and CPU seconds of ``fn()``."""
    fn()  # warm-up
    wall, cpu = [], []
    for _ in range(repeats):
        w0, c0 = time.perf_counter(), time.process_time()
        fn()
        wall.append(time.perf_counter() - w0)
        cpu.append(time.process_time() - c0)
    return statistics.median(wall), statistics.median(cpu)


def random_probs(generator: torch.Generator, *shape: int, dtype=torch.float32) -> torch.Tensor:
    return torch.softmax(2.0 * torch.randn(*shape, generator=generator), -1).to(dtype)


def report(label: str, count: int, unit: str, times: tuple[float, float]) -> None:
    wall, cpu = times
    print(
        f"{label:<44} {count / wall / 1e6:7.2f} M {unit}/s wall ({wall * 1e3:6.0f} ms), "
        f"{count / cpu / 1e6:7.2f} M {unit}/CPU-s ({cpu * 1e3:6.0f} ms)  [load {os.getloadavg()[0]:.2f}]",
        flush=True,
    )


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    generator = torch.Generator().manual_seed(0)
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, median of {args.repeats} repeats, "
        "load %.2f %.2f %.2f" % os.getloadavg()
    )

    V, N = 32, 2_000_000
    probs = random_probs(generator, N, V)  # (N, V)
    report(
        f"sample            V={V} N={N:,}",
        N,
        "draws",
        median_seconds(lambda: sample(probs, generator=generator, check=False), args.repeats),
    )
    report(
        f"sample (checked)  V={V} N={N:,}",
        N,
        "draws",
        median_seconds(lambda: sample(probs, generator=generator), args.repeats),
    )
    report(
        f"torch.multinomial V={V} N={N:,}",
        N,
        "draws",
        median_seconds(lambda: torch.multinomial(probs, 1, generator=generator), args.repeats),
    )

    B, K = 200_000, 4
    target_probs = random_probs(generator, B, K + 1, V)  # (B, K+1, V)
    draft_probs = random_probs(generator, B, K, V)  # (B, K, V)
    draft_tokens = sample(draft_probs, generator=generator)  # (B, K)
    for check in (False, True):
        times = median_seconds(
            lambda: verify(target_probs, draft_probs, draft_tokens, generator=generator, check=check), args.repeats
        )
        report(f"verify{' (checked)' if check else '          '}  B={B:,} K={K} V={V} float32", B, "blocks", times)
    rows = B * (K + 1)
    report(
        f"check_probs target_probs ({B:,}, {K + 1}, {V}) float32",
        rows,
        "rows",
        median_seconds(lambda: check_probs("target_probs", target_probs), args.repeats),
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
