"""Batch invariance of a served decoder: the same requests sent alone and among concurrent others.

A server batches concurrent requests; a kernel whose result depends on the batch (its size, a
neighbour's row, a seeded row next to unseeded ones) can change what a request samples.  For one
prompt, ``M`` continuations are collected twice:

* **alone**: one request at a time (one in flight: the server has nothing of ours to batch it with);
* **in a crowd**: the fetcher's full concurrency, each request interleaved with a distractor
  request of other prompts, so that it is batched with others.

The two sets (independent seeds) are compared with the decoder battery's two-sample tests; the
results join the run's single error budget.  Then the *alone* requests are sent again, with their
seeds, in a crowd: a server whose seeded requests are reproducible gives the same tokens whatever
the neighbours; how many rows changed is reported (a fact about determinism, not a test of the law).
"""

from __future__ import annotations

import torch

from specverify.core.results import TestResult
from specverify.core.seeds import derive_seed
from specverify.decoder.conditionals import ExactPlan
from specverify.decoder.twosample import analyse_two_sample
from specverify.endpoint.api import Sampling
from specverify.endpoint.pool import Fetcher
from specverify.endpoint.subjects import SEED_MODULUS, sampling_request

__all__ = ["batch_invariance", "SCENARIO"]

SCENARIO = "batch_invariance"
_DISTRACTOR_SAMPLES = 4


def _sampling_requests(model, sampling, prompt, seeds, max_new_tokens, composition, occurrence=0, n=1, vocab_size=None,
                       api="openai"):  # fmt: skip
    return [
        sampling_request("decoder", model, sampling, prompt, n=n, max_tokens=max_new_tokens, seed=s,
                         occurrence=occurrence, extra={"composition": composition}, vocab_size=vocab_size, api=api)
        for s in seeds
    ]  # fmt: skip


def _tokens(replies) -> torch.Tensor:
    return torch.tensor([row for reply in replies for row in reply], dtype=torch.long)


def batch_invariance(
    fetcher: Fetcher,
    model: str,
    sampling: Sampling,
    prompt: list[int],
    others: list[list[int]],
    *,
    samples: int,
    max_new_tokens: int,
    seed: int,
    vocab_size: int | None,
    plan: ExactPlan,
    api: str = "openai",
) -> tuple[list[TestResult], dict]:
    """Two-sample tests of ``samples`` continuations of ``prompt`` sent alone vs in a crowd; a summary.

    Returns the ungraded results (scenario ``batch_invariance``) and a dict for the report:
    the sizes, the requests and how many re-sent seeded rows changed among neighbours.  ``api``: the
    completion API (llama-server's takes one continuation per request, so its distractors hold one each).
    """
    base_alone, base_crowd = derive_seed(seed, 6, 0), derive_seed(seed, 7, 0)
    alone_seeds = [(base_alone + j) % SEED_MODULUS for j in range(samples)]
    crowd_seeds = [(base_crowd + j) % SEED_MODULUS for j in range(samples)]
    alone = _sampling_requests(model, sampling, prompt, alone_seeds, max_new_tokens, "alone", vocab_size=vocab_size,
                               api=api)  # fmt: skip
    alone_tokens = _tokens(fetcher.fetch(alone, what="alone", concurrency=1))  # (M, L)

    pool = others or [prompt]
    distractors = [
        _sampling_requests(model, sampling, pool[j % len(pool)], [derive_seed(seed, 8, j) % SEED_MODULUS],
                           max_new_tokens, "distractor", n=1 if api == "llama-server" else _DISTRACTOR_SAMPLES,
                           vocab_size=vocab_size, api=api)[0]
        for j in range(2 * samples)
    ]  # fmt: skip
    crowd = _sampling_requests(model, sampling, prompt, crowd_seeds, max_new_tokens, "crowd", vocab_size=vocab_size,
                               api=api)  # fmt: skip
    again = _sampling_requests(
        model, sampling, prompt, alone_seeds, max_new_tokens, "crowd", occurrence=1, vocab_size=vocab_size, api=api
    )
    mixed = [r for pair in zip(crowd + again, distractors) for r in pair]
    replies = fetcher.fetch(mixed, what="in a crowd")
    by_key = {r.key: reply for r, reply in zip(mixed, replies)}
    crowd_tokens = _tokens([by_key[r.key] for r in crowd])  # (M, L)
    again_tokens = _tokens([by_key[r.key] for r in again])  # (M, L)

    V = vocab_size if vocab_size is not None else int(max(alone_tokens.max(), crowd_tokens.max())) + 1
    results = analyse_two_sample(crowd_tokens, alone_tokens, V, scenario=SCENARIO, plan=plan)
    changed = int((again_tokens != alone_tokens).any(1).sum())
    summary = {
        "samples_per_composition": samples,
        "distractor_requests": len(distractors),
        "seeded_rows_changed_among_neighbours": changed,
        "seeded_rows_resent": samples,
    }
    return results, summary
