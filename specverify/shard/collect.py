"""Collect a battery's group outputs through the shard plan, on any backend, and merge them.

:func:`collect_runs` plans the groups of the given scenarios into shards
(:func:`~specverify.shard.plan.plan_shards`), runs the shards
(:func:`~specverify.shard.backends.execute`) and merges each scenario's groups in group
order with the job's runner (:mod:`specverify.shard.work`); the battery then analyses and
grades the merged outputs once.  :class:`Parallel` holds the options of how.

``stop`` (e.g. an anytime stopping rule) sees shard outputs in *plan order* -- an
out-of-order arrival waits for the shards before it -- so the data it has seen when it stops
form a prefix of a sequence fixed before the run, whatever the timing.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from specverify.core.errors import InvalidArgument
from specverify.core.progress import ProgressTracker, scenario_plan
from specverify.core.validation import check_int
from specverify.shard.backends import check_backend, default_parallelism, execute
from specverify.shard.plan import plan_shards
from specverify.shard.work import Analysed, GroupOutput, Job, ShardOutput, merge_outputs

__all__ = ["Collected", "TaskUnits", "Parallel", "collect_runs", "DEFAULT_SHARDS_PER_WORKER"]

#: Shards per worker when the plan is not given (small shards balance load and make a lost worker cheap).
DEFAULT_SHARDS_PER_WORKER = 4
#: Most shards of a default plan under anytime stopping (one per group up to this).
MAX_ANYTIME_SHARDS = 4096


@dataclass(frozen=True)
class TaskUnits:
    """A scenario-like record of ``groups`` units of equal cost (e.g. a decoder battery's prompts)."""

    name: str
    groups: int
    batch_size: int = 1
    length: int = 1

    def num_groups(self, tier: str) -> int:
        return self.groups


@dataclass
class _State:
    """The driver's bookkeeping while shards arrive."""

    next: int = 0
    stopped: bool = False
    pids: set = field(default_factory=set)


@dataclass
class Collected:
    """Merged runs per scenario (None where the implementation failed), errors, timings, the run's record."""

    runs: dict = field(default_factory=dict)
    analysed: dict = field(default_factory=dict)  # scenario -> Analysed (analysed in the worker)
    errors: dict = field(default_factory=dict)
    seconds: dict = field(default_factory=dict)
    cpu_seconds: dict = field(default_factory=dict)
    record: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Parallel:
    """How a battery's sampling runs execute: shard plan, backend, workers, retries, anytime stopping.

    The defaults (``workers=None``, ``backend=None``) let :func:`~specverify.shard.backends.default_parallelism`
    choose by tier and machine; the statistics never depend on these options
    (only ``until_decisive`` changes the report: the anytime e-processes and their alpha share).
    """

    workers: int | None = None
    backend: str | None = None
    shards: int | None = None
    ray_address: str | None = None
    retries: int = 2
    until_decisive: bool = False

    def __post_init__(self):
        backend, workers = check_backend(self.backend, self.workers)
        object.__setattr__(self, "backend", backend)
        if self.shards is not None:
            check_int("shards", self.shards, minimum=1)
        check_int("retries", self.retries, minimum=0)
        if self.ray_address is not None and backend != "ray":
            raise InvalidArgument(f"ray_address needs backend='ray', got backend={backend!r}")

    @property
    def default(self) -> bool:
        return self == Parallel()

    def keywords(self) -> dict:
        """The non-default options, as keyword arguments of the audit (for the recorded command)."""
        return {k: v for k, v in vars(self).items() if v != getattr(Parallel(), k)}


def collect_runs(
    job: Job,
    scenarios: Sequence,
    *,
    tier: str,
    parallel: Parallel | None = None,
    progress: Callable[[int, int, str], None] | None = None,
    stop: Callable[[ShardOutput], bool] | None = None,
) -> Collected:
    """Run ``scenarios``' groups as shards and merge them per scenario (see the module docstring).

    ``parallel`` says how (shards, backend, workers, retries, Ray address; default: inline, in
    this process); its ``until_decisive`` is the caller's business (pass ``stop``).

    ``progress`` is told as each group finishes, in tokens (``batch_size * length`` a group;
    :class:`~specverify.core.progress.ProgressTracker`): first with nothing done, last with
    everything.  ``stop(output)`` may end the run early (True); the scenarios it did not
    complete are left out of ``runs``.
    """
    parallel = Parallel() if parallel is None else parallel
    given_backend, given_workers = check_backend(parallel.backend, parallel.workers)  # as Parallel resolved them
    if given_backend is None or given_workers is None:
        backend, workers = default_parallelism(tier, job)
    else:
        backend, workers = given_backend, given_workers
    ray_address = parallel.ray_address
    num_shards = parallel.shards
    if num_shards is None and stop is not None:  # check the stopping rule often: a shard per group (capped)
        num_shards = min(MAX_ANYTIME_SHARDS, sum(s.num_groups(tier) for s in scenarios))
    elif num_shards is None:
        num_shards = 1 if backend == "inline" else DEFAULT_SHARDS_PER_WORKER * workers
    plan = plan_shards([(s.name, s.num_groups(tier), float(s.batch_size * s.length)) for s in scenarios], num_shards)
    wanted = {s.name: s.num_groups(tier) for s in scenarios}
    groups: dict[str, list[GroupOutput]] = {name: [] for name in wanted}
    have = dict.fromkeys(wanted, 0)  # groups done per scenario
    out = Collected()
    buffered: dict[int, ShardOutput] = {}
    state = _State()
    tracker = ProgressTracker(progress, scenario_plan(scenarios, tier))
    tracker.begin()

    def on_output(output: ShardOutput) -> bool:
        state.pids.add(output.pid)
        for g in output.groups:
            groups[g.scenario].append(g)
            if isinstance(g.run, Analysed):
                have[g.scenario] += g.run.groups
                tracker.scenario_done(g.scenario)
            else:
                have[g.scenario] += 1
                tracker.group_done(g.scenario, g.group)
        if stop is None:
            return False
        buffered[output.index] = output
        while state.next in buffered:  # plan order
            if stop(buffered.pop(state.next)):
                state.stopped = True
                return True
            state.next += 1
        return False

    incidents = execute(
        job,
        plan,
        backend=backend,
        workers=workers,
        on_output=on_output,
        retries=parallel.retries,
        ray_address=ray_address,
        on_group=tracker.group_done if progress is not None else None,
    )
    tracker.finish()
    merge_start = time.perf_counter()
    for name, outputs in groups.items():
        if have[name] < wanted[name]:
            continue  # stopped early
        outputs.sort(key=lambda g: g.group)
        out.seconds[name] = sum(g.seconds for g in outputs)
        out.cpu_seconds[name] = sum(g.cpu_seconds for g in outputs)
        if isinstance(outputs[0].run, Analysed):  # the worker held the whole scenario and analysed it
            out.analysed[name] = outputs[0].run
        else:
            out.runs[name], error = merge_outputs(job.runner, outputs)
            if error is not None:
                out.errors[name] = error
    out.record = {
        "backend": backend,
        "workers": workers,
        "shards": len(plan),
        "processes": len(state.pids),
        "incidents": incidents,
        "stopped_early": state.stopped,
        "merge_seconds": time.perf_counter() - merge_start,
        "ray_address": ray_address if backend == "ray" else None,
    }
    return out
