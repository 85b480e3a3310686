"""The options users turn on, over HTTP: penalties, min-p and logit bias against the local server.

The laws after each prefix are the raw teacher-forced logprobs processed with vLLM's documented
law (logit bias, then the penalties over prompt and output as vLLM counts them, temperature,
min-p, top-k, top-p): the reference server passes, and the two penalty mutants of the catalogue
(penalties dropped in verification: vLLM #18902; one token per round in the penalty record:
SGLang PR #33643) fail, at alpha 1e-3 per run and the sample sizes of tests/test_endpoint.py.
Top-M laws under penalties and a bias are exact when the list fixes the cut and asked again over
the whole vocabulary when an unlisted token could pass it.
"""

from __future__ import annotations

import json
import math
import urllib.error
import urllib.request

import numpy as np
import pytest
import torch
from _servers import DirectFetcher, Server, fixed_law_replies

from specverify.cli import main
from specverify.cli.endpoint import LAWS
from specverify.core.errors import InvalidArgument
from specverify.endpoint.api import Sampling, processed_laws, top_resolves
from specverify.endpoint.checks import check_endpoint
from specverify.endpoint.http import EndpointError, HttpClient
from specverify.endpoint.subjects import EndpointTarget
from specverify_reference.penalties import History
from specverify_reference.processors import ENGINES

SMALL = dict(num_samples=600, max_new_tokens=4, samples_per_request=50)
#: Penalties, min-p and a bias at once (vLLM's law, the endpoint's default).  No repetition penalty:
#: it needs raw logits, which logprobs do not carry (two-sample mode audits it, below).
OPTIONS = dict(temperature=0.9, min_p=0.02, frequency_penalty=0.6, presence_penalty=0.4, logit_bias={5: 1.5, 9: -2.0})


@pytest.fixture(scope="module")
def servers():
    started = {
        "reference": Server("--max-logprobs", "-1"),
    }
    yield started
    for server in started.values():
        server.close()


def test_the_reference_server_passes_under_penalties_min_p_and_a_bias(servers, tmp_path):
    report = check_endpoint(servers["reference"].url, "tiny-reference", out_dir=tmp_path, **OPTIONS, **SMALL)
    assert report.verdict == "pass", report.summary()
    sent = report.extra["endpoint"]["sampling"]
    assert sent["frequency_penalty"] == 0.6 and sent["logit_bias"] == {"5": 1.5, "9": -2.0}


def test_a_repetition_penalty_is_audited_two_sample_and_refused_in_exact_mode(servers, tmp_path):
    rep = dict(temperature=0.9, repetition_penalty=1.6)
    with pytest.raises(InvalidArgument, match="needs the raw logits"):
        check_endpoint(servers["reference"].url, "tiny-reference", out_dir=tmp_path / "exact", **rep, **SMALL)
    direct = Server("--max-logprobs", "-1", "--no-speculation")
    mutant = Server("--mutant", "penalties_not_verified")
    try:
        reports = [check_endpoint(server.url, "tiny-reference", reference_url=direct.url, two_sample=True,
                                  out_dir=tmp_path / name, **rep, **SMALL)
                   for name, server in (("reference", servers["reference"]), ("mutant", mutant))]  # fmt: skip
    finally:
        direct.close()
        mutant.close()
    # the gate (no FAIL at the family-wise alpha 1e-3); at seed 0 the reference's smallest adjusted p is
    # 0.026 (two-sample, prompt 1, position 4: a SUSPICIOUS warning), at seeds 1-3 it passes outright
    assert reports[0].passed and not reports[0].errors, reports[0].summary()
    assert reports[1].verdict == "fail", reports[1].summary()


@pytest.mark.parametrize("mutant", ["penalties_not_verified", "penalty_last_token_only"])
def test_a_penalty_mutant_server_fails(tmp_path, mutant):
    server = Server("--max-logprobs", "-1", "--mutant", mutant)
    try:
        report = check_endpoint(server.url, "tiny-reference", out_dir=tmp_path, **OPTIONS, **SMALL)
    finally:
        server.close()
    assert report.verdict == "fail", report.summary()
    assert report.extra["endpoint"]["declared_fault"]["reachable"] is True


def test_top_m_laws_under_penalties_and_a_bias_equal_the_whole_vocabulary_laws(servers):
    sampling = Sampling(temperature=0.8, top_k=3, top_p=0.95, frequency_penalty=0.5, presence_penalty=-0.3,
                        logit_bias={7: 0.5})  # fmt: skip
    prefixes = torch.randint(64, (20, 7), generator=torch.Generator().manual_seed(4))
    dense = EndpointTarget(
        DirectFetcher(HttpClient(servers["reference"].url)), "tiny-reference", sampling, vocab_size=64
    )
    fetcher = DirectFetcher(HttpClient(servers["reference"].url))
    sparse = EndpointTarget(fetcher, "tiny-reference", sampling, vocab_size=64, top_logprobs=6)
    want = dense.conditionals(prefixes, start=3)  # (20, 4, 64)
    got = sparse.conditionals(prefixes, start=3)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-15)
    fallbacks = sparse.memo()["whole_vocabulary_fallbacks"]
    assert [b["prompt_logprobs"] for b in fetcher.bodies].count(-1) == fallbacks < len(sparse.raw) / 2


def test_a_bias_that_could_lift_an_unlisted_token_past_the_cut_asks_for_the_whole_vocabulary():
    """Top-2 of a list of 3: raw cut 0.3 > least listed 0.2 fixes the plain law, but a bias of +6 on
    an unlisted token could lift it past the cut (it does), so that law is asked again in full."""
    V = 8
    full = np.log(np.array([0.35, 0.3, 0.2, 0.1, 0.03, 0.01, 0.005, 0.005]))

    plain, lifted = Sampling(top_k=2), Sampling(top_k=2, logit_bias={6: 6.0})
    assert top_resolves(full[:3], V, plain)
    history = History.of_prefixes(torch.tensor([[1]]), 1)
    assert not top_resolves(full[:3], V, lifted, ids=np.arange(3), history=history)
    assert top_resolves(full[:3], V, Sampling(top_k=2, logit_bias={6: 0.1}), ids=np.arange(3), history=history)
    fetcher = DirectFetcher(None, fixed_law_replies(full))
    target = EndpointTarget(fetcher, "m", lifted, vocab_size=V, top_logprobs=3)
    laws = target.conditionals(torch.tensor([[1, 0]]), start=1)  # (1, 1, V)
    assert [b["prompt_logprobs"] for b in fetcher.bodies] == [3, -1]
    torch.testing.assert_close(laws[0], processed_laws(full[None], lifted))
    assert laws[0, 0, 6] > 0  # the lifted token is in the law: the top-3 list alone would have dropped it


def test_a_penalty_can_lift_an_unlisted_history_token_and_the_bound_sees_it():
    """A negative frequency penalty raises a seen token: unlisted and in the output, it may pass the cut."""
    V = 6
    raw = np.log(np.array([0.4, 0.3, 0.2, 0.06, 0.03, 0.01]))
    sampling = Sampling(top_k=2, frequency_penalty=-2.0)
    history = History(torch.tensor([[0, 5]]), 1, torch.tensor([[2]]))  # token 5 in the output
    assert not top_resolves(raw[:3], V, sampling, ids=np.arange(3), history=history)
    unseen = History(torch.tensor([[0, 1]]), 1, torch.tensor([[2]]))
    assert top_resolves(raw[:3], V, sampling, ids=np.arange(3), history=unseen)


def test_the_command_records_the_options_and_bad_ones_are_named(servers, tmp_path, capsys):
    status = main(["audit", "--endpoint", servers["reference"].url, "--model", "tiny-reference",
                   "--num-samples", "100", "--max-new-tokens", "3", "--samples-per-request", "50",
                   "--frequency-penalty", "0.2", "--presence-penalty", "0.3", "--min-p", "0.05",
                   "--logit-bias", "4=1.5", "--logit-bias", "2=-1", "--skip-determinism",
                   "--out", str(tmp_path), "--no-plots"])  # fmt: skip
    assert status in (0, 1)
    command = (tmp_path / "report.md").read_text()
    assert "--min-p 0.05 --frequency-penalty 0.2 --presence-penalty 0.3 --logit-bias 2=-1 --logit-bias 4=1.5" in command
    capsys.readouterr()
    assert main(["audit", "--endpoint", servers["reference"].url, "--model", "m", "--logit-bias", "x=1"]) == 2
    assert "--logit-bias must look like ID=BIAS" in capsys.readouterr().err
    assert main(["audit", "--endpoint", servers["reference"].url, "--model", "m", "--frequency-penalty", "nan"]) == 2
    assert "frequency_penalty" in capsys.readouterr().err
    assert main(["audit", "--endpoint", servers["reference"].url, "--model", "m", "--repetition-penalty", "1.2"]) == 2
    assert "--two-sample" in capsys.readouterr().err


def test_the_server_refuses_a_bias_outside_its_vocabulary(servers):
    client = HttpClient(servers["reference"].url)
    with pytest.raises(EndpointError, match="logit_bias token ids must be in"):
        client.post("completions", {"model": "tiny-reference", "prompt": [1, 2], "max_tokens": 1,
                                    "logit_bias": {"64": 1.0}})  # fmt: skip


def test_the_cli_offers_every_engine_law():
    assert set(LAWS) == set(ENGINES)
    with pytest.raises(InvalidArgument, match="engine"):
        Sampling(engine="sglang")
    assert Sampling(logit_bias={3: -100}).fields()["logit_bias"] == {"3": -100.0}
    with pytest.raises(InvalidArgument, match="finite"):
        Sampling(logit_bias={3: -math.inf})


#: Structured output over the local server's synthetic vocabulary (64 tokens: ``{}":, ``, a-z, 0-9, ...).
REGEX = "[a-d]+( [a-d]+)*"
STRUCTURED = dict(temperature=0.9, frequency_penalty=0.3, grammar={"kind": "regex", "source": REGEX})


@pytest.mark.parametrize("mutant", [None, "grammar_first_row_only"])
def test_structured_output_the_reference_passes_and_the_grammar_mutant_fails(tmp_path, mutant):
    """vLLM's structured_outputs sent, and each teacher-forced law masked by xgrammar after its prefix."""
    pytest.importorskip("xgrammar")
    server = Server("--max-logprobs", "-1", *(("--mutant", mutant) if mutant else ()))
    try:
        report = check_endpoint(server.url, "tiny-reference", out_dir=tmp_path, **STRUCTURED, **SMALL)
    finally:
        server.close()
    assert report.verdict == ("fail" if mutant else "pass"), report.summary()
    assert report.extra["endpoint"]["sampling"]["grammar"] == {"kind": "regex", "source": REGEX}
    assert "grammar={'kind': 'regex'" in report.command


def test_structured_output_options_are_recorded_and_checked(servers, tmp_path, capsys):
    pytest.importorskip("xgrammar")
    status = main(["audit", "--endpoint", servers["reference"].url, "--model", "tiny-reference",
                   "--num-samples", "100", "--max-new-tokens", "3", "--samples-per-request", "50",
                   "--json-schema", '{"type": "object"}', "--skip-determinism", "--out", str(tmp_path),
                   "--no-plots"])  # fmt: skip
    assert status in (0, 1)
    assert """--json-schema '{"type": "object"}'""" in (tmp_path / "report.md").read_text()
    capsys.readouterr()
    assert main(["audit", "--endpoint", servers["reference"].url, "--model", "m", "--regex", "a", "--ebnf", "x"]) == 2
    assert "at most one" in capsys.readouterr().err
    body = {"model": "tiny-reference", "prompt": [1], "max_tokens": 2, "structured_outputs": {"regex": "(a"}}
    request = urllib.request.Request(servers["reference"].url + "/completions", json.dumps(body).encode(),
                                     {"Content-Type": "application/json"})  # fmt: skip
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=30)
    assert refused.value.code == 400 and b"cannot compile" in refused.value.read()
