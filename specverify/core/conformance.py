"""Rule conformance and efficiency: is the rule the declared one, and what does it accept?

The verdict of a run answers one question -- is the target distribution preserved? -- from
the tests of the law only.  Acceptance tests (family ``"acceptance"``: accepted drafts
against the exact acceptance probability of the *declared* rule, the accepted-depth law of a
tree round) answer another: is the rule the declared one?  A lossless rule that differs from
the declared one (sample-and-match on a stochastic drafter) fails them with an exact output
law.  They are graded under their own error budget (:func:`specverify.stats.grade`) and
summarised here as the run's **rule conformance** (pass / suspicious / fail) with its
**efficiency**: accepted drafts -- and tokens -- per verify pass, measured against the
declared rule's expectation.  ``Report.gate_conformance`` makes conformance part of the verdict.

Efficiency, per scenario, from the acceptance tests' recorded counts (so a report read back
from JSON gives the same numbers): with ``n_j`` trials at in-block position (or tree depth)
``j``, ``o_j`` of them accepted and ``e_j`` the sum of their exact acceptance probabilities
under the declared rule,

* measured accepted drafts per pass ``= sum_j o_j / n_1`` (every pass has a trial at position 1);
* declared ``= sum_j a_1 c_1 ... a_{j-1} c_{j-1} a_j`` with ``a_j = e_j / n_j`` the declared
  rule's acceptance probability averaged over the trials at ``j`` and ``c_j = n_{j+1} / o_j``
  the share of accepted drafts that had a next trial (1 on a chain; below 1 where a tree's
  accepted node is a leaf).  Exact when the acceptance probability does not depend on the
  context; otherwise the declared rule's expectation at the contexts the run reached.
  Positions the run never reached add nothing.

Tokens per pass are one more (the correction or bonus token).  Scenarios are pooled weighted
by their passes.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from specverify.core.results import FAIL, PASS, SUSPICIOUS, TestResult, is_error_record

__all__ = [
    "CONFORMANCE_FAMILIES",
    "count_phrase",
    "test_counts",
    "Conformance",
    "Efficiency",
    "conformance_line",
    "conformance_of",
    "is_conformance",
    "scenario_efficiency",
    "verdict_results",
]

#: Families that test the rule against the declared one, not the output law.
CONFORMANCE_FAMILIES = ("acceptance",)


def is_conformance(result: TestResult) -> bool:
    """Whether ``result`` tests rule conformance (acceptance against the declared rule), not the law."""
    return result.family in CONFORMANCE_FAMILIES


def test_counts(results: Sequence[TestResult]) -> dict[str, int]:
    """How many tests a run holds: ``{"law", "rule_conformance", "total"}`` (implementation-error records left out)."""
    tests = [r for r in results if not is_error_record(r)]
    rule = sum(1 for r in tests if is_conformance(r))
    return {"law": len(tests) - rule, "rule_conformance": rule, "total": len(tests)}


def count_phrase(results: Sequence[TestResult], *, gate_conformance: bool = False) -> str:
    """The run's tests, said the same way in every place that counts them.

    ``"720 tests (668 of the law, 52 of rule conformance)"``; ``"668 tests"`` without rule
    conformance tests.  When conformance gates the verdict it says so.
    """
    counts = test_counts(results)
    if not counts["rule_conformance"]:
        return f"{counts['total']:,} tests"
    gates = ", both in the verdict" if gate_conformance else ""
    return (
        f"{counts['total']:,} tests ({counts['law']:,} of the law, {counts['rule_conformance']:,} of rule "
        f"conformance{gates})"
    )


def verdict_results(results: Sequence[TestResult], *, gate_conformance: bool = False) -> list[TestResult]:
    """The tests a verdict is made of: the law tests (no error records), and conformance ones when gated."""
    return [r for r in results if not is_error_record(r) and (gate_conformance or not is_conformance(r))]


@dataclass(frozen=True)
class Efficiency:
    """Accepted drafts per verify pass, measured and expected under the declared rule (see the module docstring).

    Attributes
    ----------
    passes : int
        Verify passes (trials at the first position), all scenarios.
    measured : float
        Measured accepted drafts per pass (pooled over scenarios by passes).
    declared : float
        The declared rule's expected accepted drafts per pass.
    scenarios : tuple of dict
        Per scenario ``{"scenario", "passes", "measured", "declared"}``.
    """

    passes: int
    measured: float
    declared: float
    scenarios: tuple[Mapping[str, Any], ...] = ()

    @property
    def difference(self) -> float:
        """Tokens per pass gained (> 0) or lost (< 0) against the declared rule."""
        return self.measured - self.declared

    def sentence(self) -> str:
        """``"2.41 tokens per verify pass measured vs 2.87 expected under the declared rule (-0.46 per pass, -16%)"``."""
        measured, declared = self.measured + 1.0, self.declared + 1.0
        relative = f", {100.0 * self.difference / declared:+.0f}%" if declared > 0 else ""
        return (
            f"{measured:.3g} tokens per verify pass measured vs {declared:.3g} expected under the declared rule "
            f"({self.difference:+.3g} per pass{relative}; {self.passes:,} passes)"
        )


@dataclass(frozen=True)
class Conformance:
    """A run's rule conformance: its grade, the tests behind it and its efficiency.

    Attributes
    ----------
    verdict : str or None
        ``"pass"``, ``"suspicious"`` or ``"fail"`` (the worst conformance grade); None when the
        run has no conformance test.
    gated : bool
        Whether conformance is part of the run's verdict (``gate_conformance``).
    tests, failed, suspicious : int
        Conformance tests, and how many of them failed / are suspicious.
    efficiency : Efficiency or None
        None when no acceptance test recorded its counts.
    """

    verdict: str | None
    gated: bool
    tests: int
    failed: int
    suspicious: int
    efficiency: Efficiency | None = None

    def to_dict(self) -> dict:
        """The report's JSON ``"conformance"`` object (derived; ignored when a report is read back)."""
        eff = self.efficiency
        efficiency = None
        if eff is not None:
            efficiency = {
                "passes": eff.passes,
                "measured_accepted_per_pass": eff.measured,
                "declared_accepted_per_pass": eff.declared,
                "measured_tokens_per_pass": eff.measured + 1.0,
                "declared_tokens_per_pass": eff.declared + 1.0,
                "tokens_per_pass_difference": eff.difference,
                "scenarios": [dict(s) for s in eff.scenarios],
            }
        return {
            "verdict": self.verdict,
            "gates_verdict": self.gated,
            "families": list(CONFORMANCE_FAMILIES),
            "tests": self.tests,
            "failed": self.failed,
            "suspicious": self.suspicious,
            "efficiency": efficiency,
        }


def _number(value: Any) -> float | None:
    try:
        x = float(value)
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) else None


def _position(label: str) -> int | None:
    """``"block=3"`` / ``"draft=3"`` -> 3; None for other labels."""
    head, _, tail = str(label).partition("=")
    return int(tail) if head in ("block", "draft") and tail.isdigit() else None


def scenario_efficiency(tests: Sequence[TestResult]) -> tuple[int, float, float] | None:
    """``(passes, measured, declared)`` accepted drafts per pass of one scenario's acceptance tests, or None."""
    counts: dict[int, tuple[float, float, float]] = {}
    for r in tests:
        j, details = _position(r.position), r.details if isinstance(r.details, Mapping) else {}
        n, o, e = (_number(details.get(k)) for k in ("trials", "observed", "expected"))
        if r.name == "acceptance" and j is not None and n and o is not None and e is not None:
            counts[j] = (n, o, e)
    if 1 not in counts:
        return None
    passes = counts[1][0]
    measured = sum(o for _, o, _ in counts.values()) / passes
    declared, reach, j = 0.0, 1.0, 1
    while j in counts:
        n, o, e = counts[j]
        declared += reach * e / n
        branching = counts[j + 1][0] / o if j + 1 in counts and o > 0 else 0.0
        reach *= (e / n) * branching
        j += 1
    return int(passes), measured, declared


def _efficiency(tests: Sequence[TestResult]) -> Efficiency | None:
    by_scenario: dict[str, list[TestResult]] = {}
    for r in tests:
        by_scenario.setdefault(str(r.scenario), []).append(r)
    rows: list[tuple[str, int, float, float]] = []
    for name, group in by_scenario.items():
        got = scenario_efficiency(group)
        if got is not None:
            rows.append((name, *got))
    total = sum(passes for _, passes, _, _ in rows)
    if not total:
        return None
    measured = sum(passes * m for _, passes, m, _ in rows) / total
    declared = sum(passes * d for _, passes, _, d in rows) / total
    records = tuple({"scenario": n, "passes": passes, "measured": m, "declared": d} for n, passes, m, d in rows)
    return Efficiency(int(total), measured, declared, records)


def conformance_of(results: Sequence[TestResult], *, gated: bool = False) -> Conformance:
    """The rule conformance of a run's graded results (see the module docstring)."""
    tests = [r for r in results if is_conformance(r) and not is_error_record(r)]
    grades = [r.grade for r in tests]
    verdict = None
    if tests:
        verdict = FAIL if FAIL in grades else SUSPICIOUS if SUSPICIOUS in grades else PASS
    return Conformance(
        verdict=verdict,
        gated=bool(gated),
        tests=len(tests),
        failed=grades.count(FAIL),
        suspicious=grades.count(SUSPICIOUS),
        efficiency=_efficiency(tests),
    )


def conformance_line(conformance: Conformance) -> str | None:
    """One line for every report format, or None when the run has no conformance test.

    ``"rule conformance: FAIL (3 of 12 acceptance tests failed, own error budget; does not gate the
    verdict) -- efficiency: ..."``.
    """
    if conformance.verdict is None:
        return None
    flagged = []
    if conformance.failed:
        flagged.append(f"{conformance.failed} failed")
    if conformance.suspicious:
        flagged.append(f"{conformance.suspicious} suspicious")
    counts = f"{' and '.join(flagged) or 'all passed'} of {conformance.tests} acceptance tests"
    gate = "gates the verdict" if conformance.gated else "does not gate the verdict"
    meaning = {
        PASS: "the rule accepts as the declared one does",
        SUSPICIOUS: "acceptance close to differing from the declared rule's",
        FAIL: "the rule is not the declared one (its output law is judged by the verdict)",
    }[conformance.verdict]
    line = f"rule conformance: {conformance.verdict.upper()} ({counts}, own error budget; {gate}): {meaning}"
    if conformance.efficiency is not None:
        line += f"; efficiency: {conformance.efficiency.sentence()}"
    return line
