"""llama-server's native API (``--api llama-server``): request bodies, reply readers, and audits of the local
server's ``/completion`` route (the reference passes; a planted law fault and a planted logprob fault are caught)."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from _servers import DirectFetcher, Server

from specverify.core.errors import InvalidArgument
from specverify.endpoint import llamaserver
from specverify.endpoint.api import Sampling
from specverify.endpoint.checks import check_endpoint
from specverify.endpoint.http import EndpointError, HttpClient
from specverify.endpoint.subjects import EndpointTarget, law_request, sampling_request
from specverify_reference.grammar import Grammar

SMALL = dict(num_samples=200, max_new_tokens=3, api="llama-server")
LLAMA = Sampling(temperature=0.8, top_k=6, frequency_penalty=0.5, presence_penalty=0.3, logit_bias={3: 1.5},
                 engine="llama.cpp")  # fmt: skip


def test_every_chain_stage_is_sent_and_off_stages_at_their_neutral_values():
    fields = llamaserver.sampling_fields(Sampling(temperature=0.7, engine="llama.cpp"))
    # llama-server's defaults (top-k 40, top-p 0.95, min-p 0.05) would otherwise cut the law
    assert fields["top_k"] == 0 and fields["top_p"] == 1.0 and fields["min_p"] == 0.0
    assert (
        fields["repeat_last_n"] == llamaserver.PENALTY_WINDOW
        and fields["typical_p"] == 1.0
        and fields["xtc_probability"] == 0.0
    )
    body = llamaserver.sampling_body([1, 2], max_tokens=3, sampling=LLAMA, seed=7, logprobs=2)
    assert body["logit_bias"] == [[3, 1.5]] and body["seed"] == 7 and body["n_predict"] == 3
    assert body["return_tokens"] and body["ignore_eos"] and body["n_probs"] == 2 and not body["post_sampling_probs"]
    schema = Grammar("json_schema", '{"type": "object"}')
    assert llamaserver.sampling_fields(Sampling(engine="llama.cpp", grammar=schema))["json_schema"] == {
        "type": "object"
    }


@pytest.mark.parametrize(
    "sampling, says",
    [
        (Sampling(), "engine must be 'llama.cpp'"),
        (Sampling(engine="llama.cpp", grammar=Grammar("regex", "a+")), "regex"),
    ],
)
def test_a_law_llama_server_cannot_serve_is_refused(sampling, says):
    with pytest.raises(InvalidArgument, match=says):
        llamaserver.sampling_fields(sampling)


@pytest.mark.parametrize(
    "reply, says",
    [
        ({"content": "x"}, "no token ids"),
        ({"tokens": [1, 2]}, "2 tokens, 3 were asked"),
        ({"tokens": [1, 2, 99]}, "outside the vocabulary"),
        ({"tokens": [1, 2, "3"]}, "not an integer token id"),
        ([{"tokens": [1, 2, 3]}, {"tokens": [1, 2, 3]}], "not one completion object"),
    ],
)
def test_the_continuation_reader_refuses_what_was_not_asked(reply, says):
    with pytest.raises(EndpointError, match=says):
        llamaserver.continuations(reply, max_tokens=3, vocab_size=32)


def _law(values):
    entries = [{"id": t, "token": str(t), "logprob": v, "bytes": []} for t, v in values]
    return {"tokens": [0], "completion_probabilities": [{"id": 0, "logprob": -1.0, "top_logprobs": entries}]}


def test_the_law_reader_takes_every_id_once_and_refuses_a_capped_list():
    row = llamaserver.law_row(_law([(1, -0.5), (0, -1.5), (2, -2.0)]), vocab_size=3, top=None)
    assert row.tolist() == [-1.5, -0.5, -2.0]
    with pytest.raises(EndpointError, match="lists 2 tokens, not the vocabulary's 3"):
        llamaserver.law_row(_law([(1, -0.5), (0, -1.5)]), vocab_size=3, top=None)
    with pytest.raises(EndpointError, match="twice"):
        llamaserver.law_row(_law([(1, -0.5), (1, -1.5), (2, -2.0)]), vocab_size=3, top=None)
    with pytest.raises(EndpointError, match="at most 0"):
        llamaserver.law_row(_law([(1, 0.5), (0, -1.5), (2, -2.0)]), vocab_size=3, top=None)
    ids, values = llamaserver.law_row(_law([(2, -2.0), (1, -0.5)]), vocab_size=3, top=2)
    assert ids.tolist() == [1, 2] and values.tolist() == [-0.5, -2.0]


def test_the_tokens_ignore_eos_bans_are_read_and_get_probability_0(reference):
    reply = {"tokens": [1], "generation_settings": {"logit_bias": [{"token": 3, "bias": 1.5}, {"token": 7, "bias": None},
                                                                   {"token": 9, "bias": -2.0}]}}  # fmt: skip
    assert llamaserver.banned_tokens(reply, LLAMA) == (7,)  # 3 is the request's own bias, 9 is finite
    assert llamaserver.banned_tokens({"tokens": [1]}, LLAMA) == ()
    with pytest.raises(EndpointError, match="outside the vocabulary"):
        llamaserver.banned_tokens({"generation_settings": {"logit_bias": [{"token": 99, "bias": None}]}}, LLAMA, 32)
    fetcher = DirectFetcher(HttpClient(reference.url))
    plain = Sampling(temperature=0.8, engine="llama.cpp")  # no cut: every token has mass
    free = EndpointTarget(fetcher, "tiny-reference", plain, vocab_size=64, api="llama-server")
    banned = EndpointTarget(fetcher, "tiny-reference", plain, vocab_size=64, api="llama-server", banned=(7, 8))
    prefix = torch.tensor([[1, 2, 3]])
    law, without = free.next_token_probs(prefix)[0], banned.next_token_probs(prefix)[0]  # (V,)
    assert float(without[7]) == float(without[8]) == 0.0 and float(law[7]) > 0 and abs(float(without.sum()) - 1) < 1e-12


def test_native_paths_go_from_the_servers_root():
    client = HttpClient("http://127.0.0.1:9/llama/v1")
    assert client.url("completions") == "http://127.0.0.1:9/llama/v1/completions"
    assert client.url("/completion") == "http://127.0.0.1:9/llama/completion"
    request = sampling_request("decoder", "m", LLAMA, [1], n=1, max_tokens=2, seed=0, api="llama-server")
    assert request.path == "/completion" and dataclasses.replace(request, path="completions").key != request.key
    with pytest.raises(InvalidArgument, match="one continuation per request"):
        sampling_request("decoder", "m", LLAMA, [1], n=2, max_tokens=2, seed=0, api="llama-server")
    with pytest.raises(InvalidArgument, match="api must be one of"):
        sampling_request("decoder", "m", LLAMA, [1], n=1, max_tokens=2, seed=0, api="sglang")


@pytest.fixture(scope="module")
def reference():
    server = Server()
    yield server
    server.close()


def test_the_target_asks_one_law_per_prefix(reference):
    fetcher = DirectFetcher(HttpClient(reference.url))
    target = EndpointTarget(fetcher, "tiny-reference", LLAMA, vocab_size=64, api="llama-server")
    laws = target.conditionals(torch.tensor([[1, 2, 3, 4], [1, 2, 5, 6]]), start=2)  # (2, 2, 64)
    assert laws.shape == (2, 2, 64) and abs(float(laws.sum()) - 4.0) < 1e-9
    assert [b["prompt"] for b in fetcher.bodies] == [[1, 2], [1, 2, 3], [1, 2, 5]]
    assert target.memo()["laws_per_request"] == 1.0
    assert law_request("target", [1, 2], None, 64).body["n_probs"] == 64


def test_the_reference_passes_with_penalties_bias_and_logprobs(reference, tmp_path):
    report = check_endpoint(reference.url, "tiny-reference", temperature=0.8, top_k=6, frequency_penalty=0.5,
                            presence_penalty=0.3, logit_bias={3: 1.5}, logprobs=3, out_dir=tmp_path, **SMALL)  # fmt: skip
    endpoint, fidelity = report.extra["endpoint"], report.extra["logprob_fidelity"]
    assert report.verdict == "pass" and fidelity["verdict"] == "pass", report.summary()
    assert endpoint["api"] == "llama-server" and endpoint["sampling"]["engine"] == "llama.cpp"
    assert endpoint["memo"]["laws_per_request"] == 1.0 and fidelity["tokens_checked"] >= 2 * 200 * 3
    assert "api='llama-server'" in report.command


@pytest.mark.parametrize(
    "options, fault, what",
    [
        # slow: the law path's power is CI's through the OpenAI route's mutant servers (tests/test_endpoint.py)
        pytest.param(
            ("--mutant", "penalties_not_verified"),
            dict(frequency_penalty=0.8, presence_penalty=0.6),
            "law",
            marks=pytest.mark.slow,
        ),
        (("--logprob-fault", "zero"), {}, "logprobs"),
    ],
)
def test_a_planted_fault_is_caught(tmp_path, options, fault, what):
    server = Server(*options)
    try:
        size = dict(SMALL, num_samples=60) if what == "logprobs" else SMALL  # the fidelity check needs no power
        report = check_endpoint(server.url, "tiny-reference", temperature=0.8, logprobs=2, out_dir=tmp_path,
                                **fault, **size)  # fmt: skip
    finally:
        server.close()
    fidelity = report.extra["logprob_fidelity"]
    if what == "law":
        assert report.verdict == "fail", report.summary()
    else:
        assert report.passed and fidelity["verdict"] == "fail", report.summary()


def test_options_the_native_api_cannot_take_are_refused(reference):
    with pytest.raises(InvalidArgument, match="two-sample"):
        check_endpoint(reference.url, "m", grammar=Grammar("ebnf", 'root ::= "a"'), **SMALL)
    with pytest.raises(InvalidArgument, match="samples_per_request must be 1"):
        check_endpoint(reference.url, "m", samples_per_request=4, **SMALL)
    with pytest.raises(InvalidArgument, match="engine must be 'llama.cpp'"):
        check_endpoint(reference.url, "m", engine="vllm", **SMALL)
