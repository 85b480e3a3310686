"""The command line: spec loading, option parsing, exit codes for bad usage, the progress bar."""

import io

import pytest

from specverify.cli.commands import EXIT_USAGE, Progress, main
from specverify.core.errors import InvalidArgument
from specverify.core.loading import load_object, parse_options


def test_load_object_resolves_module_attribute():
    from specverify_reference.rules import verify

    assert load_object("reference.rules:verify") is verify


@pytest.mark.parametrize("spec", ["reference.rules", "a:b:c", ":verify", "reference.rules:", 3])
def test_load_object_rejects_malformed_specs(spec):
    with pytest.raises(InvalidArgument, match="package.module:name"):
        load_object(spec, argument="--verifier")


def test_load_object_names_missing_module_and_attribute():
    with pytest.raises(InvalidArgument, match="cannot import module 'no_such_module_xyz'"):
        load_object("no_such_module_xyz:f")
    with pytest.raises(InvalidArgument, match="has no attribute 'nope'"):
        load_object("reference.rules:nope")


def test_parse_options_literals_and_strings():
    assert parse_options(["k=3", "temperature=0.7", "top_k=None", "name=abc"]) == {
        "k": 3,
        "temperature": 0.7,
        "top_k": None,
        "name": "abc",
    }
    with pytest.raises(InvalidArgument, match="KEY=VALUE"):
        parse_options(["novalue"])


def test_audit_without_target_is_usage_error(capsys):
    assert main(["audit"]) == EXIT_USAGE
    assert "needs one of --verifier" in capsys.readouterr().err
    assert main(["audit", "--verifier", "no_such_module_xyz:f"]) == EXIT_USAGE
    assert main(["audit", "--decoder", "reference.rules:verify"]) == EXIT_USAGE


class _Terminal(io.StringIO):
    """A fake terminal: the bar redraws its line with carriage returns."""

    def isatty(self):
        return True


def test_progress_bar_moves_as_groups_finish_in_a_terminal():
    """A real battery run into a fake terminal: the line is redrawn as groups finish, with tokens,
    scenarios and an ETA, and ends once at 100%."""
    import specverify as sv
    from specverify_reference.rules import verify

    terminal = _Terminal()
    sv.check_verifier(verify, scenarios=["pos2_least_likely_k2", "markov4_oracle_k8"],
                      progress=Progress(terminal, delay=0, redraw=0))  # fmt: skip
    frames = [f.strip() for f in terminal.getvalue().split("\r") if f.strip()]
    percents = [int(f.split("]")[1].split("%")[0]) for f in frames]
    assert len(set(p for p in percents if 0 < p < 100)) >= 8, frames  # 16 groups: the bar moves
    assert percents == sorted(percents) and percents[-1] == 100
    assert "tokens" in frames[1] and "scenarios done" in frames[1] and "ETA" in frames[1]
    assert "markov4_oracle_k8" in terminal.getvalue() and terminal.getvalue().count("\n") == 1
    assert "ETA" not in frames[-1]


def test_progress_in_a_log_is_a_line_every_interval():
    from specverify.core.progress import ProgressState

    log = io.StringIO()
    bar = Progress(log, delay=0, interval=3600)
    for done in range(0, 11):
        bar.update(ProgressState(done, 10, "tokens", done // 5, 2, "a" if done < 5 else "b", 1.0 + done))
    lines = log.getvalue().splitlines()
    assert len(lines) == 2 and lines[0].startswith("[") and "0%" in lines[0] and "100%" in lines[1]


def test_progress_bar_stays_silent_for_fast_runs_and_draws_for_slow_ones():
    stream = io.StringIO()
    bar = Progress(stream, delay=3600)
    bar(1, 2, "a")
    bar(2, 2, "b")
    assert stream.getvalue() == ""
    bar = Progress(stream, delay=0)
    bar(1, 2, "scenario-a")
    bar(2, 2, "scenario-b")
    assert "1/2" in stream.getvalue() and "2/2" in stream.getvalue()


def _audit(tmp_path, *extra):
    out = tmp_path / "out"
    code = main(["audit", "--tier", "smoke", "--seed", "3", "--out", str(out), "--no-plots", *extra])
    return code, out


def test_audit_verifier_exit_codes_pass_fail_and_broken(tmp_path, capsys):
    from specverify.report import load_report

    code, out = _audit(tmp_path, "--verifier", "reference.rules:verify", "--scenario", "pos8_uniform_k4")
    assert code == 0, capsys.readouterr().out
    report = load_report(out / "report.json")
    assert report.verdict in ("pass", "suspicious") and report.seed == 3
    assert report.command.startswith("specverify audit") and "--scenario pos8_uniform_k4" in report.command
    assert (out / "report.md").exists() and (out / "report.html").exists()

    code, out = _audit(tmp_path, "--verifier", "specverify.mutants:residual_is_p", "--scenario", "pos8_uniform_k4")
    assert code == 1
    assert load_report(out / "report.json").verdict == "fail"

    code, out = _audit(tmp_path, "--verifier", "tests.test_cli:_out_of_vocab_verifier", "--scenario", "pos8_uniform_k4")
    assert code == 2
    assert any("vocab" in e or "[0," in e for e in load_report(out / "report.json").errors)


def _out_of_vocab_verifier(target_probs, draft_probs, draft_tokens, *, generator):
    """A broken kernel (GHSA-8wr5 style): returns token id V."""
    from specverify_reference.rules import verify

    tokens, num_emitted = verify(target_probs, draft_probs, draft_tokens, generator=generator)
    tokens[0, 0] = target_probs.shape[-1]
    return tokens, num_emitted


def test_audit_drafter_through_cli(tmp_path, capsys):
    code, out = _audit(
        tmp_path,
        "--drafter",
        "specverify.cli.factories:zoo_drafter",
        "--drafter-option",
        "name=uniform",
        "--target",
        "specverify.cli.factories:table_target",
        "--draft-cost",
        "0.05",
    )
    assert code == 0, capsys.readouterr().out
    from specverify.report import load_report

    report = load_report(out / "report.json")
    assert report.kind == "drafter" and "name='uniform'" in report.implementation
    assert "efficiency" in report.extra


# ----------------------------------------------------------------------------- implementations that cannot be built


def _raising_factory(*, weight: float = 0.5):
    """A factory that fails while building (as a model loader might)."""
    raise ValueError(f"cannot load weights with weight={weight}\n(second line)")


def _one_line_error(capsys) -> str:
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    return lines[0]


def test_issue_commands_fail_with_one_line_usage_errors(capsys):
    # the two repro lines quoted in issue 17, as the old reports printed them
    argv = "audit --drafter specverify.models:MarkovTable --target specverify.models:MarkovTable --tier smoke --seed 0"
    assert main(argv.split()) == EXIT_USAGE
    line = _one_line_error(capsys)
    assert "cannot import module 'specverify.models'" in line and "specverify.core.tables:MarkovTable" in line
    argv = "audit --decoder reference.decoder:SpeculativeDecoder --tier smoke --seed 0"
    assert main(argv.split()) == EXIT_USAGE
    assert "--decoder needs --target" in _one_line_error(capsys)


def test_class_with_required_arguments_names_spec_missing_options_and_form(capsys):
    argv = [
        "audit",
        "--drafter",
        "specverify.core.tables:MarkovTable",
        "--target",
        "specverify.core.tables:MarkovTable",
    ]
    assert main(argv) == EXIT_USAGE
    line = _one_line_error(capsys)
    assert line.startswith("specverify: error: --drafter specverify.core.tables:MarkovTable: ")
    assert "missing initial, transition" in line and "--drafter-option KEY=VALUE" in line
    argv = ["audit", "--decoder", "reference.decoder:SpeculativeDecoder", "--target", "reference.rules:verify"]
    assert main(argv) == EXIT_USAGE
    line = _one_line_error(capsys)
    assert "--decoder reference.decoder:SpeculativeDecoder" in line and "missing drafter, k, target" in line


def test_unknown_option_and_options_for_an_instance_or_function(capsys):
    argv = ["audit", "--drafter", "specverify.cli.factories:zoo_drafter", "--target"]
    assert main([*argv, "specverify.cli.factories:table_target", "--target-option", "vocab=8"]) == EXIT_USAGE
    line = _one_line_error(capsys)
    assert "--target specverify.cli.factories:table_target" in line and "unknown vocab" in line
    assert "--target-option KEY=VALUE" in line and "vocab_size" in line  # what it accepts
    assert main(["audit", "--verifier", "reference.rules:verify", "--verifier-option", "k=1"]) == EXIT_USAGE
    assert "not a factory" in _one_line_error(capsys)


def test_factory_that_raises_is_one_line_and_debug_shows_the_traceback(capsys):
    argv = [
        "audit",
        "--decoder",
        "tests.test_cli:_raising_factory",
        "--target",
        "specverify.cli.factories:table_target",
    ]
    assert main(argv) == EXIT_USAGE
    line = _one_line_error(capsys)
    assert "--decoder tests.test_cli:_raising_factory" in line
    assert "ValueError: cannot load weights with weight=0.5 (second line)" in line and "--debug" in line
    assert main([*argv, "--debug"]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert "Traceback" in err and "_raising_factory" in err and err.rstrip().splitlines()[-1].startswith("specverify:")


def test_a_raising_verifier_is_an_error_said_once_with_where_it_raised(tmp_path, capsys, monkeypatch):
    """ERROR, not FAIL: one line for the error (the scenarios that met it, the file and line that
    raised), exit 2, and the reports carry an error section instead of a counterexample."""
    package = tmp_path / "mybad"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "spec.py").write_text(
        "def verify(target_probs, draft_probs, draft_tokens, *, generator):\n"
        "    raise ValueError('boom: unsupported shape')\n"
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    scenarios = ["--scenario", "pos8_uniform_k4", "--scenario", "pos16_noisy_k1"]
    assert main(["audit", "--verifier", "mybad.spec:verify", *scenarios, "--out", "out", "--no-plots"]) == 2
    printed = capsys.readouterr().out
    assert printed.count("boom") == 1, printed
    assert "ERROR (the implementation could not be tested)" in printed
    assert (
        "implementation error in 2 of 2 scenarios (pos8_uniform_k4, pos16_noisy_k1): verifier raised "
        "ValueError: boom: unsupported shape (at mybad/spec.py:2, in verify)"
    ) in printed
    assert "[FAIL]" not in printed and "0 failed, 0 suspicious, 0 passed; 2 of 2 scenarios not tested" in printed
    html = (tmp_path / "out" / "report.html").read_text()
    markdown = (tmp_path / "out" / "report.md").read_text()
    assert "Implementation errors: 2 of 2 scenarios could not be tested" in html and html.count("boom") == 1
    assert "Minimal counterexample" not in html and "Minimal counterexample" not in markdown
    assert markdown.startswith("# specverify verifier audit: ERROR") and 'class="badge b-error"' in html


def test_a_failed_test_outweighs_errors_elsewhere():
    from specverify import stats
    from specverify.core.results import TestResult, protocol_result

    law = TestResult(statistic=9.0, pvalue=1e-9, name="gof", family="gof", method="m", n=100, scenario="a")
    error = protocol_result("b", "verifier raised ValueError: x", 0, method="m")
    graded, verdict = stats.grade_run([law, error], ["b: verifier raised ValueError: x"], alpha=1e-3)
    assert verdict == "fail"  # tested where it could be, and wrong there: exit 1, not 2
    graded, verdict = stats.grade_run([error], ["b: verifier raised ValueError: x"], alpha=1e-3)
    assert verdict == "error"
    assert stats.run_verdict([], []) == "fail"  # nothing tested, nothing said: never a silent pass
