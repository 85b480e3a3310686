"""The chain and tree batteries' sampling runs through the shard executor: runners, exact merges, grading.

A :class:`ChainRunner` or :class:`TreeRunner` is the picklable runner of a
:class:`~specverify.shard.work.Job`: it builds a scenario's table models once per shard, runs
one group of the harness seeded from (root seed, scenario, group) alone
(:func:`~specverify.core.seeds.group_seed`), and merges a scenario's group runs by
concatenation in group order (:func:`merge_runs`, :func:`merge_tree_runs`).  Per-token records
are the sufficient statistics of every test of the battery -- including the order-dependent
ones (a context node's test takes its first visits in position-major order; PIT/KS tests need
every value, not a sum) -- so the analysis of the merged run is the analysis of the run one
process would have made.  :func:`run_battery` collects, analyses each scenario once and
grades once.

Shapes: R rows, L tokens per row, T trials.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from specverify.core.errors import InvalidArgument
from specverify.core.seeds import group_seed
from specverify.shard.collect import Parallel, collect_runs
from specverify.shard.work import Job
from specverify.verifier.harness import HarnessRun, harness_setup, run_harness

__all__ = [
    "BatteryOutcome",
    "ChainRunner",
    "TreeRunner",
    "merge_runs",
    "merge_tree_runs",
    "run_battery",
]

#: Rows of the protocol's determinism check, in group 0 of every scenario.
DETERMINISM_ROWS = 64


@dataclass(frozen=True)
class _HarnessRunner:
    """What the chain and tree runners share: the implementation, the run's seed, device and dtype, the scenarios."""

    implementation: Any
    seed: int
    scenarios: tuple  # the scenario objects of the run (workers run these very objects)
    device: Any = None  # str or torch.device; None: the CPU
    dtype: Any = None  # torch.dtype of the probabilities handed in; None: float32

    def scenario(self, name: str):
        for scenario in self.scenarios:
            if scenario.name == name:
                return scenario
        raise InvalidArgument(f"no scenario {name!r} in this run")


class ChainRunner(_HarnessRunner):
    """Groups of the chain harness (:func:`~specverify.verifier.harness.run_harness`)."""

    def setup(self, scenario):
        target, drafter = scenario.build()
        tables = harness_setup(
            target, drafter, k=scenario.k, verifier_dtype=self.dtype or torch.float32, device=self.device
        )
        return target, drafter, tables

    def run_group(self, scenario, state, group: int) -> HarnessRun:
        target, drafter, tables = state
        generator = torch.Generator().manual_seed(group_seed(self.seed, scenario.name, group))
        return run_harness(
            self.implementation, target, drafter, k=scenario.k, batch_size=scenario.batch_size,
            length=scenario.length, generator=generator, num_groups=1, verifier_dtype=self.dtype or torch.float32,
            determinism_rows=DETERMINISM_ROWS if group == 0 else 0, device=self.device, setup=tables,
        )  # fmt: skip

    def merge(self, runs) -> HarnessRun:
        return merge_runs(runs)


class TreeRunner(_HarnessRunner):
    """Groups of the tree harness (:func:`~specverify.verifier.tree.harness.run_tree_harness`)."""

    def setup(self, scenario):
        return scenario.build()

    def run_group(self, scenario, state, group: int):
        from specverify.verifier.tree.harness import run_tree_harness

        target, drafter = state
        generator = torch.Generator().manual_seed(group_seed(self.seed, "tree/" + scenario.name, group))
        return run_tree_harness(
            self.implementation, target, drafter, scenario.drafting, batch_size=scenario.batch_size,
            length=scenario.length, generator=generator, num_groups=1, edge_coins=scenario.edge_coins,
            determinism_rows=DETERMINISM_ROWS if group == 0 else 0, device=self.device, dtype=self.dtype,
        )  # fmt: skip

    def merge(self, runs):
        return merge_tree_runs(runs)


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


@dataclass
class BatteryOutcome:
    """What a sharded sampling battery produced: graded results, errors, timings and its record."""

    results: list
    errors: list
    timings: dict
    cpu_seconds: dict
    extra: dict
    summaries: dict = field(default_factory=dict)


def run_battery(
    runner: _HarnessRunner, scenarios: Sequence, *, tier: str, alpha: float, parallel: Parallel, progress, analyse
) -> BatteryOutcome:
    """Collect, analyse each scenario once, grade once.

    ``analyse(scenario, merged run or None, error) -> (results, errors, summary)`` must be
    picklable (a module-level function or a ``functools.partial`` of one): a worker holding a
    whole scenario runs it there and returns only the results (no per-token records to ship);
    the driver runs it on the scenarios that were split across shards.  Same function, same
    merged run, same results.

    With ``parallel.until_decisive`` the anytime e-processes of :mod:`specverify.verifier.anytime`
    get ``alpha * SHARE``; a decisive stop grades only them (and the protocol results of the
    scenarios finished), otherwise the battery is graded at ``alpha * (1 - SHARE)``.
    """
    from specverify import stats
    from specverify.verifier.anytime import SHARE, AnytimeStop

    if not scenarios:  # e.g. every chosen tree scenario skipped
        return BatteryOutcome([], [], {}, {}, {})
    tree = isinstance(runner, TreeRunner)
    stopper = AnytimeStop(scenarios, alpha=alpha, tree=tree) if parallel.until_decisive else None
    job = Job(runner, analyse=analyse if stopper is None else None)  # the stopping rule needs every group's records
    collected = collect_runs(job, scenarios, tier=tier, parallel=parallel, progress=progress, stop=stopper)
    results: list = []
    errors: list = []
    summaries: dict = {}
    for scenario in scenarios:
        if scenario.name in collected.analysed:
            done = collected.analysed[scenario.name]
            res, errs, summaries[scenario.name] = list(done.results), list(done.errors), done.summary
        elif scenario.name in collected.runs:
            run, error = collected.runs[scenario.name], collected.errors.get(scenario.name)
            res, errs, summaries[scenario.name] = analyse(scenario, run, error)
        else:
            continue  # not finished: the run stopped early
        if stopper is not None and stopper.decisive is not None:
            res = [r for r in res if r.family == "protocol"]  # fixed-N tests are not valid at a data-dependent N
        results += res
        errors += errs
    extra: dict = {}
    if stopper is None:
        graded = list(stats.grade(results, alpha=alpha))
    else:
        graded = list(stats.grade(results, alpha=alpha * (1 - SHARE))) if results else []
        graded += stats.grade(stopper.results(), alpha=alpha * SHARE)
        planned = sum(s.num_groups(tier) * s.batch_size * s.length for s in scenarios)
        extra["anytime"] = stopper.record(planned)
    if not parallel.default or collected.record.get("backend") != "inline":  # asked for, or chosen by default
        extra["sharding"] = collected.record
    timings = {**collected.seconds}
    return BatteryOutcome(list(graded), errors, timings, collected.cpu_seconds, extra, summaries)
