"""The drafter zoo: table drafters with honest q, built from a target table model.

Speculative sampling is lossless for *any* drafter, so a verifier under test
must keep the target's law whatever q it is given; each drafter here stresses a
different code path of the accept/residual rule (see the scenario table in
:mod:`specverify.verifier.scenarios`).  Every drafter is a :class:`~specverify.core.tables.TableModel`
whose reported rows are exactly the laws its tokens are drawn from.

==================  ====================================================================
name                q (per context of the target unless stated)
==================  ====================================================================
``oracle``          q = p: every draft accepted, the residual never used
``uniform``         uniform over the vocabulary, one context
``least_likely``    point mass on p's least likely token in its support (deterministic drafter)
``argmax``          point mass on argmax of a noisy copy of p (a greedy, deterministic drafter)
``disjoint``        uniform over the tokens with p = 0 (every draft rejected; residual = p);
                    rows of p with full support fall back to ``least_likely``
``anti_inverse``    q proportional to 1/p on p's support
``anti_complement`` q proportional to 1 - p (mass on tokens with p = 0 too)
``temperature``     q proportional to p^(1/tau) (tau = 2 by default: flatter than p)
``noisy``           softmax(log(p + eps) + sigma * N(0, 1)): close to p, full support
``stale``           conditioned on the prefix without its last token (the previous-but-one
                    context); an :class:`~specverify.core.tables.FSMTable` tracking both contexts
``adversary``       (1 - eps) p + eps * point mass on p's least likely token: the residual
                    (p - q)+ has total mass ~eps, spread like p -- rejections are rare and their
                    residual rows tiny and unnormalised (catches unnormalised inverse CDFs)
``padding_leak``    (1 - mass) p^(1/tau) + mass * uniform over the padding ids >= ``real_vocab``
                    (a drafter whose padded head is not masked: its padding drafts must all be rejected)
``hot_set``         p^(1/tau) restricted to ``size`` scattered ids (a reduced draft vocabulary mapped into
                    the target's ids, EAGLE-3 / FR-Spec style): the target's mass outside it is
                    reachable only through the residual and the bonus token
==================  ====================================================================

References: Leviathan et al. 2023 (losslessness for any q); the stale / point-mass
drafters mirror real bugs catalogued in ``docs/bugs.md``.
"""

from __future__ import annotations

import torch

from specverify.core import portable
from specverify.core.errors import InvalidArgument
from specverify.core.tables import FSMTable, PositionalCategorical, TableModel, hot_ids

__all__ = [
    "oracle",
    "uniform",
    "least_likely",
    "argmax",
    "disjoint",
    "anti_inverse",
    "anti_complement",
    "temperature",
    "noisy",
    "stale",
    "adversary",
    "padding_leak",
    "hot_set",
    "ZOO",
    "make_drafter",
]


def _least_likely_onehot(table: torch.Tensor) -> torch.Tensor:
    masked = torch.where(table > 0, table, torch.full_like(table, float("inf")))
    return torch.nn.functional.one_hot(masked.argmin(-1), table.shape[-1]).to(torch.float64)  # (C, V)


def oracle(target: TableModel) -> TableModel:
    """q = p (the same model)."""
    return target.with_table(target.table, name="oracle")


def uniform(target: TableModel) -> TableModel:
    """Uniform over the vocabulary (one context)."""
    V = target.vocab_size
    return PositionalCategorical(torch.full((1, V), 1.0 / V, dtype=torch.float64), name="uniform")


def least_likely(target: TableModel) -> TableModel:
    """Point mass on the least likely token of p's support (ties: lowest id)."""
    return target.with_table(_least_likely_onehot(target.table), name="least_likely")


def argmax(target: TableModel, *, sigma: float = 1.0, seed: int = 0) -> TableModel:
    """Point mass on the argmax of ``log p + sigma * noise`` restricted to p's support (greedy drafter)."""
    gen = torch.Generator().manual_seed(seed)
    noise = torch.randn(target.table.shape, generator=gen, dtype=torch.float64)
    logits = torch.where(
        target.table > 0, portable.log(target.table) + sigma * noise, torch.full_like(noise, -float("inf"))
    )
    return target.with_table(
        torch.nn.functional.one_hot(logits.argmax(-1), target.vocab_size).to(torch.float64), name="argmax"
    )


def disjoint(target: TableModel) -> TableModel:
    """Uniform over the tokens where p = 0; rows of full support fall back to the least likely token."""
    zeros = (target.table == 0).to(torch.float64)  # (C, V)
    has = portable.row_sums(zeros, keepdim=True) > 0
    rows = torch.where(
        has, zeros / portable.row_sums(zeros, keepdim=True).clamp_min(1), _least_likely_onehot(target.table)
    )
    return target.with_table(rows, name="disjoint")


def anti_inverse(target: TableModel) -> TableModel:
    """q proportional to 1/p on p's support."""
    table = target.table
    inv = torch.where(table > 0, 1.0 / table.clamp_min(1e-300), torch.zeros_like(table))
    inv = inv / inv.max(-1, keepdim=True).values  # avoid overflow before normalising
    return target.with_table(portable.normalise(inv), name="anti_inverse")


def anti_complement(target: TableModel) -> TableModel:
    """q proportional to 1 - p (uniform where p is one-hot's complement: mass on p = 0 tokens)."""
    comp = 1.0 - target.table
    if target.vocab_size == 1:
        comp = torch.ones_like(comp)
    comp = torch.where(portable.row_sums(comp, keepdim=True) > 0, comp, torch.ones_like(comp))
    return target.with_table(portable.normalise(comp), name="anti_complement")


def temperature(target: TableModel, tau: float = 2.0) -> TableModel:
    """q proportional to p ** (1 / tau) (tau > 1 flattens, tau < 1 sharpens; zeros stay zero)."""
    if not tau > 0:
        raise InvalidArgument(f"tau must be > 0, got {tau!r}")
    table = target.table
    logp = torch.where(table > 0, portable.log(table), torch.full_like(table, -float("inf")))
    return target.with_table(portable.softmax(logp / tau), name=f"temperature{tau:g}")


def noisy(target: TableModel, sigma: float = 0.5, *, eps: float = 1e-3, seed: int = 0) -> TableModel:
    """softmax(log(p + eps) + sigma * N(0, 1)) per context (seeded): near p with full support."""
    gen = torch.Generator().manual_seed(seed)
    noise = torch.randn(target.table.shape, generator=gen, dtype=torch.float64)
    return target.with_table(portable.softmax(portable.log(target.table + eps) + sigma * noise), name=f"noisy{sigma:g}")


def adversary(target: TableModel, eps: float = 0.1) -> TableModel:
    """(1 - eps) p + eps * point mass on p's least likely token: a tiny, p-shaped residual."""
    if not 0 < eps < 1:
        raise InvalidArgument(f"eps must be in (0, 1), got {eps!r}")
    rows = (1 - eps) * target.table + eps * _least_likely_onehot(target.table)
    return target.with_table(rows, name=f"adversary{eps:g}")


def stale(target: TableModel) -> TableModel:
    """Drafts with the target's conditional one token out of date.

    After a prefix s (length >= 1) q is the target's row after ``s[:-1]``; after the
    empty prefix it is the target's first row.  States are pairs (target context
    before the last token, last token) plus one initial state: ``C * V + 1`` rows.
    """
    C, V = target.table.shape
    if C * V + 1 > 1 << 22:
        raise InvalidArgument(f"stale drafter needs {C * V + 1} contexts for this target: too large")
    ctx = torch.arange(C).repeat_interleave(V)  # (C*V,) context before the last token
    last = torch.arange(V).repeat(C)  # (C*V,)
    table = torch.cat([target.table[ctx], target.table[target.initial_context][None]])  # (C*V+1, V)
    tokens = torch.arange(V)
    after_last = target.next_context(ctx, last)  # (C*V,) the target context after the last token
    transition = after_last[:, None] * V + tokens[None]  # (C*V, V)
    initial_row = target.initial_context * V + tokens  # (V,) state after the first token
    transition = torch.cat([transition, initial_row[None]])  # (C*V+1, V)
    return FSMTable(table, transition, initial_context=C * V, name="stale")


def padding_leak(target: TableModel, real_vocab: int | None = None, mass: float = 0.05, tau: float = 1.3) -> TableModel:
    """(1 - mass) p^(1/tau) + mass * uniform over ids >= real_vocab (the padding of a wider head).

    ``real_vocab`` (the tokenizer's ids; the head is wider) has no default: it is the model's layout.
    """
    V = target.vocab_size
    if real_vocab is None:
        raise InvalidArgument("padding_leak needs real_vocab (the ids below it are real, the rest padding)")
    if not 0 < real_vocab < V or not 0 < mass < 1:
        raise InvalidArgument(f"need 0 < real_vocab < V={V} and 0 < mass < 1, got {real_vocab!r}, {mass!r}")
    pad = torch.zeros(V, dtype=torch.float64)
    pad[real_vocab:] = 1.0 / (V - real_vocab)
    rows = (1 - mass) * temperature(target, tau).table + mass * pad
    return target.with_table(rows, name=f"padding_leak{mass:g}")


def hot_set(target: TableModel, size: int | None = None, tau: float = 1.3) -> TableModel:
    """p^(1/tau) on the ``size`` ids of :func:`~specverify.core.tables.hot_ids`, renormalised: a reduced
    draft vocabulary in the target's ids.  ``size`` has no default: it is the drafter's layout."""
    V = target.vocab_size
    if size is None:
        raise InvalidArgument("hot_set needs size (the number of ids in the draft vocabulary)")
    if not 0 < size < V:
        raise InvalidArgument(f"size must be in (0, V={V}), got {size!r}")
    keep = torch.zeros(V, dtype=torch.bool)
    keep[hot_ids(V, size)] = True
    table = temperature(target, tau).table.masked_fill(~keep, 0.0)
    if bool((portable.row_sums(table) <= 0).any()):
        raise InvalidArgument(f"a target row has no mass on the hot set of {size} ids: it cannot be drafted")
    return target.with_table(portable.normalise(table), name=f"hot_set{size}")


#: name -> factory(target) with the zoo's default options.
ZOO = {
    "oracle": oracle,
    "uniform": uniform,
    "least_likely": least_likely,
    "argmax": argmax,
    "disjoint": disjoint,
    "anti_inverse": anti_inverse,
    "anti_complement": anti_complement,
    "temperature": temperature,
    "noisy": noisy,
    "stale": stale,
    "adversary": adversary,
}

#: name -> factory(target, **layout): drafters defined by the vocabulary's layout, which has no
#: default (``padding_leak`` needs ``real_vocab``, ``hot_set`` needs ``size``).
SHAPED = {
    "padding_leak": padding_leak,
    "hot_set": hot_set,
}


def make_drafter(name: str, target: TableModel, **options) -> TableModel:
    """Build the zoo drafter ``name`` for ``target`` (options go to its factory)."""
    factories = {**ZOO, **SHAPED}
    if name not in factories:
        raise InvalidArgument(f"drafter must be one of {sorted(factories)}, got {name!r}")
    return factories[name](target, **options)
