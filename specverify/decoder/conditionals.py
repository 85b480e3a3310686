"""Exact-conditional statistics of one decoder scenario (the target's conditionals are known).

Given N continuations (N, L) of one prompt and the target, the target's exact
processed conditional at every sampled prefix is computed by teacher forcing
(in chunks of rows), and these tests are built:

* ``gof`` per position j (``position="abs=j"``, 1-based): counts of the token at
  position j against the *sum over samples* of the exact conditionals at that
  position.  Under H0 the counts are a sum of independent multinomials (one per
  sample, each with its own conditional); testing them against the averaged law
  is valid and conservative (see :func:`specverify.stats.gof_test`, Notes).
* ``gof`` per prefix node (``position="node=..."``): a node is a distinct sampled
  prefix (prompt + the first d new tokens, d >= 1).  Nodes are chosen by their
  visit counts only (most visited first); given the visits, the next tokens of
  the visiting samples are i.i.d. from the node's fixed conditional, so the test
  is exact in law whatever the selection.
* ``directed``: the randomised PIT of every emitted token with tokens ordered by p
  (KS uniformity) and the entropy scores ``log p(x) + H(p)`` (martingale CLT) --
  each uses all N L tokens.
* ``support``: any emitted token whose exact conditional probability is 0 is a
  certain failure; the result names the tokens, rows and positions.
* ``independence``: the first new tokens of the N samples are i.i.d. from
  p(. | prompt); within-batch collision counts (consecutive batches of 64 rows)
  against the exact moments, two-sided;
* ``tail_mass`` (vocabularies of at least :data:`~specverify.stats.tails.LARGE_VOCAB` ids):
  every emitted token in the tail of its own exact conditional (beyond its
  :data:`~specverify.stats.tails.TAIL_HEAD` most probable ids) against the tails' exact
  masses (:func:`specverify.stats.set_mass_test`, Poisson-binomial): where large-vocabulary faults
  move mass (a float32 running sum that stalls in the tail, a silent top-k cut) and where the
  position and node bins pool too many ids to see it.
* ``dependence``: rows in pairs (adjacent, offsets 32..256, tile edges, first and last,
  random), the products of their tokens' centred mid-ranks at every position
  (:func:`specverify.stats.midrank_pair_test`).

References: Leviathan et al. (2023) and Chen et al. (2023) for the law to be
preserved; ``docs/design.md`` for bins, nodes and directed tests.

Shapes: N samples, L new tokens, V vocabulary, b rows of a chunk.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from specverify import stats
from specverify.core.results import TestResult
from specverify.core.seeds import derive_seed
from specverify.stats.tails import LARGE_VOCAB, TAIL_HEAD, emitted_in_tail, informative

from .protocol import conditional_blocks

__all__ = ["ExactPlan", "ExactAnalysis", "analyse_exact", "prefix_ids"]

#: Batch size of the collision test on the first new tokens.
COLLISION_BATCH = 64
#: A pair class of the dependence family needs at least this many token pairs.
MIN_PAIR_TOKENS = 20


@dataclass(frozen=True)
class ExactPlan:
    """Knobs of the exact analysis: node selection and the level for detectable-TV statements."""

    max_nodes: int = 8
    min_node_visits: int = 200
    alpha: float = 1e-3


@dataclass
class ExactAnalysis:
    """What :func:`analyse_exact` found: the tests, whether every conditional was one-hot, summaries."""

    results: list[TestResult] = field(default_factory=list)
    all_one_hot: bool = True
    prompt_probs: np.ndarray | None = None  # (V,) exact conditional after the prompt
    summary: dict = field(default_factory=dict)


def prefix_ids(tokens: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Node ids (N, L): entry [n, d] identifies the prefix made of the first d new tokens of row n.

    Ids are dense per depth (0 .. nodes at depth d - 1); depth 0 is the prompt (id 0).
    """
    N, L = tokens.shape
    ids = torch.zeros(N, L, dtype=torch.long)  # (N, L)
    for d in range(1, L):
        key = ids[:, d - 1] * vocab_size + tokens[:, d - 1]  # (N,) < N * V
        ids[:, d] = torch.unique(key, return_inverse=True)[1]
    return ids


def _candidate_nodes(ids: torch.Tensor, plan: ExactPlan) -> list[tuple[int, int, int, int]]:
    """(visits, depth, node id, first visiting row) of nodes at depth >= 1 with enough visits, most visited first."""
    N, L = ids.shape
    found = []
    for d in range(1, L):
        visits = torch.bincount(ids[:, d])  # (nodes at depth d,)
        for node in (visits >= plan.min_node_visits).nonzero().flatten().tolist():
            found.append((int(visits[node]), d, node))
    found.sort(key=lambda x: (-x[0], x[1], x[2]))
    found = found[: 4 * plan.max_nodes]
    out = []
    for visits, d, node in found:
        first = int((ids[:, d] == node).nonzero()[0])
        out.append((visits, d, node, first))
    return out


def analyse_exact(
    target,
    prompt: torch.Tensor,
    tokens: torch.Tensor,
    vocab_size: int,
    *,
    scenario: str,
    plan: ExactPlan,
    pit_seed: int,
) -> ExactAnalysis:
    """All exact-conditional tests of one scenario (see the module docstring); results are ungraded.

    Raises ImplementationError (from the target) if the target misbehaves.
    """
    N, L = tokens.shape
    V = vocab_size
    labels = dict(scenario=scenario)
    ids = prefix_ids(tokens, V)  # (N, L)
    candidates = _candidate_nodes(ids, plan)
    wanted = {first_row: [] for *_, first_row in candidates}
    for i, (_, d, _, first_row) in enumerate(candidates):
        wanted[first_row].append((i, d))
    node_rows: dict[int, torch.Tensor] = {}

    expected = torch.zeros(L, V, dtype=torch.float64)  # (L, V) sum of exact conditionals per position
    pit_values, scores, variances = [], [], []
    mids, mid_vars = [], []  # (b, L) per chunk: each token's centred mid-rank and its variance
    score_bound = 0.0
    tail_flags, tail_masses = [], []  # per chunk (b L,): each token in its law's tail, the tail's mass
    bad_rows, bad_pos, bad_tok = [], [], []
    all_one_hot = True
    prompt_probs = None
    pit_generator = torch.Generator().manual_seed(pit_seed)
    for s, cond in conditional_blocks(target, prompt, tokens, V):  # cond (b, L, V)
        b = cond.shape[0]
        chunk = tokens[s : s + b]  # (b, L)
        if prompt_probs is None:
            prompt_probs = cond[0, 0].numpy().copy()
        expected += cond.sum(0)
        emitted_probs = cond.gather(-1, chunk[..., None]).squeeze(-1)  # (b, L)
        zero = emitted_probs <= 0  # (b, L)
        if bool(zero.any()):
            r, c = zero.nonzero(as_tuple=True)
            bad_rows += (r + s).tolist()
            bad_pos += (c + 1).tolist()
            bad_tok += chunk[r, c].tolist()
        all_one_hot = all_one_hot and bool(((cond > 0).sum(-1) == 1).all())
        flat = cond.reshape(b * L, V)  # (b L, V)
        flat_tokens = chunk.reshape(b * L)  # (b L,)
        pit_values.append(stats.randomised_pit(flat, flat_tokens, generator=pit_generator, order="p"))
        law = cond.numpy()  # (b, L, V)
        mid = stats.mid_distribution(law)  # (b, L, V)
        mids.append(np.take_along_axis(mid, chunk.numpy()[..., None], -1)[..., 0])  # (b, L)
        mid_vars.append((law * mid * mid).sum(-1))  # (b, L)
        if V >= LARGE_VOCAB:
            in_tail, tail_mass = emitted_in_tail(flat, flat_tokens)
            tail_flags.append(in_tail.numpy())
            tail_masses.append(tail_mass.numpy())
        sc, var, chunk_bound = stats.entropy_scores(flat, flat_tokens)
        score_bound = max(score_bound, chunk_bound)
        scores.append(np.asarray(sc, dtype=np.float64))
        variances.append(np.asarray(var, dtype=np.float64))
        for row, entries in wanted.items():
            if s <= row < s + b:
                for i, d in entries:
                    node_rows[i] = cond[row - s, d].clone()

    out = ExactAnalysis(all_one_hot=all_one_hot, prompt_probs=prompt_probs)
    res = out.results
    tokens_np = tokens.numpy()
    # ---- per position
    for j in range(L):
        counts = np.bincount(tokens_np[:, j], minlength=V)
        res += stats.gof_pair(counts, expected[j].numpy(), alpha=plan.alpha, position=f"abs={j + 1}", **labels)
    # ---- per prefix node
    used = 0
    for i, (visits, d, node, first_row) in enumerate(candidates):
        if used >= plan.max_nodes:
            break
        row = node_rows[i]
        if int((row > 0).sum()) < 2:
            continue  # a one-hot node: the gof has no power (support covers it)
        visitors = (ids[:, d] == node).numpy()
        counts = np.bincount(tokens_np[visitors, d], minlength=V)
        prefix = tokens_np[first_row, :d].tolist()
        pair = stats.gof_pair(
            counts, row.numpy(), alpha=plan.alpha, position=f"node=d{d}:{','.join(map(str, prefix))}", **labels
        )
        node = {"node_prefix": prefix, "node_depth": d, "visits": visits}
        res += [result.replace(details={**result.details, **node}) for result in pair]
        used += 1
    # ---- directed, every token
    pit = stats.pit_test(np.concatenate(pit_values), alpha=plan.alpha, name="pit_p", position="all", **labels)
    res.append(pit.replace(details={**pit.details, "seed": pit_seed}))
    res.append(
        stats.score_test(
            np.concatenate(scores),
            np.concatenate(variances),
            alpha=plan.alpha,
            name="entropy_score",
            position="all",
            bound=score_bound,
            **labels,
        )
    )
    # ---- the tails' mass, every token (large vocabularies)
    if tail_masses and informative(np.concatenate(tail_masses)):
        label = f"the tail beyond each law's top {TAIL_HEAD:,} ids"
        res.append(stats.set_mass_test(np.concatenate(tail_flags), np.concatenate(tail_masses), label=label,
                                       alpha=plan.alpha, name="tail_mass", position="all", **labels))  # fmt: skip
    # ---- support, every token
    res.append(_support_result(bad_rows, bad_pos, bad_tok, N * L, scenario))
    # ---- independence of the first new tokens
    n_batches = N // COLLISION_BATCH
    if n_batches >= 1 and prompt_probs is not None:
        first = tokens_np[: n_batches * COLLISION_BATCH, 0].reshape(n_batches, COLLISION_BATCH)  # (n_batches, 64)
        res.append(stats.collision_test(first, prompt_probs, alpha=plan.alpha, position="abs=1", **labels))
    res += _row_pair_results(np.concatenate(mids), np.concatenate(mid_vars), plan, scenario, pit_seed)
    out.summary = {"nodes_tested": used, "node_candidates": len(candidates), "support_violations": len(bad_rows)}
    return out


def _row_pair_results(mids: np.ndarray, mid_vars: np.ndarray, plan, scenario: str, seed: int) -> list[TestResult]:
    """The ``dependence`` family: rows of the generate call in pairs, every position, mid-rank products.

    Rows of one call may share a batch inside the decoder; under H0 they are independent,
    so the products of their tokens' centred mid-ranks at each position are martingale
    differences (:func:`specverify.stats.midrank_pair_test`).  Pair classes:
    :func:`specverify.stats.call_pairs` on the N rows (the decoder's own batching is unknown,
    so row offsets stand for batch slots).
    """
    N, L = mids.shape
    out = []
    gen = torch.Generator().manual_seed(derive_seed(seed, 1))
    for name, (ra, rb) in stats.call_pairs(N, generator=gen).items():
        if ra.size * L < MIN_PAIR_TOKENS:
            continue
        out.append(
            stats.midrank_pair_test(
                mids[ra].ravel(),
                mid_vars[ra].ravel(),
                mids[rb].ravel(),
                mid_vars[rb].ravel(),
                alpha=plan.alpha,
                name=f"pairs_{name}",
                scenario=scenario,
                position="every position",
            )  # fmt: skip
        )
    return out


def _support_result(rows: list, positions: list, toks: list, n: int, scenario: str) -> TestResult:
    """Exact support check over every emitted token (its own conditional, not a pooled law)."""
    hits = len(rows)
    distinct = sorted(set(toks))
    details = {
        "tokens": distinct[:100],
        "counts": [toks.count(t) for t in distinct[:100]],
        "rows": rows[:20],
        "positions": positions[:20],
        "examples": [{"row": r, "position": p, "token": t} for r, p, t in zip(rows[:10], positions[:10], toks[:10])],
    }
    method = (
        "support: emitted tokens whose exact conditional probability at their own prefix is 0 "
        "(exact; any is a certain failure)"
    )
    return TestResult(
        statistic=float(hits),
        pvalue=0.0 if hits else 1.0,
        name="support",
        family="support",
        method=method,
        n=n,
        scenario=scenario,
        position="all",
        details=details,
    )
