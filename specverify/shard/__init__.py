"""Sharded batteries: the same audit cut into shards, run by any number of processes or a Ray cluster.

A battery's work is planned into shards of (scenario, group) items (:mod:`.plan`); each group
is seeded from (root seed, scenario, group) alone, so a shard's output does not depend on who
runs it.  Shards run inline, in local worker processes or as Ray tasks (:mod:`.backends`),
with bounded retries of lost workers; their outputs -- every group's harness run, the
sufficient statistics of every test -- are merged exactly, in group order (:mod:`.work`,
:mod:`.collect`), and the battery grades the merge once.  Same seed, same report, on 1
process, N processes or a cluster.  :mod:`.faults` injects a lost worker for drills and tests.
"""

from .backends import BACKENDS, ShardError, check_backend, execute
from .collect import Collected, collect_runs
from .plan import Shard, WorkItem, plan_shards
from .work import Job, merge_runs, merge_tree_runs, run_shard

__all__ = [
    "BACKENDS",
    "Collected",
    "Job",
    "Shard",
    "ShardError",
    "WorkItem",
    "check_backend",
    "collect_runs",
    "execute",
    "merge_runs",
    "merge_tree_runs",
    "plan_shards",
    "run_shard",
]
