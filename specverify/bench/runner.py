"""Interleaved rounds: the speculative configuration and its baseline, the same requests, alternating.

At each concurrency ``c`` a round sends ``c * requests_per_client`` requests through ``c``
workers (each worker sends its next request when its last one is answered, as ``c`` users
would) and lasts from the first request to the last reply.  Rounds alternate A B B A A B ... so
that neither arm always goes first; the ``j``-th request of a round gets the same prompt and
the same seed on both arms.  Warm-up pairs run first and are not kept (a server's first
requests compile kernels and fill caches).  The speculative subject's counters are read
after the warm-up and after the last round of each concurrency, so acceptance is counted over
the measured rounds only.  A failed request stops the benchmark with the server's error.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from specverify.bench.counters import SpecCounts
from specverify.bench.timed import Timing
from specverify.core.errors import InvalidArgument
from specverify.core.validation import check_int

__all__ = ["ARMS", "Round", "Level", "run_levels"]

#: The two arms, in the order the first pair runs them.
ARMS = ("speculative", "baseline")


@dataclass(frozen=True)
class Round:
    """One arm's round: its wall time (first request sent to last reply) and its requests' timings."""

    arm: str
    pair: int
    wall: float
    timings: tuple[Timing, ...]

    @property
    def tokens(self) -> int:
        return sum(t.tokens for t in self.timings)


@dataclass(frozen=True)
class Level:
    """Every measured round at one concurrency, and the speculative subject's counters over them."""

    concurrency: int
    rounds: tuple[Round, ...]
    counters: SpecCounts | None
    counters_note: str

    def arm(self, name: str) -> list[Round]:
        """The arm's rounds in pair order."""
        return sorted((r for r in self.rounds if r.arm == name), key=lambda r: r.pair)


def _order(pair: int) -> tuple[str, str]:
    """A B, B A, A B, ...: each arm goes first in every other pair."""
    return ARMS if pair % 2 == 0 else ARMS[::-1]


def _round(subject, prompts: list, pool: ThreadPoolExecutor, first_index: int, count: int) -> tuple[float, list]:
    started = time.perf_counter()
    futures = [pool.submit(subject.request, prompts[(first_index + j) % len(prompts)], first_index + j)
               for j in range(count)]  # fmt: skip
    timings = [future.result() for future in futures]  # a failed request raises here
    return time.perf_counter() - started, timings


def run_levels(
    subjects: dict,
    prompts: list,
    *,
    concurrency: tuple[int, ...] = (1, 4, 16),
    pairs: int = 8,
    warmup_pairs: int = 1,
    requests_per_client: int = 2,
    progress=None,
) -> list[Level]:
    """Run both arms (``subjects["speculative"]``, ``subjects["baseline"]``) at every concurrency.

    ``progress(done, total, what)``, if given, is called after each round.
    """
    if set(subjects) != set(ARMS):
        raise InvalidArgument(f"subjects must name exactly {ARMS}, got {sorted(subjects)}")
    if not prompts:
        raise InvalidArgument("prompts must not be empty")
    pairs = check_int("pairs", pairs, minimum=2)
    warmup_pairs = check_int("warmup_pairs", warmup_pairs, minimum=0)
    requests_per_client = check_int("requests_per_client", requests_per_client, minimum=1)
    if not concurrency or any(check_int("concurrency", c, minimum=1) > 256 for c in concurrency):
        raise InvalidArgument(f"concurrency must be levels in [1, 256], got {concurrency!r}")
    total = len(concurrency) * (pairs + warmup_pairs) * 2
    done = 0
    levels = []
    index = {arm: 0 for arm in ARMS}
    for c in concurrency:
        count = c * requests_per_client
        rounds: list[Round] = []
        before: SpecCounts | None = None
        with ThreadPoolExecutor(max_workers=c, thread_name_prefix=f"bench-c{c}") as pool:
            for pair in range(-warmup_pairs, pairs):
                if pair == 0:
                    before = subjects["speculative"].counters()
                for arm in _order(pair):
                    wall, timings = _round(subjects[arm], prompts, pool, index[arm], count)
                    index[arm] += count
                    if pair >= 0:
                        rounds.append(Round(arm, pair, wall, tuple(timings)))
                    done += 1
                    if progress is not None:
                        progress(done, total, f"concurrency {c}, {'warm-up' if pair < 0 else 'pair'} {pair}, {arm}")
        after = subjects["speculative"].counters()
        counts = after if after is None or before is None else after - before  # none before: nothing counted yet
        levels.append(Level(c, tuple(rounds), counts, getattr(subjects["speculative"], "counters_note", "")))
    return levels
