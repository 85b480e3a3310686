"""Fault injection for drills and tests: kill the worker running a shard, once.

:class:`KillOnce` is handed to a run as its ``Job.fault`` hook (tests and cluster drills
only): the first time the chosen shard has finished its first group, the process running it
kills itself with SIGKILL -- a worker lost mid-shard, with part of its work done and lost.
A marker file makes it fire once across processes and retries, so the retried shard runs to
the end.  The run must then give the same statistics as an undisturbed one.

For a drill of a whole audit (CLI, or a cluster whose workers inherit the driver's
environment), set ``SPECVERIFY_FAULT=kill-once:<marker path>:<shard index>`` before the run
(and before ``ray.init`` when the cluster is started by hand): :func:`from_environment` reads it.
"""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass
from pathlib import Path

__all__ = ["KillOnce", "from_environment", "ENV"]

#: Environment variable of a fault drill: ``kill-once:<marker path>:<shard index>``.
ENV = "SPECVERIFY_FAULT"


@dataclass(frozen=True)
class KillOnce:
    """Kill the process running shard ``shard`` the first time (``marker`` records that it fired)."""

    marker: str
    shard: int

    def fired(self) -> bool:
        return Path(self.marker).exists()

    def __call__(self, shard_index: int) -> None:
        if shard_index != self.shard:
            return
        try:
            fd = os.open(self.marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)  # atomic: one process wins
        except FileExistsError:
            return
        os.write(fd, str(os.getpid()).encode())
        os.close(fd)
        os.kill(os.getpid(), signal.SIGKILL)


def from_environment() -> KillOnce | None:
    """The fault drill named by ``SPECVERIFY_FAULT`` (None when unset)."""
    spec = os.environ.get(ENV, "")
    if not spec:
        return None
    kind, _, rest = spec.partition(":")
    marker, _, shard = rest.rpartition(":")
    if kind != "kill-once" or not marker or not shard.isdigit():
        raise ValueError(f"{ENV} must be kill-once:<marker path>:<shard index>, got {spec!r}")
    return KillOnce(marker, int(shard))
