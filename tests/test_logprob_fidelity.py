"""Logprob fidelity: the logprobs a server reports for its emitted tokens against the teacher-forced raw laws.

The reader of OpenAI's ``choices[i].logprobs`` and its refusals; the check on built laws (equal,
beyond the tolerance, a more likely token left out of the top list, values a top-M law does not
hold); and whole audits of the local server (V = 64): the reference passes both the law and the
fidelity check, and each planted logprob fault (``zero``: llama.cpp #27972; ``first_only``:
llama.cpp PR #27196; ``processed``: vLLM V0's semantics where V1's raw ones are documented) leaves
the law verdict passing and fails fidelity -- "the law is right but the reported logprobs are not".
With a reference endpoint the server under test's prompt logprobs are checked too (``prompt_draft``:
prompts scored by the drafter, a modelled fault).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from _servers import Server

from specverify.cli import main
from specverify.core.errors import InvalidArgument
from specverify.endpoint.api import BYTES_PER_LOGPROB, sampling_reply_bytes
from specverify.endpoint.checks import check_endpoint
from specverify.endpoint.fidelity import check_logprob_fidelity, reported_logprobs
from specverify.endpoint.http import EndpointError

SMALL = dict(num_samples=300, max_new_tokens=4, samples_per_request=50)
LAW = np.log(np.array([0.5, 0.25, 0.125, 0.0625, 0.0625]))


def _choice(values, tops) -> dict:
    return {"index": 0, "token_ids": [0] * len(values), "logprobs": {"token_logprobs": values, "top_logprobs": tops}}


def test_the_reader_takes_token_logprobs_and_top_lists():
    reply = {"choices": [_choice([-0.7, -1.4], [{"token_id:0": -0.7, "1": -1.4}, {"token_id:1": -1.4}])]}
    assert reported_logprobs(reply, n=1, max_tokens=2, top=1, vocab_size=5) == [
        [[-0.7, [[0, -0.7], [1, -1.4]]], [-1.4, [[1, -1.4]]]]
    ]


@pytest.mark.parametrize(
    "choice, says",
    [
        (_choice([-0.7], [{"0": -0.7}]), "not a list of 2 numbers"),
        (_choice([-0.7, 0.5], [{"0": -0.7}, {"0": -0.7}]), "not a finite log-probability"),
        (_choice([-0.7, math.nan], [{"0": -0.7}, {"0": -0.7}]), "not a finite log-probability"),
        (_choice([-0.7, -0.7], [{"0": -0.7}, {"9": -0.7}]), "not a token id in"),
        (_choice([-0.7, -0.7], [{"0": -0.7}, {"0": -1, "1": -2, "2": -3}]), "at most 2 entries"),
        (_choice([-0.7, -0.7], None), "top_logprobs is not a list"),
    ],
)
def test_the_reader_refuses_what_was_not_asked(choice, says):
    with pytest.raises(EndpointError, match=says):
        reported_logprobs({"choices": [choice]}, n=1, max_tokens=2, top=1, vocab_size=5)


def _reported(value_shift=0.0, top=((0, 0.0), (1, 0.0))):
    entries = [[float(LAW[2]) + value_shift, [[t, float(LAW[t]) + d] for t, d in top]]]
    return {(4,): [((2,), entries)]}


def test_equal_values_pass_and_a_shift_beyond_the_tolerance_fails():
    laws = {(4,): LAW}.get
    good = check_logprob_fidelity(_reported(), laws, top=2)
    assert good.verdict == "pass" and good.tokens_checked == 1 and good.top_entries_checked == 2
    within = check_logprob_fidelity(_reported(5e-4), laws)
    assert within.verdict == "pass" and within.max_abs_error == pytest.approx(5e-4)
    bad = check_logprob_fidelity(_reported(0.01), laws)
    assert bad.verdict == "fail" and bad.mismatches == 1
    assert bad.first_mismatch["token"] == 2 and bad.first_mismatch["what"] == "emitted token"
    assert "FAIL" in bad.line() and "reported -2.06944" in bad.line()


def test_a_top_list_that_leaves_out_a_more_likely_token_fails():
    laws = {(4,): LAW}.get
    result = check_logprob_fidelity(_reported(top=((1, 0.0), (2, 0.0))), laws, top=2)  # token 0 (0.5) left out
    assert result.verdict == "fail" and "left out" in result.first_mismatch["what"]
    assert result.first_mismatch["token"] == 0
    # the emitted token listed beyond the top 2 (it is 3rd here) is not a top entry the list must rank
    beyond = {(4,): [((3,), [[float(LAW[3]), [[0, float(LAW[0])], [1, float(LAW[1])], [3, float(LAW[3])]]]])]}
    assert check_logprob_fidelity(beyond, laws, top=2).verdict == "pass"


def test_values_a_top_m_law_does_not_hold_are_unchecked():
    sparse = {(4,): (np.array([0, 1]), LAW[:2])}.get
    result = check_logprob_fidelity(_reported(), sparse)  # token 2 is not in the top-2 law
    assert result.verdict == "pass" and result.unchecked == 1 and result.tokens_checked == 0
    assert check_logprob_fidelity(_reported(), {}.get).verdict == "not checked"


@pytest.fixture(scope="module")
def reference():
    server = Server("--max-logprobs", "-1")
    yield server
    server.close()


def test_the_reference_server_reports_the_targets_logprobs(reference, tmp_path):
    report = check_endpoint(reference.url, "tiny-reference", logprobs=3, out_dir=tmp_path, temperature=0.8, **SMALL)
    fidelity = report.extra["logprob_fidelity"]
    assert report.verdict == "pass" and fidelity["verdict"] == "pass", report.summary()
    # every sampled token of the battery's 2 prompts x 300 x 4 (and the determinism check's, when its
    # prefixes were teacher-forced; the others are counted as unchecked)
    assert fidelity["tokens_checked"] >= 2 * 300 * 4 and fidelity["top_entries_checked"] >= 3 * 2 * 300 * 4
    # float32 forward passes of different shapes (n rows at once, one sequence teacher-forced): 5.6e-6 here
    assert fidelity["max_abs_error"] < 1e-4
    assert "logprob fidelity (raw logprobs, tolerance 0.001): PASS" in report.summary()


@pytest.mark.parametrize("fault", ["zero", "first_only", "processed"])
def test_a_logprob_fault_fails_fidelity_while_the_law_passes(tmp_path, fault):
    server = Server("--max-logprobs", "-1", "--logprob-fault", fault)
    try:
        report = check_endpoint(server.url, "tiny-reference", logprobs=2, out_dir=tmp_path, temperature=0.8,
                                top_k=6, **SMALL)  # fmt: skip
    finally:
        server.close()
    fidelity = report.extra["logprob_fidelity"]
    assert report.passed and fidelity["verdict"] == "fail", report.summary()
    assert fidelity["mismatches"] > 0 and fidelity["first_mismatch"]["reported"] != fidelity["first_mismatch"]["target"]


def test_logprobs_are_checked_in_exact_mode_only(reference, tmp_path):
    with pytest.raises(InvalidArgument, match="exact-conditional mode only"):
        check_endpoint(reference.url, "m", reference_url=reference.url, two_sample=True, logprobs=2, **SMALL)
    with pytest.raises(InvalidArgument, match="logprobs"):
        check_endpoint(reference.url, "m", logprobs=21, **SMALL)


def test_the_cli_records_logprobs_and_prints_the_fidelity_line(reference, tmp_path, capsys):
    status = main(["audit", "--endpoint", reference.url, "--model", "tiny-reference", "--logprobs", "2",
                   "--num-samples", "100", "--max-new-tokens", "3", "--samples-per-request", "50",
                   "--skip-determinism", "--out", str(tmp_path), "--no-plots"])  # fmt: skip
    out = capsys.readouterr().out
    assert status == 0 and "logprob fidelity (raw logprobs, tolerance 0.001): PASS" in out
    markdown = (tmp_path / "report.md").read_text()
    assert "--logprobs 2" in markdown and "Logprob fidelity (raw logprobs, tolerance 0.001): PASS" in markdown
    assert '"logprob_fidelity"' not in markdown  # rendered as a sentence, not repeated as JSON


def test_gate_logprobs_makes_a_fidelity_failure_exit_1(tmp_path, capsys):
    server = Server("--max-logprobs", "-1", "--logprob-fault", "zero")
    args = ["audit", "--endpoint", server.url, "--model", "tiny-reference", "--logprobs", "1", "--num-samples", "100",
            "--max-new-tokens", "3", "--samples-per-request", "50", "--skip-determinism", "--no-plots"]  # fmt: skip
    try:
        plain = main([*args, "--out", str(tmp_path / "plain")])
        gated = main([*args, "--out", str(tmp_path / "gated"), "--gate-logprobs"])
    finally:
        server.close()
    out = capsys.readouterr().out
    assert (plain, gated) == (0, 1) and "logprob fidelity (raw logprobs, tolerance 0.001): FAIL" in out
    assert "--gate-logprobs" in (tmp_path / "gated" / "report.md").read_text()
    assert main(["audit", "--endpoint", server.url, "--model", "m", "--gate-logprobs"]) == 2
    assert "--gate-logprobs needs --logprobs" in capsys.readouterr().err


def test_a_reply_with_logprobs_may_hold_its_top_lists_and_no_more():
    """The client's byte cap on a sampling reply grows by the asked entries per token, nothing else."""
    plain = sampling_reply_bytes(50, 8)
    assert sampling_reply_bytes(50, 8, 20) - plain == 50 * 8 * 21 * BYTES_PER_LOGPROB
    assert sampling_reply_bytes(50, 8, None) == plain


@pytest.mark.parametrize("fault", [None, "prompt_draft"])
def test_prompt_logprobs_are_checked_against_the_reference_endpoint(reference, tmp_path, fault):
    """With a reference endpoint, the server under test's prompt logprobs of sampled sequences are the
    reference's teacher-forced raw laws; a server scoring prompts with its drafter fails that line only."""
    server = Server("--max-logprobs", "-1", *(("--logprob-fault", fault) if fault else ()))
    try:
        report = check_endpoint(server.url, "tiny-reference", reference_url=reference.url, logprobs=2,
                                out_dir=tmp_path, temperature=0.8, **{**SMALL, "num_samples": 120})  # fmt: skip
    finally:
        server.close()
    fidelity = report.extra["logprob_fidelity"]
    sampled, prompt = fidelity["verdict"], fidelity["prompt"]
    assert report.passed and fidelity["tokens_checked"] >= 2 * 120 * 4, report.summary()
    # 2 prompts x 8 sequences x 4 positions: every listed top-2 entry checked, the token's own where listed
    assert prompt["top_entries_checked"] == 2 * 8 * 4 * 2 and prompt["tokens_checked"] > 0
    if fault is None:
        assert sampled == prompt["verdict"] == "pass" and prompt["max_abs_error"] < 1e-4
        assert "; prompt logprob fidelity (raw logprobs, tolerance 0.001): PASS" in report.summary()
    else:
        assert sampled == prompt["verdict"] == "fail" and prompt["mismatches"] > 0
        assert "logprob fidelity (raw logprobs, tolerance 0.001): PASS -- " in fidelity["line"]  # the sampled ones
        assert "prompt logprob fidelity (raw logprobs, tolerance 0.001): FAIL" in fidelity["line"]
