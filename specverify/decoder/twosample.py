"""Two-sample statistics of one decoder scenario against a reference decoder (black-box target).

When the target's conditionals are not available, the decoder under test is
compared with a reference decoder (e.g. direct autoregressive sampling of the
same target) that draws m >= 4 n samples from the same prompt:

* ``two_sample`` per position j (``position="abs=j"``): the token at position j of
  each continuation is, under H0, i.i.d. from the same marginal law in both samples;
* ``two_sample`` on the pair of the first two new tokens (``position="pair=1,2"``),
  a V^2-category law that sees context-dependent errors at position 2;
* ``two_sample`` per prefix node (``position="node=..."``): nodes (distinct prefixes,
  depth >= 1) are chosen by the decoder's visit counts only; given the visits, the
  next tokens in both samples are i.i.d. from the node's conditional.

All use :func:`specverify.stats.two_sample_test` (Cressie-Read on bins fixed from
the pooled, label-free counts); the detectable TV is governed by n m / (n + m).

Shapes: N decoder samples, M reference samples, L new tokens, V vocabulary.
"""

from __future__ import annotations

import numpy as np
import torch

from specverify import stats
from specverify.core.results import TestResult

from .conditionals import ExactPlan, prefix_ids

__all__ = ["analyse_two_sample", "MAX_PAIR_CATEGORIES"]

#: The pair test is skipped when V^2 exceeds this (the counts would be too sparse to bin usefully).
MAX_PAIR_CATEGORIES = 1 << 20


def analyse_two_sample(
    tokens: torch.Tensor, reference_tokens: torch.Tensor, vocab_size: int, *, scenario: str, plan: ExactPlan
) -> list[TestResult]:
    """Two-sample tests of ``tokens`` (N, L) against ``reference_tokens`` (M, L); results are ungraded."""
    N, L = tokens.shape
    V = vocab_size
    labels = dict(scenario=scenario, alpha=plan.alpha)
    a, b = tokens.numpy(), reference_tokens.numpy()
    out = []
    for j in range(L):
        out.append(
            stats.two_sample_test(
                np.bincount(a[:, j], minlength=V), np.bincount(b[:, j], minlength=V), position=f"abs={j + 1}", **labels
            )
        )
    if L >= 2 and V * V <= MAX_PAIR_CATEGORIES:
        pair_a = np.bincount(a[:, 0] * V + a[:, 1], minlength=V * V)
        pair_b = np.bincount(b[:, 0] * V + b[:, 1], minlength=V * V)
        out.append(stats.two_sample_test(pair_a, pair_b, name="two_sample_pair", position="pair=1,2", **labels))
    # ---- nodes: ids over both samples so that a prefix has one id; chosen by the decoder's visits
    ids = prefix_ids(torch.cat([tokens, reference_tokens]), V)  # (N + M, L)
    ids_a, ids_b = ids[:N].numpy(), ids[N:].numpy()
    found = []
    for d in range(1, L):
        visits = np.bincount(ids_a[:, d])
        for node in np.flatnonzero(visits >= plan.min_node_visits).tolist():
            found.append((int(visits[node]), d, node))
    found.sort(key=lambda x: (-x[0], x[1], x[2]))
    for visits, d, node in found[: plan.max_nodes]:
        in_a, in_b = ids_a[:, d] == node, ids_b[:, d] == node
        first = int(np.flatnonzero(in_a)[0])
        prefix = a[first, :d].tolist()
        result = stats.two_sample_test(
            np.bincount(a[in_a, d], minlength=V),
            np.bincount(b[in_b, d], minlength=V),
            position=f"node=d{d}:{','.join(map(str, prefix))}",
            **labels,
        )
        out.append(
            result.replace(
                details={
                    **result.details,
                    "node_prefix": prefix,
                    "node_depth": d,
                    "visits": visits,
                    "reference_visits": int(in_b.sum()),
                }
            )
        )
    return out
