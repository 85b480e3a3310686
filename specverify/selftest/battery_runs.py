"""The decoder, drafter and tree entries of the catalogue, each run through its subject's whole battery.

Decoder mutants (``specverify.mutants.entries(subject="decoder")``) wrap the reference
speculative decoder around the tiny seeded transformer pair
(``reference.models.make_pair(vocab_size=32, seed=3, d_model=32, n_layers=2, n_heads=2,
draft_layers=1)``, K = 3); the lossless one (``stale_context``) must pass.  Drafter
mutants (:mod:`specverify.mutants.drafter`, when present) and its honest drafters are
audited against the Markov target of the ``markov8_temperature_k2`` scenario.

These checks are too slow for a doubling schedule in CI, so "samples needed" is the
power estimate of the killing test: with its observed noncentrality
``lam_hat = chi2.isf(p, df) - df`` (df = 1 for z-type tests) and ``lam*`` the
noncentrality a chi-square test with that df needs at its Holm share of alpha and power
0.9 (:func:`specverify.stats.power.noncentrality_needed`), ``N_needed ~ n lam* / lam_hat``
(noncentrality grows linearly in n under a fixed alternative).
"""

from __future__ import annotations

import math
import time

from scipy import stats as _st

from specverify.core.results import FAIL
from specverify.stats.power import noncentrality_needed

from .verifiers import best_result, killing_test, protocol_kill

__all__ = ["DECODER_SMOKE_SAMPLES", "power_estimate", "run_decoder_mutants", "run_drafter_mutants", "run_tree_entries"]

#: Continuations per prompt for decoder mutants in the smoke tier (the tier default is 4000).
DECODER_SMOKE_SAMPLES = 1000


def power_estimate(kill: dict | None) -> int | None:
    """Samples (in the killing test's own units, scaled to the run) at which it would have power 0.9."""
    if not kill or not kill.get("n"):
        return None
    df = kill.get("df") or 1
    alpha = kill.get("alpha_share") or 1e-3
    p = kill.get("pvalue") or 0.0
    if p > 0:
        lam_hat = float(_st.chi2.isf(p, df)) - df
    elif kill.get("statistic") is not None and kill.get("df"):
        lam_hat = float(kill["statistic"]) - df
    else:
        return None
    if not math.isfinite(lam_hat) or lam_hat <= 0:
        return None
    return max(1, int(math.ceil(kill["n"] * noncentrality_needed(df, alpha, 0.9) / lam_hat)))


def _kill_with_stats(results) -> dict | None:
    kill = killing_test(results)
    if kill is not None:
        r = next(
            x
            for x in results
            if x.grade == FAIL
            and x.scenario == kill["scenario"]
            and x.name == kill["name"]
            and x.position == kill["position"]
        )
        kill.update(df=r.df, statistic=r.statistic)
    return kill


#: ``expected`` of an entry this installation cannot run (not scored; the summary names it).
NOT_RUN = "not run"


def missing_engine(config) -> str:
    """Why an entry whose sampling needs an optional engine cannot run here ('' when it can)."""
    if getattr(config, "grammar", None) is None:
        return ""
    try:
        import xgrammar  # noqa: F401
    except ImportError:
        return "needs the grammar engine xgrammar: pip install 'specverify-suite[grammar]'"
    return ""


def not_run_row(group, name, kind, provenance, why, note) -> dict:
    """The row of an entry not run (``expected`` :data:`NOT_RUN`, ``ok``: it is not scored)."""
    return {
        "group": group, "name": name, "kind": kind, "provenance": provenance, "needs": why, "requires": "",
        "expected": NOT_RUN, "verdict": "not run", "conformance": "", "killed": False, "ok": True,
        "scenarios": [], "samples_run": 0, "killing_test": None, "closest_test": None, "errors": [],
        "samples_needed": None, "samples_method": None, "lr": None, "lr_ratio": None, "seconds": 0.0, "note": note,
    }  # fmt: skip


def _row(group, name, kind, provenance, expected_fail, report, seconds, samples_run, note="") -> dict:
    killed = not report.passed  # a fail, or an error (the mutant broke the protocol)
    kill = _kill_with_stats(report.results) if killed else None
    if killed and kill is None and report.errors:
        kill = protocol_kill(report.errors[0])
    needed = power_estimate(kill) if (killed and expected_fail) else None
    return {
        "group": group,
        "name": name,
        "kind": kind,
        "provenance": provenance,
        "needs": "",
        "requires": "",
        "expected": "fail" if expected_fail else "pass",
        "verdict": report.verdict,
        "conformance": report.conformance.verdict,
        "killed": killed,
        "ok": killed if expected_fail else not killed,
        "scenarios": [s.get("name", "") for s in report.scenarios],
        "samples_run": samples_run,
        "killing_test": kill,
        "closest_test": None if killed else best_result(report.results),
        "errors": list(report.errors),
        "samples_needed": needed,
        "samples_method": "power estimate (killing test's units)" if needed else None,
        "lr": None,
        "lr_ratio": None,
        "seconds": seconds,
        "note": note,
    }


def run_decoder_mutants(*, tier: str, seed: int, alpha: float, names=None) -> list[dict]:
    """One row per decoder mutant (``lossy=False`` ones are expected to pass)."""
    from specverify.decoder import TIER_PLANS, check_decoder
    from specverify.mutants import entries
    from specverify_reference.direct import TargetAdapter
    from specverify_reference.models import make_pair

    target, drafter = make_pair(vocab_size=32, seed=3, d_model=32, n_layers=2, n_heads=2, draft_layers=1)
    plan = TIER_PLANS[tier]
    num_samples = DECODER_SMOKE_SAMPLES if tier == "smoke" else None
    rows = []
    for m in entries(subject="decoder"):
        if names is not None and m.name not in names:
            continue
        missing = missing_engine(m.config)
        if missing:
            rows.append(not_run_row("decoder", m.name, "decoder", m.provenance, missing, m.description))
            continue
        start = time.perf_counter()
        report = check_decoder(
            m.build(target, drafter, k=3),
            TargetAdapter(target, m.config),
            tier=tier,
            seed=seed,
            alpha=alpha,
            num_samples=num_samples,
        )
        n = (num_samples or plan.num_samples) * plan.max_new_tokens * plan.num_prompts
        rows.append(
            _row(
                "decoder" if m.lossy else "decoder_equivalent",
                m.name,
                "decoder" if m.lossy else "decoder (lossless)",
                m.provenance,
                m.lossy,
                report,
                time.perf_counter() - start,
                n,
                note=m.description,
            )
        )
    return rows


DRAFTER_TARGET_SCENARIO = "markov8_temperature_k2"


def run_drafter_mutants(*, tier: str, seed: int, alpha: float, names=None) -> tuple[list[dict], str]:
    """``(rows, note)``: one row per drafter mutant and honest drafter, and where they were audited."""
    from specverify.drafter import AUDIT_PLANS, audit_drafter
    from specverify.mutants import entries
    from specverify.verifier.scenarios import get_scenarios

    (scenario,) = get_scenarios([DRAFTER_TARGET_SCENARIO])
    target, _ = scenario.build()
    plan = AUDIT_PLANS[tier]
    rows = []
    for e in entries(subject="drafter"):
        if names is not None and e.name not in names:
            continue
        mutant = e.lossy
        start = time.perf_counter()
        report = audit_drafter(e.build(target), target, tier=tier, seed=seed, alpha=alpha)
        n = plan.num_prompts * plan.consistency_samples
        rows.append(
            _row(
                "drafter" if mutant else "drafter_equivalent",
                e.name,
                e.kind,
                e.provenance,
                mutant,
                report,
                time.perf_counter() - start,
                n,
                note=e.description,
            )
        )
    return rows, f"drafters audited against the target of {DRAFTER_TARGET_SCENARIO} with the canonical verifier"


def run_tree_entries(*, tier: str, seed: int, alpha: float, names=None) -> list[dict]:
    """One row per tree catalogue entry: mutants must fail, equivalents pass, on their scenarios."""
    from specverify.mutants import entries
    from specverify.selftest.entry_scenarios import tree_entry_scenarios
    from specverify.verifier.tree.battery import check_tree_verifier

    rows = []
    for e in entries(subject="tree"):
        if names is not None and e.name not in names:
            continue
        start = time.perf_counter()
        scenarios = tree_entry_scenarios(e, tier)
        report = check_tree_verifier(e.fn, tier=tier, seed=seed, alpha=alpha, scenarios=scenarios)
        n = sum(s["rows_total"] * s["length"] for s in report.scenarios)
        group = "tree" if e.lossy else "tree_equivalent"
        row = _row(
            group, e.name, e.kind, e.provenance, e.lossy, report, time.perf_counter() - start, n, note=e.description
        )
        rows.append({**row, "needs": e.needs, "requires": e.requires})
    return rows
