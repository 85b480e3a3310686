"""What a shard does: run its groups through the job's runner, and merge a scenario's groups exactly.

The executor knows no battery.  A :class:`Job` carries a picklable *runner* that the battery
defines (the chain and tree harness runners in :mod:`specverify.verifier.runs`, the decoder's
prompt runner in :mod:`specverify.decoder.battery`):

* ``runner.scenario(name)`` -- the scenario object of a work item;
* ``runner.setup(scenario)`` -- what a scenario's groups share within one shard (precomputed
  tables), or None;
* ``runner.run_group(scenario, state, group)`` -- one group's output, seeded from (root seed,
  scenario, group) alone; an :class:`~specverify.core.errors.ImplementationError` it raises is
  a finding about the implementation, recorded with the group, never retried;
* ``runner.merge(runs)`` -- a scenario's group outputs, in group order, as one output: the
  output one process running every group would have made;
* ``runner.implementation`` and ``runner.device`` -- what is under test (named in messages)
  and where it runs (Ray asks for a GPU when that is CUDA).

A job may also carry ``analyse(scenario, merged output or None, error)``: a shard that holds a
whole scenario then analyses it where it ran and returns only the results.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Any

from specverify.core.errors import ImplementationError
from specverify.shard.plan import Shard

__all__ = ["Analysed", "GroupOutput", "Job", "ShardOutput", "merge_outputs", "run_shard"]


@dataclass(frozen=True)
class Job:
    """Everything a worker needs besides its shard (picklable: see the module docstring).

    ``fault`` is a fault-injection hook for drills and tests (``fault(shard_index)`` after a
    shard's first group; :mod:`specverify.shard.faults`); None in real runs.
    """

    runner: Any
    fault: Any = None
    analyse: Any = None  # analyse(scenario, merged output or None, error) -> (results, errors, summary)

    @property
    def implementation(self) -> Any:
        return getattr(self.runner, "implementation", self.runner)

    @property
    def device(self) -> Any:
        return getattr(self.runner, "device", None)


@dataclass(frozen=True)
class GroupOutput:
    """One group's output, or the implementation error it raised."""

    scenario: str
    group: int
    run: Any  # the runner's output, None on error (or Analysed for a whole scenario, group -1)
    error: str | None
    seconds: float
    cpu_seconds: float


@dataclass(frozen=True)
class Analysed:
    """A whole scenario analysed in the worker: its results, errors and summary, and how many groups it had."""

    results: tuple
    errors: tuple
    summary: dict
    groups: int


@dataclass(frozen=True)
class ShardOutput:
    """A finished shard: its groups' outputs, the process that ran it and its wall time."""

    index: int
    groups: tuple[GroupOutput, ...]
    pid: int
    seconds: float


def run_shard(job: Job, shard: Shard, on_group=None) -> ShardOutput:
    """Run every group of ``shard``; implementation errors are recorded, anything else propagates.

    ``on_group(scenario name, group)`` is called as each group finishes (progress; see
    :mod:`specverify.shard.backends` for how it reaches the driver from other threads and processes).
    """
    from specverify.shard.faults import from_environment

    fault = job.fault if job.fault is not None else from_environment()
    runner = job.runner
    start = time.perf_counter()
    outputs: list[GroupOutput] = []
    for item in shard.items:
        scenario = runner.scenario(item.scenario)
        state = runner.setup(scenario)
        first = len(outputs)
        for group in item.groups:
            t0, c0 = time.perf_counter(), time.process_time()
            try:
                run, error = runner.run_group(scenario, state, group), None
            except ImplementationError as exc:
                row = f" (row {exc.row})" if exc.row is not None and not str(exc).startswith("row") else ""
                run, error = None, f"{item.scenario}: {exc}{row}"
            outputs.append(
                GroupOutput(item.scenario, group, run, error, time.perf_counter() - t0, time.process_time() - c0)
            )
            if on_group is not None:
                on_group(item.scenario, group)
            if fault is not None and len(outputs) == 1:
                fault(shard.index)
        if job.analyse is not None and item.start == 0 and item.stop == item.total:
            outputs[first:] = [_analysed(job, scenario, outputs[first:])]
    return ShardOutput(shard.index, tuple(outputs), os.getpid(), time.perf_counter() - start)


def _analysed(job: Job, scenario, groups: list[GroupOutput]) -> GroupOutput:
    """One scenario's groups (all of them, in order) merged and analysed: a group -1 output holding :class:`Analysed`."""
    t0, c0 = time.perf_counter(), time.process_time()
    results, errors, summary = job.analyse(scenario, *merge_outputs(job.runner, groups))
    analysed = Analysed(tuple(results), tuple(errors), summary, len(groups))
    seconds = sum(g.seconds for g in groups) + time.perf_counter() - t0
    cpu = sum(g.cpu_seconds for g in groups) + time.process_time() - c0
    return GroupOutput(groups[0].scenario, -1, analysed, None, seconds, cpu)


def merge_outputs(runner, groups) -> tuple:
    """``(merged output, None)`` of a scenario's group outputs (in group order), or ``(None, first error)``."""
    failed = [g.error for g in groups if g.error is not None]
    if failed:
        return None, failed[0]  # the first in group order: the same for every plan
    return runner.merge([g.run for g in groups]), None
