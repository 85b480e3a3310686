"""Calibration of the battery: false-alarm rate of correct implementations over many seeds.

The run's alpha (1e-3) makes false alarms too rare to observe in CI, so calibration
runs at ``CALIBRATION_ALPHA = 0.05``: each (implementation, scenario, seed) is one
small run of the scenario (its rows cut to ``rows``), graded on its own at 0.05
(weighted Holm, as a real run); its rejection is a Bernoulli trial with success
probability <= 0.05 when the battery is valid (Holm controls the family-wise rate;
equality is not expected: Holm is conservative under dependence and exact tests add
nothing).  Reported: rejections / trials with a Clopper-Pearson 95% interval, and
whether alpha is below the interval's upper end (the pass condition: the rate is not
significantly above alpha).  Also the raw p-values of the gof tests (KS distance to
uniform, informative only: tests within a run are dependent).
"""

from __future__ import annotations

import time

import numpy as np
from scipy import stats as _st

from specverify import stats
from specverify.core.results import FAIL
from specverify.mutants import by_name
from specverify.verifier.battery import run_scenario
from specverify.verifier.scenarios import get_scenarios

from .entry_scenarios import CALIBRATION_SCENARIOS, ONE_HOT_DRAFTERS
from .verifiers import scaled_scenario

__all__ = ["CALIBRATION_ALPHA", "CALIBRATION_PLANS", "clopper_pearson", "run_calibration"]

CALIBRATION_ALPHA = 0.05
#: (seeds, rows per scenario run, implementations) per tier.
# fmt: off
CALIBRATION_PLANS = {
    "smoke": (30, 1024, ("canonical",)),
    "standard": (200, 4096, ("canonical", "accept_le", "exponential_race", "residual_over_overlap", "no_bonus",
                             "sample_and_match", "pointmass_fallback")),
    "deep": (1000, 8192, ("canonical", "accept_le", "exponential_race", "residual_over_overlap", "no_bonus",
                          "sample_and_match", "pointmass_fallback")),
}
# fmt: on


def clopper_pearson(k: int, n: int, level: float = 0.95) -> tuple[float, float]:
    """Exact binomial confidence interval for k successes in n trials."""
    a = (1.0 - level) / 2
    lo = 0.0 if k == 0 else float(_st.beta.ppf(a, k, n - k + 1))
    hi = 1.0 if k == n else float(_st.beta.ppf(1 - a, k + 1, n - k))
    return lo, hi


def run_calibration(
    *,
    tier: str,
    seed: int,
    seeds: int | None = None,
    rows: int | None = None,
    implementations=None,
    scenarios=None,
    alpha: float = CALIBRATION_ALPHA,
) -> dict:
    """False-alarm rate of correct implementations at ``alpha`` over ``seeds`` seeds (see the module docstring)."""
    n_seeds, n_rows, impls = CALIBRATION_PLANS[tier]
    n_seeds = seeds or n_seeds
    n_rows = rows or n_rows
    impls = tuple(implementations or impls)
    chosen = get_scenarios(scenarios or CALIBRATION_SCENARIOS)
    start = time.perf_counter()
    per_impl, gof_p = {}, []
    for name in impls:
        entry = by_name(name)
        one_hot_only = "one-hot" in entry.requires
        trials = rejections = 0
        for sc in chosen:
            if one_hot_only and sc.drafter not in ONE_HOT_DRAFTERS:
                continue
            small = scaled_scenario(sc, n_rows)
            for s in range(n_seeds):
                res, errs, _ = run_scenario(entry.fn, small, tier="smoke", seed=seed * 100_003 + s, alpha=alpha)
                graded = stats.grade(res, alpha=alpha)
                trials += 1
                rejections += int(bool(errs) or stats.verdict(graded) == FAIL)
                gof_p += [r.pvalue for r in res if r.family == "gof"]
        lo, hi = clopper_pearson(rejections, trials)
        per_impl[name] = {
            "trials": trials,
            "rejections": rejections,
            "rate": rejections / max(trials, 1),
            "ci95": [lo, hi],
            "consistent": alpha <= hi,
        }
    total = sum(v["trials"] for v in per_impl.values())
    rej = sum(v["rejections"] for v in per_impl.values())
    lo, hi = clopper_pearson(rej, total)
    ks = _st.kstest(np.asarray(gof_p), "uniform") if gof_p else None
    return {
        "alpha": alpha,
        "seeds": n_seeds,
        "rows_per_run": n_rows,
        "scenarios": [s.name for s in chosen],
        "implementations": per_impl,
        "trials": total,
        "rejections": rej,
        "rate": rej / max(total, 1),
        "ci95": [lo, hi],
        "consistent": alpha <= hi,
        "gof_pvalues": {
            "count": len(gof_p),
            "ks_statistic": None if ks is None else float(ks.statistic),
            "ks_pvalue": None if ks is None else float(ks.pvalue),
            "fraction_below_alpha": float(np.mean(np.asarray(gof_p) <= alpha)) if gof_p else None,
        },
        "seconds": time.perf_counter() - start,
    }
