"""What a drafter buys: acceptance per in-block position, accepted length, speedup, latency.

From the counters of :class:`specverify.decoder.pipeline.PipelineStats` (the drafter run
through :class:`~specverify.decoder.pipeline.ProtocolDecoder` with the audited verifier):

* acceptance rate per in-block position with a two-sided Clopper-Pearson interval
  (exact binomial; conservative for the adaptively chosen trials here, whose
  probabilities differ from trial to trial), and the exact expectation: the mean of the
  per-trial probabilities ``sum_x min(p, q)`` (Leviathan et al. 2023, sec. 3.1);
* ``acceptance`` tests (family ``"acceptance"``): the accepted count at each position
  against the Poisson-binomial law of its exact per-trial probabilities
  (:func:`specverify.stats.acceptance_test`).  The trials are sequential (a trial at
  position i+1 exists only after an acceptance at i), each Bernoulli with its exact
  probability given the past, so the centred count is a martingale with the
  Poisson-binomial's variance as its predictable variation: the test is
  asymptotically valid (martingale CLT) -- and fails for a drafter whose reported q
  is not its sampling law, or a broken accept step;
* mean accepted length with a normal interval, tokens per target pass, target passes
  per emitted token, the accepted-length histogram and its exact expectation given the
  drafts (``prod_{i<j} r_i (1 - r_j)``, ``r = min(1, p(x)/q(x))``, averaged over rounds);
* the speedup model of :mod:`specverify.measure.costmodel` (``best_draft_length``) with the
  observed per-position rates (positions past the audited K assume the last rate) for
  the given drafter cost c or a few typical ones, and the memory-bound latency per
  token for a model of ``model_params`` parameters.

References: Leviathan, Kalman & Matias (ICML 2023), sec. 3; C. J. Clopper and
E. S. Pearson, Biometrika 26 (1934).
"""

from __future__ import annotations

import math

import numpy as np
from scipy import stats as _st

from specverify import stats
from specverify.core.results import TestResult
from specverify.decoder.pipeline import PipelineStats
from specverify.measure import costmodel

__all__ = [
    "clopper_pearson",
    "acceptance_results",
    "efficiency_section",
    "acceptance_entry",
    "DEFAULT_DRAFT_COSTS",
    "CI_LEVEL",
]

#: Drafter cost (drafter pass / target pass) values for which the speedup curve is reported when none is given.
DEFAULT_DRAFT_COSTS = (0.01, 0.05, 0.1, 0.25)
#: Level of the reported confidence intervals.
CI_LEVEL = 0.95
#: Longest draft length the speedup model considers.
MAX_K = 16


def clopper_pearson(successes: int, trials: int, level: float = CI_LEVEL) -> tuple[float, float]:
    """Two-sided exact (Clopper-Pearson) interval of a binomial rate; (nan, nan) without trials."""
    if trials <= 0:
        return (math.nan, math.nan)
    tail = (1.0 - level) / 2.0
    low = 0.0 if successes == 0 else float(_st.beta.ppf(tail, successes, trials - successes + 1))
    high = 1.0 if successes == trials else float(_st.beta.isf(tail, successes + 1, trials - successes))
    return (low, high)


def acceptance_results(run: PipelineStats, *, alpha: float, scenario: str) -> list[TestResult]:
    """One ``acceptance`` test per in-block position (ungraded)."""
    out = []
    for i in range(run.k):
        if run.drafted[i] == 0:
            continue
        out.append(
            stats.acceptance_test(
                run.accepted[i],
                run.accept_probs[i],
                alpha=alpha,
                name="acceptance",
                family="acceptance",
                scenario=scenario,
                position=f"draft={i + 1}",
            )
        )
    return out


def acceptance_entry(run: PipelineStats) -> dict:
    """``Report.extra["acceptance"][scenario]`` in the report renderer's documented format."""
    positions = [
        {
            "position": i + 1,
            "observed_rate": run.acceptance_rate[i],
            "expected_rate": run.expected_acceptance_rate[i],
            "n": run.drafted[i],
        }
        for i in range(run.k)
        if run.drafted[i]
    ]
    total = sum(run.length_probs_sum)
    return {
        "positions": positions,
        "length_counts": list(run.length_counts),
        "length_probs": [x / total for x in run.length_probs_sum] if total > 0 else [],
    }


def _speedup_block(rates: np.ndarray, k: int, cost: float, target_seconds: float | None) -> dict:
    plan = costmodel.best_draft_length(rates, cost, max_k=MAX_K)
    block = {
        "draft_cost": cost,
        "best_k": plan.best_k,
        "best_speedup": plan.best_speedup,
        "speedup_at_audited_k": costmodel.speedup(rates, k, cost),
        "speedups": list(plan.speedups),
    }
    if target_seconds is not None:
        block["seconds_per_token_at_best_k"] = costmodel.latency_per_token(rates, plan.best_k, cost, target_seconds)
        block["seconds_per_token_at_audited_k"] = costmodel.latency_per_token(rates, k, cost, target_seconds)
    return block


def efficiency_section(
    run: PipelineStats,
    *,
    draft_cost: float | None,
    model_params: float | None,
    bandwidth: float,
    bytes_per_param: float,
) -> dict:
    """``Report.extra["efficiency"]``: the numbers listed in the module docstring (JSON-able)."""
    K = run.k
    positions = []
    for i in range(K):
        low, high = clopper_pearson(run.accepted[i], run.drafted[i])
        positions.append(
            {
                "position": i + 1,
                "drafted": run.drafted[i],
                "accepted": run.accepted[i],
                "observed_rate": run.acceptance_rate[i],
                "ci_low": low,
                "ci_high": high,
                "expected_rate": run.expected_acceptance_rate[i],
            }
        )
    counts = np.asarray(run.length_counts, dtype=np.float64)
    lengths = np.arange(K + 1)
    rounds = max(run.rounds, 1)
    mean = float((counts * lengths).sum() / rounds)
    sd = float(np.sqrt(max((counts * (lengths - mean) ** 2).sum() / max(rounds - 1, 1), 0.0)))
    half = float(_st.norm.isf((1 - CI_LEVEL) / 2)) * sd / math.sqrt(rounds)
    section = {
        "k": K,
        "ci_level": CI_LEVEL,
        "rounds": run.rounds,
        "tokens_generated": run.tokens_generated,
        "tokens_kept": run.tokens_kept,
        "positions": positions,
        "mean_accepted": mean,
        "mean_accepted_ci": [mean - half, mean + half],
        "expected_mean_accepted": run.expected_mean_accepted,
        "tokens_per_target_pass": run.tokens_per_pass,
        "expected_tokens_per_target_pass": 1.0 + run.expected_mean_accepted,
        "target_passes_per_token": 1.0 / run.tokens_per_pass if run.tokens_per_pass else math.nan,
        "target_passes_per_kept_token": run.target_passes_per_token,
        "length_counts": list(run.length_counts),
        "length_probs": acceptance_entry(run)["length_probs"],
        "model_note": "speedup = E[tokens per round] / (c K + 1) (Leviathan et al. 2023) with the observed "
        "per-position rates; positions past the audited K assume the last observed rate",
    }
    rates = np.array([r if np.isfinite(r) else 0.0 for r in run.acceptance_rate], dtype=np.float64)
    target_seconds = None
    if model_params is not None:
        target_seconds = costmodel.target_pass_seconds(
            model_params, bytes_per_parameter=bytes_per_param, bandwidth_bytes_per_s=bandwidth
        )
        section["latency"] = {
            "model_params": model_params,
            "bytes_per_param": bytes_per_param,
            "bandwidth_bytes_per_s": bandwidth,
            "target_pass_seconds": target_seconds,
            "plain_decoding_seconds_per_token": target_seconds,
            "note": "memory-bound lower bound: one target pass reads every weight once",
        }
    costs = (draft_cost,) if draft_cost is not None else DEFAULT_DRAFT_COSTS
    section["speedup"] = [_speedup_block(rates, K, float(c), target_seconds) for c in costs]
    return section
