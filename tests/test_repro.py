"""Every report says how to reproduce it, and saying so reproduces it.

* Each committed example report (``reports/**/report.json``) is rerun from its recorded
  command (or Python snippet) and must give the same verdict and, test by test, the same
  statistic and p-value (``reference-verifier``: against the recorded run that
  ``test_devices`` reruns, :data:`RECORDED_RUN_REPORT`).  The basic examples take seconds each and run in CI; the Hugging
  Face ones take minutes and are marked ``slow``.
* Every report the CLI writes carries a command that the CLI's own parser reads back to the
  same run (generic: verifier, decoder and drafter audits with options, filters and sizes).
* A run started from Python records a Python snippet, never a command line; the snippet of a
  run on importable objects reruns it.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from _results import assert_same_statistics, tolerance_for

from specverify.cli.audit import audit_command, run_audit
from specverify.cli.commands import build_parser, main, parse_command
from specverify.core.errors import InvalidArgument
from specverify.core.repro import PYTHON_MARK, is_python_repro, python_repro, spec_of
from specverify.core.results import Report
from specverify.report import load_report

REPORTS = Path(__file__).resolve().parent.parent / "reports"
COMMITTED = sorted(REPORTS.glob("**/report.json"))


def _rerun(command: str) -> Report:
    """The Report of a recorded command line (run in-process, no files) or Python snippet."""
    if is_python_repro(command):
        assert "= ...  #" not in command, f"the snippet names objects it cannot rebuild:\n{command}"
        namespace: dict = {}
        exec(compile(command, "<repro>", "exec"), namespace)  # the snippet is ours, from a committed report
        return namespace["report"]
    return run_audit(parse_command(command))


def _same_statistics(recorded: Report, again: Report) -> None:
    assert again.verdict == recorded.verdict, f"verdict {again.verdict} != recorded {recorded.verdict}"
    assert_same_statistics(recorded.results, again.results, rel_tol=tolerance_for(recorded.command))


#: Report folders of real engines or libraries: the package each needs (their reruns take minutes: ``slow``).
ENGINES = {
    "hf-transformers": "transformers",
    "vllm": "vllm",
    "eagle": "eagle.model.utils",
    "openvino": "openvino_genai",
}


#: Example reports whose rerun is nightly (``slow``), for CI's time: each is a smoke audit of 30-50 s on
#: 2 cores whose code CI exercises otherwise -- the catalogue mutant by the wheel's selftest, the tree
#: verifier by ``tests/tree`` -- while the decoder's and the drafter's reruns, and the recorded verifier
#: run (on three CPU paths), stay in CI.
NIGHTLY_RERUNS = ("mutant-residual-is-p", "reference-tree-verifier")


def _committed_params():
    for path in COMMITTED:
        name = str(path.parent.relative_to(REPORTS))
        deep = len(path.relative_to(REPORTS).parts) > 2  # engine/<config>/report.json
        marks = [pytest.mark.slow] if deep or name in NIGHTLY_RERUNS else []
        yield pytest.param(path, id=name, marks=marks)


def test_every_example_report_is_covered():
    names = {str(p.parent.relative_to(REPORTS)) for p in COMMITTED}
    assert {"reference-verifier", "mutant-residual-is-p", "reference-decoder", "drafter-adversary"} <= names
    for path in COMMITTED:  # cheap for every report, engines included: the command is there and parses
        command = json.loads(path.read_text())["command"]
        assert command, f"{path}: empty command"
        if not is_python_repro(command):
            assert parse_command(command).command == "audit", f"{path}: {command}"


def _rerun_isolated(command: str) -> Report:
    """The Report of a recorded ``specverify audit`` command run in a fresh interpreter.

    Engine runs change process state (vLLM's ``patch_expand`` diagnostic replaces a module
    function for the rest of the process; engines keep caches and allocator state), so each
    engine report is rerun in its own process, as its report generator ran it.
    """
    if is_python_repro(command):
        return _rerun(command)
    argv = shlex.split(command)[1:]  # drop "specverify"
    code = "import sys; from specverify.cli import main; sys.exit(main(sys.argv[1:]))"
    with tempfile.TemporaryDirectory() as out:
        proc = subprocess.run(
            [sys.executable, "-c", code, *argv, "--out", out, "--no-plots"], capture_output=True, text=True
        )
        report = Path(out) / "report.json"  # exit 2: a broken implementation, still reported
        assert proc.returncode in (0, 1, 2) and report.exists(), (
            f"{command}: exit {proc.returncode}\n{proc.stderr[-3000:]}"
        )
        return load_report(report)


@pytest.mark.parametrize("path", list(_committed_params()))
def test_committed_report_reruns_from_its_recorded_command(path):
    folder = path.relative_to(REPORTS).parts[0]
    recorded = load_report(path)
    if " --endpoint " in recorded.command:  # the audit of a server: its generator starts the server and reruns it
        pytest.skip("an endpoint audit reruns with its server: python -m tools.reports.vllm_served")
    if folder not in ENGINES:
        if folder == RECORDED_RUN_REPORT:  # its run is rerun against the recording: compare with that
            _same_as_the_recorded_run(recorded)
            return
        _same_statistics(recorded, _rerun(recorded.command))
        return
    pytest.importorskip(ENGINES[folder])
    again = _rerun_isolated(recorded.command)
    if path.parent.name in _engine_nondeterministic(folder):  # the engine's own output varies: the verdict stands
        _same_verdict_of_a_nondeterministic_engine(recorded, again)
        return
    _same_statistics(recorded, again)


#: The committed report of the run that ``tests/data/reference_smoke_seed0.json`` records.  That run
#: (check_verifier on the canonical rule, smoke tier, seed 0) is rerun by
#: ``test_devices.test_cpu_is_bit_identical_to_the_recorded_run`` and, on the AVX2 and scalar CPU
#: paths, by ``python tests/cpu_paths.py --check`` in CI, each against the recording; this report is
#: checked against the same recording, so each run of the battery is made once, not twice.
RECORDED_RUN_REPORT = "reference-verifier"


def _same_as_the_recorded_run(report: Report) -> None:
    recording = json.loads((Path(__file__).parent / "data" / "reference_smoke_seed0.json").read_text())
    assert report.command == (
        f"specverify audit --verifier {recording['verifier']} --tier {recording['tier']} "
        f"--seed {recording['seed']} --alpha 0.001"
    ), report.command
    assert report.passed
    assert_same_statistics(recording["results"], report.results)


def _same_verdict_of_a_nondeterministic_engine(recorded: Report, again: Report) -> None:
    """The verdict of a rerun of an engine whose output varies for a fixed seed.

    The gate must agree.  A failing one may come back as "fail" or "error": whether a prompt
    passes its determinism check (and is then tested, and fails) or not (and the prompt could not
    be tested) is itself the engine's chance when it reproduces some rows and not others.
    """
    assert again.passed == recorded.passed, f"verdict {again.verdict} != recorded {recorded.verdict}"
    if recorded.passed or {again.verdict, recorded.verdict} - {"fail", "error"}:
        assert again.verdict == recorded.verdict, f"verdict {again.verdict} != recorded {recorded.verdict}"


def _engine_nondeterministic(folder: str) -> frozenset:
    """Configurations whose engine output is not reproducible, as their report generator declares them."""
    module = {"vllm": "vllm_reports", "openvino": "openvino_reports", "eagle": "eagle_reports"}.get(folder)
    if module is None:
        return frozenset()
    import importlib

    return frozenset(getattr(importlib.import_module(f"tools.reports.{module}"), "NONDETERMINISTIC", ()))


# ----------------------------------------------------------------------------- CLI-written reports

CLI_RUNS = {
    "verifier": [
        "--verifier",
        "specverify.mutants:residual_is_p",
        "--scenario",
        "pos8_uniform_k4",
        "--seed",
        "3",
        "--alpha",
        "0.01",
    ],
    "greedy-decoder": [
        "--decoder",
        "specverify.cli.factories:reference_decoder",
        "--decoder-option",
        "greedy=True",
        "--target",
        "specverify.cli.factories:reference_target",
        "--greedy",
        "--num-samples",
        "20",
        "--max-new-tokens",
        "3",
    ],
    "decoder": [
        "--decoder",
        "specverify.cli.factories:reference_decoder",
        "--decoder-option",
        "top_k=5",
        "--decoder-option",
        "drafter=early_exit",
        "--target",
        "specverify.cli.factories:reference_target",
        "--target-option",
        "top_k=5",
        "--num-samples",
        "300",
        "--max-new-tokens",
        "3",
        "--seed",
        "1",
    ],
    "drafter": [
        "--drafter",
        "specverify.cli.factories:zoo_drafter",
        "--drafter-option",
        "name=noisy",
        "--drafter-option",
        "vocab_size=8",
        "--target",
        "specverify.cli.factories:table_target",
        "--target-option",
        "vocab_size=8",
        "--verifier",
        "reference.rules:verify",
        "--k",
        "3",
        "--draft-cost",
        "0.1",
        "--model-params",
        "7e9",
        "--bandwidth",
        "2e12",
    ],
}
FIELDS = (
    "verifier",
    "decoder",
    "drafter",
    "target",
    "reference",
    "verifier_option",
    "decoder_option",
    "drafter_option",
    "target_option",
    "greedy",
    "scenario",
    "k",
    "draft_cost",
    "model_params",
    "bandwidth",
    "bytes_per_param",
    "num_samples",
    "max_new_tokens",
    "tier",
    "seed",
    "alpha",
)


@pytest.mark.parametrize("name", list(CLI_RUNS))
def test_cli_report_command_parses_back_to_the_same_run(name, tmp_path, capsys):
    argv = CLI_RUNS[name]
    code = main(["audit", *argv, "--out", str(tmp_path), "--no-plots"])
    assert code in (0, 1), capsys.readouterr()
    report = load_report(tmp_path / "report.json")
    given = build_parser().parse_args(["audit", *argv])
    recorded = parse_command(report.command)  # the CLI's own parser, or InvalidArgument
    assert report.command.startswith("specverify audit ")
    for field in FIELDS:  # every option that shapes the run survives the round trip
        a, b = getattr(given, field), getattr(recorded, field)
        if field.endswith("_option"):
            from specverify.core.loading import parse_options

            a, b = parse_options(a), parse_options(b)
        if field == "bytes_per_param" or (field == "bandwidth" and given.drafter is None):
            continue  # not part of this kind of audit
        assert a == b or (field == "greedy" and not a and not b), f"{field}: {a!r} recorded as {b!r}"
    assert audit_command(recorded) == report.command  # canonical: recording it again changes nothing
    assert "--out" not in report.command and "--no-plots" not in report.command


def test_cli_recorded_command_reruns_to_the_same_report(tmp_path, capsys):
    assert main(["audit", *CLI_RUNS["drafter"], "--out", str(tmp_path), "--no-plots"]) == 0, capsys.readouterr()
    recorded = load_report(tmp_path)
    _same_statistics(recorded, _rerun(recorded.command))


def test_parse_command_rejects_what_the_cli_would_reject():
    with pytest.raises(InvalidArgument, match="must start with 'specverify'"):
        parse_command("python -m tools.reports.hf_reports --out x")
    with pytest.raises(InvalidArgument, match="rejected"):
        parse_command("specverify audit --tier huge")
    assert parse_command(shlex.join(["specverify", "audit", "--verifier", "a.b:c d"])).verifier == "a.b:c d"


# ----------------------------------------------------------------------------- runs started from Python


def _cheap_check(verify):
    from specverify.verifier.battery import check_verifier

    return check_verifier(verify, scenarios=["pos8_uniform_k4"], seed=2)


def test_python_run_on_importable_objects_records_a_snippet_that_reruns_it():
    from specverify_reference.rules import verify

    report = _cheap_check(verify)
    assert is_python_repro(report.command) and "specverify audit" not in report.command
    assert "this snippet reruns it" in report.command.splitlines()[0]
    assert "from specverify_reference.rules import verify" in report.command
    assert "scenarios=['pos8_uniform_k4']" in report.command and "seed=2" in report.command
    _same_statistics(report, _rerun(report.command))


def test_python_run_on_a_local_object_says_what_is_missing():
    from specverify_reference.rules import verify as canonical

    def my_kernel(target_probs, draft_probs, draft_tokens, *, generator):
        return canonical(target_probs, draft_probs, draft_tokens, generator=generator)

    report = _cheap_check(my_kernel)
    first, *rest = report.command.splitlines()
    assert first.startswith(PYTHON_MARK) and "supply the objects marked '...'" in first
    assert any(line.startswith("verify = ...  # ") and "my_kernel" in line for line in rest)
    compile(report.command, "<repro>", "exec")  # still valid Python


def test_python_snippets_of_decoder_and_drafter_runs_name_their_objects():
    from specverify.cli.factories import reference_decoder, reference_target, table_target, zoo_drafter
    from specverify.decoder import check_decoder
    from specverify.drafter import audit_drafter

    decoder = check_decoder(reference_decoder(), reference_target(), num_samples=50, max_new_tokens=2)
    assert is_python_repro(decoder.command) and "check_decoder(decoder, target" in decoder.command
    assert "an instance of specverify_reference.decoder:SpeculativeDecoder" in decoder.command
    assert "num_samples=50" in decoder.command and "max_new_tokens=2" in decoder.command
    drafter = audit_drafter(zoo_drafter(name="oracle", vocab_size=4), table_target(vocab_size=4), draft_cost=0.2)
    assert is_python_repro(drafter.command) and "audit_drafter(drafter, target" in drafter.command
    assert "draft_cost=0.2" in drafter.command
    for command in (decoder.command, drafter.command):
        compile(command, "<repro>", "exec")


def test_python_repro_helpers():
    from specverify_reference.rules import verify

    assert spec_of(verify) == "specverify_reference.rules:verify"
    assert spec_of(lambda x: x) is None and spec_of(3) is None
    snippet = python_repro("m.n:f", {"x": verify}, {"alpha": 0.5, "names": ("a",), "skip": None})
    assert snippet.splitlines()[1:] == [
        "from m.n import f",
        "from specverify_reference.rules import verify as x",
        "report = f(x, alpha=0.5, names=('a',))",
    ]


def test_a_report_never_has_an_empty_command():
    report = Report("verifier", "mypkg:fn", "smoke", 4, 1e-3, "pass")
    assert report.command.startswith(PYTHON_MARK) and "mypkg:fn" in report.command and "seed=4" in report.command
    assert Report.from_json(report.to_json()).command == report.command


@pytest.mark.parametrize("folder", ["vllm", "openvino"])
def test_declared_nondeterministic_configurations_exist(folder):
    declared = _engine_nondeterministic(folder)
    assert declared and all((REPORTS / folder / name / "report.json").exists() for name in declared)
