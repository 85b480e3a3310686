"""The law verdict vs rule conformance: a lossless rule that is not the declared one passes the
verdict and fails conformance (and the verdict too with ``gate_conformance=True``); a lossy rule
fails the verdict through the law tests.  Fixed seeds; each battery run here takes < 5 s."""

from __future__ import annotations

import json

import pytest

from specverify.cli.audit import _validate, audit_argv
from specverify.cli.commands import build_parser
from specverify.core.errors import InvalidArgument
from specverify.core.results import Report
from specverify.mutants import by_name
from specverify.report import render_html, render_markdown
from specverify.report.content import first_failure
from specverify.verifier.battery import check_verifier
from specverify.verifier.tree.battery import check_tree_verifier

CHAIN = ["pos8_uniform_k4"]  # stochastic drafter: sum p q < sum min(p, q)
TREE = ["markov8_iid_2x2"]  # i.i.d. siblings from a stochastic q


@pytest.fixture(scope="module")
def chain_match():
    return check_verifier(by_name("sample_and_match").fn, scenarios=CHAIN, seed=1)


@pytest.fixture(scope="module")
def tree_match():
    return check_tree_verifier(by_name("sample_and_match_any_mode").fn, scenarios=TREE, seed=0)


def test_sample_and_match_on_a_chain_preserves_the_law_but_is_not_the_declared_rule(chain_match):
    report = chain_match
    assert report.verdict == "pass" and report.passed, report.summary()
    conformance = report.conformance
    assert conformance.verdict == "fail" and not conformance.gated and conformance.failed >= 1
    # sample-and-match accepts sum p q < sum min(p, q): tokens per pass are lost
    assert conformance.efficiency.difference < -0.1
    assert first_failure(report) is None  # the verdict names no failure
    assert "rule conformance: FAIL" in report.summary()


def test_gating_makes_conformance_fail_the_verdict():
    report = check_verifier(by_name("sample_and_match").fn, scenarios=CHAIN, seed=1, gate_conformance=True)
    assert report.verdict == "fail" and not report.passed and report.gate_conformance
    assert first_failure(report).family == "acceptance"
    assert "gates the verdict" in report.summary() and "gate_conformance=True" in report.command


def test_sample_and_match_on_an_iid_tree_passes_the_verdict_and_fails_conformance(tree_match):
    assert tree_match.verdict == "pass", tree_match.summary()
    assert tree_match.conformance.verdict == "fail" and tree_match.conformance.efficiency.difference < 0
    gated = check_tree_verifier(by_name("sample_and_match_any_mode").fn, scenarios=TREE, seed=0, gate_conformance=True)
    assert gated.verdict == "fail" and gated.conformance.gated


@pytest.mark.parametrize("name", ["residual_not_carried", "residual_zero_only_rejected"])
def test_lossy_tree_mutants_still_fail_through_the_law(name):
    # both were first killed by an acceptance test before conformance left the verdict
    report = check_tree_verifier(by_name(name).fn, scenarios=TREE, seed=0)
    assert report.verdict == "fail" and first_failure(report).family != "acceptance"


def test_lossy_chain_mutant_still_fails():
    report = check_verifier(by_name("pointmass_accept").fn, scenarios=CHAIN, seed=0)
    assert report.verdict == "fail" and first_failure(report).family in ("gof", "directed", "support")


def test_conformance_line_in_every_format_and_json(chain_match):
    data = json.loads(chain_match.to_json())
    assert data["schema"] == "specverify.report/2" and data["gate_conformance"] is False
    rule = data["conformance"]
    assert rule["verdict"] == "fail" and rule["gates_verdict"] is False and rule["families"] == ["acceptance"]
    eff = rule["efficiency"]
    assert eff["measured_tokens_per_pass"] == pytest.approx(eff["measured_accepted_per_pass"] + 1)
    assert eff["tokens_per_pass_difference"] < 0 and eff["scenarios"][0]["scenario"] == CHAIN[0]
    assert "Rule conformance: FAIL" in render_markdown(chain_match)
    assert '<p class="conformance">Rule conformance: FAIL' in render_html(chain_match, plots=False)
    again = Report.from_json(chain_match.to_json())
    assert again.conformance == chain_match.conformance and again.gate_conformance is False


def test_a_schema_1_report_still_loads(chain_match):
    data = chain_match.to_dict()
    data["schema"] = "specverify.report/1"
    for key in ("gate_conformance", "conformance"):
        data.pop(key)
    old = Report.from_dict(data)
    assert old.gate_conformance is False and old.verdict == chain_match.verdict
    with pytest.raises(InvalidArgument, match="specverify.report/9"):
        Report.from_dict({**data, "schema": "specverify.report/9"})


@pytest.mark.parametrize("check", [check_verifier, check_tree_verifier])
def test_gate_conformance_is_validated(check):
    with pytest.raises(InvalidArgument, match="gate_conformance must be True or False, got 'yes'"):
        check(by_name("canonical").fn, gate_conformance="yes")


def test_audit_drafter_validates_gate_conformance():
    from specverify.drafter import audit_drafter

    with pytest.raises(InvalidArgument, match="gate_conformance must be True or False, got 1"):
        audit_drafter(object(), object(), gate_conformance=1)


def test_cli_flag_is_recorded_and_refused_where_there_is_no_acceptance():
    parser = build_parser()
    args = parser.parse_args(["audit", "--verifier", "reference.rules:verify", "--gate-conformance"])
    assert args.gate_conformance is True and "--gate-conformance" in audit_argv(args)
    assert "--gate-conformance" not in audit_argv(parser.parse_args(["audit", "--verifier", "reference.rules:verify"]))
    for argv in (
        ["audit", "--decoder", "m:d", "--target", "m:t", "--gate-conformance"],
        ["audit", "--verifier", "m:v", "--greedy", "--gate-conformance"],
    ):
        args = parser.parse_args(argv)
        with pytest.raises(InvalidArgument, match="--gate-conformance"):
            _validate(args, "decoder" if "--decoder" in argv else "verifier")


def test_plugin_settings_carry_the_gate_into_both_repro_lines():
    from specverify.cli.plugin_settings import Settings

    s = Settings(impl="reference.rules:verify", tier="smoke", seed=0, alpha=1e-3, greedy=False, skips=None,
                 report=None, battery="specverify.verifier.battery", gate_conformance=True)  # fmt: skip
    assert "--gate-conformance" in s.audit_command()
    assert "--specverify-gate-conformance" in s.pytest_command("specverify[protocol]")
