"""The pytest plugin (specverify/plugin.py): options, items, selection, skips, messages, JUnit.

Most tests run pytest in-process (pytester) against a fake battery module written
into the test directory (``--specverify-battery fake_battery``), so they take
milliseconds and can steer grades per scenario; the fake records every
``check_verifier`` call in ``calls.json``.  The inertness test runs in a subprocess
(the plugin must be loaded through the pytest11 entry point and must not import
torch or scipy); one end-to-end run uses the real battery.
"""

from __future__ import annotations

import json
import textwrap
import xml.etree.ElementTree as ET

# Modules the in-process runs import (the active plugin; hypothesis' pytest plugin at summary time).
# Import them before pytester snapshots sys.modules: otherwise each test's teardown drops them and
# the next run re-imports them -- slow, and for torch a crash of the interpreter.
import hypothesis  # noqa: F401
import pytest
import scipy.stats  # noqa: F401  (report plots; numpy.fft cannot be loaded twice in one process)
import torch

import specverify.cli.audit  # the recorded command of a written report
import specverify.report  # noqa: F401

pytest_plugins = ["pytester"]

FAKE_BATTERY = '''
"""A fake battery: instant, and graded by attributes of the verify callable."""
import json, os
from specverify.core.results import Report, TestResult

SCENARIOS = ["alpha_small", "beta_markov", "gamma_bonus"]


def list_scenarios(tier, *, greedy=False):
    return ["greedy_ties"] if greedy else SCENARIOS + (["delta_deep"] if tier == "deep" else [])


def check_verifier(verify, *, tier="smoke", seed=0, alpha=1e-3, greedy=False, progress=None, scenarios=None):
    calls = json.load(open("calls.json")) if os.path.exists("calls.json") else []
    calls.append({"tier": tier, "seed": seed, "alpha": alpha, "greedy": greedy,
                  "scenarios": None if scenarios is None else list(scenarios)})
    json.dump(calls, open("calls.json", "w"))
    if getattr(verify, "crash", False):
        raise RuntimeError("battery bug")
    grades = getattr(verify, "grades", {})
    results = []
    for name in (list_scenarios(tier, greedy=greedy) if scenarios is None else scenarios):
        grade = grades.get(name, "pass")
        p = {"pass": 0.5, "suspicious": 2e-5, "fail": 1e-12}[grade]
        results.append(TestResult(
            statistic=123.4, pvalue=p, name="gof", family="gof", method="Cressie-Read lambda=2/3",
            n=4000, df=3.0, bins=4, mde_tv=0.031, alpha=alpha / 4, adjusted_pvalue=min(1.0, 4 * p),
            grade=grade, scenario=name, position="abs=2",
            details={"observed": [812, 1000, 1188, 1000], "expected": [1000.0, 1000.0, 1000.0, 1000.0],
                     "bin_tokens": [[5], [6], [7], [8, 9]]}))
    results.append(TestResult(statistic=0.0, pvalue=1.0, name="determinism", family="protocol",
                              method="same seed, same output", n=1, grade="pass", scenario=""))
    errors = tuple(getattr(verify, "errors", ()))
    verdict = "fail" if errors or "fail" in grades.values() else ("suspicious" if "suspicious" in grades.values() else "pass")
    return Report(kind="verifier", implementation=str(verify), tier=tier, seed=seed, alpha=alpha,
                  verdict=verdict, results=tuple(results), errors=errors,
                  scenarios=tuple({"name": n} for n in (scenarios or list_scenarios(tier, greedy=greedy))),
                  timings={"total": 0.01})
'''

IMPL = """
def good(target_probs, draft_probs, draft_tokens, *, generator):
    raise AssertionError("the fake battery never calls the verifier")

def bad(target_probs, draft_probs, draft_tokens, *, generator):
    raise AssertionError("the fake battery never calls the verifier")
bad.grades = {"beta_markov": "fail", "gamma_bonus": "suspicious"}

def broken(target_probs, draft_probs, draft_tokens, *, generator):
    raise AssertionError("the fake battery never calls the verifier")
broken.errors = ["scenario beta_markov: returned token 99 >= vocabulary size 8 (row 3)"]

def crash(target_probs, draft_probs, draft_tokens, *, generator):
    pass
crash.crash = True
"""

FAKE = ("--specverify-battery", "fake_battery")


@pytest.fixture
def fake(pytester, monkeypatch):
    for name in ("IMPL", "TIER", "SEED", "ALPHA", "SKIPS", "GREEDY", "REPORT", "BATTERY"):
        monkeypatch.delenv(f"SPECVERIFY_{name}", raising=False)
    pytester.makepyfile(fake_battery=FAKE_BATTERY, myimpl=IMPL)
    pytester.syspathinsert()
    return pytester


def calls(pytester) -> list[dict]:
    path = pytester.path / "calls.json"
    return json.loads(path.read_text()) if path.exists() else []


def test_inert_without_option_no_heavy_imports(pytester, monkeypatch):
    """Entry point loaded in a subprocess; no items, no header, and no torch/scipy/numpy imported."""
    monkeypatch.delenv("SPECVERIFY_IMPL", raising=False)
    pytester.makepyfile(
        test_light="""
        import sys

        def test_light(pytestconfig):
            assert pytestconfig.pluginmanager.has_plugin("specverify"), "entry point not loaded"
            heavy = sorted(m for m in ("torch", "scipy", "numpy", "specverify.verifier.battery", "specverify.report") if m in sys.modules)
            assert heavy == []
    """
    )
    result = pytester.runpytest_subprocess("-v", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)
    assert "specverify[" not in result.stdout.str()
    assert "implementation=" not in result.stdout.str()


def test_options_visible_in_process(pytester):
    result = pytester.runpytest("--help")
    result.stdout.fnmatch_lines(["*--specverify-impl=PKG.MOD:NAME*", "*--specverify-skips=FILE*"])


def test_items_pass_header_and_summary(fake):
    fake.makepyfile(test_user="def test_user(): pass")
    result = fake.runpytest("--specverify-impl", "myimpl:good", *FAKE, "--specverify-seed", "7", "-v")
    result.assert_outcomes(passed=5)
    result.stdout.fnmatch_lines(
        [
            "specverify: implementation=myimpl:good tier=smoke seed=7 alpha=0.001",
            "specverify 0.1.0, torch *, device *",
        ]
    )
    result.stdout.fnmatch_lines(
        ["*specverify?protocol? PASSED*", "*specverify?alpha_small? PASSED*", "*specverify?gamma_bonus? PASSED*"]
    )
    result.stdout.fnmatch_lines(
        [
            "*= specverify =*",
            "verifier myimpl:good: PASS (tier smoke, seed 7, alpha 0.001, 3 scenarios, 4 tests graded together, *",
            "repro: specverify audit --verifier myimpl:good --tier smoke --seed 7 --alpha 0.001",
        ]
    )
    assert calls(fake) == [{"tier": "smoke", "seed": 7, "alpha": 0.001, "greedy": False, "scenarios": None}]


def test_keyword_and_marker_selection_reach_the_battery(fake):
    result = fake.runpytest("--specverify-impl", "myimpl:good", *FAKE, "-k", "beta_markov or gamma")
    result.assert_outcomes(passed=2, deselected=2)
    result = fake.runpytest(
        "--specverify-impl",
        "myimpl:good",
        *FAKE,
        "-k",
        "specverify[alpha_small] or protocol",
        "--specverify-tier",
        "deep",
        "--specverify-alpha",
        "1e-4",
    )
    result.assert_outcomes(passed=2, deselected=3)
    result = fake.runpytest("--specverify-impl", "myimpl:good", *FAKE, "--specverify-greedy", "-v")
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(["*specverify?greedy_ties? PASSED*"])
    assert calls(fake) == [
        {"tier": "smoke", "seed": 0, "alpha": 0.001, "greedy": False, "scenarios": ["beta_markov", "gamma_bonus"]},
        {"tier": "deep", "seed": 0, "alpha": 1e-4, "greedy": False, "scenarios": ["alpha_small"]},
        {"tier": "smoke", "seed": 0, "alpha": 0.001, "greedy": True, "scenarios": None},
    ]
    fake.makepyfile(test_user="def test_user(): pass")
    result = fake.runpytest("--specverify-impl", "myimpl:good", *FAKE, "-m", "not specverify")
    result.assert_outcomes(passed=1, deselected=4)
    assert len(calls(fake)) == 3, "deselecting every item must not run the battery"
    result = fake.runpytest("--specverify-impl", "myimpl:good", *FAKE, "--collect-only", "-q")
    result.stdout.fnmatch_lines(["specverify[[]protocol[]]", "specverify[[]alpha_small[]]"])
    assert len(calls(fake)) == 3


def test_failure_message_and_suspicious_warning(fake):
    result = fake.runpytest("--specverify-impl", "myimpl:bad", *FAKE, "--specverify-seed", "3")
    result.assert_outcomes(passed=3, failed=1, warnings=1)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    out = result.stdout.str()
    result.stdout.fnmatch_lines(
        [
            "verifier myimpl:bad (tier=smoke, seed=3, alpha=0.001): scenario 'beta_markov' FAILED: 1 of 1 tests below their allocated alpha",
            "  gof@abs=2 ?FAIL? (Cressie-Read lambda=2/3)",
            "    observed vs expected: token 5: 812 vs 1000 (z=-5.9); token 7: 1188 vs 1000 (z=+5.9); *",
            "    statistic=123.4, p=1e-12, adjusted p=4e-12 (allocated alpha 0.00025), N=4000, df=3, bins=4, detectable TV=0.031, seed=3",
            "repro: specverify audit --verifier myimpl:bad --tier smoke --seed 3 --alpha 0.001",
            "       pytest --specverify-impl myimpl:bad --specverify-tier smoke --specverify-seed 3 "
            "--specverify-battery fake_battery -k 'specverify?beta_markov?'*",
        ]
    )
    assert "Traceback" not in out and "def runtest" not in out, "failures must read without a traceback"
    result.stdout.fnmatch_lines(
        [
            "  specverify?gamma_bonus?:0: SuspiciousResultWarning: verifier myimpl:bad * "
            "scenario 'gamma_bonus' SUSPICIOUS (p below 100x its allocated alpha; not a failure)",
            "    gof@abs=2 ?SUSPICIOUS? (Cressie-Read lambda=2/3)",
        ]
    )
    result.stdout.fnmatch_lines(
        [
            "verifier myimpl:bad: FAIL *",
            "worst tests:",
            "  ?FAIL? gof/gof beta_markov/abs=2: *",
            "  ?SUSPICIOUS? gof/gof gamma_bonus/abs=2: *",
        ]
    )
    # the same scenario alone, as the repro line says; -W error turns the warning into a failure
    result = fake.runpytest(
        "--specverify-impl",
        "myimpl:bad",
        *FAKE,
        "-k",
        "specverify[gamma_bonus]",
        "-W",
        "error::specverify.cli.plugin.SuspiciousResultWarning",
    )
    result.assert_outcomes(failed=1, deselected=3)


def test_written_report_records_the_run_as_a_command_the_cli_parses(fake):
    """--specverify-report: report.json's command is the `specverify audit` line of what ran (the subset too)."""
    from specverify.cli.commands import parse_command

    result = fake.runpytest(
        "--specverify-impl",
        "myimpl:good",
        *FAKE,
        "-k",
        "beta_markov or gamma",
        "--specverify-seed",
        "5",
        "--specverify-report",
        "out",
    )
    result.assert_outcomes(passed=2, deselected=2)
    command = json.loads((fake.path / "out" / "report.json").read_text())["command"]
    assert command == (
        "specverify audit --verifier myimpl:good --scenario beta_markov --scenario gamma_bonus "
        "--tier smoke --seed 5 --alpha 0.001"
    )
    args = parse_command(command)
    assert (args.verifier, args.scenario, args.tier, args.seed, args.alpha) == (
        "myimpl:good",
        ["beta_markov", "gamma_bonus"],
        "smoke",
        5,
        1e-3,
    )
    result.stdout.fnmatch_lines([f"repro: {command}"])


def test_implementation_errors_fail_protocol_and_their_scenario(fake):
    result = fake.runpytest("--specverify-impl", "myimpl:broken", *FAKE)
    result.assert_outcomes(passed=2, failed=2)
    result.stdout.fnmatch_lines(
        [
            "*: protocol ERROR: the implementation could not be tested",
            "  implementation error: scenario beta_markov: returned token 99 >= *",
        ]
    )
    result.stdout.fnmatch_lines(
        ["*: scenario 'beta_markov' ERROR: the implementation could not be tested", "  implementation error: *"]
    )
    result.stdout.fnmatch_lines(["verifier myimpl:broken: FAIL *", "implementation error: scenario beta_markov: *"])


@pytest.mark.parametrize(
    "impl, expect",
    [
        ("myimpl:crash", "RuntimeError: battery bug"),
        ("nowhere:verify", "*InvalidArgument: --specverify-impl='nowhere:verify': cannot import module 'nowhere'*"),
        ("myimpl:missing", "*has no attribute 'missing'*"),
    ],
)
def test_load_and_battery_errors_fail_every_item(fake, impl, expect):
    result = fake.runpytest("--specverify-impl", impl, *FAKE, "-k", "protocol or alpha")
    result.assert_outcomes(failed=2, deselected=2)
    result.stdout.fnmatch_lines([expect])
    assert len(calls(fake)) == (1 if impl == "myimpl:crash" else 0)


def test_missing_battery_module_fails_the_protocol_item(fake):
    result = fake.runpytest("--specverify-impl", "myimpl:good", "--specverify-battery", "no_such_battery")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*cannot load the battery (no_such_battery.check_verifier): ModuleNotFoundError*"])


def test_degrades_without_list_scenarios_or_subsets(fake):
    fake.makepyfile(old_battery=FAKE_BATTERY.replace("list_scenarios(tier", "_all(tier"))
    result = fake.runpytest("--specverify-impl", "myimpl:bad", "--specverify-battery", "old_battery", "-v")
    result.assert_outcomes(passed=1, failed=1, warnings=1)
    result.stdout.fnmatch_lines(
        [
            "*specverify?protocol? PASSED*",
            "*specverify?battery? FAILED*",
            "verifier myimpl:bad (*): the whole battery FAILED: 1 of 4 tests below *",
        ]
    )
    fake.makepyfile(nosubset=FAKE_BATTERY.replace(", scenarios=None):", "):\n    scenarios = None"))
    result = fake.runpytest("--specverify-impl", "myimpl:good", "--specverify-battery", "nosubset", "-k", "alpha")
    result.assert_outcomes(passed=1, deselected=3)
    result.stdout.fnmatch_lines(["note: nosubset.check_verifier has no 'scenarios' argument: all 3 scenarios ran*"])


def test_skips_file(fake):
    fake.makefile(
        ".txt",
        skips=textwrap.dedent("""\
        # known problems of myimpl
        xfail specverify[beta_markov]   # residual computed in float16 (issue 12)
        skip  gamma_*                   # too slow here
        SKIP  nothing_matches_this
    """),
    )
    result = fake.runpytest("--specverify-impl", "myimpl:bad", *FAKE, "--specverify-skips", "skips.txt", "-rsx")
    result.assert_outcomes(passed=2, xfailed=1, skipped=1)
    result.stdout.fnmatch_lines(
        [
            "SKIPPED ?1? specverify?gamma_bonus?: too slow here",
            "XFAIL specverify?beta_markov? - residual computed in float16 (issue 12)",
        ]
    )
    result.stdout.fnmatch_lines(
        ["specverify: warning: skips file skips.txt:4: 'nothing_matches_this' matches no specverify item"]
    )
    assert calls(fake)[-1]["scenarios"] == ["alpha_small", "beta_markov"], "skipped scenarios must not run"
    fake.makefile(".txt", bad="xfail\n")
    result = fake.runpytest("--specverify-impl", "myimpl:bad", *FAKE, "--specverify-skips", "bad.txt")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*bad.txt:1: expected 'skip <glob>' or 'xfail <glob>'*"])


def test_junit_properties(fake):
    result = fake.runpytest("--specverify-impl", "myimpl:bad", *FAKE, "--junitxml", "out.xml")
    result.assert_outcomes(passed=3, failed=1, warnings=1)
    cases = {c.get("name"): c for c in ET.parse(fake.path / "out.xml").getroot().iter("testcase")}
    assert set(cases) == {
        "specverify[protocol]",
        "specverify[alpha_small]",
        "specverify[beta_markov]",
        "specverify[gamma_bonus]",
    }
    props = {p.get("name"): p.get("value") for p in cases["specverify[beta_markov]"].iter("property")}
    assert props["gof@abs=2.grade"] == "fail"
    assert float(props["gof@abs=2.pvalue"]) == 1e-12 and float(props["gof@abs=2.adjusted_pvalue"]) == 4e-12
    assert float(props["gof@abs=2.statistic"]) == 123.4 and props["gof@abs=2.n"] == "4000"
    assert float(props["gof@abs=2.mde_tv"]) == 0.031
    assert props["specverify.seed"] == "0" and props["specverify.verdict"] == "fail"
    assert cases["specverify[beta_markov]"].find("failure") is not None
    protocol = {p.get("name") for p in cases["specverify[protocol]"].iter("property")}
    assert "protocol/determinism.pvalue" in protocol


def test_environment_and_ini_configuration(fake, monkeypatch):
    fake.makeini("[pytest]\nspecverify_impl = myimpl:good\nspecverify_battery = fake_battery\nspecverify_seed = 5\n")
    result = fake.runpytest()
    result.assert_outcomes(passed=4)
    monkeypatch.setenv("SPECVERIFY_IMPL", "myimpl:bad")
    monkeypatch.setenv("SPECVERIFY_SEED", "9")
    result = fake.runpytest("--specverify-seed", "11")
    result.assert_outcomes(passed=3, failed=1, warnings=1)
    assert [c["seed"] for c in calls(fake)] == [5, 11]


@pytest.mark.parametrize(
    "args, message",
    [
        (("--specverify-seed", "-1"), "--specverify-seed must be a non-negative integer, got '-1'"),
        (("--specverify-seed", "x"), "--specverify-seed must be a non-negative integer, got 'x'"),
        (("--specverify-alpha", "2"), "--specverify-alpha must be a number in (0, 1), got '2'"),
    ],
)
def test_bad_options_are_usage_errors(fake, args, message):
    result = fake.runpytest("--specverify-impl", "myimpl:good", *FAKE, *args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert message in result.stderr.str()


def test_report_directory(fake):
    result = fake.runpytest("--specverify-impl", "myimpl:good", *FAKE, "--specverify-report", "rep")
    result.assert_outcomes(passed=4)
    assert json.loads((fake.path / "rep" / "report.json").read_text())["verdict"] == "pass"


BROKEN = '''
import torch
from specverify.core.sampling import sample, uniform


def broken(target_probs, draft_probs, draft_tokens, *, generator):
    """Canonical accept step, but the replacement token is drawn from p instead of (p - q)+."""
    B, K, V = draft_probs.shape
    u = uniform((B, K), generator=generator)
    p_x = target_probs[:, :K].gather(-1, draft_tokens[..., None])[..., 0].double()  # (B, K)
    q_x = draft_probs.gather(-1, draft_tokens[..., None])[..., 0].double()  # (B, K)
    n_acc = (u * q_x < p_x).long().cumprod(-1).sum(-1)  # (B,)
    rows = torch.arange(B)
    extra = sample(target_probs[rows, n_acc].double(), generator=generator)  # (B,)
    tokens = torch.zeros(B, K + 1, dtype=torch.long)
    tokens[:, :K] = draft_tokens
    tokens[rows, n_acc] = extra
    return tokens, n_acc + 1
'''

# Until specverify.verifier.battery has list_scenarios, the end-to-end test lists the scenarios through this shim.
SHIM = """
from specverify.verifier.battery import check_verifier
from specverify.verifier.scenarios import get_scenarios


def list_scenarios(tier, *, greedy=False):
    return [s.name for s in get_scenarios(greedy=greedy)]
"""


@pytest.mark.slow
def test_end_to_end_real_battery(pytester, monkeypatch):
    """reference.rules:verify passes two fast scenarios; residual = p fails the one that exposes it."""
    battery = pytest.importorskip("specverify.verifier.battery")
    monkeypatch.delenv("SPECVERIFY_IMPL", raising=False)
    pytester.makepyfile(brokenimpl=BROKEN, sv_battery=SHIM)
    pytester.syspathinsert()
    extra = () if hasattr(battery, "list_scenarios") else ("--specverify-battery", "sv_battery")
    selection = "protocol or pos2_least_likely_k2 or markov4_oracle_k8"
    result = pytester.runpytest(
        "--specverify-impl", "reference.rules:verify", *extra, "-k", selection, "--junitxml", "ok.xml"
    )
    assert result.parseoutcomes()["passed"] == 3, result.stdout.str()
    result.stdout.fnmatch_lines(
        ["verifier reference.rules:verify: PASS *", "repro: specverify audit --verifier reference.rules:verify *"]
    )
    result = pytester.runpytest("--specverify-impl", "brokenimpl:broken", *extra, "-k", "pos2_least_likely_k2")
    result.assert_outcomes(failed=1, deselected=result.parseoutcomes()["deselected"])
    result.stdout.fnmatch_lines(
        [
            "verifier brokenimpl:broken (tier=smoke, seed=0, alpha=0.001): scenario "
            "'pos2_least_likely_k2' FAILED: * tests below their allocated alpha",
            "    observed vs expected: *",
            "    statistic=*, p=*, adjusted p=*, N=*, seed=*",
        ]
    )
    result.stdout.fnmatch_lines(["verifier brokenimpl:broken: FAIL *"])


def test_tree_impl_runs_the_tree_battery(pytester):
    from specverify.verifier.tree.scenarios import TREE_SCENARIOS

    result = pytester.runpytest(
        "-p",
        "no:cacheprovider",
        "--specverify-tree-impl",
        "specverify.mutants:greedy_fallback",
        "-k",
        "markov8_topk_3x2",
    )
    result.assert_outcomes(failed=1, deselected=len(TREE_SCENARIOS))  # the other scenarios and [protocol]
    out = result.stdout.str()
    assert (
        "repro: specverify audit --tree-verifier specverify.mutants:greedy_fallback --scenario markov8_topk_3x2" in out
    )
    assert "pytest --specverify-tree-impl specverify.mutants:greedy_fallback" in out


def test_tree_impl_and_impl_are_exclusive(pytester):
    result = pytester.runpytest("--specverify-tree-impl", "a.b:c", "--specverify-impl", "a.b:d")
    assert result.ret != 0
    assert "give one of --specverify-impl" in result.stderr.str()
    result = pytester.runpytest("--specverify-endpoint", "http://127.0.0.1:9", "--specverify-impl", "a.b:d")
    assert result.ret != 0 and "give one of" in result.stderr.str()


def test_an_endpoint_needs_a_model_and_valid_arguments(pytester):
    result = pytester.runpytest("--specverify-endpoint", "http://127.0.0.1:9")
    assert result.ret != 0 and "needs --specverify-model" in result.stderr.str()
    result = pytester.runpytest("--specverify-endpoint", "http://127.0.0.1:9", "--specverify-model", "m",
                                "--specverify-endpoint-args", "--temperature -1")  # fmt: skip
    assert result.ret != 0 and "--specverify-endpoint-args" in result.stderr.str()


def test_device_and_dtype_options(fake):
    result = fake.runpytest("--specverify-impl", "myimpl:good", *FAKE, "--specverify-dtype", "int8")
    assert result.ret != 0
    result.stderr.fnmatch_lines(["*--specverify-dtype must be one of*int8*"])
    if not torch.cuda.is_available():
        result = fake.runpytest("--specverify-impl", "myimpl:good", *FAKE, "--specverify-device", "cuda:0")
        assert result.ret != 0
        result.stderr.fnmatch_lines(["*--specverify-device = 'cuda:0' is not available*"])
    # a battery without the argument: the run fails and says so
    result = fake.runpytest("--specverify-impl", "myimpl:good", *FAKE, "--specverify-dtype", "bf16")
    assert result.ret != 0
    result.stdout.fnmatch_lines(["*has no 'dtype' argument*"])
    # the real battery: the dtype reaches the verifier, the repro lines carry it
    result = fake.runpytest(
        "--specverify-impl",
        "reference.uniforms:verify",
        "--specverify-dtype",
        "bfloat16",
        "--specverify-device",
        "cpu",
        "--specverify-report",
        "out",
        "-k",
        "pos8_uniform_k4 or protocol",
    )
    result.assert_outcomes(passed=2, deselected=len(sv_scenarios()) - 1)
    report = json.loads((fake.path / "out" / "report.json").read_text())
    assert report["extra"]["dtype"] == "bfloat16" and "--device cpu --dtype bfloat16" in report["command"]


def sv_scenarios():
    from specverify.verifier.battery import list_scenarios

    return list_scenarios("smoke")


def test_workers_and_backend_options_shard_the_run(fake):
    result = fake.runpytest("--specverify-impl", "myimpl:good", *FAKE, "--specverify-workers", "0")
    assert result.ret != 0
    result.stderr.fnmatch_lines(["*--specverify-workers must be a positive integer*"])
    result = fake.runpytest("--specverify-impl", "myimpl:good", *FAKE, "--specverify-backend", "mpi")
    assert result.ret != 0
    result.stderr.fnmatch_lines(["*--specverify-backend must be one of*mpi*"])
    result = fake.runpytest_subprocess(  # worker processes: not inside pytester's in-process run
        "--specverify-impl", "reference.rules:verify", "--specverify-workers", "2", "--specverify-report", "out",
        "-k", "pos2_least_likely_k2 or protocol",
    )  # fmt: skip
    result.assert_outcomes(passed=2, deselected=len(sv_scenarios()) - 1)
    report = json.loads((fake.path / "out" / "report.json").read_text())
    assert report["extra"]["sharding"]["backend"] == "processes" and "--workers 2" in report["command"]


def test_plugin_progress_lines_move_through_the_run():
    """The plugin's progress writes through pytest's terminal reporter: tokens, scenarios, ETA, what runs."""
    import contextlib

    from specverify.cli.plugin import _PluginProgress
    from specverify.core.progress import ProgressTracker

    class Reporter:
        def __init__(self):
            self.lines = []

        def write_line(self, line):
            self.lines.append(line)

    class Capture:
        def global_and_fixture_disabled(self):
            return contextlib.nullcontext()

    reporter = Reporter()
    tracker = ProgressTracker(_PluginProgress(reporter, Capture(), interval=0.0), [("a", 2, 100), ("b", 2, 100)])
    tracker.begin()
    for name in ("a", "b"):
        for group in range(2):
            tracker.group_done(name, group)
    tracker.finish()
    assert len(reporter.lines) == 4  # at the start and after each of the first three groups; not at the end
    assert reporter.lines[0].startswith("specverify: 0% (0/400 tokens), 0/2 scenarios done")
    assert reporter.lines[1].startswith("specverify: 25% (100/400 tokens), 0/2 scenarios done")
    assert "ETA" in reporter.lines[1] and reporter.lines[1].endswith("running a")
    assert reporter.lines[3].startswith("specverify: 75%") and reporter.lines[3].endswith("running b")


RULE_BATTERY = '''
"""A fake battery whose one scenario preserves the law but fails rule conformance."""
import json, os
from specverify import stats
from specverify.core.results import Report, TestResult


def list_scenarios(tier, *, greedy=False):
    return ["alpha_small"]


def check_verifier(verify, *, tier="smoke", seed=0, alpha=1e-3, greedy=False, progress=None, scenarios=None,
                   gate_conformance=False):
    calls = json.load(open("calls.json")) if os.path.exists("calls.json") else []
    calls.append({"gate_conformance": gate_conformance})
    json.dump(calls, open("calls.json", "w"))
    results = [TestResult(statistic=0.1, pvalue=0.6, name="gof", family="gof", method="", n=100,
                          scenario="alpha_small", position="abs=0"),
               TestResult(statistic=9.0, pvalue=1e-12, name="acceptance", family="acceptance", method="", n=100,
                          scenario="alpha_small", position="block=1",
                          details={"trials": 100, "observed": 20, "expected": 60.0})]
    graded, verdict = stats.grade_run(results, [], alpha=alpha, gate_conformance=gate_conformance)
    return Report(kind="verifier", implementation=str(verify), tier=tier, seed=seed, alpha=alpha, verdict=verdict,
                  results=graded, scenarios=({"name": "alpha_small"},), timings={"total": 0.01},
                  gate_conformance=gate_conformance)
'''


def test_conformance_fails_items_only_when_gated(fake, monkeypatch):
    monkeypatch.delenv("SPECVERIFY_GATE_CONFORMANCE", raising=False)
    fake.makepyfile(rule_battery=RULE_BATTERY)
    rule = ("--specverify-impl", "myimpl:good", "--specverify-battery", "rule_battery")
    fake.runpytest(*rule).assert_outcomes(passed=2)
    result = fake.runpytest(*rule, "--specverify-gate-conformance")
    result.assert_outcomes(passed=1, failed=1)
    assert "FAILED specverify[alpha_small]" in result.stdout.str()
    monkeypatch.setenv("SPECVERIFY_GATE_CONFORMANCE", "perhaps")
    result = fake.runpytest(*rule)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert (
        "--specverify-gate-conformance must be 1/0, true/false, yes/no or on/off, got 'perhaps'" in result.stderr.str()
    )
    assert calls(fake) == [{"gate_conformance": False}, {"gate_conformance": True}]
