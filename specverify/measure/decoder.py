"""Measure how far a whole (lossy) decoder's output is from the target, per absolute position.

The decoder counterpart of :func:`specverify.measure.chain.measure_divergence`: the
decoder draws independent continuations of one prompt through the decoder protocol
(:func:`specverify.decoder.protocol.call_generate`, validated), the target's (and the
drafter's) exact teacher-forced conditionals come from
:func:`specverify.decoder.protocol.target_conditionals`, and every absolute position is
one stratum of :func:`specverify.stats.divergence.divergence` whose contexts are the
distinct generated prefixes before it.  The result is a
:class:`specverify.measure.chain.MeasureResult` with ``by_position`` only.

Positions are labelled from 1 (``abs=1`` is the first new token), as the decoder battery
(:mod:`specverify.decoder.conditionals`) labels its per-position tests and as ``positions``
selects them; the chain and tree measurements label from 0, as the verifier battery does.
Each stratum's sample split is drawn from
:func:`specverify.measure.chain.split_generator` ``(seed, name, stratum)``.

Memory: the laws of one position's contexts at a time, O(C V) (the estimator of
:func:`specverify.stats.divergence.divergence` reads every context's whole law); never the
(N, L, V) conditionals of every sample.

Shapes: N samples, T prompt tokens, L new tokens, V vocabulary, C contexts.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from specverify.core.errors import InvalidArgument
from specverify.core.results import TestResult
from specverify.core.validation import check_int
from specverify.decoder.conditionals import prefix_ids
from specverify.decoder.protocol import (
    block_rows,
    call_generate,
    generate_fn,
    next_token_probs,
    normalise_prompts,
    target_conditionals,
    vocab_size_of,
)
from specverify.measure.chain import MeasureResult, StratumDivergence, split_generator
from specverify.stats.budget import grade_run
from specverify.stats.divergence import divergence
from specverify.stats.gof import support_test
from specverify.stats.sparse import gof_pair

__all__ = ["measure_decoder_divergence"]


def context_rows(model, sequences: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """The law of each sequence's last token given the tokens before it: (C, V) float64.

    Teacher-forced one position at a time (``start = S - 1``) in blocks of rows, so that
    only the rows the estimate reads exist: memory O(C V), not O(N L V).
    """
    C, S = sequences.shape
    out = torch.empty(C, vocab_size, dtype=torch.float64)  # (C, V)
    step = block_rows(1, vocab_size)
    for s in range(0, C, step):
        out[s : s + step] = target_conditionals(model, sequences[s : s + step], S - 1, vocab_size)[:, 0]
    return out


def measure_decoder_divergence(
    decoder,
    target,
    *,
    prompt: torch.Tensor,
    num_samples: int,
    max_new_tokens: int,
    seed: int = 0,
    level: float = 0.95,
    draft=None,
    declared_law: Callable | None = None,
    alpha: float = 1e-3,
    name: str = "decoder",
    positions=None,
) -> MeasureResult:
    """Distance of a whole decoder's output from the target, per absolute position.

    ``decoder.generate(prompt, num_samples=, max_new_tokens=, seed=)`` draws independent
    continuations; ``target.conditionals(sequences (N, T+L), start=T) -> (N, L, V)`` (and
    ``draft``'s, when given) are the exact teacher-forced laws.  Position t is one
    stratum; its contexts are the distinct generated prefixes before it.  Rounds are not
    observable from a decoder's output, so there are no in-block strata and no tokens
    per pass; ``declared_law(target_rows, draft_rows)`` must be the law at *every*
    measured position (e.g. the ensemble law ``w p + (1 - w) q`` at positions 1..K,
    which are draft positions of some round whatever was accepted before -- provided
    ``max_new_tokens >= K + 1``: HF caps a round's drafts at the tokens left minus one, so
    the last position can be a capped round's bonus).

    ``positions`` (1-based absolute positions, default all) selects the strata.

    Returns
    -------
    MeasureResult
        ``by_position`` only; ``k`` is ``decoder.k`` when it has one, else 0.
    """
    num_samples = check_int("num_samples", num_samples, minimum=2)
    max_new_tokens = check_int("max_new_tokens", max_new_tokens, minimum=1)
    seed = check_int("seed", seed, minimum=0)
    if declared_law is not None and (draft is None or not callable(declared_law)):
        raise InvalidArgument(f"declared_law needs a callable and a draft model, got {declared_law!r}, draft={draft!r}")
    V = vocab_size_of(decoder, target)
    (prompt,) = normalise_prompts(prompt, V)  # (T,)
    V = V or int(next_token_probs(target, prompt[None]).shape[-1])
    samples = call_generate(
        generate_fn(decoder), prompt, num_samples=num_samples, max_new_tokens=max_new_tokens, seed=seed, vocab_size=V
    )  # (N, L) validated
    sequences = torch.cat([prompt[None].expand(num_samples, -1), samples], 1)  # (N, T+L)
    T = prompt.shape[0]
    if positions is None:
        positions = range(1, max_new_tokens + 1)
    positions = [check_int("positions", t, minimum=1, maximum=max_new_tokens) for t in positions]
    conformance: list[TestResult] = []
    by_position = []
    all_ids = prefix_ids(samples, V)  # (N, L) the prefix before each position
    for t in (t - 1 for t in positions):
        ids = all_ids[:, t]  # (N,)
        first = torch.zeros(int(ids.max()) + 1, dtype=torch.long).scatter_(
            0, ids.flip(0), torch.arange(num_samples).flip(0)
        )
        # one row per context (the first sample holding it), teacher-forced at position t alone
        p_rows = context_rows(target, sequences[first, : T + t + 1], V)  # (C, V)
        tokens = samples[:, t].numpy()  # (N,)
        position = f"abs={t + 1}"
        estimate = divergence(
            tokens, p_rows.numpy(), contexts=ids.numpy(), level=level, generator=split_generator(seed, name, position)
        )
        declared_tv = None
        if declared_law is not None and draft is not None:
            q_rows = context_rows(draft, sequences[first, : T + t + 1], V)  # (C, V)
            law = torch.as_tensor(declared_law(p_rows, q_rows), dtype=torch.float64)  # (C, V)
            law = law / law.sum(-1, keepdim=True)
            weights = torch.bincount(ids, minlength=law.shape[0]).to(torch.float64)  # (C,)
            declared_tv = float((weights * 0.5 * (law - p_rows).abs().sum(-1)).sum() / num_samples)
            counts = np.bincount(tokens, minlength=p_rows.shape[1])  # (V,)
            expected = (weights[:, None] * law).sum(0).numpy()  # (V,)
            conformance += gof_pair(counts, expected, scenario=name, position=position, name="declared_gof")
            conformance.append(
                support_test(counts, expected, scenario=name, position=position, name="declared_support")
            )
        by_position.append(StratumDivergence(position, estimate, declared_tv))
    graded, verdict = grade_run(conformance, [], alpha=alpha) if conformance else ((), None)
    nan = float("nan")
    return MeasureResult(
        scenario=name,
        k=int(getattr(decoder, "k", 0) or 0),
        tier="decoder",
        seed=seed,
        level=level,
        by_block=(),
        by_position=tuple(by_position),
        acceptance_by_block=(),
        mean_accepted=nan,
        tokens_per_pass=nan,
        num_calls=num_samples,
        row_calls=num_samples,
        num_tokens=int(samples.numel()),
        seconds=nan,
        conformance=tuple(graded),
        conformance_verdict=verdict,
    )
