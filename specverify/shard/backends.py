"""Run a shard plan: in this process (on one or N threads), in N local worker processes, or on a Ray cluster.

``execute(job, shards, backend=..., workers=..., on_output=...)`` calls ``on_output`` in the
driver once per finished shard, in completion order (callers that need a fixed order --
the anytime stopping rule -- buffer by shard index).  ``on_output`` returning True stops the
run: unfinished shards are cancelled.  ``on_group(scenario, group)``, when given, is called in
the driver as each group finishes, for progress: inline directly; from threads through a queue
and from worker processes through a pipe (one write of a few bytes per group, atomic on a
pipe, so a killed worker cannot leave half a message), both read while the driver waits for
shards; on Ray only the shards' outputs say which groups finished.  A group may be reported
twice (a retried shard): the caller counts it once.

Faults.  A shard whose worker dies (SIGKILL, OOM, a lost node) or that raises anything but an
implementation error -- an *infrastructure* error -- is run again, up to ``retries`` more
times, and every such incident is returned (shard, attempt, error) for the report.  An
:class:`~specverify.core.errors.ImplementationError` never reaches this level: the shard
records it as a finding about the implementation (:mod:`specverify.shard.work`).  A shard's
output is kept once, by index, so a retried shard is never counted twice, and a shard's
output does not depend on the attempt or the process (its groups are seeded by plan
position), so a retry changes nothing in the statistics.  Ctrl-C cancels everything and
re-raises: nothing is merged or written.

Backends: ``"inline"`` (this process; no retries), ``"threads"`` (``workers`` threads of this
process; no retries, nothing pickled or spawned), ``"processes"`` (``concurrent.futures``
with spawned workers; no extra dependency) and ``"ray"`` (``pip install specverify[ray]``;
with no address a local Ray instance of ``workers`` CPUs is started and shut down by the
run; a shard asks for one GPU when the implementation runs on CUDA).

``"threads"`` suits small audits on a few cores: torch releases the GIL inside its operators,
so shards overlap without the seconds each spawned worker spends importing torch.  For the run
torch's intra-op threads are set to 1 (as in a worker process) and restored after, since every
shard's operators would otherwise start parallel regions on the same cores.  The
implementation is called from several threads at once, so it must be thread-safe (no shared
mutable state, no global RNG); a shard cannot be killed, so Ctrl-C or a stop waits for the
running shards to finish.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import os
import queue
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, ThreadPoolExecutor, wait

from specverify.core.errors import InvalidArgument, SpecVerifyError
from specverify.core.validation import check_int
from specverify.shard.plan import Shard
from specverify.shard.work import Job, ShardOutput, run_shard

__all__ = ["BACKENDS", "ShardError", "available_cpus", "check_backend", "default_parallelism", "execute"]

BACKENDS = ("inline", "threads", "processes", "ray")
RAY_INSTALL = "pip install 'specverify[ray]'  (or: pip install ray)"


class ShardError(SpecVerifyError):
    """A shard kept failing for reasons outside the implementation (its retries are spent)."""


def check_backend(backend, workers) -> tuple[str | None, int | None]:
    """``(backend, workers)`` validated.

    ``backend=None`` means inline for 1 worker and processes for more; with ``workers=None`` too
    the choice is left to :func:`default_parallelism` (``(None, None)``); a backend other than
    inline with ``workers=None`` gets one worker per CPU this process may use.
    """
    if workers is None:
        if backend is None:
            return None, None
        workers = 1 if backend == "inline" else available_cpus()
    workers = check_int("workers", workers, minimum=1)
    if backend is None:
        backend = "inline" if workers == 1 else "processes"
    if backend not in BACKENDS:
        raise InvalidArgument(f"backend must be one of {BACKENDS}, got {backend!r}")
    if backend == "inline" and workers != 1:
        raise InvalidArgument(f"backend 'inline' runs in this process: workers must be 1, got {workers}")
    return backend, workers


def available_cpus() -> int:
    """The CPUs this process may run on (its affinity mask where the OS has one)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        return os.cpu_count() or 1


#: Tiers whose default is one worker process per CPU (the smoke tier stays in this process).
PROCESS_TIERS = frozenset({"standard", "deep"})


def default_parallelism(tier: str, job: Job) -> tuple[str, int]:
    """``(backend, workers)`` of a run that names neither: chosen from measurement.

    On 2 cores (benchmarks/README.md, "Default parallelism"), the reference verifier's smoke
    tier takes 13.2 s inline on one torch thread and 12.8 s on 2 worker processes when the
    machine is idle, 11.1 s and 18.5 s with another process holding a core (the workers' start
    costs more than they save); the standard tier 66.7 s inline and 49.2 s on 2 processes idle,
    62.8 s and 65.4 s with a core busy.  So: the smoke tier in this process (one torch thread,
    see :func:`_one_torch_thread`), larger tiers on one worker process per CPU this process may
    use, when there are several and the job can be pickled (otherwise in this process).
    """
    cpus = available_cpus()
    if tier in PROCESS_TIERS and cpus > 1 and _picklable(job):
        return "processes", cpus
    return "inline", 1


def _picklable(job: Job) -> bool:
    try:
        _check_picklable(job)
    except InvalidArgument:
        return False
    return True


def execute(
    job: Job,
    shards: Sequence[Shard],
    *,
    backend: str,
    workers: int,
    on_output: Callable[[ShardOutput], bool | None],
    retries: int = 2,
    ray_address: str | None = None,
    on_group: Callable[[str, int], None] | None = None,
) -> list[dict]:
    """Run every shard (see the module docstring); return the infrastructure incidents.

    Raises
    ------
    ShardError
        A shard failed more than ``retries`` times for infrastructure reasons.
    """
    checked_backend, checked_workers = check_backend(backend, workers)
    if checked_backend is None or checked_workers is None:
        raise InvalidArgument("execute needs a backend or a number of workers (collect_runs chooses the default)")
    backend, workers = checked_backend, checked_workers
    retries = check_int("retries", retries, minimum=0)
    if backend == "inline":
        with _one_torch_thread():
            for shard in shards:
                if on_output(run_shard(job, shard, on_group)):
                    break
        return []
    if backend == "threads":
        return _threads(job, shards, workers, on_output, on_group)
    if backend == "processes":
        _check_picklable(job)
        return _processes(job, shards, workers, on_output, retries, on_group)
    return _ray(job, shards, workers, on_output, retries, ray_address)


def _check_picklable(job: Job) -> None:
    """Worker processes get the implementation by pickling (by reference for module-level functions)."""
    import pickle

    try:
        pickle.dumps(job)
    except Exception as exc:
        raise InvalidArgument(
            f"backend 'processes' sends the implementation {job.implementation!r} to worker processes by "
            f"pickling, which failed ({type(exc).__name__}: {exc}); use a module-level function or class "
            "instance, or backend='ray' (cloudpickle)"
        ) from None


class _Attempts:
    """Per-shard attempt counts and the incident log; raises once a shard's retries are spent."""

    def __init__(self, retries: int):
        self.retries = retries
        self.counts: dict[int, int] = {}
        self.incidents: list[dict] = []

    def failed(self, shard: Shard, error: BaseException) -> None:
        attempt = self.counts.get(shard.index, 0) + 1
        self.counts[shard.index] = attempt
        text = f"{type(error).__name__}: {error}".strip()[:500]
        self.incidents.append({"shard": shard.index, "attempt": attempt, "error": text})
        if attempt > self.retries:
            raise ShardError(f"shard {shard.index} failed {attempt} times; last: {text}") from error


@contextlib.contextmanager
def _one_torch_thread():
    """torch's intra-op threads set to 1 for the block (restored after), as in a worker process.

    Measured (benchmarks/README.md, "Default parallelism"): on 2 idle cores the sampling runs as
    fast on one thread as on two (the harness is bound by memory bandwidth), and with another
    process holding a core two OpenMP threads wait on a descheduled thread, 3.4x slower at the
    smoke tier.  The implementation under test runs inside this block, on one thread too.
    """
    import torch

    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


#: Seconds the driver waits for a shard before it reads the groups reported meanwhile.
POLL_SECONDS = 0.25


def _threads(job, shards, workers, on_output, on_group) -> list[dict]:
    """Shards on ``workers`` threads of this process; ``on_output`` is called in this thread, in completion order."""
    events: queue.SimpleQueue = queue.SimpleQueue()

    def report(scenario: str, group: int) -> None:
        events.put((scenario, group))

    def drain() -> None:
        while on_group is not None and not events.empty():
            on_group(*events.get())

    with _one_torch_thread():  # as in a worker process: each shard's operators run serially
        pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="specverify-shard")
        try:
            pending = {pool.submit(run_shard, job, shard, report if on_group else None) for shard in shards}
            while pending:
                done, pending = wait(pending, timeout=POLL_SECONDS, return_when=FIRST_COMPLETED)
                drain()
                for future in done:
                    if on_output(future.result()):  # a decisive stop: the shards not started are cancelled
                        return []
            return []
        finally:
            pool.shutdown(wait=True, cancel_futures=True)  # running shards finish: a thread cannot be killed


#: The write end of the driver's group pipe in a worker process (set by :func:`_init_worker`).
_GROUP_PIPE = None


def _init_worker(pipe=None) -> None:
    import torch

    global _GROUP_PIPE
    _GROUP_PIPE = pipe
    torch.set_num_threads(1)  # one core per worker process


def _send_group(scenario: str, group: int) -> None:
    assert _GROUP_PIPE is not None
    _GROUP_PIPE.send_bytes(f"{group}\t{scenario}".encode())  # one short write: atomic on a pipe


def _run_reported_shard(job: Job, shard: Shard) -> ShardOutput:
    """:func:`run_shard` in a worker process, its groups reported through the driver's pipe."""
    return run_shard(job, shard, _send_group if _GROUP_PIPE is not None else None)


def _drain_pipe(reader, on_group) -> None:
    """Every group a worker reported since the last call (never blocks)."""
    if reader is None or on_group is None:
        return
    while reader.poll():
        group, scenario = reader.recv_bytes().decode().split("\t", 1)
        on_group(scenario, int(group))


def _processes(job, shards, workers, on_output, retries, on_group) -> list[dict]:
    attempts = _Attempts(retries)
    pending = {shard.index: shard for shard in shards}
    context = multiprocessing.get_context("spawn")
    reader, writer = context.Pipe(duplex=False) if on_group is not None else (None, None)
    try:
        while pending:
            if _pool_round(job, pending, workers, on_output, attempts, context, (reader, writer), on_group):
                break
        _drain_pipe(reader, on_group)
    finally:
        for end in (reader, writer):
            if end is not None:
                end.close()
    return attempts.incidents


def _pool_round(job, pending, workers, on_output, attempts, context, pipe, on_group) -> bool:
    """One pool over the ``pending`` shards (each removed as it finishes); True on a decisive stop."""
    reader, writer = pipe
    stopped = False
    pool = ProcessPoolExecutor(
        max_workers=min(workers, len(pending)), mp_context=context, initializer=_init_worker, initargs=(writer,)
    )
    try:
        futures = {pool.submit(_run_reported_shard, job, shard): shard for shard in pending.values()}
        while futures:
            done, _ = wait(futures, timeout=POLL_SECONDS, return_when=FIRST_COMPLETED)
            _drain_pipe(reader, on_group)
            for future in done:
                shard = futures.pop(future)
                try:
                    output = future.result()
                except Exception as exc:  # a worker died (BrokenProcessPool) or an infrastructure error
                    attempts.failed(shard, exc)
                    continue
                del pending[shard.index]
                if on_output(output):
                    stopped = True
                    pending.clear()
                    futures.clear()
                    break
    except BaseException:
        _kill(pool)
        raise
    if stopped or pending:  # a decisive stop, or a broken pool: its workers go now
        _kill(pool)
    else:
        pool.shutdown(wait=True)
    return stopped


def _kill(pool: ProcessPoolExecutor) -> None:
    """Terminate a pool's workers now (Ctrl-C, a broken pool, or a decisive stop)."""
    processes = list((getattr(pool, "_processes", None) or {}).values())
    for process in processes:
        if process.is_alive():
            process.kill()
    for process in processes:
        process.join(timeout=10)
    pool.shutdown(wait=False, cancel_futures=True)


def _ray(job, shards, workers, on_output, retries, address) -> list[dict]:
    try:
        import ray
    except ImportError as exc:
        raise InvalidArgument(f"backend 'ray' needs Ray: {RAY_INSTALL}") from exc
    started = False
    if not ray.is_initialized():
        if address:
            ray.init(address=address, include_dashboard=False, log_to_driver=False, logging_level=logging.ERROR)
        else:
            ray.init(num_cpus=workers, include_dashboard=False, log_to_driver=False, logging_level=logging.ERROR)
        started = True
    attempts = _Attempts(retries)
    gpus = 1 if str(job.device or "cpu").startswith("cuda") else 0
    task = ray.remote(run_shard).options(num_cpus=1, num_gpus=gpus, max_retries=0)
    refs: dict = {}
    try:
        refs = {task.remote(job, shard): shard for shard in shards}
        while refs:
            (ref,), _ = ray.wait(list(refs), num_returns=1)
            shard = refs.pop(ref)
            try:
                output = ray.get(ref)
            except ray.exceptions.RayError as exc:  # a dead worker or node, or an error raised in the task
                attempts.failed(shard, exc)
                refs[task.remote(job, shard)] = shard
                continue
            if on_output(output):
                break
    finally:
        for ref in refs:
            ray.cancel(ref, force=True)
        if started:
            ray.shutdown()
    return attempts.incidents
