"""The command line: spec loading, option parsing, exit codes for bad usage, the progress bar."""

import io

import pytest

from specverify.cli import EXIT_USAGE, Progress, main
from specverify.errors import InvalidArgument
from specverify.loading import load_object, parse_options


def test_load_object_resolves_module_attribute():
    from reference.rules import verify

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
        "k": 3, "temperature": 0.7, "top_k": None, "name": "abc"}
    with pytest.raises(InvalidArgument, match="KEY=VALUE"):
        parse_options(["novalue"])


def test_audit_without_target_is_usage_error(capsys):
    assert main(["audit"]) == EXIT_USAGE
    assert "needs one of --verifier" in capsys.readouterr().err
    assert main(["audit", "--verifier", "no_such_module_xyz:f"]) == EXIT_USAGE
    assert main(["audit", "--decoder", "reference.rules:verify"]) == EXIT_USAGE


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
