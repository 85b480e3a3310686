"""The drafter zoo: honest q with the intended shape for every target kind."""

from __future__ import annotations

import pytest
import torch

from specverify.core import tables
from specverify.core.errors import InvalidArgument
from specverify.verifier import zoo

TARGETS = {
    "positional": lambda: tables.positional(6, 3, "topk", seed=0, top_k=3),
    "markov": lambda: tables.markov(5, seed=1),
    "ngram": lambda: tables.ngram(3, 3, seed=2),
}


@pytest.mark.parametrize("tname", sorted(TARGETS))
@pytest.mark.parametrize("dname", sorted(zoo.ZOO))
def test_zoo_rows_are_distributions(tname, dname):
    target = TARGETS[tname]()
    d = zoo.make_drafter(dname, target)
    assert d.vocab_size == target.vocab_size
    torch.testing.assert_close(d.table.sum(-1), torch.ones(d.num_contexts, dtype=torch.float64))
    assert (d.table >= 0).all()
    gen = torch.Generator().manual_seed(0)
    prefix = torch.randint(target.vocab_size, (4, 3), generator=gen)
    tokens, probs = d.draft(prefix, 3, generator=gen)
    assert tokens.shape == (4, 3) and probs.shape == (4, 3, target.vocab_size)
    assert (probs.gather(-1, tokens[..., None]) > 0).all()  # drawn tokens have positive reported probability


def test_shaped_drafters_put_their_mass_where_the_layout_says():
    """padding_leak: exactly ``mass`` on the ids past ``real_vocab``, spread evenly; hot_set: support
    exactly the hot ids, the target's tempered rows renormalised there.  Neither has a default
    layout, so neither is in ZOO (whose factories take the target alone)."""
    target = tables.positional(64, 3, "lm", seed=0, real_vocab=56, hot=16)
    leak = zoo.make_drafter("padding_leak", target, real_vocab=56, mass=0.05).table
    torch.testing.assert_close(leak[:, 56:].sum(-1), torch.full((3,), 0.05, dtype=torch.float64))
    torch.testing.assert_close(leak[:, 56:], torch.full((3, 8), 0.05 / 8, dtype=torch.float64))
    assert (target.table[:, 56:] == 0).all()
    hot = zoo.make_drafter("hot_set", target, size=16).table
    support = torch.zeros(64, dtype=torch.bool)
    support[tables.hot_ids(64, 16)] = True
    assert ((hot > 0) == (support & (target.table > 0))).all()
    tempered = zoo.temperature(target, 1.3).table.masked_fill(~support, 0.0)
    torch.testing.assert_close(hot, tempered / tempered.sum(-1, keepdim=True))
    assert set(zoo.SHAPED).isdisjoint(zoo.ZOO)
    with pytest.raises(InvalidArgument, match="size"):
        zoo.make_drafter("hot_set", target)  # no default layout
    with pytest.raises(InvalidArgument, match="real_vocab"):
        zoo.make_drafter("padding_leak", target, real_vocab=64)


def test_shapes_of_q():
    target = TARGETS["positional"]()
    p = target.table
    assert torch.equal(zoo.oracle(target).table, p)
    ll = zoo.least_likely(target).table
    assert ((ll == 1).sum(-1) == 1).all()
    masked = torch.where(p > 0, p, torch.full_like(p, 2.0))
    assert torch.equal(ll.argmax(-1), masked.argmin(-1))
    dj = zoo.disjoint(target).table
    assert ((dj > 0) & (p > 0)).sum() == 0  # topk target has zeros in every row
    inv = zoo.anti_inverse(target).table
    assert torch.equal(inv > 0, p > 0)
    assert torch.equal(inv.argmax(-1), masked.argmin(-1))
    comp = zoo.anti_complement(target).table
    assert (comp[p == 0] > 0).all()
    hot = zoo.temperature(target, 0.01).table
    assert torch.equal(hot.argmax(-1), p.argmax(-1))
    assert torch.equal(zoo.temperature(target, 3.0).table > 0, p > 0)
    adv = zoo.adversary(target, 0.1).table
    torch.testing.assert_close(
        (p - adv).clamp_min(0).sum(-1),
        torch.full((p.shape[0],), 0.1, dtype=torch.float64)
        - 0.1 * p.gather(-1, masked.argmin(-1, keepdim=True)).squeeze(-1),
    )


def test_stale_is_one_token_late():
    target = tables.markov(4, seed=5)
    d = zoo.stale(target)
    x = torch.tensor([[2, 1, 3]])
    for t in range(4):
        want = target.probs_at(x, torch.tensor([max(t - 1, 0)]))
        torch.testing.assert_close(d.probs_at(x, torch.tensor([t])), want)


def test_noisy_and_argmax_are_seeded():
    target = TARGETS["markov"]()
    assert torch.equal(zoo.noisy(target, seed=3).table, zoo.noisy(target, seed=3).table)
    assert not torch.equal(zoo.noisy(target, seed=3).table, zoo.noisy(target, seed=4).table)
    a = zoo.argmax(target, seed=1).table
    assert ((a == 1).sum(-1) == 1).all() and (target.table[a == 1] > 0).all()


def test_bad_arguments():
    target = TARGETS["markov"]()
    with pytest.raises(InvalidArgument, match="drafter"):
        zoo.make_drafter("nope", target)
    with pytest.raises(InvalidArgument, match="tau"):
        zoo.temperature(target, 0.0)
    with pytest.raises(InvalidArgument, match="eps"):
        zoo.adversary(target, 1.5)
