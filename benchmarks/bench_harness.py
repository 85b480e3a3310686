"""Throughput of the table-model harness (specverify.verifier.harness.run_harness) with the canonical rule.

For every drafter of the zoo, on a positional (gather-only) target and a Markov target
(V=32, K=4, large B), it prints emitted tokens per second (wall) and per CPU-second
(``time.process_time``, all threads of this process) with the verifier's input checks on
(``reference.rules.verify``, the default) and off (``check=False``, a trusted hot loop),
at each requested number of torch intra-op threads.  Target on 2 CPU cores: >= 4 M
emitted tokens/s for every drafter with checks on.  The machine is often shared: the load
average is printed with every figure; wall time under load says little, CPU time is the
more robust figure (with one thread, tokens per CPU-second is the single-core rate; with
two, it includes OpenMP spinning while a descheduled thread is awaited).

``--processes N`` instead runs N independent copies of one checked configuration at once,
each in its own process with one intra-op thread (each repeat started together; the models'
``harness_setup`` built once per process, as in ``--group-threads``), and prints their best
aggregate rate: the ceiling that running the harness on every core at once could reach on
this machine (the copies share nothing but the memory system).

``--baseline TREE`` (with ``--processes``) also runs each configuration with another source
tree's code (a ``git worktree`` of an earlier commit), alternating with this one's: the
before/after ratio on one machine, which a table of absolute rates on a shared VM is not.

``--group-threads N`` runs the groups of one checked configuration (65536 rows in all) on N
Python threads of this process, torch's intra-op threads set to 1 -- what the ``threads``
shard backend does with a battery's groups -- and prints the aggregate rate: the in-process
counterpart of ``--processes``.

``--profile DRAFTER`` prints a cProfile (CPU-time clock) of one checked run instead
(``--profile-out FILE`` also writes it; ``benchmarks/results/harness_profile_*.txt`` are
such files).

Run: ``nice python benchmarks/bench_harness.py [--threads 1,2] [--batch 65536] [--repeats 3]
[--targets positional,markov] [--drafters oracle,uniform] [--profile least_likely --profile-target markov]``.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import time

import torch

from specverify.core import tables
from specverify.verifier import zoo
from specverify.verifier.harness import harness_setup, run_harness
from specverify_reference.rules import verify


def fast_verify(target_probs, draft_probs, draft_tokens, *, generator):
    """The canonical rule without input validation (what a trusted hot loop would call)."""
    return verify(target_probs, draft_probs, draft_tokens, generator=generator, check=False)


VERIFIERS = {"checks on": verify, "checks off": fast_verify}


def load() -> str:
    return "load {:.2f} {:.2f} {:.2f}".format(*os.getloadavg())


def make_target(name: str, vocab: int, length: int, module=tables) -> tables.TableModel:
    """The benchmark's target ``name``, built by ``module`` (this tree's ``tables``, or a baseline tree's)."""
    if name == "positional":
        return module.positional(vocab, length, "peaked", seed=1)
    if name == "markov":
        return module.markov(vocab, "peaked", seed=2)
    raise SystemExit(f"--targets: unknown target {name!r} (positional, markov)")


def bench(target, drafter, verifier, *, batch, length, k, repeats) -> tuple[float, float, float]:
    """Best-of-``repeats`` ``(wall tokens/s, tokens/CPU-s, acceptance)`` of one configuration."""
    gen = torch.Generator().manual_seed(0)
    run_harness(verifier, target, drafter, k=k, batch_size=min(batch, 4096), length=length, generator=gen)  # warm-up
    best_wall = best_cpu = float("inf")
    for _ in range(repeats):
        w0, c0 = time.perf_counter(), time.process_time()
        run = run_harness(verifier, target, drafter, k=k, batch_size=batch, length=length, generator=gen)
        best_wall = min(best_wall, time.perf_counter() - w0)
        best_cpu = min(best_cpu, time.process_time() - c0)
    acc = run.trial_accepted.double().mean().item()
    return run.num_tokens / best_wall, run.num_tokens / best_cpu, acc


def profile(args) -> None:
    """cProfile one checked run (after a warm-up) and print / write the top entries."""
    torch.set_num_threads(args.threads[0])
    target = make_target(args.profile_target, args.vocab, args.length)
    drafter = zoo.make_drafter(args.profile, target)
    gen = torch.Generator().manual_seed(0)
    common = dict(k=args.k, length=args.length, generator=gen)
    run_harness(verify, target, drafter, batch_size=min(args.batch, 4096), **common)  # warm-up
    profiler = cProfile.Profile(time.process_time)  # CPU time: a descheduled process is not charged
    w0, c0 = time.perf_counter(), time.process_time()
    profiler.enable()
    run = run_harness(verify, target, drafter, batch_size=args.batch, **common)
    profiler.disable()
    wall, cpu = time.perf_counter() - w0, time.process_time() - c0
    out = io.StringIO()
    out.write(
        f"PROFILE {args.profile_target} target, {args.profile} drafter, checks on, {torch.get_num_threads()} "
        f"thread(s), B={args.batch} L={args.length} K={args.k} V={args.vocab}: {run.num_tokens / 1e6:.2f} M tokens, "
        f"{run.num_calls} calls; wall {wall:.3f} s = {run.num_tokens / wall / 1e6:.2f} M tokens/s; CPU {cpu:.3f} s = "
        f"{run.num_tokens / cpu / 1e6:.2f} M tokens/CPU-s (profiler overhead included)  [{load()}]\n"
    )
    for order in ("tottime", "cumulative"):
        pstats.Stats(profiler, stream=out).strip_dirs().sort_stats(order).print_stats(args.profile_lines)
    print(out.getvalue())
    if args.profile_out:
        with open(args.profile_out, "w") as fh:
            fh.write(f"torch {torch.__version__}, {os.cpu_count()} CPUs\n" + out.getvalue())


def _code(checkout: str | None):
    """``(verify, tables, zoo, harness_setup or None, run_harness)`` of this checkout, or of ``checkout``'s source tree.

    For ``--baseline``: the other tree's ``reference`` and ``specverify`` replace the ones imported
    here (only in a ``--processes`` child, which runs nothing else).
    """
    if checkout is None:
        return verify, tables, zoo, harness_setup, run_harness
    import importlib
    import sys

    for name in [m for m in sys.modules if m.split(".")[0] in ("reference", "specverify")]:
        del sys.modules[name]
    sys.path.insert(0, os.path.abspath(checkout))
    rules = importlib.import_module("specverify_reference.rules")
    harness = importlib.import_module("specverify.verifier.harness")
    other_tables = importlib.import_module("specverify.core.tables")
    other_zoo = importlib.import_module("specverify.verifier.zoo")
    return rules.verify, other_tables, other_zoo, getattr(harness, "harness_setup", None), harness.run_harness


def _copy(target_name, drafter_name, args, barrier, queue, checkout=None) -> None:
    """One process of ``--processes``: a warm-up, then ``args.repeats`` checked runs, each started with the others."""
    torch.set_num_threads(1)
    verify, tables_module, zoo_module, harness_setup, run_harness = _code(checkout)
    target = make_target(target_name, args.vocab, args.length, tables_module)
    drafter = zoo_module.make_drafter(drafter_name, target)
    gen = torch.Generator().manual_seed(os.getpid())
    common = dict(k=args.k, batch_size=args.batch, length=args.length, generator=gen)
    if harness_setup is not None:  # built once, as a battery builds it once per scenario (older trees lack it)
        common["setup"] = harness_setup(target, drafter, k=args.k)
    run_harness(verify, target, drafter, **common)  # warm-up
    for _ in range(args.repeats):
        barrier.wait()  # every copy imported, warmed up and done with the previous repeat
        w0 = time.perf_counter()
        run = run_harness(verify, target, drafter, num_groups=max(1, 65536 // args.batch), **common)  # >= 65536 rows
        queue.put((run.num_tokens, time.perf_counter() - w0))


def _aggregate(context, target_name, name, args, checkout) -> tuple[float, str]:
    """Best aggregate rate of ``args.processes`` copies of one configuration, with each copy's rate in it."""
    queue, barrier = context.Queue(), context.Barrier(args.processes)
    procs = [
        context.Process(target=_copy, args=(target_name, name, args, barrier, queue, checkout))
        for _ in range(args.processes)
    ]
    for proc in procs:
        proc.start()
    best_total, best_each = 0.0, ""
    for _ in range(args.repeats):
        results = [queue.get() for _ in procs]
        total = sum(n for n, _ in results) / max(s for _, s in results)
        if total > best_total:
            best_total, best_each = total, ", ".join(f"{n / s / 1e6:.2f}" for n, s in results)
    for proc in procs:
        proc.join()
    return best_total / 1e6, best_each


def processes(args) -> None:
    """``--processes N``: the aggregate rate of N concurrent single-threaded copies per configuration.

    Each repeat starts the copies' runs together (a barrier); its aggregate is their tokens over
    the slowest copy's time.  The best repeat is printed, with each copy's rate in it.  With
    ``--baseline TREE`` each configuration is also run with the code of another source tree
    (e.g. a ``git worktree`` of an earlier commit), the two alternating which goes first: a
    same-machine before/after that does not depend on how fast this machine is today.
    """
    import multiprocessing as mp

    context = mp.get_context("spawn")
    print(
        f"{args.processes} concurrent processes x 1 thread, B={args.batch} L={args.length} K={args.k}, checks on, "
        f"best of {args.repeats}" + (f"; baseline {args.baseline}" if args.baseline else "") + f"  [{load()}]"
    )
    configs = [(t, d) for t in args.targets.split(",") for d in args.drafters.split(",")]
    for i, (target_name, name) in enumerate(configs):
        label = f"{target_name + '/' + name:<28}"
        if not args.baseline:
            total, each = _aggregate(context, target_name, name, args, None)
            print(f"{label} aggregate {total:5.2f} M tokens/s (each {each})  [{load()}]", flush=True)
            continue
        order = [args.baseline, None] if i % 2 == 0 else [None, args.baseline]
        rates = {checkout: _aggregate(context, target_name, name, args, checkout)[0] for checkout in order}
        before, after = rates[args.baseline], rates[None]
        print(
            f"{label} baseline {before:5.2f}  this {after:5.2f} M tokens/s  ({after / before:.2f}x)  [{load()}]",
            flush=True,
        )


def group_threads(args) -> None:
    """``--group-threads N``: the aggregate rate of N Python threads running the groups of a configuration."""
    import threading

    torch.set_num_threads(1)
    n = args.group_threads
    groups = max(1, 65536 // args.batch // n)  # per thread
    print(
        f"{n} Python threads x {groups} groups, torch 1 thread, B={args.batch} L={args.length} K={args.k}, "
        f"checks on, best of {args.repeats}  [{load()}]",
        flush=True,
    )
    for target_name in args.targets.split(","):
        target = make_target(target_name, args.vocab, args.length)
        for name in args.drafters.split(","):
            drafter = zoo.make_drafter(name, target)
            setup = harness_setup(target, drafter, k=args.k)
            tokens: dict[int, int] = {}

            def work(i: int) -> None:
                gen = torch.Generator().manual_seed(i)
                common = dict(k=args.k, batch_size=args.batch, length=args.length, generator=gen, setup=setup)
                tokens[i] = run_harness(verify, target, drafter, num_groups=groups, **common).num_tokens

            work(0)  # warm-up
            best = float("inf")
            for _ in range(args.repeats):
                threads = [threading.Thread(target=work, args=(i,)) for i in range(n)]
                start = time.perf_counter()
                for thread in threads:
                    thread.start()
                for thread in threads:
                    thread.join()
                best = min(best, time.perf_counter() - start)
            rate = sum(tokens.values()) / best
            print(f"{target_name + '/' + name:<28} {rate / 1e6:5.2f} M tokens/s  [{load()}]", flush=True)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=65536)
    parser.add_argument("--length", type=int, default=32)
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", default="1,2", help="comma-separated torch intra-op thread counts (default 1,2)")
    parser.add_argument("--targets", default="positional,markov")
    parser.add_argument("--drafters", default=",".join(zoo.ZOO), help="comma-separated zoo names (default all)")
    parser.add_argument("--checks", default="on,off", help="on, off or on,off")
    parser.add_argument("--processes", type=int, default=0, metavar="N", help="N concurrent 1-thread copies instead")
    parser.add_argument(
        "--baseline", metavar="TREE", help="with --processes: also run another source tree's code, alternating"
    )
    parser.add_argument(
        "--group-threads", type=int, default=0, metavar="N", help="groups on N Python threads (torch 1 thread) instead"
    )
    parser.add_argument("--profile", metavar="DRAFTER", help="cProfile one checked run instead")
    parser.add_argument("--profile-target", default="markov")
    parser.add_argument("--profile-lines", type=int, default=30)
    parser.add_argument("--profile-out", metavar="FILE", help="also write the profile to FILE")
    args = parser.parse_args(argv)
    args.threads = [int(t) for t in args.threads.split(",")]
    if args.profile:
        return profile(args)
    if args.processes:
        return processes(args)
    if args.group_threads:
        return group_threads(args)
    print(
        f"torch {torch.__version__}, {os.cpu_count()} CPUs, B={args.batch} L={args.length} K={args.k} "
        f"V={args.vocab}, best of {args.repeats}; M tokens/s wall | M tokens/CPU-s  [{load()}]",
        flush=True,
    )
    checks = [f"checks {c}" for c in args.checks.split(",")]
    common = dict(batch=args.batch, length=args.length, k=args.k, repeats=args.repeats)
    slowest: dict[tuple[int, str], tuple[float, str]] = {}
    for target_name in args.targets.split(","):
        target = make_target(target_name, args.vocab, args.length)
        for name in args.drafters.split(","):
            drafter = zoo.make_drafter(name, target)
            cells, acc = [], 0.0
            for threads in args.threads:
                torch.set_num_threads(threads)
                for check in checks:
                    wall, cpu, acc = bench(target, drafter, VERIFIERS[check], **common)
                    cells.append(f"{threads}t {check[7:]:>3}: {wall / 1e6:5.2f} | {cpu / 1e6:5.2f}")
                    key = (threads, check)
                    slowest[key] = min(slowest.get(key, (float("inf"), "")), (wall, f"{target_name}/{name}"))
            print(f"{target_name + '/' + name:<28} acc {acc:.3f}  " + "   ".join(cells) + f"  [{load()}]", flush=True)
    for (threads, check), (wall, where) in sorted(slowest.items()):
        print(f"slowest, {threads} thread(s), {check}: {where} at {wall / 1e6:.2f} M tokens/s wall")


if __name__ == "__main__":
    main()
