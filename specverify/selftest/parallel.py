"""The selftest's parts in worker processes: the same rows, in the same order, in less wall time.

Every part of the selftest (one catalogue entry's battery, the calibration run) is seeded by
the run's seed alone and shares no state with another part, so running the parts in separate
processes changes nothing but the wall time: :func:`run_parts` returns their results in
submission order whatever order they finish in.  Workers are spawned (never forked: torch's
thread pools do not survive a fork) and run one torch thread each, one core per worker.
"""

from __future__ import annotations

import multiprocessing
import pickle
import time
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Any

from specverify.core.errors import InvalidArgument

__all__ = ["Part", "run_parts"]


@dataclass(frozen=True)
class Part:
    """One independent unit of selftest work: ``fn(**kwargs)``, announced as ``label``."""

    label: str
    fn: Callable[..., Any]
    kwargs: dict = field(default_factory=dict)


def _init_worker() -> None:
    import torch

    torch.set_num_threads(1)  # one core per worker process


def _picklable(part: Part) -> None:
    try:
        pickle.dumps((part.fn, part.kwargs))
    except Exception as exc:  # any pickling failure means the part cannot travel
        raise InvalidArgument(
            f"workers > 1 needs picklable selftest parts; {part.label!r} is not ({type(exc).__name__}: {exc}): "
            "define its functions at module level, or run with workers=1"
        ) from None


def run_parts(parts: Sequence[Part], *, workers: int = 1, progress: Callable[[str], None] | None = None) -> list:
    """Run every part; their results in the order of ``parts``.

    Parameters
    ----------
    parts : sequence of Part
    workers : int, default 1
        1 runs the parts in this process, one after another (``progress`` before each);
        more spawns that many worker processes (``progress`` as each part finishes).
    progress : callable, optional
        ``progress(message)``.

    Returns
    -------
    list
        ``parts[i].fn(**parts[i].kwargs)`` at index i.  A part that raises re-raises here
        (the other parts are cancelled).
    """
    say = progress or (lambda message: None)
    if workers == 1 or len(parts) <= 1:
        results = []
        for part in parts:
            say(part.label)
            results.append(part.fn(**part.kwargs))
        return results
    for part in parts:
        _picklable(part)
    start = time.perf_counter()
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(
        max_workers=min(workers, len(parts)), mp_context=context, initializer=_init_worker
    ) as pool:
        futures = {pool.submit(part.fn, **part.kwargs): i for i, part in enumerate(parts)}
        results: list = [None] * len(parts)
        pending = set(futures)
        try:
            while pending:
                done, pending = wait(pending, return_when=FIRST_COMPLETED)
                for future in done:
                    i = futures[future]
                    results[i] = future.result()
                    say(f"{parts[i].label} (done, {time.perf_counter() - start:.0f} s)")
        except BaseException:
            for future in pending:
                future.cancel()
            raise
    return results
