"""What a drafter buys: expected tokens per target pass, speedup and latency models.

Leviathan, Kalman & Matias (ICML 2023), section 3: with an acceptance rate
``a`` that is the same at every draft position, one round of draft length K
emits ``(1 - a^(K+1)) / (1 - a)`` tokens in expectation, and with a drafter
whose forward pass costs ``c`` target passes the walltime improvement factor is
``(1 - a^(K+1)) / ((1 - a) (c K + 1))``.  Real drafters' acceptance decays with
the in-block position, so the general form used here takes per-position rates
``a_1..a_K``: ``E[tokens per round] = 1 + a_1 + a_1 a_2 + ... + a_1...a_K``
(the bonus or residual token is always emitted).

The memory-bound cost model: at small batch a target forward pass reads every
weight once, so it takes at least ``weight_bytes / memory_bandwidth`` (an 8B
bf16 model on an H100: 16 GB / 3.35 TB/s ~ 4.8 ms).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from specverify.core.errors import InvalidArgument
from specverify.core.validation import check_int

__all__ = [
    "expected_tokens_per_round",
    "speedup",
    "best_draft_length",
    "target_pass_seconds",
    "latency_per_token",
    "SpeedupPlan",
]


def _rates(acceptance_rates, name: str = "acceptance_rates") -> np.ndarray:
    rates = np.atleast_1d(np.asarray(acceptance_rates, dtype=np.float64))
    if rates.ndim != 1 or rates.size == 0 or not np.all(np.isfinite(rates)) or np.any((rates < 0) | (rates > 1)):
        raise InvalidArgument(f"{name} must be a non-empty sequence of numbers in [0, 1], got {acceptance_rates!r}")
    return rates


def _per_position(acceptance_rates, k: int) -> np.ndarray:
    """Rates for positions 1..k: a scalar is repeated; a sequence is extended with its last value."""
    rates = _rates(acceptance_rates)
    if rates.size >= k:
        return rates[:k]
    return np.concatenate([rates, np.full(k - rates.size, rates[-1])])


def expected_tokens_per_round(acceptance_rates, k: int) -> float:
    """Expected tokens emitted per target pass: ``sum_{j=0..K} prod_{i<=j} a_i``.

    Parameters
    ----------
    acceptance_rates : float or sequence of float
        Acceptance probability at each in-block position (a scalar means the same at every position).
    k : int
        Draft length K >= 1.
    """
    k = check_int("k", k, minimum=1)
    rates = _per_position(acceptance_rates, k)
    return float(1.0 + np.cumprod(rates).sum())


def speedup(acceptance_rates, k: int, draft_cost: float) -> float:
    """Walltime improvement factor over plain decoding: E[tokens per round] / (c K + 1)."""
    if not (isinstance(draft_cost, (int, float)) and np.isfinite(draft_cost) and draft_cost >= 0):
        raise InvalidArgument(
            f"draft_cost must be a finite number >= 0 (drafter pass / target pass), got {draft_cost!r}"
        )
    return expected_tokens_per_round(acceptance_rates, k) / (draft_cost * k + 1.0)


@dataclass(frozen=True)
class SpeedupPlan:
    """Best draft length under the speedup model, with the whole curve."""

    best_k: int
    best_speedup: float
    speedups: tuple[float, ...]  # index i is K = i + 1
    tokens_per_round: tuple[float, ...]


def best_draft_length(acceptance_rates, draft_cost: float, *, max_k: int = 16) -> SpeedupPlan:
    """The K in 1..max_k that maximises :func:`speedup`."""
    max_k = check_int("max_k", max_k, minimum=1)
    speedups = [speedup(acceptance_rates, k, draft_cost) for k in range(1, max_k + 1)]
    tokens = [expected_tokens_per_round(acceptance_rates, k) for k in range(1, max_k + 1)]
    best = int(np.argmax(speedups))
    return SpeedupPlan(best + 1, speedups[best], tuple(speedups), tuple(tokens))


def target_pass_seconds(
    num_parameters: float, *, bytes_per_parameter: float = 2.0, bandwidth_bytes_per_s: float = 3.35e12
) -> float:
    """Lower bound of one memory-bound target forward pass: weight bytes / memory bandwidth."""
    for name, value in (
        ("num_parameters", num_parameters),
        ("bytes_per_parameter", bytes_per_parameter),
        ("bandwidth_bytes_per_s", bandwidth_bytes_per_s),
    ):
        if not (isinstance(value, (int, float)) and np.isfinite(value) and value > 0):
            raise InvalidArgument(f"{name} must be a positive number, got {value!r}")
    return num_parameters * bytes_per_parameter / bandwidth_bytes_per_s


def latency_per_token(acceptance_rates, k: int, draft_cost: float, target_seconds: float) -> float:
    """Estimated seconds per emitted token: (c K + 1) t_target / E[tokens per round]."""
    if not (isinstance(target_seconds, (int, float)) and np.isfinite(target_seconds) and target_seconds > 0):
        raise InvalidArgument(f"target_seconds must be a positive number, got {target_seconds!r}")
    return target_seconds / speedup(acceptance_rates, k, draft_cost)
