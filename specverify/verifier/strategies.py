"""Hypothesis strategies: probability rows, table targets and drafters, verifier scenarios.

Distributions deliberately include the corners that break kernels: exact zeros
(truncated supports), point masses (temperature 0 / deterministic drafters),
near-degenerate values (1e-12 next to 1), ties, and a vocabulary of 1 or 2.
Strategies take values or strategies for their sizes, hypothesis-style; random
choices are drawn by hypothesis itself, so failures shrink and replay.

Use :func:`table_models` for a (target, drafter) pair and
:func:`scenario_configs` for a single-scenario ``check_verifier``-style run
(see ``tests/test_harness.py``).
"""

from __future__ import annotations

import hypothesis.strategies as st
import torch

from specverify.core.tables import MarkovTable, PositionalCategorical, TableModel
from specverify.verifier import zoo

__all__ = ["prob_rows", "prob_vectors", "targets", "drafters_for", "table_models"]

_SPECIAL = (0.0, 0.0, 1e-12, 1e-6, 0.5, 1.0, 1.0, 1e6)


def _as_strategy(value):
    return value if isinstance(value, st.SearchStrategy) else st.just(value)


@st.composite
def prob_vectors(draw, vocab_size=st.integers(1, 12)) -> torch.Tensor:
    """One float64 probability vector (V,): zeros, point masses, near-degenerate weights, ties."""
    V = draw(_as_strategy(vocab_size))
    shape = draw(st.sampled_from(["weights", "point", "uniform", "tie"]))
    if shape == "point":
        return torch.nn.functional.one_hot(torch.tensor(draw(st.integers(0, V - 1))), V).to(torch.float64)
    if shape == "uniform":
        return torch.full((V,), 1.0 / V, dtype=torch.float64)
    weights = draw(st.lists(st.one_of(st.sampled_from(_SPECIAL), st.floats(0.0, 1.0)), min_size=V, max_size=V))
    w = torch.tensor(weights, dtype=torch.float64)
    if shape == "tie" and V >= 2:
        w[1] = w[0] = max(float(w.max()), 1.0)
    if not w.sum() > 0:
        w[draw(st.integers(0, V - 1))] = 1.0
    return w / w.sum()


@st.composite
def prob_rows(draw, num_rows=st.integers(1, 4), vocab_size=st.integers(1, 12)) -> torch.Tensor:
    """``(num_rows, V)`` float64 rows from :func:`prob_vectors`."""
    n = draw(_as_strategy(num_rows))
    V = draw(_as_strategy(vocab_size))
    return torch.stack([draw(prob_vectors(st.just(V))) for _ in range(n)])


@st.composite
def targets(draw, vocab_size=st.integers(2, 8), kinds=("positional", "markov")) -> TableModel:
    """A table target: positional (1..4 rows) or first-order Markov, rows from :func:`prob_rows`."""
    V = draw(_as_strategy(vocab_size))
    kind = draw(st.sampled_from(kinds))
    if kind == "positional":
        return PositionalCategorical(draw(prob_rows(st.integers(1, 4), st.just(V))), name="hyp-positional")
    return MarkovTable.from_table(draw(prob_rows(st.just(V + 1), st.just(V))), name="hyp-markov")


@st.composite
def drafters_for(draw, target: TableModel) -> TableModel:
    """A drafter for ``target``: a zoo member or arbitrary rows with the target's contexts."""
    choice = draw(st.sampled_from(["arbitrary", "arbitrary", *sorted(zoo.ZOO)]))
    if choice == "arbitrary":
        rows = draw(prob_rows(st.just(target.num_contexts), st.just(target.vocab_size)))
        return target.with_table(rows, name="hyp-drafter")
    options = {"seed": draw(st.integers(0, 2**16))} if choice in ("noisy", "argmax") else {}
    return zoo.make_drafter(choice, target, **options)


@st.composite
def table_models(draw, vocab_size=st.integers(2, 8)):
    """``(target, drafter)`` pair of table models over the same vocabulary."""
    target = draw(targets(vocab_size))
    return target, draw(drafters_for(target))
