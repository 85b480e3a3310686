"""The tail of a law: the ids beyond its most probable ``TAIL_HEAD``, fixed by the law alone.

Where large-vocabulary faults move mass (a float32 running sum that stalls in the tail, a silent
top-k cut), and where pooled histogram bins see least.  :func:`tail_sets` marks the tails of a
table of laws; :func:`emitted_in_tail` answers for emitted tokens only, without sorting a row (the
decoder's laws arrive in blocks of (rows, V)).  The set-mass tests that use them:
:mod:`specverify.verifier.mass_sets` (chain and tree batteries) and
:mod:`specverify.decoder.conditionals` (the decoder battery), through :func:`specverify.stats.set_mass_test`.
"""

from __future__ import annotations

import numpy as np
import torch

__all__ = ["LARGE_VOCAB", "TAIL_HEAD", "tail_sets", "emitted_in_tail", "informative"]

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
    if wide.numel() < n:  # only the rows with a tail
        in_tail[wide], mass[wide] = _tail_of_wide_rows(rows[wide], tokens[wide], head)
        return in_tail, mass
    return _tail_of_wide_rows(rows, tokens, head)


def _tail_of_wide_rows(rows: torch.Tensor, tokens: torch.Tensor, head: int) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`emitted_in_tail` of rows (n, V) that all have more than ``head`` ids of support."""
    V = rows.shape[1]
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


def informative(probs: np.ndarray) -> bool:
    """Whether some set mass is strictly between 0 and 1 (else the count is fixed under H0)."""
    return bool(np.any((probs > 0) & (probs < 1)))
