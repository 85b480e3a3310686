"""What a shard does: run its groups of the chain or tree harness, and merge group outputs exactly.

A shard returns, per group, the group's full harness run (every emitted token with its
contexts and in-round position, every acceptance trial with its exact probability) or the
:class:`~specverify.core.errors.ImplementationError` message the implementation earned.
These per-token records are the sufficient statistics of every test of the battery --
including the order-dependent ones (a context node's test takes its first visits in
position-major order; PIT/KS tests need every value, not a sum) -- and merging them is
concatenation in group order (:func:`merge_runs`), so the analysis of the merged run is the
analysis of the run one process would have made.  Grading happens once, on the merge.

Shapes: R rows, L tokens per row, T trials.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Any

import torch

from specverify.core.errors import ImplementationError, InvalidArgument
from specverify.core.seeds import group_seed
from specverify.shard.plan import Shard
from specverify.verifier.harness import HarnessRun

__all__ = [
    "Analysed",
    "Job",
    "GroupOutput",
    "ShardOutput",
    "merge_group_runs",
    "run_shard",
    "merge_runs",
    "merge_tree_runs",
    "KINDS",
]

KINDS = ("verifier", "tree_verifier", "task")


@dataclass(frozen=True)
class Job:
    """Everything a worker needs besides its shard (picklable: the implementation by reference).

    ``kind="task"``: ``implementation`` is a picklable callable ``task(group) -> (output, error)``
    run once per group (the decoder battery's prompts); the scenario's groups are its units.

    ``fault`` is a fault-injection hook for drills and tests (``fault(shard_index)`` after
    a shard's first group; see :mod:`specverify.shard.faults`); None in real runs.
    ``analyse`` (picklable), when given, is run in the worker on every scenario the shard holds
    whole, which then returns its test results (:class:`Analysed`) instead of its records:
    the same function on the same merged run as the driver would use, so the same results.

    ``scenarios``: scenario objects that replace the registry's of the same name in the
    workers (e.g. the selftest's resized scenarios, :func:`specverify.selftest.verifiers.scaled_scenario`);
    :func:`~specverify.shard.collect.collect_runs` fills it with every scenario it is given
    that is not the registry's.  A scenario not listed is looked up by name.
    """

    kind: str
    implementation: Any
    tier: str
    seed: int
    device: Any = None  # str or torch.device; None: the CPU
    dtype: Any = None  # torch.dtype of the probabilities handed in; None: float32
    fault: Any = None
    analyse: Any = None  # analyse(scenario, merged run or None, error) -> (results, errors, summary)
    scenarios: tuple = ()

    def __post_init__(self):
        if self.kind not in KINDS:
            raise InvalidArgument(f"kind must be one of {KINDS}, got {self.kind!r}")


@dataclass(frozen=True)
class GroupOutput:
    """One group's harness run, or the implementation error it raised."""

    scenario: str
    group: int
    run: Any  # HarnessRun or TreeHarnessRun, None on error
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


def _scenario(job: Job, name: str):
    """The scenario ``name`` of ``job``: its own object if it carries one, else the registry's."""
    for scenario in job.scenarios:
        if scenario.name == name:
            return scenario
    return registered_scenario(job.kind, name)


def registered_scenario(kind: str, name: str):
    """The registry's scenario ``name`` of the chain (``kind="verifier"``) or tree battery."""
    if kind == "verifier":
        from specverify.verifier.scenarios import get_scenarios

        return get_scenarios([name])[0]
    from specverify.verifier.tree.scenarios import get_tree_scenarios

    return get_tree_scenarios([name])[0]


def _setup(job: Job, scenario, target, drafter):
    """The chain harness' precomputed tables, shared by a scenario's groups in this shard (None for trees)."""
    if job.kind != "verifier":
        return None
    from specverify.verifier.harness import harness_setup

    return harness_setup(target, drafter, k=scenario.k, verifier_dtype=job.dtype or torch.float32, device=job.device)


def _run_group(job: Job, scenario, target, drafter, group: int, setup=None):
    """The harness run of one group, seeded from (root seed, scenario, group)."""
    from specverify.verifier.harness import run_harness
    from specverify.verifier.tree.harness import run_tree_harness

    determinism_rows = 64 if group == 0 else 0  # the protocol's determinism check: once per scenario
    if job.kind == "verifier":
        generator = torch.Generator().manual_seed(group_seed(job.seed, scenario.name, group))
        return run_harness(
            job.implementation, target, drafter, k=scenario.k, batch_size=scenario.batch_size,
            length=scenario.length, generator=generator, num_groups=1,
            verifier_dtype=job.dtype or torch.float32, determinism_rows=determinism_rows, device=job.device,
            setup=setup,
        )  # fmt: skip
    generator = torch.Generator().manual_seed(group_seed(job.seed, "tree/" + scenario.name, group))
    return run_tree_harness(
        job.implementation, target, drafter, scenario.drafting, batch_size=scenario.batch_size,
        length=scenario.length, generator=generator, num_groups=1, edge_coins=scenario.edge_coins,
        determinism_rows=determinism_rows, device=job.device, dtype=job.dtype,
    )  # fmt: skip


def run_shard(job: Job, shard: Shard, on_group=None) -> ShardOutput:
    """Run every group of ``shard``; implementation errors are recorded, anything else propagates.

    ``on_group(scenario name, group)`` is called as each group finishes (progress; see
    :mod:`specverify.shard.backends` for how it reaches the driver from other threads and processes).
    """
    from specverify.shard.faults import from_environment

    fault = job.fault if job.fault is not None else from_environment()
    start = time.perf_counter()
    outputs: list[GroupOutput] = []
    for item in shard.items:
        if job.kind == "task":
            for group in item.groups:
                t0, c0 = time.perf_counter(), time.process_time()
                output, error = job.implementation(group)
                elapsed = time.perf_counter() - t0
                outputs.append(GroupOutput(item.scenario, group, output, error, elapsed, time.process_time() - c0))
                if on_group is not None:
                    on_group(item.scenario, group)
                if fault is not None and len(outputs) == 1:
                    fault(shard.index)
            continue
        scenario = _scenario(job, item.scenario)
        target, drafter = scenario.build()
        setup = _setup(job, scenario, target, drafter)
        first = len(outputs)
        for group in item.groups:
            t0, c0 = time.perf_counter(), time.process_time()
            try:
                run, error = _run_group(job, scenario, target, drafter, group, setup), None
            except ImplementationError as exc:
                row = f" (row {exc.row})" if exc.row is not None and not str(exc).startswith("row") else ""
                run, error = None, f"{scenario.name}: {exc}{row}"
            outputs.append(
                GroupOutput(scenario.name, group, run, error, time.perf_counter() - t0, time.process_time() - c0)
            )
            if on_group is not None:
                on_group(scenario.name, group)
            if fault is not None and len(outputs) == 1:
                fault(shard.index)
        if job.analyse is not None and item.start == 0 and item.stop == scenario.num_groups(job.tier):
            outputs[first:] = [_analysed(job, scenario, outputs[first:])]
    return ShardOutput(shard.index, tuple(outputs), os.getpid(), time.perf_counter() - start)


def _analysed(job: Job, scenario, groups: list[GroupOutput]) -> GroupOutput:
    """One scenario's groups (all of them, in order) merged and analysed: a group -1 output holding :class:`Analysed`."""
    t0, c0 = time.perf_counter(), time.process_time()
    results, errors, summary = job.analyse(scenario, *merge_outputs(job.kind, groups))
    analysed = Analysed(tuple(results), tuple(errors), summary, len(groups))
    seconds = sum(g.seconds for g in groups) + time.perf_counter() - t0
    cpu = sum(g.cpu_seconds for g in groups) + time.process_time() - c0
    return GroupOutput(scenario.name, -1, analysed, None, seconds, cpu)


def merge_outputs(kind: str, groups) -> tuple:
    """``(merged run, None)`` of a scenario's group outputs (in group order), or ``(None, first error)``."""
    failed = [g.error for g in groups if g.error is not None]
    if failed:
        return None, failed[0]  # the first in group order: the same for every plan
    return merge_group_runs(kind, [g.run for g in groups]), None


def merge_group_runs(kind: str, runs):
    """The merged run of a scenario's group runs for a ``kind`` of job."""
    return merge_runs(runs) if kind == "verifier" else merge_tree_runs(runs)


def merge_runs(runs) -> HarnessRun:
    """One :class:`HarnessRun` from the runs of consecutive groups (in group order): rows and trials concatenated."""
    runs = list(runs)
    if not runs:
        raise InvalidArgument("merge_runs needs at least one run")
    first = runs[0]
    if any((r.k, r.batch_size, r.length) != (first.k, first.batch_size, first.length) for r in runs):
        raise InvalidArgument("runs of different scenarios cannot be merged")
    return HarnessRun(
        tokens=torch.cat([r.tokens for r in runs]),  # (R, L)
        target_contexts=torch.cat([r.target_contexts for r in runs]),  # (R, L)
        draft_contexts=torch.cat([r.draft_contexts for r in runs]),  # (R, L)
        block_positions=torch.cat([r.block_positions for r in runs]),  # (R, L)
        trial_positions=torch.cat([r.trial_positions for r in runs]),  # (T,)
        trial_accept_probs=torch.cat([r.trial_accept_probs for r in runs]),  # (T,)
        trial_accepted=torch.cat([r.trial_accepted for r in runs]),  # (T,)
        k=first.k,
        batch_size=first.batch_size,
        num_groups=sum(r.num_groups for r in runs),
        length=first.length,
        num_calls=sum(r.num_calls for r in runs),
        seconds=sum(r.seconds for r in runs),
    )


def merge_tree_runs(runs):
    """One :class:`~specverify.verifier.tree.harness.TreeHarnessRun` from consecutive groups' runs."""
    from specverify.verifier.tree.harness import TreeHarnessRun

    runs = list(runs)
    if not runs:
        raise InvalidArgument("merge_tree_runs needs at least one run")
    return TreeHarnessRun(
        merge_runs([r.run for r in runs]),
        torch.cat([r.accepted_depths for r in runs]),
        torch.cat([r.root_target_contexts for r in runs]),
        torch.cat([r.root_draft_contexts for r in runs]),
        max(r.num_nodes for r in runs),
    )
