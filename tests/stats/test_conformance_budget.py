"""Rule conformance is graded under its own budget and counts in a verdict only when gated."""

from __future__ import annotations

import pytest

from specverify import stats
from specverify.core.conformance import conformance_line, conformance_of, is_conformance, scenario_efficiency
from specverify.core.results import TestResult


def _result(family: str, p: float, *, name: str = "", position: str = "", scenario: str = "s", **details):
    return TestResult(
        statistic=0.0,
        pvalue=p,
        name=name or family,
        family=family,
        method="",
        n=1,
        scenario=scenario,
        position=position,
        details=details,
    )


LAW = [_result("gof", 4e-4), _result("directed", 2e-4), _result("support", 1.0), _result("independence", 0.3)]
RULE = [_result("acceptance", 1e-9), _result("acceptance", 0.02), _result("acceptance", 0.5)]


def _graded_fields(results):
    return [(r.alpha, r.adjusted_pvalue, r.grade) for r in results]


def test_conformance_neither_consumes_nor_inflates_the_law_budget():
    mixed = stats.grade(LAW[:2] + RULE + LAW[2:], alpha=1e-3)
    law_alone, rule_alone = stats.grade(LAW, alpha=1e-3), stats.grade(RULE, alpha=1e-3)
    law_in_mixed = [r for r in mixed if not is_conformance(r)]
    rule_in_mixed = [r for r in mixed if is_conformance(r)]
    assert _graded_fields(law_in_mixed) == _graded_fields(law_alone)
    assert _graded_fields(rule_in_mixed) == _graded_fields(rule_alone)
    # each budget spends the whole alpha among its own tests
    assert sum(r.alpha for r in law_in_mixed) == pytest.approx(1e-3)
    assert sum(r.alpha for r in rule_in_mixed) == pytest.approx(1e-3)
    # input order is kept
    assert [r.family for r in mixed] == [r.family for r in LAW[:2] + RULE + LAW[2:]]


def test_verdict_is_the_laws_unless_conformance_gates_it():
    passing_law = stats.grade([_result("gof", 0.4), _result("support", 1.0)] + RULE, alpha=1e-3)
    assert [r.grade for r in passing_law if is_conformance(r)][0] == "fail"
    assert stats.run_verdict(passing_law, []) == "pass"
    assert stats.verdict(passing_law) == "pass"
    assert stats.run_verdict(passing_law, [], gate_conformance=True) == "fail"
    assert stats.verdict(passing_law, gate_conformance=True) == "fail"
    graded, verdict = stats.grade_run(passing_law, [], alpha=1e-3, gate_conformance=True)
    assert verdict == "fail" and len(graded) == len(passing_law)
    failing_law = stats.grade([_result("gof", 0.0)] + RULE[2:], alpha=1e-3)
    assert stats.run_verdict(failing_law, []) == "fail"  # a lossy rule fails with or without the gate
    # a run whose only tests are conformance tests tested nothing of the law: it fails
    assert stats.run_verdict(stats.grade(RULE[2:], alpha=1e-3), []) == "fail"


def test_conformance_summary_and_efficiency_from_recorded_counts():
    # K = 2 on a chain: 100 passes, 50 accepted at position 1 (declared 60), 20 of 50 at 2 (declared 25)
    tests = [
        _result("acceptance", 1e-6, position="block=1", trials=100, observed=50, expected=60.0),
        _result("acceptance", 0.3, position="block=2", trials=50, observed=20, expected=25.0),
    ]
    passes, measured, declared = scenario_efficiency(tests)
    assert passes == 100
    assert measured == pytest.approx(0.7)  # (50 + 20) / 100
    assert declared == pytest.approx(0.6 + 0.6 * 1.0 * 0.5)  # a_1 + a_1 c_1 a_2, c_1 = 50/50
    conformance = conformance_of(stats.grade(tests + [_result("gof", 0.5)], alpha=1e-3))
    assert (conformance.verdict, conformance.tests, conformance.failed, conformance.gated) == ("fail", 2, 1, False)
    assert conformance.efficiency.difference == pytest.approx(0.7 - 0.9)
    line = conformance_line(conformance)
    assert line.startswith("rule conformance: FAIL (1 failed of 2 acceptance tests")
    assert "does not gate the verdict" in line and "1.7 tokens per verify pass measured vs 1.9 expected" in line
    assert conformance_of([_result("gof", 0.5)]).verdict is None and conformance_line(conformance_of([])) is None


def test_a_leaf_lowers_the_declared_reach():
    # a tree whose accepted depth-1 nodes have children only half the time: c_1 = 30 / 60
    tests = [
        _result("acceptance", 0.5, position="block=1", trials=100, observed=60, expected=60.0),
        _result("acceptance", 0.5, position="block=2", trials=30, observed=15, expected=15.0),
    ]
    passes, measured, declared = scenario_efficiency(tests)
    assert (passes, measured) == (100, pytest.approx(0.75))
    assert declared == pytest.approx(0.6 + 0.6 * 0.5 * 0.5)  # = measured: the rule accepts as declared
