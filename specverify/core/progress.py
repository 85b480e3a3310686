"""Progress of a run, counted in work units as its groups finish, for every battery and backend.

A battery plans its work as scenarios of equal-sized groups (a group of the chain or tree
harness emits ``batch_size * length`` tokens; a decoder prompt has three stages).  A
:class:`ProgressTracker` is told when each group finishes -- once per group, however many
times a backend reports it -- and tells the caller's ``progress`` callback:

- a callable with an ``update`` method (the command line's bar, the pytest plugin) gets
  ``update(state)`` with the whole :class:`ProgressState` (units and scenarios done, what is
  running, elapsed seconds, an ETA);
- any other callable gets ``progress(done, total, name)``: ``done`` and ``total`` in work units
  (tokens for the sampling batteries), ``name`` the running scenario with the count of
  finished ones, e.g. ``"markov4_oracle_k8 (3/14 scenarios done)"``, and ``""`` at the end.

The first call comes before any work (``done == 0``), the last when everything is done
(``done == total``, name ``""``); ``done`` never decreases.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

__all__ = ["ProgressState", "ProgressTracker", "format_count", "format_seconds", "scenario_plan", "stage_plan"]


@dataclass(frozen=True)
class ProgressState:
    """Where a run stands.

    Attributes
    ----------
    done, total : int
        Work units finished and planned (``unit``: ``"tokens"`` for the sampling batteries).
    unit : str
        What ``done`` counts.
    scenarios_done, scenarios_total : int
        Scenarios (prompts, for the decoder battery) whose every group has finished.
    current : str
        The first unfinished scenario in the battery's order; ``""`` when all are done.
    elapsed : float
        Seconds since the tracker started.
    """

    done: int
    total: int
    unit: str
    scenarios_done: int
    scenarios_total: int
    current: str
    elapsed: float

    @property
    def eta(self) -> float | None:
        """Seconds left at the rate so far (None before the first unit is done)."""
        if self.done <= 0 or self.elapsed <= 0:
            return None
        return max(self.total - self.done, 0) * self.elapsed / self.done

    def describe(self) -> str:
        """``"38% (1.21M/3.17M tokens), 5/14 scenarios done, 12 s, ETA 20 s"`` (no ETA once done)."""
        percent = 100 * self.done / max(self.total, 1)
        text = f"{percent:.0f}% ({format_count(self.done)}/{format_count(self.total)} {self.unit})"
        if self.scenarios_total > 1:
            text += f", {self.scenarios_done}/{self.scenarios_total} scenarios done"
        text += f", {format_seconds(self.elapsed)}"
        eta = self.eta
        if eta is not None and self.done < self.total:
            text += f", ETA {format_seconds(eta)}"
        return text

    def label(self) -> str:
        """``"<running scenario> (3/14 scenarios done)"``, or ``""`` when everything is done."""
        if not self.current:
            return ""
        return f"{self.current} ({self.scenarios_done}/{self.scenarios_total} scenarios done)"


class ProgressTracker:
    """Counts finished groups per scenario and reports them (see the module docstring).

    Parameters
    ----------
    progress : callable or None
        The caller's callback; None makes every method a no-op.
    plan : sequence of (name, groups, units per group)
        The scenarios in the battery's order.
    unit : str
        What a unit is (``"tokens"``).

    Thread-safe: groups may be reported from several threads.
    """

    def __init__(
        self,
        progress: Callable | None,
        plan: Sequence[tuple[str, int, int]],
        *,
        unit: str = "tokens",
        clock: Callable[[], float] = time.perf_counter,
    ):
        self.progress, self.unit, self.clock = progress, unit, clock
        self.plan = {name: (int(groups), int(units)) for name, groups, units in plan}
        self.total = sum(groups * units for groups, units in self.plan.values())
        self.seen: dict[str, set[int]] = {name: set() for name in self.plan}
        self.done = 0
        self.start = clock()
        self.lock = threading.Lock()

    def group_done(self, scenario: str, group: int) -> None:
        """Group ``group`` of ``scenario`` finished (reporting it again changes nothing)."""
        if self.progress is None or scenario not in self.plan:
            return
        with self.lock:
            if group in self.seen[scenario]:
                return
            self.seen[scenario].add(group)
            self.done += self.plan[scenario][1]
            self._emit()

    def scenario_done(self, scenario: str) -> None:
        """Every group of ``scenario`` finished (e.g. a shard that analysed it whole came back)."""
        if self.progress is None or scenario not in self.plan:
            return
        with self.lock:
            groups, units = self.plan[scenario]
            missing = set(range(groups)) - self.seen[scenario]
            if not missing:
                return
            self.seen[scenario].update(missing)
            self.done += len(missing) * units
            self._emit()

    def begin(self) -> None:
        """The first call (nothing done yet)."""
        if self.progress is not None:
            with self.lock:
                self._emit()

    def finish(self) -> None:
        """The last call: everything done (also what was skipped or stopped early)."""
        if self.progress is None:
            return
        with self.lock:
            for name, (groups, _) in self.plan.items():
                self.seen[name] = set(range(groups))
            self.done = self.total
            self._emit()

    def state(self) -> ProgressState:
        finished = [name for name, (groups, _) in self.plan.items() if len(self.seen[name]) >= groups]
        current = next((name for name, (groups, _) in self.plan.items() if len(self.seen[name]) < groups), "")
        return ProgressState(
            done=self.done,
            total=self.total,
            unit=self.unit,
            scenarios_done=len(finished),
            scenarios_total=len(self.plan),
            current=current,
            elapsed=self.clock() - self.start,
        )

    def _emit(self) -> None:
        state = self.state()
        update = getattr(self.progress, "update", None)
        if callable(update):
            update(state)
        elif self.progress is not None:
            self.progress(state.done, state.total, state.label())


def format_count(n: int) -> str:
    """``"812"``, ``"45.1k"``, ``"3.21M"``."""
    for size, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if n >= size:
            return f"{n / size:.3g}{suffix}"
    return str(n)


def format_seconds(seconds: float) -> str:
    """``"12 s"``, ``"3 min 05 s"``."""
    if seconds < 120:
        return f"{seconds:.0f} s"
    return f"{seconds // 60:.0f} min {seconds % 60:02.0f} s"


def scenario_plan(scenarios: Sequence, tier: str) -> list[tuple[str, int, int]]:
    """``(name, groups, tokens per group)`` of harness scenarios (``batch_size * length`` tokens a group)."""
    return [(s.name, s.num_groups(tier), int(s.batch_size) * int(s.length)) for s in scenarios]


def stage_plan(names: Sequence[str], stages: int | Mapping[str, int]) -> list[tuple[str, int, int]]:
    """``(name, stages, 1)`` per item: progress counted in stages (the decoder and drafter audits)."""
    per = stages if isinstance(stages, Mapping) else dict.fromkeys(names, stages)
    return [(name, int(per[name]), 1) for name in names]
