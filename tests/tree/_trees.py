"""Hypothesis strategies and fixed examples for the tree tests.

``tree_shapes`` draws parent arrays (topological, siblings in index order, padding
anywhere); ``table_pairs`` draws a (target, drafter) pair of Markov tables whose rows are
adversarial per context (``_strategies.pq_pairs``: q on p's zeros, point masses, equal
rows, disjoint supports ...).
"""

from __future__ import annotations

import numpy as np
import torch
from _strategies import normalise, pq_pairs, weight_rows
from hypothesis import strategies as st

from specverify.core.tables import MarkovTable
from specverify.protocols.tree import PAD, ROOT

__all__ = ["tree_shapes", "table_pairs", "fixed_rows", "batch_of", "FIXED_TREES"]


@st.composite
def tree_shapes(draw, *, min_nodes: int = 0, max_nodes: int = 7, padding: bool = True):
    """A parent array (N,) long: each real node under the root or an earlier real node; some PAD."""
    N = draw(st.integers(min_nodes, max_nodes))
    parents = []
    for n in range(N):
        if padding and draw(st.integers(0, 4)) == 0:
            parents.append(PAD)
            continue
        parents.append(draw(st.sampled_from([ROOT] + [j for j in range(n) if parents[j] != PAD])))
    return torch.tensor(parents, dtype=torch.long)


@st.composite
def table_pairs(draw, V: int):
    """``(target, drafter)`` MarkovTables over V tokens, rows paired adversarially per context."""
    target_rows, draft_rows = [], []
    for _ in range(V + 1):
        p, q = draw(pq_pairs(V))
        target_rows.append(p)
        draft_rows.append(q)
    return MarkovTable.from_table(torch.stack(target_rows)), MarkovTable.from_table(torch.stack(draft_rows))


@st.composite
def prob_tables(draw, rows: int, V: int):
    """(rows, V) float64 probability rows (adversarial values included)."""
    return torch.stack([normalise(draw(weight_rows(V))) for _ in range(rows)])


def fixed_rows(rows: int, V: int, *, seed: int, zeros: float = 0.2) -> torch.Tensor:
    """Seeded (rows, V) float64 probability rows with some exact zeros."""
    rng = np.random.default_rng(seed)
    w = rng.random((rows, V)) ** 2 * (rng.random((rows, V)) >= zeros)
    w[np.arange(rows), rng.integers(V, size=rows)] += 0.05
    return torch.as_tensor(w / w.sum(-1, keepdims=True))


def batch_of(B: int, *trees):
    """Stack per-tree (target (N+1, V), draft (N+1, V) | None, tokens (N,), parents (N,)) cycling over B rows."""
    index = torch.arange(B) % len(trees)
    target = torch.stack([t[0] for t in trees])[index]
    draft = None if trees[0][1] is None else torch.stack([t[1] for t in trees])[index]
    tokens = torch.stack([t[2] for t in trees])[index]
    parents = torch.stack([t[3] for t in trees])[index]
    return target, draft, tokens, parents, index


#: Small fixed trees (parents) with padding in different places; N = 6.
FIXED_TREES = [
    torch.tensor([-1, -1, 0, 0, 1, -2]),  # two children at the root, three below
    torch.tensor([-1, -2, -1, 0, 2, 3]),  # padding in the middle, depth 3
    torch.tensor([-1, -1, -1, 2, 2, -2]),  # wide and shallow
]
