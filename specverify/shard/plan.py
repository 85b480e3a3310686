"""The shard plan: a battery's work cut into shards that any process can run alone.

The unit of work is one *group* of a scenario (``batch_size`` rows decoded to the
scenario's length; a tier is a number of groups per scenario).  Group ``g`` of scenario
``s`` is seeded from ``(root seed, s, g)`` alone (:func:`group_seed`), so its output does
not depend on which process runs it, in which order, or with what else: a shard is fully
determined by (root seed, its work items), and the merged run of a scenario -- its groups
concatenated in group order -- is the same whether one process ran everything or N
processes or a Ray cluster ran the shards.  That is what makes the merged report identical
for every shard count, worker count and backend.

:func:`plan_shards` cuts the (scenario, group) items, in scenario then group order, into
``num_shards`` contiguous runs of about equal cost (rows x length), so a shard touches few
scenarios and the plan is a pure function of the scenarios, the tier and ``num_shards``.
"""

from __future__ import annotations

from dataclasses import dataclass

from specverify.core.errors import InvalidArgument
from specverify.core.validation import check_int

__all__ = ["WorkItem", "Shard", "plan_shards"]


@dataclass(frozen=True)
class WorkItem:
    """Groups ``start .. stop - 1`` of one scenario, which has ``total`` groups in all."""

    scenario: str
    start: int
    stop: int
    cost: float
    total: int

    @property
    def groups(self) -> range:
        return range(self.start, self.stop)


@dataclass(frozen=True)
class Shard:
    """One shard: its index in the plan and its work items (each a run of groups of one scenario)."""

    index: int
    items: tuple[WorkItem, ...]

    @property
    def cost(self) -> float:
        return sum(item.cost for item in self.items)


def plan_shards(scenarios, num_shards: int) -> tuple[Shard, ...]:
    """Cut ``scenarios`` (``(name, num_groups, cost_per_group)`` triples, in battery order) into shards.

    Parameters
    ----------
    scenarios : sequence of (str, int, float)
        Each scenario's name, its number of groups at the tier, and the cost of one group
        (e.g. rows x length).
    num_shards : int >= 1
        Shards wanted; fewer are returned when there are fewer groups than that.

    Returns
    -------
    tuple of Shard
        Contiguous, in battery order, about equal cost, none empty; every group of every
        scenario is in exactly one shard.
    """
    num_shards = check_int("num_shards", num_shards, minimum=1)
    units: list[tuple[str, int, float]] = []
    totals: dict[str, int] = {}
    for name, groups, cost in scenarios:
        if check_int("num_groups", groups, minimum=1) and not cost > 0:
            raise InvalidArgument(f"cost of a group of {name!r} must be > 0, got {cost!r}")
        units += [(name, g, float(cost)) for g in range(groups)]
        totals[name] = groups
    if not units:
        raise InvalidArgument("nothing to shard: no scenario")
    num_shards = min(num_shards, len(units))
    total = sum(cost for _, _, cost in units)
    shards: list[list[tuple[str, int, float]]] = [[] for _ in range(num_shards)]
    done, s = 0.0, 0
    for i, unit in enumerate(units):
        left_units, left_shards = len(units) - i, num_shards - s
        # move on when this shard has its share, or when every later shard needs a unit
        if shards[s] and (done >= total * (s + 1) / num_shards or left_units <= left_shards - 1):
            s += 1
        shards[s].append(unit)
        done += unit[2]
    return tuple(Shard(i, _items(units, totals)) for i, units in enumerate(shards))


def _items(units, totals: dict[str, int]) -> tuple[WorkItem, ...]:
    """Consecutive groups of one scenario as one item."""
    items: list[WorkItem] = []
    for name, g, cost in units:
        last = items[-1] if items else None
        if last is not None and last.scenario == name and last.stop == g:
            items[-1] = WorkItem(name, last.start, g + 1, last.cost + cost, totals[name])
        else:
            items.append(WorkItem(name, g, g + 1, cost, totals[name]))
    return tuple(items)
