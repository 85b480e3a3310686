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

import torch

from specverify import stats
from specverify.core.results import TestResult
from specverify.stats.tails import LARGE_VOCAB, TAIL_HEAD, emitted_in_tail, informative, tail_sets

__all__ = [
    "LARGE_VOCAB",
    "TAIL_HEAD",
    "tail_sets",
    "emitted_in_tail",
    "outside_support_mass",
    "informative",
    "mass_set_results",
]


def outside_support_mass(target_rows: torch.Tensor, draft_rows: torch.Tensor) -> torch.Tensor:
    """Target mass where the draft law is zero: ``sum_{x: q(x) = 0} p(x)`` per row, float64.

    Parameters
    ----------
    target_rows, draft_rows : Tensor (..., V)
    """
    zero = draft_rows == 0
    return torch.where(zero, target_rows, torch.zeros((), dtype=target_rows.dtype)).sum(-1, dtype=torch.float64)


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
