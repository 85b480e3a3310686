"""Table models: context ids, exact conditionals and marginals, the target/drafter protocols."""

from __future__ import annotations

import itertools

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from specverify.core import tables
from specverify.core.errors import InvalidArgument
from specverify.verifier.strategies import prob_rows, targets


def _brute_marginals(model, L):
    """Law of the token at each position by enumerating every prefix (tiny V, L)."""
    V = model.vocab_size
    out = torch.zeros(L, V, dtype=torch.float64)
    for t in range(L):
        for prefix in itertools.product(range(V), repeat=t):
            x = torch.tensor([prefix], dtype=torch.long).reshape(1, t)
            prob = 1.0
            for s in range(t):
                prob *= float(model.probs_at(x, torch.tensor([s]))[0, prefix[s]])
            if prob:
                out[t] += prob * model.probs_at(x, torch.tensor([t]))[0]
    return out


@pytest.mark.parametrize(
    "build",
    [
        lambda: tables.positional(3, 4, seed=0),
        lambda: tables.markov(3, seed=1),
        lambda: tables.ngram(2, 3, seed=2),
    ],
)
def test_marginals_match_enumeration(build):
    model = build()
    torch.testing.assert_close(model.token_marginals(4), _brute_marginals(model, 4), rtol=0, atol=1e-12)


def test_context_ids_incremental_equals_batch():
    gen = torch.Generator().manual_seed(0)
    for model in (tables.positional(5, 3, seed=0), tables.markov(5, seed=0), tables.ngram(4, 3, seed=0)):
        tokens = torch.randint(model.vocab_size, (6, 7), generator=gen)
        ctx = torch.full((6,), model.initial_context)
        for t in range(8):
            lengths = torch.full((6,), t)
            assert torch.equal(model.context_ids(tokens, lengths), ctx), (model, t)
            assert torch.equal(TableModelFold.context_ids(model, tokens, lengths), ctx)
            if t < 7:
                ctx = model.next_context(ctx, tokens[:, t])


class TableModelFold:
    """The base class' generic fold (subclasses override context_ids with closed forms)."""

    context_ids = tables.TableModel.context_ids


def test_markov_rows_and_protocols():
    initial = torch.tensor([0.2, 0.8], dtype=torch.float64)
    transition = torch.tensor([[0.9, 0.1], [0.3, 0.7]], dtype=torch.float64)
    m = tables.MarkovTable(initial, transition)
    prefix = torch.tensor([[1, 0], [0, 1]])
    torch.testing.assert_close(m.next_token_probs(prefix), transition[[0, 1]])
    torch.testing.assert_close(m.next_token_probs(prefix[:, :0]), initial.expand(2, 2))
    gen = torch.Generator().manual_seed(0)
    tokens, probs = m.draft(prefix, 3, generator=gen)
    assert tokens.shape == (2, 3) and probs.shape == (2, 3, 2)
    torch.testing.assert_close(probs[:, 0], transition[[0, 1]])
    torch.testing.assert_close(probs[:, 1], transition[tokens[:, 0]])


def test_positional_rows_differ_and_repeat():
    m = tables.positional(8, 3, seed=0)
    x = torch.zeros(1, 10, dtype=torch.long)
    rows = [m.probs_at(x, torch.tensor([t]))[0] for t in range(5)]
    assert not torch.equal(rows[0], rows[1]) and not torch.equal(rows[1], rows[2])
    assert torch.equal(rows[2], rows[3]) and torch.equal(rows[3], rows[4])


def test_draft_is_exact_law():
    m = tables.positional(4, 2, seed=3)
    gen = torch.Generator().manual_seed(1)
    tokens, _ = m.draft(torch.zeros(200_000, 0, dtype=torch.long), 2, generator=gen)
    freq = torch.bincount(tokens[:, 1], minlength=4).double() / 200_000
    assert (freq - m.table[1]).abs().max() < 0.006  # ~6 sigma at N = 2e5


@pytest.mark.parametrize("kind", tables.ROW_KINDS)
def test_make_rows_kinds(kind):
    rows = tables.make_rows(5, 16, kind, generator=torch.Generator().manual_seed(0))
    assert rows.shape == (5, 16) and rows.dtype == torch.float64
    torch.testing.assert_close(rows.sum(-1), torch.ones(5, dtype=torch.float64))
    assert (rows >= 0).all()
    if kind == "onehot":
        assert ((rows == 1).sum(-1) == 1).all()
    if kind in ("topk", "topp"):
        assert (rows == 0).any()


def test_bad_arguments():
    with pytest.raises(InvalidArgument, match="table"):
        tables.PositionalCategorical(torch.tensor([[0.5, 0.6]]))
    with pytest.raises(InvalidArgument, match="table"):
        tables.NGramTable(torch.full((4, 2), 0.5), order=3)
    with pytest.raises(InvalidArgument, match="kind"):
        tables.make_rows(1, 2, "nope", generator=torch.Generator())
    m = tables.markov(3, seed=0)
    with pytest.raises(InvalidArgument, match="tokens"):
        m.context_ids(torch.tensor([[5]]), torch.tensor([1]))
    with pytest.raises(InvalidArgument, match="lengths"):
        m.context_ids(torch.tensor([[0]]), torch.tensor([2]))
    with pytest.raises(InvalidArgument, match="generator"):
        m.draft(torch.zeros(1, 1, dtype=torch.long), 2, generator=None)


@settings(max_examples=30, deadline=None)
@given(model=targets(st.integers(1, 5)))
def test_marginals_are_distributions(model):
    marg = model.token_marginals(4)
    torch.testing.assert_close(marg.sum(-1), torch.ones(4, dtype=torch.float64))
    assert (marg >= 0).all()
    # zero-probability tokens of the first row stay impossible at position 0
    assert torch.equal(marg[0] == 0, model.table[model.initial_context] == 0)


@settings(max_examples=30, deadline=None)
@given(rows=prob_rows(st.integers(1, 3), st.integers(1, 6)))
def test_prob_rows_are_valid(rows):
    assert torch.isfinite(rows).all() and (rows >= 0).all()
    torch.testing.assert_close(rows.sum(-1), torch.ones(rows.shape[0], dtype=torch.float64))
