"""Every seed of a run derived from its root seed: the same on every platform, process and plan.

* :func:`scenario_seed` -- a scenario's seed from (root seed, scenario name) by sha256;
* :func:`group_seed` -- the seed of one group of a scenario (the unit a shard runs), so a
  group's output does not depend on which process runs it or with what else;
* :func:`derive_seed` -- a child seed for integer labels (prompts, parts of an audit), by
  numpy's ``SeedSequence``.
"""

from __future__ import annotations

import hashlib

import numpy as np

__all__ = ["derive_seed", "group_seed", "scenario_seed"]


def scenario_seed(seed: int, name: str) -> int:
    """Deterministic 63-bit seed from the run seed and a scenario name (sha256)."""
    digest = hashlib.sha256(f"{int(seed)}/{name}".encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


def group_seed(seed: int, scenario: str, group: int) -> int:
    """The seed of group ``group`` of ``scenario`` under the root ``seed`` (platform independent)."""
    return scenario_seed(seed, f"{scenario}/group={group}")


def derive_seed(seed: int, *labels: int) -> int:
    """A child seed in [0, 2**31) of the root ``seed`` for the integer ``labels`` (platform independent)."""
    state = np.random.SeedSequence(entropy=int(seed), spawn_key=tuple(int(x) for x in labels)).generate_state(1)
    return int(state[0]) & 0x7FFFFFFF
