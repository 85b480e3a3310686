"""Where large-vocabulary bugs move mass: the tail beyond each law's head, ids outside the draft vocabulary.

Engines shipped bugs that only show at real vocabulary sizes (``docs/bugs.md``): a float32 running
sum over 150k probabilities that stalls in the tail, a reduced draft vocabulary whose ``q`` is
left in draft ids, noise over the whole vocabulary.  Goodness-of-fit bins at a real vocabulary
pool the long tail into few bins, and the per-token directed tests only see a few rows there
(:data:`specverify.verifier.battery.DIRECTED_CELLS`), so the battery adds, at vocabularies of at
least :data:`LARGE_VOCAB` ids, two counts of emitted tokens in sets fixed by the laws alone
(:func:`specverify.stats.set_mass_test`, exact Poisson-binomial):

* ``tail_mass`` -- every emitted token: in the tail of its context's target law, the ids of
  positive probability outside the :data:`TAIL_HEAD` most probable (ties by id), against the
  tail's exact mass;
* ``outside_draft_mass`` -- every drafted position: outside the support of its draft law
  (``q = 0``: a reduced draft vocabulary, a top-k drafter), against the target mass there.  Such
  tokens can only come from the residual, so the count measures the residual's share directly.

Each states the shift of the set's mass it detects at power 0.9 (its two-bin TV).  A test is
left out where its sets carry no randomness (every set mass 0 or 1).  Cost: O(C x V) for the
sets of the C contexts, O(N) for N tokens -- no (N, V) array.
"""

from __future__ import annotations

import numpy as np
import torch

from specverify import stats
from specverify.core.results import TestResult

__all__ = [
    "LARGE_VOCAB",
    "TAIL_HEAD",
    "tail_sets",
    "emitted_in_tail",
    "outside_support_mass",
    "informative",
    "mass_set_results",
]

#: Smallest vocabulary that gets the set-mass tests (8 x TAIL_HEAD: a tail of at least 7/8 of the ids).
LARGE_VOCAB = 8192
#: Head size: the tail of a law is its support beyond its TAIL_HEAD most probable ids.
TAIL_HEAD = 1024


def tail_sets(table: torch.Tensor, head: int = TAIL_HEAD) -> tuple[torch.Tensor, torch.Tensor]:
    """The tail of each law and its exact mass.

    Parameters
    ----------
    table : Tensor (C, V) float64
        Laws, one per context.
    head : int
        Ids kept in the head: the most probable, ties broken by the lower id.

    Returns
    -------
    in_tail : Tensor (C, V) bool
        Positive probability and not in the head.
    mass : Tensor (C,) float64
        ``table[c, in_tail[c]].sum()`` (float64).
    """
    C, V = table.shape
    order = torch.argsort(-table, dim=-1, stable=True)[:, : min(head, V)]  # (C, head): by p, ties by id
    in_tail = table > 0  # (C, V)
    in_tail.scatter_(1, order, False)
    mass = torch.where(in_tail, table, torch.zeros((), dtype=table.dtype)).sum(-1, dtype=torch.float64)  # (C,)
    return in_tail, mass


def emitted_in_tail(
    rows: torch.Tensor, tokens: torch.Tensor, head: int = TAIL_HEAD
) -> tuple[torch.Tensor, torch.Tensor]:
    """Whether each emitted token is in the tail of its own law (:func:`tail_sets`), and the tail's mass.

    The same sets as :func:`tail_sets` (positive probability, not among the ``head`` most probable ids,
    ties by the lower id) without sorting a row: the ``head`` largest probabilities (``torch.topk``)
    give the head's mass and its smallest value ``t``; a token below ``t`` is in the tail, above it in
    the head, and at ``t`` by its rank among the ids at ``t`` (counted for those rows only).  The
    tail's mass is the row's sum less the head's (clamped at 0).  Rows whose support has at most
    ``head`` ids (a top-k law) have no tail: flag False, mass exactly 0, no top-k taken.  O(n V) for
    n rows, no (n, V) index array.

    Parameters
    ----------
    rows : Tensor (n, V) float64
        Each emitted token's law.
    tokens : Tensor (n,) long
        The emitted tokens.
    head : int
        Ids in the head.

    Returns
    -------
    in_tail : Tensor (n,) bool
    mass : Tensor (n,) float64
    """
    n, V = rows.shape
    in_tail, mass = torch.zeros(n, dtype=torch.bool), torch.zeros(n, dtype=torch.float64)
    wide = ((rows > 0).sum(-1) > head).nonzero().squeeze(-1)  # rows with a tail (top-k laws have none)
    if head >= V or not wide.numel():
        return in_tail, mass
    if wide.numel() < n:
        flags, tails = emitted_in_tail(rows[wide], tokens[wide], head)
        in_tail[wide], mass[wide] = flags, tails
        return in_tail, mass
    top = torch.topk(rows, head, dim=-1, sorted=True).values  # (n, head) descending: a fixed summation order
    t = top[:, -1]  # (n,) the head-th largest probability (> 0: every row has a tail)
    mass = (rows.sum(-1, dtype=torch.float64) - top.sum(-1, dtype=torch.float64)).clamp(min=0)  # (n,)
    p_token = rows.gather(-1, tokens[:, None]).squeeze(-1)  # (n,)
    in_tail = (p_token > 0) & (p_token < t)
    tied = (p_token == t).nonzero().squeeze(-1)  # rows whose token ties the head's last value
    if tied.numel():
        r, x = rows[tied], tokens[tied]  # (m, V), (m,)
        above = (r > t[tied, None]).sum(-1)  # (m,) ids certainly in the head
        before = ((r == t[tied, None]) & (torch.arange(V)[None, :] < x[:, None])).sum(-1)  # (m,) ties with lower ids
        in_tail[tied] = before >= head - above
    return in_tail, mass


def outside_support_mass(target_rows: torch.Tensor, draft_rows: torch.Tensor) -> torch.Tensor:
    """Target mass where the draft law is zero: ``sum_{x: q(x) = 0} p(x)`` per row, float64.

    Parameters
    ----------
    target_rows, draft_rows : Tensor (..., V)
    """
    zero = draft_rows == 0
    return torch.where(zero, target_rows, torch.zeros((), dtype=target_rows.dtype)).sum(-1, dtype=torch.float64)


def informative(probs: np.ndarray) -> bool:
    """Whether some set mass is strictly between 0 and 1 (else the count is fixed under H0)."""
    return bool(np.any((probs > 0) & (probs < 1)))


def mass_set_results(run, target, drafter, *, common: dict) -> list[TestResult]:
    """The set-mass tests of one harness run at a vocabulary of at least :data:`LARGE_VOCAB` ids.

    Parameters
    ----------
    run : specverify.verifier.harness.HarnessRun
    target, drafter : specverify.core.tables.TableModel
    common : dict
        ``scenario`` and ``alpha`` of the run's results.
    """
    V = target.vocab_size
    if V < LARGE_VOCAB:
        return []
    out = []
    tok = run.tokens.reshape(-1)  # (N,)
    tctx = run.target_contexts.reshape(-1)  # (N,)
    table = target.table.to(torch.float64)  # (C, V)
    in_tail, tail_mass = tail_sets(table)
    probs = tail_mass[tctx].numpy()  # (N,)
    if informative(probs):
        flags = in_tail[tctx, tok].numpy()
        label = f"the tail beyond each law's top {TAIL_HEAD:,} ids"
        out.append(stats.set_mass_test(flags, probs, label=label, name="tail_mass", position="all", **common))
    dctx = run.draft_contexts.reshape(-1)
    drafted = dctx >= 0  # positions 1..K (the bonus has no draft law)
    if bool(drafted.any()):
        dtable = drafter.table.to(torch.float64)  # (D, V)
        pairs, inverse = torch.unique(torch.stack([tctx[drafted], dctx[drafted]]), dim=1, return_inverse=True)
        mass = outside_support_mass(table[pairs[0]], dtable[pairs[1]])  # (pairs,)
        probs = mass[inverse].numpy()
        if informative(probs):
            flags = (dtable[dctx[drafted], tok[drafted]] == 0).numpy()
            out.append(
                stats.set_mass_test(
                    flags,
                    probs,
                    label="ids the draft law gives probability 0",
                    name="outside_draft_mass",
                    position="drafted",
                    **common,
                )
            )
    return out
