"""What two cores of this machine give a torch workload: the ceilings behind the harness benchmark.

Three measurements, each at one and at two concurrent workers, each the best of ``--repeats``:

* **Memory hierarchy** (two processes, one torch thread each): ``torch.add(x, y, out=z)`` on
  float32 vectors whose three buffers together fill L2, L3 or DRAM sizes.  The aggregate rate of two
  processes over one shows how far streaming work scales on two cores: work that streams from DRAM
  does not scale when the cores share the memory bandwidth.
* **Torch ops on two Python threads** (one process, torch at one thread): the cost per op of a tiny
  op (``select``) and of a 64 K-element ``add`` into a preallocated output, alone and on two threads.
  Every torch op releases and re-takes the GIL; on two threads each op waits for the other
  thread to hand it back, which is what limits the ``threads`` shard backend at small batches.
* **Page faults**: the cost of filling a fresh 64 MB tensor against a reused one, per fault.

Run: ``python benchmarks/bench_machine.py [--repeats 3]``; ``benchmarks/results/machine.txt`` is such a run.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import resource
import threading
import time

import torch

#: Working sets (bytes of the three buffers together) and what they fit in on the machine measured.
SIZES = {"L2 (384 KiB)": 3 << 17, "L3 (6 MiB)": 6 << 20, "DRAM (48 MiB)": 48 << 20}
#: Elements added per process and measurement (about 0.1-0.4 s each).
ELEMENTS = 1 << 30


def _stream(nbytes: int, repeats: int, barrier, queue) -> None:
    """One process: best time of ``repeats`` passes adding ELEMENTS elements in vectors of ``nbytes / 3`` bytes."""
    torch.set_num_threads(1)
    n = nbytes // 12
    x, y, z = torch.rand(n), torch.rand(n), torch.empty(n)
    loops = max(1, ELEMENTS // n)
    torch.add(x, y, out=z)
    best = float("inf")
    for _ in range(repeats):
        barrier.wait()
        start = time.perf_counter()
        for _ in range(loops):
            torch.add(x, y, out=z)
        best = min(best, time.perf_counter() - start)
    queue.put(loops * n / best)


def streaming(repeats: int) -> None:
    context = mp.get_context("spawn")
    print("torch.add into a preallocated output, 1 torch thread per process (G elements/s per process):")
    for name, nbytes in SIZES.items():
        rates = []
        for workers in (1, 2):
            barrier, queue = context.Barrier(workers), context.Queue()
            procs = [context.Process(target=_stream, args=(nbytes, repeats, barrier, queue)) for _ in range(workers)]
            for proc in procs:
                proc.start()
            each = [queue.get() for _ in procs]
            for proc in procs:
                proc.join()
            rates.append(each)
        one, two = rates[0][0], sum(rates[1])
        print(
            f"  {name:<14} 1 process {one / 1e9:5.2f}; 2 processes {', '.join(f'{r / 1e9:.2f}' for r in rates[1])}: "
            f"aggregate {two / one:.2f}x one",
            flush=True,
        )


def _per_op(op, calls: int, threads: int, repeats: int) -> float:
    """Best seconds per call of ``op`` when ``threads`` Python threads each make ``calls`` calls."""

    def work() -> None:
        for _ in range(calls):
            op()

    best = float("inf")
    for _ in range(repeats):
        pool = [threading.Thread(target=work) for _ in range(threads)]
        start = time.perf_counter()
        for thread in pool:
            thread.start()
        for thread in pool:
            thread.join()
        best = min(best, (time.perf_counter() - start) / (calls * threads))
    return best


def gil(repeats: int) -> None:
    torch.set_num_threads(1)
    small, big, out = torch.rand(64), torch.rand(1 << 16), torch.empty(1 << 16)
    ops = {"select (a view)": lambda: small.select(0, 3), "add, 64 K floats": lambda: torch.add(big, big, out=out)}
    print("torch ops on Python threads of one process, torch at 1 thread (us per op, all threads' ops counted):")
    for name, op in ops.items():
        one, two = (_per_op(op, 20000, threads, repeats) for threads in (1, 2))
        print(f"  {name:<18} 1 thread {one * 1e6:5.2f}; 2 threads {two * 1e6:5.2f} ({one / two:.2f}x the rate of one)")


def faults(repeats: int) -> None:
    n = 16 << 20  # 64 MB of float32
    reused = torch.empty(n)
    best_fresh = best_reused = float("inf")
    counted = 0
    for _ in range(repeats):
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        start = time.perf_counter()
        torch.empty(n).fill_(1.0)
        best_fresh = min(best_fresh, time.perf_counter() - start)
        counted = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
        start = time.perf_counter()
        reused.fill_(1.0)
        best_reused = min(best_reused, time.perf_counter() - start)
    per_fault = (best_fresh - best_reused) / max(1, counted)
    print(
        f"page faults: filling a fresh 64 MB tensor {best_fresh * 1e3:.1f} ms ({counted} faults), a reused one "
        f"{best_reused * 1e3:.1f} ms: {per_fault * 1e6:.2f} us per fault"
    )


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    print(f"torch {torch.__version__}, {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f}")
    streaming(args.repeats)
    gil(args.repeats)
    faults(args.repeats)


if __name__ == "__main__":
    main()
