"""Run the battery on one verifier entry: verdict, killing test, samples needed, LR limit.

* verdict: :func:`specverify.verifier.battery.check_verifier` on the entry's scenarios
  (:mod:`.plan`) at the run's alpha;
* killing test: the failing result with the smallest adjusted p-value (a protocol
  violation, i.e. an ``ImplementationError``, counts as a kill by the protocol check);
* samples needed: a doubling schedule on the killing scenario alone -- the scenario
  re-run with 8, 16, 32, ... rows (same tables, same seed; fewer rows per batch below
  the scenario's batch size, more batches above it), each level graded on its own at
  alpha -- the emitted tokens of the smallest level that kills, else the full level's
  (the verdict run).  The schedule's resolution is a factor 2;
* LR limit (:mod:`specverify.selftest.lr_limit`): for the killing test's token set, the
  samples the Neyman-Pearson test that knows the mutant's law would need at alpha and
  power 0.9, expressed in emitted tokens of the scenario; ratio = samples needed / that.
"""

from __future__ import annotations

import dataclasses
import math
import time

from specverify import stats
from specverify.core.conformance import verdict_results
from specverify.core.results import FAIL
from specverify.verifier.battery import check_verifier, run_scenario
from specverify.verifier.scenarios import get_scenarios

__all__ = ["BELOW_TIER", "killing_test", "run_verifier_entry", "scaled_scenario", "scenario_tokens", "FIRST_LEVEL_ROWS"]

#: Rows of the first doubling level.
FIRST_LEVEL_ROWS = 8


def killing_test(results) -> dict | None:
    """The failing test of the law with the smallest adjusted p-value, as a dict (None if none failed).

    Rule-conformance tests do not kill: the verdict is the law's (:mod:`specverify.core.conformance`).
    """
    failing = [r for r in verdict_results(results) if r.grade == FAIL]
    if not failing:
        return None
    r = min(failing, key=lambda x: (x.adjusted_pvalue if x.adjusted_pvalue is not None else 1.0, x.pvalue))
    details = {k: v for k, v in r.details.items() if k in ("context", "error", "tokens")}
    return {**_summary(r), "alpha_share": r.alpha, "details": details}


def _summary(r) -> dict:
    """Where a result stands and how strong it is, for a selftest row."""
    return {
        "family": r.family,
        "name": r.name,
        "scenario": r.scenario,
        "position": r.position,
        "pvalue": r.pvalue,
        "adjusted_pvalue": r.adjusted_pvalue,
        "n": r.n,
    }


def protocol_kill(error: str) -> dict:
    """The 'killing test' of a run stopped by a protocol violation (no statistic)."""
    return {
        "family": "protocol",
        "name": "protocol",
        "scenario": "",
        "position": "",
        "pvalue": 0.0,
        "adjusted_pvalue": 0.0,
        "n": 0,
        "details": {"error": error},
    }


def best_result(results) -> dict | None:
    """The test of the law with the smallest adjusted p-value (for a survivor: how close it came)."""
    graded = [r for r in verdict_results(results) if r.adjusted_pvalue is not None]
    if not graded:
        return None
    return _summary(min(graded, key=lambda x: (x.adjusted_pvalue, x.pvalue)))


def scenario_tokens(scenario, tier: str) -> int:
    return scenario.batch_size * scenario.num_groups(tier) * scenario.length


def scaled_scenario(scenario, rows: int):
    """The same scenario (same tables: they are seeded by the name) with about ``rows`` rows in the smoke tier.

    The smoke tier's batch multiplier is pinned to 1, so ``groups`` is the number of batches.
    """
    rows = max(2, int(rows))
    unscaled = (("smoke", 1),)
    if rows >= scenario.batch_size:
        return dataclasses.replace(scenario, groups=max(1, math.ceil(rows / scenario.batch_size)), tier_scale=unscaled)
    return dataclasses.replace(scenario, batch_size=rows, groups=1, tier_scale=unscaled)


def _doubling(fn, scenario, *, tier: str, seed: int, alpha: float) -> tuple[int | None, list]:
    full_rows = scenario.batch_size * scenario.num_groups(tier)
    trace = []
    rows = FIRST_LEVEL_ROWS
    while rows < full_rows:
        sc = scaled_scenario(scenario, rows)
        res, errs, secs = run_scenario(fn, sc, tier="smoke", seed=seed, alpha=alpha)
        graded = stats.grade(res, alpha=alpha)
        killed = bool(errs) or stats.verdict(graded) == FAIL
        tokens = sc.batch_size * sc.num_groups("smoke") * sc.length
        trace.append({"tokens": tokens, "killed": killed, "seconds": secs})
        if killed:
            return tokens, trace
        rows *= 2
    return None, trace


#: ``expected`` of a mutant whose ``tokens_to_detect`` (a measured lower bound) is at least the tokens a run has.
BELOW_TIER = "below tier"


def _expected(entry, samples_run: int) -> str:
    """``"pass"`` (an equivalent), ``"fail"`` (a mutant the run must kill) or :data:`BELOW_TIER`
    (a mutant whose measured effect needs more tokens than the run has: reported, not scored)."""
    if entry.kind != "verifier":
        return "pass"
    needed = entry.tokens_to_detect
    return BELOW_TIER if needed and samples_run <= needed else "fail"


def run_verifier_entry(
    entry, *, tier: str, seed: int, alpha: float, scenarios=None, schedule: bool = True, lr_rows: int | None = None
) -> dict:
    """One matrix row for a verifier entry (mutant or equivalent); see the module docstring."""
    from specverify.selftest.entry_scenarios import equivalent_scenarios, mutant_scenarios

    mutant = entry.kind == "verifier"
    if scenarios is None:
        scenarios = mutant_scenarios(entry.name, tier) if mutant else equivalent_scenarios(entry.requires, tier)
    chosen = get_scenarios(scenarios)
    start = time.perf_counter()
    report = check_verifier(
        entry.fn,
        tier=tier,
        seed=seed,
        alpha=alpha,
        scenarios=[s.name for s in chosen],
        implementation=f"catalogue:{entry.name}",
    )
    verdict_seconds = time.perf_counter() - start
    kill = killing_test(report.results)
    if kill is None and report.errors:
        kill = protocol_kill(report.errors[0])
    killed = not report.passed  # a fail, or an error (the mutant broke the protocol)
    samples_run = sum(scenario_tokens(s, tier) for s in chosen)
    expected = _expected(entry, samples_run)
    row = {
        "group": "verifier" if mutant else "equivalent",
        "name": entry.name,
        "kind": entry.kind,
        "provenance": entry.provenance,
        "needs": entry.needs,
        "requires": entry.requires,
        "expected": expected,
        "verdict": report.verdict,
        "conformance": report.conformance.verdict,
        "killed": killed,
        "ok": {"fail": killed, "pass": not killed}.get(expected, True),
        "scenarios": [s.name for s in chosen],
        "samples_run": samples_run,
        "tokens_to_detect": entry.tokens_to_detect,
        "effect": entry.effect,
        "killing_test": kill,
        "closest_test": None if killed else best_result(report.results),
        "errors": list(report.errors),
        "samples_needed": None,
        "samples_method": None,
        "lr": None,
        "lr_ratio": None,
    }
    if killed and mutant and kill is not None:
        by_name = {s.name: s for s in chosen}
        kill_scenario = by_name.get(kill["scenario"]) or chosen[0]
        full = scenario_tokens(kill_scenario, tier)
        if schedule:
            needed, trace = _doubling(entry.fn, kill_scenario, tier=tier, seed=seed, alpha=alpha)
            row["samples_needed"] = needed if needed is not None else full
            row["samples_method"] = "doubling"
            row["doubling"] = trace
            # killed at the first level: the schedule only bounds the samples needed from above
            row["samples_at_most"] = len(trace) == 1 and trace[0]["killed"]
        else:
            row["samples_needed"], row["samples_method"] = full, "run"
        if lr_rows and "within-batch" in entry.needs:
            row["lr"] = {
                "n_lr_tokens": None,
                "note": "no LR limit: the mutant makes the rows of a batch dependent "
                "(each row's law is exact), so the i.i.d. likelihood-ratio limit does not apply",
            }
        elif lr_rows:
            from specverify.selftest.lr_limit import estimate_law_limit

            t0 = time.perf_counter()
            try:
                lr = estimate_law_limit(
                    entry.fn,
                    kill_scenario,
                    kill["position"],
                    kill["family"],
                    rows=lr_rows,
                    seed=seed,
                    alpha=alpha,
                    details=kill.get("details"),
                )
            except Exception as exc:  # the mutant raised inside the Monte Carlo run: report, do not crash
                lr = {"n_lr_tokens": None, "note": f"{type(exc).__name__}: {exc}"}
            lr["seconds"] = time.perf_counter() - t0
            row["lr"] = lr
            if lr.get("n_lr_tokens"):
                row["lr_ratio"] = row["samples_needed"] / lr["n_lr_tokens"]
    row["seconds"] = time.perf_counter() - start
    row["verdict_seconds"] = verdict_seconds
    return row
