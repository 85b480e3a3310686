"""Teacher forcing from the top M logprobs (``top_logprobs``): replies, store and memory in M, not V.

The reader of a ``prompt_logprobs = M`` reply (:func:`prompt_logprob_tops`) and its refusals; when
a top-M list fixes the processed law (:func:`top_resolves`); the sparse target's laws against the
dense target's on the same server (equal within float64 rounding); a law whose cut ties the least
listed value asked again over the whole vocabulary; and whole audits of the local server (V = 64):
the reference passes and the top-k mutant fails in sparse mode, at alpha 1e-3 per run, as in
tests/test_endpoint.py.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from _servers import DirectFetcher, Server, fixed_law_replies

from specverify.cli import main
from specverify.core.errors import InvalidArgument
from specverify.endpoint.api import Sampling, densify, processed_laws, prompt_logprob_tops, top_resolves
from specverify.endpoint.checks import check_endpoint
from specverify.endpoint.http import EndpointError, HttpClient
from specverify.endpoint.subjects import EndpointTarget

SMALL = dict(num_samples=600, max_new_tokens=4, samples_per_request=50)


def _reply(entries: list[dict | None]) -> dict:
    return {"choices": [{"index": 0, "prompt_logprobs": entries}]}


def _entry(values: dict[int, float]) -> dict:
    return {str(t): {"logprob": v, "rank": 0, "decoded_token": str(t)} for t, v in values.items()}


LOG = {t: math.log(p) for t, p in {5: 0.4, 2: 0.3, 7: 0.2, 0: 0.06, 1: 0.04}.items()}


def test_a_top_list_is_read_most_likely_first_and_the_extra_prompt_token_dropped():
    top3 = {t: LOG[t] for t in (5, 2, 7)}
    rows = prompt_logprob_tops(
        _reply([None, _entry(top3), _entry({**top3, 0: LOG[0]})]), [3, 2, 0], top=3, vocab_size=8
    )
    for ids, values in rows:
        assert ids.tolist() == [5, 2, 7] and values.tolist() == [LOG[5], LOG[2], LOG[7]]


@pytest.mark.parametrize(
    "entry, says",
    [
        ({5: LOG[5], 2: LOG[2]}, "lists 2 tokens, 3 were asked"),
        ({5: LOG[5], 2: LOG[2], 7: LOG[7], 0: LOG[0], 1: LOG[1]}, "lists 5 tokens"),
        ({5: LOG[5], 7: LOG[7], 0: LOG[0]}, "does not list the prompt token 2"),
        ({2: LOG[7], 5: LOG[5], 7: LOG[2], 0: LOG[0]}, "is above the least likely"),
        ({2: -0.1, 5: -0.2, 7: -0.3}, "more than 1"),
        ({2: LOG[2], 5: LOG[5], 9: LOG[7]}, "outside the vocabulary"),
        ({2: LOG[2], 5: LOG[5], 7: 0.5}, "at most 0"),
    ],
)
def test_a_top_list_that_contradicts_itself_is_refused(entry, says):
    with pytest.raises(EndpointError, match=says):
        prompt_logprob_tops(_reply([None, _entry(entry)]), [3, 2], top=3, vocab_size=8)


def test_a_top_list_fixes_the_law_only_when_the_cut_is_strictly_inside_it():
    values = np.log([0.4, 0.3, 0.2, 0.06])
    assert top_resolves(values, 64, Sampling(top_k=3))
    assert not top_resolves(values, 64, Sampling(top_k=4))  # the 4th may tie tokens not listed
    assert not top_resolves(np.log([0.4, 0.3, 0.2, 0.2]), 64, Sampling(top_k=3))  # a tie at the cut
    assert top_resolves(values, 64, Sampling(temperature=0))
    assert not top_resolves(values, 64, Sampling(top_p=0.9))  # no cut: every value matters
    assert top_resolves(values, 4, Sampling())  # the whole vocabulary
    # where it resolves, the law from the list equals the law from the whole row
    full = np.log(np.array([0.4, 0.3, 0.2, 0.06, 0.02, 0.01, 0.01]))
    ids = np.arange(4)
    for sampling in (Sampling(temperature=0.7, top_k=3), Sampling(top_k=2, top_p=0.8), Sampling(temperature=0)):
        torch.testing.assert_close(
            processed_laws(densify(ids, full[:4], 7)[None], sampling),
            processed_laws(full[None], sampling),
            rtol=1e-15,
            atol=1e-17,
        )


@pytest.mark.parametrize(
    "options, says",
    [
        (dict(top_logprobs=6), "top-k with k < top_logprobs"),
        (dict(top_logprobs=6, top_k=6), "top-k with k < top_logprobs"),
        (dict(top_logprobs=1, top_k=1), "top_logprobs must be"),
        (dict(top_logprobs=6, top_k=3, two_sample=True, reference_url="http://127.0.0.1:9"), "two_sample"),
    ],
)
def test_top_logprobs_needs_a_cut_inside_the_list(options, says):
    with pytest.raises(InvalidArgument, match=says):
        check_endpoint("http://127.0.0.1:9/v1", "m", **options)


@pytest.fixture(scope="module")
def servers():
    """The reference decoder's server (V = 64), whole-vocabulary logprobs allowed ("open"), and the
    same capped at 4 logprobs, like vLLM's default cap of 20 ("capped")."""
    started = {"open": Server("--max-logprobs", "-1"), "capped": Server("--max-logprobs", "4")}
    yield started
    for server in started.values():
        server.close()


def test_the_sparse_target_gives_the_dense_targets_laws(servers):
    client = HttpClient(servers["open"].url)
    sampling = Sampling(temperature=0.8, top_k=5, top_p=0.95)
    prefixes = torch.randint(64, (24, 6), generator=torch.Generator().manual_seed(3))
    dense = EndpointTarget(DirectFetcher(client), "tiny-reference", sampling, vocab_size=64)
    fetcher = DirectFetcher(client)
    sparse = EndpointTarget(fetcher, "tiny-reference", sampling, vocab_size=64, top_logprobs=6)
    want = dense.conditionals(prefixes, start=2)  # (24, 4, 64)
    got = sparse.conditionals(prefixes, start=2)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-15)
    assert (got > 0).sum(-1).max() <= 5
    assert {b["prompt_logprobs"] for b in fetcher.bodies} == {6}
    assert all(len(law[0]) == 6 for law in sparse.raw.values())
    assert sparse.memo()["whole_vocabulary_fallbacks"] == 0 and sparse.memo()["top_logprobs"] == 6


def test_a_law_whose_cut_ties_the_list_is_asked_over_the_whole_vocabulary():
    """A server whose top-3 after prefix (1, 2) ends in a tie with the 2nd: top-2 cannot be read off it."""
    V = 8
    full = np.log(np.array([0.3, 0.2, 0.2, 0.1, 0.1, 0.05, 0.03, 0.02]))

    fetcher = DirectFetcher(None, fixed_law_replies(full))
    target = EndpointTarget(fetcher, "m", Sampling(top_k=2), vocab_size=V, top_logprobs=3)
    laws = target.conditionals(torch.tensor([[1, 2, 3]]), start=1)  # (1, 2, V)
    assert target.memo()["whole_vocabulary_fallbacks"] == 2  # both laws tie at the cut (0.2, 0.2)
    assert [b["prompt_logprobs"] for b in fetcher.bodies] == [3, -1, -1]
    torch.testing.assert_close(laws[0], processed_laws(np.stack([full, full]), Sampling(top_k=2)))
    assert (laws[0] > 0).sum(-1).tolist() == [3, 3]  # ties at the cut are all kept


def test_a_server_cannot_turn_a_top_m_audit_into_a_whole_vocabulary_one(monkeypatch):
    """Every law tied at the cut: past MAX_FALLBACKS laws asked again, the audit stops."""
    import specverify.endpoint.subjects as subjects

    monkeypatch.setattr(subjects, "MAX_FALLBACKS", 3)

    def replies(body):  # the top 3 (and the prompt token) all at 1/16
        prompt = body["prompt"]
        return _reply([None] + [_entry(dict.fromkeys([0, 1, 2, t], math.log(1 / 16))) for t in prompt[1:]])

    fetcher = DirectFetcher(None, replies)
    target = EndpointTarget(fetcher, "m", Sampling(top_k=2), vocab_size=16, top_logprobs=3)
    with pytest.raises(EndpointError, match="more than the 3"):
        target.conditionals(torch.tensor([[1, 2, 3, 4, 5]]), start=1)
    assert fetcher.failure is not None and {b["prompt_logprobs"] for b in fetcher.bodies} == {3}


def test_the_reference_server_passes_and_the_topk_mutant_fails_in_sparse_mode(servers, tmp_path):
    """Against servers capped at 4 logprobs, given the vocabulary: no whole-vocabulary law is asked."""
    sparse = dict(top_k=3, top_logprobs=4, vocab_size=64, **SMALL)
    report = check_endpoint(servers["capped"].url, "tiny-reference", out_dir=tmp_path / "ref", **sparse)
    assert report.verdict == "pass", report.summary()
    memo = report.extra["endpoint"]["memo"]
    assert memo["top_logprobs"] == 4 and memo["distinct_prefix_laws"] > 50
    mutant = Server("--max-logprobs", "4", "--mutant", "topk_not_in_reported_q")
    try:
        failed = check_endpoint(mutant.url, "tiny-reference", out_dir=tmp_path / "mutant", **sparse)
    finally:
        mutant.close()
    assert failed.verdict == "fail", failed.summary()
    dense = check_endpoint(servers["open"].url, "tiny-reference", top_k=3, out_dir=tmp_path / "dense", **SMALL)
    assert dense.verdict == "pass"
    laws = [_law_bytes(tmp_path / run / "samples.jsonl") for run in ("ref", "dense")]
    assert laws[0] < laws[1] / 8, laws  # ids and values of 4 tokens against values of 64


def _law_bytes(store) -> int:
    """Bytes of the stored teacher-forcing replies (the laws) of a sample store."""
    lines = [json.loads(line) for line in store.read_text().splitlines()[1:]]
    return sum(len(json.dumps(line["reply"])) for line in lines if line["role"] == "target")


def test_a_capped_server_needs_the_vocabulary_given(servers, tmp_path):
    with pytest.raises(EndpointError, match="caps logprobs"):
        check_endpoint(servers["capped"].url, "tiny-reference", top_k=3, top_logprobs=4, out_dir=tmp_path, **SMALL)


def test_the_cli_records_top_logprobs_and_the_vocabulary_in_the_command(servers, tmp_path):
    status = main(["audit", "--endpoint", servers["capped"].url, "--model", "tiny-reference", "--top-k", "3",
                   "--top-logprobs", "4", "--vocab-size", "64", "--num-samples", "200", "--max-new-tokens", "3",
                   "--samples-per-request", "50", "--out", str(tmp_path)])  # fmt: skip
    assert status in (0, 1)
    assert "--top-logprobs 4 --vocab-size 64" in (tmp_path / "report.md").read_text()
