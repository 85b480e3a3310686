"""A benchmark's numbers: per arm latency quantiles and throughput, per level the speedups with intervals.

Speedups are stated so that above 1 means the speculative configuration is faster:

* ``tokens_per_s``: (speculative tokens / speculative round time) over (baseline tokens /
  baseline round time), summed over the measured rounds (throughput at that concurrency);
* ``latency_mean``, ``latency_p50/p90/p99``: baseline end-to-end latency over speculative;
* ``tpot_mean``, ``tpot_p50``: baseline time per output token over speculative, from the first
  token to the last (streamed subjects only): the decoding phase, which the cost model predicts;
* ``ttft_p50``: baseline time to first token over speculative (speculation usually costs a
  little here: its first step drafts before it verifies).

Beside them, ``saved_ms``: the mean end-to-end latency the speculative configuration saves per
request (baseline minus speculative, milliseconds).  A difference, unlike a ratio, is free of
what every request costs both arms alike (its HTTP handling, its queueing at a server that is
not busy), which is why a known answer is checked on it.

Each is a :class:`~specverify.bench.intervals.Interval` of the paired bootstrap over the level's
pairs of rounds (:func:`~specverify.bench.intervals.paired_bootstrap`), seeded from the bench's seed
and the level, so the same records give the same intervals.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from specverify.bench.counters import SpecCounts
from specverify.bench.intervals import QUANTILES, Interval, paired_bootstrap, percentile
from specverify.bench.runner import Level, Round
from specverify.core.seeds import derive_seed

__all__ = ["ArmSummary", "LevelSummary", "summarise", "SPEEDUPS"]

#: The speedups every level states, in this order.
SPEEDUPS = (
    "tokens_per_s",
    "latency_mean",
    "latency_p50",
    "latency_p90",
    "latency_p99",
    "tpot_mean",
    "tpot_p50",
    "ttft_p50",
)


@dataclass(frozen=True)
class ArmSummary:
    """One arm at one concurrency: requests, tokens per second, latency / TTFT / TPOT quantiles (seconds)."""

    requests: int
    tokens_per_s: float
    latency: dict[int, float]
    latency_mean: float
    ttft: dict[int, float] | None
    tpot: dict[int, float] | None

    def as_dict(self) -> dict:
        def q(d):
            return None if d is None else {f"p{k}": v for k, v in d.items()}

        return {"requests": self.requests, "tokens_per_s": self.tokens_per_s, "latency": q(self.latency),
                "latency_mean": self.latency_mean, "ttft": q(self.ttft), "tpot": q(self.tpot)}  # fmt: skip


@dataclass(frozen=True)
class LevelSummary:
    """One concurrency: both arms, the speedups with intervals, and the acceptance counters."""

    concurrency: int
    speculative: ArmSummary
    baseline: ArmSummary
    speedups: dict[str, Interval]
    saved_ms: Interval
    counters: SpecCounts | None
    counters_note: str

    def as_dict(self) -> dict:
        return {
            "concurrency": self.concurrency,
            "speculative": self.speculative.as_dict(),
            "baseline": self.baseline.as_dict(),
            "speedups": {name: interval.as_dict() for name, interval in self.speedups.items()},
            "saved_ms": self.saved_ms.as_dict(),
            "counters": None if self.counters is None else self.counters.as_dict(),
            "counters_note": "" if self.counters is not None else self.counters_note,
        }


def _values(rounds: list[Round], idx: np.ndarray, what: Callable) -> np.ndarray:
    values = [what(t) for i in idx for t in rounds[i].timings]
    return np.array([v for v in values if v is not None], dtype=np.float64)


def _throughput(rounds: list[Round], idx: np.ndarray) -> float:
    tokens = np.array([rounds[i].tokens for i in idx], dtype=np.float64)
    wall = np.array([rounds[i].wall for i in idx], dtype=np.float64)
    return float(tokens.sum() / wall.sum())


def _arm(rounds: list[Round]) -> ArmSummary:
    idx = np.arange(len(rounds))
    latency = _values(rounds, idx, lambda t: t.latency)
    ttft = _values(rounds, idx, lambda t: t.first_token)
    tpot = _values(rounds, idx, lambda t: t.per_output_token)
    return ArmSummary(
        requests=int(latency.size),
        tokens_per_s=_throughput(rounds, idx),
        latency={q: percentile(latency, q) for q in QUANTILES},
        latency_mean=float(latency.mean()),
        ttft={q: percentile(ttft, q) for q in QUANTILES} if ttft.size else None,
        tpot={q: percentile(tpot, q) for q in QUANTILES} if tpot.size else None,
    )


def _ratio(spec: list[Round], base: list[Round], what: Callable, stat: Callable) -> Callable[[np.ndarray], float]:
    """statistic(baseline values) / statistic(speculative values) over the pairs ``idx``."""

    def ratio(idx: np.ndarray) -> float:
        b, s = _values(base, idx, what), _values(spec, idx, what)
        if not b.size or not s.size:
            return float("nan")
        denominator = stat(s)
        return float(stat(b) / denominator) if denominator > 0 else float("nan")

    return ratio


def _statistics(spec: list[Round], base: list[Round]) -> dict[str, Callable[[np.ndarray], float]]:
    latency = _latency

    def p(q):
        return lambda values: percentile(values, q)

    return {
        "tokens_per_s": lambda idx: _throughput(spec, idx) / _throughput(base, idx),
        "latency_mean": _ratio(spec, base, latency, np.mean),
        "latency_p50": _ratio(spec, base, latency, p(50)),
        "latency_p90": _ratio(spec, base, latency, p(90)),
        "latency_p99": _ratio(spec, base, latency, p(99)),
        "tpot_mean": _ratio(spec, base, lambda t: t.per_output_token, np.mean),
        "tpot_p50": _ratio(spec, base, lambda t: t.per_output_token, p(50)),
        "ttft_p50": _ratio(spec, base, lambda t: t.first_token, p(50)),
    }


def summarise(level: Level, *, seed: int, resamples: int = 2000, level_of_confidence: float = 0.95) -> LevelSummary:
    """The level's arms and speedups (see the module docstring); a speedup a subject cannot time is left out."""
    spec, base = level.arm("speculative"), level.arm("baseline")
    pairs = min(len(spec), len(base))
    spec, base = spec[:pairs], base[:pairs]
    speedups = {}
    for n, (name, statistic) in enumerate(_statistics(spec, base).items()):
        generator = torch.Generator().manual_seed(derive_seed(seed, level.concurrency, n))
        interval = paired_bootstrap(pairs, statistic, generator=generator, resamples=resamples,
                                    level=level_of_confidence)  # fmt: skip
        if np.isfinite(interval.estimate):
            speedups[name] = interval

    def saved(idx: np.ndarray) -> float:
        return 1e3 * float(_values(base, idx, _latency).mean() - _values(spec, idx, _latency).mean())

    generator = torch.Generator().manual_seed(derive_seed(seed, level.concurrency, len(SPEEDUPS)))
    saved_ms = paired_bootstrap(pairs, saved, generator=generator, resamples=resamples, level=level_of_confidence)
    return LevelSummary(level.concurrency, _arm(spec), _arm(base), speedups, saved_ms, level.counters,
                        level.counters_note)  # fmt: skip


def _latency(timing) -> float:
    return timing.latency
