"""A generic executor: a battery's work cut into shards, run by any number of processes or a Ray cluster.

A battery's work is planned into shards of (scenario, group) items (:mod:`.plan`); the job's
runner, which the battery defines, runs one group seeded from (root seed, scenario, group)
alone, so a shard's output does not depend on who runs it (:mod:`.work`).  Shards run inline,
on threads, in local worker processes or as Ray tasks (:mod:`.backends`), with bounded retries
of lost workers; a scenario's group outputs are merged exactly, in group order, by the runner
(:mod:`.collect`).  Same seed, same report, on 1 process, N processes or a cluster.
:mod:`.faults` injects a lost worker for drills and tests.  This floor imports only
:mod:`specverify.core`.
"""

from .backends import BACKENDS, ShardError, check_backend, execute
from .collect import Collected, collect_runs
from .plan import Shard, WorkItem, plan_shards
from .work import Job, run_shard

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
    "plan_shards",
    "run_shard",
]
