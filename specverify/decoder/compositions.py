"""Batch invariance of a whole decoder: one prompt's law must not depend on its neighbours in a batch.

Engines batch requests, and some of their bugs need a batch of a particular make-up: OpenVINO
GenAI's first token went wrong only when more than 64 requests shared a batch; vLLM PR #10863
gave garbage to unseeded rows of a batch that also held seeded ones.  A decoder that can run
several requests in one batch exposes the optional method

    generate_requests(prompts, *, num_samples, max_new_tokens, seeds) -> list of (n_i, L) long

(``prompts`` a list of 1-D prompts, ``num_samples`` and ``seeds`` one entry per request, a seed
``None`` for an unseeded request).  The focus prompt's continuations are collected alone and
with 1, 63, 64, 127 and 128 neighbour requests (:data:`COMPOSITIONS`: the batch holds 1, 2, 64,
65, 128, 129 requests; neighbours alternate seeded and unseeded), each composition with its own
seed, and tested:

* ``invariance`` family, per composition and new position: goodness of fit of the focus tokens
  against the sum of their exact teacher-forced conditionals (``stats.gof_pair``), and a
  two-sample test against the composition of one request (the law must be the same in every
  make-up of the batch);
* ``invariance`` ``seeded_tokens`` (exact), when the decoder declares ``per_request_seeds =
  True``: the focus request with one fixed seed emits the same tokens alone and in every
  composition, seeded and unseeded neighbours mixed.

A decoder without ``generate_requests`` is reported as not tested for batch invariance (a note in
the report's ``extra``), not failed.
"""

from __future__ import annotations

import numpy as np
import torch

from specverify import stats
from specverify.core.errors import ImplementationError, raised
from specverify.core.results import TestResult
from specverify.core.seeds import derive_seed

from .protocol import summed_conditionals

__all__ = ["COMPOSITIONS", "SAMPLE_SHARE", "composition_results"]

#: Requests per batch: the focus request alone and with neighbours across the 64- and 128-request edges.
COMPOSITIONS = (1, 2, 64, 65, 128, 129)
#: Focus samples per composition, as a share of the tier's samples per prompt.
SAMPLE_SHARE = 0.05
_SEEDED_ROWS = 16


def _call(generate_requests, prompts, counts, seeds, length: int, vocab_size: int) -> torch.Tensor:
    """The focus request's (first request's) tokens (n, L), validated."""
    what = f"generate_requests({len(prompts)} requests, num_samples={counts[:3]}..., max_new_tokens={length})"
    try:
        out = generate_requests(prompts, num_samples=counts, max_new_tokens=length, seeds=seeds)
    except Exception as error:
        raise raised(what, error) from error
    if not isinstance(out, (list, tuple)) or len(out) != len(prompts):
        raise ImplementationError(f"{what} must return one tensor per request, got {type(out).__name__}")
    focus = torch.as_tensor(out[0])
    if tuple(focus.shape) != (counts[0], length) or focus.is_floating_point():
        raise ImplementationError(f"{what}: request 0 gave shape {tuple(focus.shape)} {focus.dtype}")
    focus = focus.long().cpu()
    if bool(((focus < 0) | (focus >= vocab_size)).any()):
        raise ImplementationError(f"{what}: request 0 has token ids outside [0, {vocab_size})")
    return focus


def _requests(prompt, neighbours, size: int, n: int, seed: int, focus_seed: int):
    prompts = [prompt] + [neighbours[j % len(neighbours)] for j in range(size - 1)]
    counts = [n] + [1] * (size - 1)
    seeds = [focus_seed] + [derive_seed(seed, size, j) if j % 2 == 0 else None for j in range(size - 1)]
    return prompts, counts, seeds


def composition_results(
    decoder,
    target,
    prompt: torch.Tensor,
    neighbours,
    *,
    vocab_size: int,
    num_samples: int,
    max_new_tokens: int,
    seed: int,
    alpha: float,
    scenario: str = "batch",
) -> tuple[list[TestResult], dict]:
    """The invariance tests of one focus prompt (module docstring): ``(results, summary)``.

    Raises ImplementationError when the decoder or the target misbehaves.
    """
    generate_requests = getattr(decoder, "generate_requests", None)
    if not callable(generate_requests):
        return [], {"batch_invariance": "not tested: the decoder has no generate_requests method"}
    V, L = vocab_size, max_new_tokens
    n = max(200, int(num_samples * SAMPLE_SHARE))
    results: list[TestResult] = []
    alone = None
    summary: dict = {"compositions": list(COMPOSITIONS), "focus_samples": n}
    for size in COMPOSITIONS:
        prompts, counts, seeds = _requests(prompt, neighbours, size, n, seed, derive_seed(seed, size))
        tokens = _call(generate_requests, prompts, counts, seeds, L, V)  # (n, L)
        expected = summed_conditionals(target, prompt, tokens, V).numpy()  # (L, V), in blocks of rows
        counts_np = np.stack([np.bincount(tokens[:, j].numpy(), minlength=V) for j in range(L)])  # (L, V)
        for j in range(L):
            where = f"abs={j + 1} batch={size}"
            for res in stats.gof_pair(counts_np[j], expected[j], alpha=alpha, position=where, scenario=scenario):
                results.append(res.replace(family="invariance", details={**res.details, "requests": size}))
            if alone is not None:
                res = stats.two_sample_test(
                    counts_np[j], alone[j], alpha=alpha, name="two_sample_vs_alone", family="invariance",
                    scenario=scenario, position=where,
                )  # fmt: skip
                results.append(res.replace(details={**res.details, "requests": size}))
        if alone is None:
            alone = counts_np
    if getattr(decoder, "per_request_seeds", False):
        results.append(_seeded(generate_requests, prompt, neighbours, L, V, seed, scenario))
    else:
        summary["seeded_tokens"] = "not tested: the decoder does not declare per_request_seeds"
    return results, summary


def _seeded(generate_requests, prompt, neighbours, L: int, V: int, seed: int, scenario: str) -> TestResult:
    """Exact: the fixed-seed focus request emits the same tokens in every composition."""
    fixed = derive_seed(seed, 7919)
    base = None
    differing = []
    for size in COMPOSITIONS:
        prompts, counts, seeds = _requests(prompt, neighbours, size, _SEEDED_ROWS, seed, fixed)
        tokens = _call(generate_requests, prompts, counts, seeds, L, V)
        if base is None:
            base = tokens
        elif not torch.equal(tokens, base):
            differing.append(size)
    ok = not differing
    return TestResult(
        statistic=float(len(differing)),
        pvalue=1.0 if ok else 0.0,
        name="seeded_tokens",
        family="invariance",
        method="a seeded request's tokens alone and among seeded and unseeded neighbours (exact equality)",
        n=_SEEDED_ROWS * L * len(COMPOSITIONS),
        scenario=scenario,
        position="all",
        details={"differs_in_batches_of": differing, "rows": _SEEDED_ROWS},
    )
