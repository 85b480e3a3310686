"""Endpoint audits over real HTTP: a local OpenAI-compatible server process, the client, the store, the errors.

The servers are ``python -m specverify.endpoint.localserver`` processes on 127.0.0.1 (the
reference decoder's tiny model pair, V = 64): speculative decoding (must pass), two catalogued
decoder mutants under the sampling parameters where their bug shows (must fail), plain sampling
(the two-sample reference), a flaky one (HTTP 503 every third request: retries), and one with
a smaller vocabulary (a mismatch).  Sample sizes are small (600 continuations of 4 tokens per
prompt, 50 per request); alpha is the suite's 1e-3 per run.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest
from _servers import Server

from specverify.cli import main
from specverify.endpoint.api import Sampling, continuations, prompt_logprob_rows
from specverify.endpoint.checks import check_endpoint
from specverify.endpoint.http import EndpointError, HttpClient
from specverify.endpoint.store import STORE_NAME, SampleStore
from specverify.endpoint.subjects import EndpointTarget

SMALL = dict(num_samples=600, max_new_tokens=4, samples_per_request=50)
SMALL_ARGS = ["--num-samples", "600", "--max-new-tokens", "4", "--samples-per-request", "50"]


SERVERS = {
    "speculative": ("--max-logprobs", "-1"),
    "direct": ("--max-logprobs", "-1", "--no-speculation"),
    "target_unprocessed": ("--max-logprobs", "-1", "--mutant", "target_unprocessed"),
    "topk_not_in_reported_q": ("--max-logprobs", "-1", "--mutant", "topk_not_in_reported_q"),
    "capped": (),
    "flaky": ("--max-logprobs", "-1", "--flaky", "10"),
    "small_vocab": ("--max-logprobs", "-1", "--vocab-size", "32"),
    "batch_dependent": ("--max-logprobs", "-1", "--batch-dependent"),
}


class _Servers(dict):
    """Server processes started on first use, stopped at the end of the module."""

    def __missing__(self, name: str) -> Server:
        self[name] = Server(*SERVERS[name])
        return self[name]


@pytest.fixture(scope="module")
def servers():
    started = _Servers()
    yield started
    for server in started.values():
        server.close()


def _stats(report) -> list:
    return [(r.family, r.scenario, r.position, r.statistic, r.pvalue) for r in report.results]


@pytest.fixture(scope="module")
def reference_audit(servers, tmp_path_factory):
    """The speculative reference server audited in exact-conditional mode, with its store."""
    out = tmp_path_factory.mktemp("whole")
    return check_endpoint(servers["speculative"].url, "tiny-reference", out_dir=out, **SMALL), out


def test_the_reference_server_passes_exact_conditional(reference_audit):
    report, out = reference_audit
    assert report.verdict == "pass", report.summary()
    endpoint = report.extra["endpoint"]
    assert endpoint["mode"] == "exact" and endpoint["memo"]["teacher_forcing_requests"] > 0
    # the prefix trie: fewer teacher-forcing requests than distinct laws, far fewer than laws asked
    memo = endpoint["memo"]
    assert memo["teacher_forcing_requests"] < memo["distinct_prefix_laws"] < memo["laws_asked"]
    assert (out / STORE_NAME).exists()


def test_the_reference_server_passes_two_sample(servers, tmp_path):
    report = check_endpoint(
        servers["speculative"].url,
        "tiny-reference",
        reference_url=servers["direct"].url,
        two_sample=True,
        out_dir=tmp_path,
        **SMALL,
    )
    assert report.verdict == "pass", report.summary()
    assert report.extra["endpoint"]["requests_sent"].get("reference", 0) > 0


@pytest.mark.parametrize(
    "mutant, sampling",
    [("target_unprocessed", {"temperature": 0.7}), ("topk_not_in_reported_q", {"top_k": 3})],
)
def test_a_mutant_server_fails(servers, tmp_path, mutant, sampling):
    report = check_endpoint(servers[mutant].url, "tiny-reference", out_dir=tmp_path, **sampling, **SMALL)
    assert report.verdict == "fail", report.summary()
    assert report.extra["endpoint"]["declared_fault"]["reachable"] is True


def test_a_mutant_server_says_which_options_show_its_fault_and_the_audit_warns_when_it_cannot(
    servers, capsys, tmp_path
):
    """target_unprocessed is wrong only at T != 1: its start-up line says so, and an audit at T = 1 warns."""
    server = Server("--max-logprobs", "-1", "--mutant", "target_unprocessed")
    try:
        status = main(["audit", "--endpoint", server.url, "--model", "tiny-reference", *SMALL_ARGS,
                       "--num-samples", "200", "--out", str(tmp_path), "--no-plots"])  # fmt: skip
    finally:
        server.close()
    assert "its fault shows with a temperature other than 1" in server.banner and "--temperature 0.7" in server.banner
    err = capsys.readouterr().err
    assert status == 0  # the law at T = 1 is right: the audit passes, and says why that proves nothing here
    warning = next(line for line in err.splitlines() if line.startswith("warning: "))
    assert "mutant target_unprocessed" in warning and "cannot reach it" in warning and "--temperature 0.7" in warning
    assert "Warning: the server declares a planted fault" in (tmp_path / "report.md").read_text()


@pytest.mark.slow
def test_the_teacher_forcing_laws_may_come_from_a_reference_endpoint(servers, tmp_path):
    report = check_endpoint(
        servers["target_unprocessed"].url,
        "tiny-reference",
        reference_url=servers["direct"].url,
        temperature=0.7,
        out_dir=tmp_path,
        **SMALL,
    )
    assert report.verdict == "fail"
    assert report.extra["endpoint"]["requests_sent"]["target"] > 0


def test_an_interrupted_audit_resumes_with_identical_statistics(servers, reference_audit, tmp_path):
    """A store cut in the middle of a line, half its replies gone: the rerun sends only the rest."""
    whole, out = reference_audit
    lines = (out / STORE_NAME).read_text().splitlines(keepends=True)
    kept = len(lines) // 2
    (tmp_path / "cut").mkdir()
    (tmp_path / "cut" / STORE_NAME).write_text("".join(lines[:kept]) + lines[kept][: len(lines[kept]) // 2])
    resumed = check_endpoint(servers["speculative"].url, "tiny-reference", out_dir=tmp_path / "cut", **SMALL)
    assert _stats(resumed) == _stats(whole) and resumed.verdict == whole.verdict
    endpoint = resumed.extra["endpoint"]
    assert endpoint["requests_in_store_at_start"] == kept - 1  # the header line is not a reply
    sent = sum(endpoint["requests_sent"].values())
    assert sent == len(lines) - kept  # what was lost is sent again, nothing else
    again = check_endpoint(servers["speculative"].url, "tiny-reference", out_dir=tmp_path / "cut", **SMALL)
    assert _stats(again) == _stats(whole) and sum(again.extra["endpoint"]["requests_sent"].values()) == 0


@pytest.mark.slow
def test_an_interrupted_cli_audit_keeps_what_it_collected_and_resumes(servers, tmp_path):
    out = tmp_path / "out"
    command = [sys.executable, "-m", "specverify", "audit", "--endpoint", servers["speculative"].url,
               "--model", "tiny-reference", *SMALL_ARGS, "--samples-per-request", "10", "--out", str(out)]  # fmt: skip
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    store = out / STORE_NAME
    for _ in range(600):  # kill it once some replies are stored
        if store.exists() and store.read_text().count("\n") > 20:
            break
        threading.Event().wait(0.05)
    process.kill()
    process.wait()
    collected = store.read_text().count("\n")
    assert collected > 20
    finished = subprocess.run(command, capture_output=True, text=True)
    assert finished.returncode == 0, finished.stderr
    report = json.loads((out / "report.json").read_text())
    assert report["extra"]["endpoint"]["requests_in_store_at_start"] >= collected - 2
    keys = [json.loads(line)["key"] for line in store.read_text().splitlines()[1:] if line.endswith("}")]
    assert len(keys) == len(set(keys))  # nothing counted twice


def test_retries_carry_an_audit_through_a_flaky_server(servers, tmp_path):
    report = check_endpoint(servers["flaky"].url, "tiny-reference", out_dir=tmp_path, **{**SMALL, "num_samples": 200})
    assert report.verdict == "pass"
    assert report.extra["endpoint"]["retried"] > 0


def test_batch_invariance_holds_on_the_reference_server(servers, tmp_path):
    report = check_endpoint(servers["speculative"].url, "tiny-reference", out_dir=tmp_path, batch_invariance=100,
                            **{**SMALL, "num_samples": 300})  # fmt: skip
    assert report.verdict == "pass", report.summary()
    tests = [r for r in report.results if r.scenario == "batch_invariance"]
    assert tests and all(r.grade == "pass" for r in tests)
    summary = report.extra["endpoint"]["batch_invariance"]
    assert summary["seeded_rows_changed_among_neighbours"] == 0 and summary["seeded_rows_resent"] == 100


@pytest.mark.slow
def test_a_batch_dependent_server_fails_batch_invariance(servers, tmp_path):
    """Requests handled while another is in flight lose their temperature: alone and crowded laws differ."""
    report = check_endpoint(servers["batch_dependent"].url, "tiny-reference", out_dir=tmp_path, temperature=0.7,
                            batch_invariance=400, **{**SMALL, "num_samples": 300})  # fmt: skip
    assert report.verdict == "fail"
    assert any(r.grade == "fail" for r in report.results if r.scenario == "batch_invariance")
    assert report.extra["endpoint"]["batch_invariance"]["seeded_rows_changed_among_neighbours"] > 0


# ----------------------------------------------------------------------------------- clear errors
def _cli_error(capsys, *argv) -> str:
    status = main(["audit", *argv, "--retries", "1", "--no-plots"])
    err = capsys.readouterr().err.strip()
    assert status == 2, err
    return err


def test_unreachable_server_is_one_line_exit_2(capsys, tmp_path):
    err = _cli_error(capsys, "--endpoint", "http://127.0.0.1:9", "--model", "m", "--out", str(tmp_path))
    assert "unreachable" in err and len(err.splitlines()) == 1


def test_wrong_model_names_what_is_served(servers, capsys, tmp_path):
    err = _cli_error(capsys, "--endpoint", servers["speculative"].url, "--model", "gpt-9", "--out", str(tmp_path))
    assert "does not serve model 'gpt-9'" in err and "tiny-reference" in err


def test_capped_logprobs_name_the_server_flag(servers, capsys, tmp_path):
    err = _cli_error(capsys, "--endpoint", servers["capped"].url, "--model", "tiny-reference", "--out", str(tmp_path))
    assert "--max-logprobs -1" in err and len(err.splitlines()) == 1


def test_vocabulary_mismatch_between_endpoints(servers, capsys, tmp_path):
    err = _cli_error(
        capsys, "--endpoint", servers["speculative"].url, "--model", "tiny-reference",
        "--reference-endpoint", servers["small_vocab"].url, "--out", str(tmp_path),
    )  # fmt: skip
    assert "vocabulary size mismatch" in err and "64" in err and "32" in err


class _Stub:
    """An in-process HTTP server answering every request with a fixed reply; records the headers."""

    def __init__(self, status: int, body: bytes, content_type: str = "application/json"):
        self.headers: list = []
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                return

            def _answer(self):
                stub.headers.append(dict(self.headers))
                length = int(self.headers.get("Content-Length") or 0)
                self.rfile.read(length)
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = _answer

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()


def test_a_reply_that_is_not_json(capsys, tmp_path):
    stub = _Stub(200, b"<html>proxy login</html>", "text/html")
    try:
        err = _cli_error(capsys, "--endpoint", stub.url, "--model", "m", "--out", str(tmp_path))
    finally:
        stub.close()
    assert "not valid JSON" in err and "proxy login" in err


def test_a_server_that_returns_no_token_ids(capsys, tmp_path):
    reply = {"data": [{"id": "m"}], "choices": [{"index": 0, "text": "hello there", "finish_reason": "length"}]}
    stub = _Stub(200, json.dumps(reply).encode())
    try:
        err = _cli_error(capsys, "--endpoint", stub.url, "--model", "m", "--out", str(tmp_path))
    finally:
        stub.close()
    assert "no token ids" in err and "return_token_ids" in err


def test_the_api_key_is_sent_and_never_recorded(servers, monkeypatch, tmp_path):
    secret = "sk-test-5ecret-never-written"
    monkeypatch.setenv("SPECVERIFY_API_KEY", secret)
    stub = _Stub(200, json.dumps({"data": [{"id": "m"}]}).encode())
    try:
        HttpClient(stub.url).get("models")
    finally:
        stub.close()
    assert stub.headers[0]["Authorization"] == f"Bearer {secret}"
    status = main(["audit", "--endpoint", servers["speculative"].url, "--model", "tiny-reference", *SMALL_ARGS,
                   "--num-samples", "200", "--out", str(tmp_path), "--no-plots"])  # fmt: skip
    assert status == 0
    for path in tmp_path.iterdir():
        assert secret not in path.read_text(errors="replace"), path.name


@pytest.mark.parametrize("value", [None, ""])
def test_a_named_key_variable_that_is_unset_or_empty_is_a_usage_error(capsys, tmp_path, monkeypatch, value):
    """``--api-key-env VAR`` names a key the user means to send: unset or empty, nothing is sent."""
    monkeypatch.delenv("NOT_SET_XYZ", raising=False)
    if value is not None:
        monkeypatch.setenv("NOT_SET_XYZ", value)
    stub = _Stub(200, json.dumps({"data": [{"id": "m"}]}).encode())
    try:
        err = _cli_error(capsys, "--endpoint", stub.url, "--model", "m", "--api-key-env", "NOT_SET_XYZ",
                         "--out", str(tmp_path))  # fmt: skip
    finally:
        stub.close()
    assert len(err.splitlines()) == 1 and "$NOT_SET_XYZ" in err
    assert ("not set" if value is None else "empty") in err
    assert stub.headers == []  # before any request


def test_progress_counts_the_whole_run_with_an_eta(servers, capsys, tmp_path):
    """Every progress line: requests done in the run of the plan's upper bound, tokens, time, ETA; the batch last."""
    import re

    status = main(["audit", "--endpoint", servers["speculative"].url, "--model", "tiny-reference", *SMALL_ARGS,
                   "--num-samples", "200", "--out", str(tmp_path), "--no-plots", "--json"])  # fmt: skip
    assert status == 0
    captured = capsys.readouterr()
    report = json.loads(captured.out)["extra"]["endpoint"]
    pattern = re.compile(
        r"\[[#-]{24}\] ([\d,]+) of at most ([\d,]+) requests, [\d,]+ tokens, \d+ s(, ETA at most \d+ (s|min))? \(.+ \d+/\d+\)$"
    )
    lines = [line for line in captured.err.splitlines() if line.startswith("[")]
    matches = [pattern.match(line) for line in lines]
    assert lines and all(matches), lines
    done = [int(m.group(1).replace(",", "")) for m in matches]
    planned = {int(m.group(2).replace(",", "")) for m in matches}
    assert done == sorted(done) and planned == {
        report["plan"]["sampling_requests"] + report["plan"]["teacher_forcing_requests"]
    }
    assert done[-1] == sum(report["requests_sent"].values()) + report["requests_from_store"]
    assert any(m.group(3) for m in matches)  # an ETA once a rate is known


# ----------------------------------------------------------------------------------- parts
def test_the_store_refuses_another_audits_samples(tmp_path):
    SampleStore(tmp_path, {"model": "a"}).add("k", "decoder", {"x": 1}, [[1, 2]])
    with pytest.raises(EndpointError, match="another audit"):
        SampleStore(tmp_path, {"model": "b"})
    again = SampleStore(tmp_path, {"model": "a"})
    assert again.get("k") == [[1, 2]] and again.loaded == 1


def test_a_capped_logprob_row_is_refused():
    row = {str(t): {"logprob": float(np.log(1 / 64))} for t in range(20)}
    reply = {"choices": [{"prompt_logprobs": [None, row]}]}
    with pytest.raises(EndpointError, match="capped"):
        prompt_logprob_rows(reply, [0, 1], 64)
    with pytest.raises(EndpointError, match="sums to probability"):
        prompt_logprob_rows(reply, [0, 1], None)


def test_token_ids_are_read_from_vllm_token_id_strings():
    reply = {"choices": [{"index": 0, "logprobs": {"tokens": ["token_id:5", "token_id:7"]}}]}
    assert continuations(reply, n=1, max_tokens=2) == [[5, 7]]


class _FakeFetcher:
    def __init__(self):
        self.sequences: list = []

    def fetch(self, requests, what=""):
        out = []
        for r in requests:
            self.sequences.append(r.body["prompt"])
            out.append([[-np.log(4.0)] * 4 for _ in r.extra["keep"]])
        return out


def test_the_prefix_trie_asks_each_law_once():
    fetcher = _FakeFetcher()
    target = EndpointTarget(fetcher, "m", Sampling(), vocab_size=4)
    import torch

    sequences = torch.tensor([[1, 2, 0, 0], [1, 2, 0, 1], [1, 2, 1, 3], [1, 2, 0, 0]])
    laws = target.conditionals(sequences, start=2)
    assert laws.shape == (4, 2, 4)
    # needed: (1,2), (1,2,0), (1,2,1): two longest prefixes, two requests
    assert fetcher.sequences == [[1, 2, 0, 0], [1, 2, 1, 0]]
    target.conditionals(sequences, start=2)
    assert len(fetcher.sequences) == 2  # memoised
    assert target.memo()["distinct_prefix_laws"] == 3


def test_endpoint_flags_conflict_with_in_process_audits(capsys, tmp_path):
    err = _cli_error(capsys, "--endpoint", "http://127.0.0.1:9", "--model", "m", "--verifier", "reference.rules:verify",
                     "--out", str(tmp_path))  # fmt: skip
    assert "does not take --verifier" in err
    err = _cli_error(capsys, "--endpoint", "http://127.0.0.1:9", "--out", str(tmp_path))
    assert "needs --model" in err
    err = _cli_error(capsys, "--endpoint", "http://127.0.0.1:9", "--model", "m", "--two-sample", "--out", str(tmp_path))
    assert "needs --reference-endpoint" in err


def test_the_recorded_command_reruns_the_audit(reference_audit, tmp_path, servers, capsys):
    """From Python the report records a check_endpoint snippet; from the CLI the canonical command line."""
    from specverify.cli.commands import parse_command

    report, _ = reference_audit
    assert "check_endpoint(" in report.command and "num_samples=600" in report.command
    status = main(["audit", "--endpoint", servers["speculative"].url, "--model", "tiny-reference", *SMALL_ARGS,
                   "--num-samples", "200", "--out", str(tmp_path), "--no-plots", "--json"])  # fmt: skip
    assert status == 0
    command = json.loads(capsys.readouterr().out)["command"]
    assert command.startswith("specverify audit --endpoint ")
    args = parse_command(command)
    assert args.model == "tiny-reference" and args.num_samples == 200


@pytest.mark.parametrize(
    "server, extra, status",
    [("speculative", "", 0), pytest.param("target_unprocessed", " --temperature 0.7", 1, marks=pytest.mark.slow)],
)
def test_the_pytest_plugin_audits_an_endpoint(servers, tmp_path, server, extra, status):
    """``pytest --specverify-endpoint URL --specverify-model NAME``: one item, pass or fail with the battery."""
    (tmp_path / "test_nothing.py").write_text("def test_nothing():\n    pass\n")
    args = "--num-samples 300 --max-new-tokens 4 --samples-per-request 50" + extra
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rA", "--specverify-endpoint",
         servers[server].url, "--specverify-model", "tiny-reference", "--specverify-endpoint-args", args,
         "--specverify-report", str(tmp_path / "report")],
        cwd=tmp_path, capture_output=True, text=True,
    )  # fmt: skip
    assert out.returncode == status, out.stdout[-3000:] + out.stderr[-2000:]
    word = "PASSED" if status == 0 else "FAILED"
    assert f"{word} specverify[endpoint]" in out.stdout
    report = json.loads((tmp_path / "report" / "report.json").read_text())
    assert report["command"].startswith("specverify audit --endpoint ")


def test_skip_determinism_answers_the_repeat_from_the_store(servers, tmp_path):
    report = check_endpoint(servers["speculative"].url, "tiny-reference", out_dir=tmp_path, check_determinism=False,
                            **{**SMALL, "num_samples": 200})  # fmt: skip
    endpoint = report.extra["endpoint"]
    assert report.verdict == "pass" and endpoint["determinism"].startswith("not checked")
    assert endpoint["requests_from_store"] >= 2  # one repeated determinism call per prompt, never sent
    assert "check_determinism=False" in report.command


def test_the_report_has_an_endpoint_section(reference_audit):
    from specverify.report.html import render_html
    from specverify.report.markdown import render_markdown

    report, _ = reference_audit
    text = render_markdown(report)
    assert "## Endpoint" in text and "Prefix trie:" in text and "teacher forcing from the same server" in text
    assert '"endpoint"' not in text.split("## Other sections")[-1]  # not repeated as JSON
    assert "<h2>Endpoint</h2>" in render_html(report, plots=False)


def test_check_endpoint_is_a_public_name():
    import specverify

    assert specverify.check_endpoint is check_endpoint and "check_endpoint" in dir(specverify)
