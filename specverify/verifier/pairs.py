"""The dependence family of the chain and tree batteries: rows of one verify call, tested in pairs.

A kernel that shares a random number between rows (a Philox offset taken modulo a tile,
a per-block scratch value read by the wrong row, one seed for a whole batch) leaves every
row's marginal law exact; only the joint law of rows of the same call shows it.  Which
rows shared a call is known without instrumenting the harness: a group's rounds call the
verifier on its unfinished rows in row order, and a row takes part in every round until
it is finished, so round k of a group holds exactly the rows with more than k blocks, and
a row's slot in that call is its rank among them.  Each block starts with the token at
in-block position 1 (:attr:`~specverify.verifier.harness.HarnessRun.block_positions`).

Tested per call, for disjoint pairs of slots (:func:`specverify.stats.call_pairs`):

* ``adjacent`` -- slots (2i, 2i+1);
* ``lag32`` .. ``lag256`` (and ``lag<block>`` for a declared block size) -- slots (j, j+T)
  for j mod 2T < T: rows whose offsets agree modulo T;
* ``boundary`` -- (T-1, T) for every power of two T from 32 (and the block size) below the
  call's size: rows on either side of a tile edge;
* ``first_last`` -- slots (0, b-1);
* ``random`` -- a random perfect matching of the slots (drawn from the scenario's seed).

The tokens compared are, per row and call, the **first emitted token** -- for any lossless
rule its law given the row's past is the target's row at that context, marginally over the
drafts, which the harness draws independently per row -- and, for chains, the **bonus
token** after K acceptances (law p_{K+1}) when both rows of a pair emitted one.  Neither
depends on which lossless rule the verifier implements, so a verifier whose rule differs
from the canonical one but is lossless is not flagged here.  Each class is one
:func:`specverify.stats.pair_dependence_test` (family ``dependence``).
"""

from __future__ import annotations

import numpy as np
import torch

from specverify import stats
from specverify.core.errors import InvalidArgument
from specverify.core.results import TestResult
from specverify.core.seeds import scenario_seed

__all__ = ["MIN_PAIRS", "call_slots", "declared_block_size", "dependence_results"]

#: A pair class needs at least this many pairs in a scenario to be tested.
MIN_PAIRS = 20


def declared_block_size(implementation) -> int | None:
    """The rows per tile an implementation declares (its ``block_size`` attribute), or None.

    A kernel that processes rows in tiles and says so (``verify.block_size = 128``) gets its
    tile edge and that offset tested besides the powers of two.
    """
    value = getattr(implementation, "block_size", None)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 2:
        raise InvalidArgument(f"block_size (declared by {implementation!r:.60}) must be an int >= 2, got {value!r}")
    return int(value)


def call_slots(block_positions: torch.Tensor, batch_size: int) -> tuple[np.ndarray, ...]:
    """Where each row's blocks sat: ``(rows, positions, calls, slots, call_sizes, block_of)``.

    For every block start (in-block position 1) at ``(rows[i], positions[i])``: its call's
    index ``calls[i]`` (group-major, then round) and its slot in that call; ``call_sizes``
    (calls,) rows per call; ``block_of`` (R, L) the block index of every token in its row.
    """
    bpos = block_positions.numpy()  # (R, L)
    R, L = bpos.shape
    starts = bpos == 1  # (R, L)
    block_of = np.cumsum(starts, axis=1) - 1  # (R, L)
    rows, positions = np.nonzero(starts)  # row-major: rows ascending
    rounds = block_of[rows, positions]  # (n,)
    max_rounds = int(rounds.max()) + 1 if rounds.size else 1
    calls = (rows // batch_size) * max_rounds + rounds  # (n,)
    order = np.lexsort((rows, calls))  # by call, then row
    sorted_calls = calls[order]
    first = np.searchsorted(sorted_calls, sorted_calls, side="left")
    slots = np.empty_like(order)
    slots[order] = np.arange(order.size) - first
    _, dense = np.unique(calls, return_inverse=True)
    call_sizes = np.bincount(dense)
    return rows, positions, dense, slots, call_sizes, block_of


def dependence_results(
    run,
    table: torch.Tensor,
    *,
    scenario: str,
    alpha: float,
    seed: int,
    block_size: int | None = None,
    bonus_position: int | None = None,
) -> list[TestResult]:
    """The ``dependence`` family of one harness run (see the module docstring).

    ``table`` (C, V) the target's exact rows, indexed by ``run.target_contexts``;
    ``bonus_position`` the in-block position of a bonus token (K+1 for chains; None: no
    bonus pairs).
    """
    tokens, tctx = run.tokens.numpy(), run.target_contexts.numpy()
    rows, positions, calls, slots, sizes, block_of = call_slots(run.block_positions, run.batch_size)
    if sizes.size == 0 or int(sizes.max()) < 2:
        return []
    # (call, slot) -> entry of the call's first tokens; and the bonus token of that block, if any
    offsets = np.concatenate([[0], np.cumsum(sizes)])
    index = np.empty(offsets[-1], dtype=np.int64)
    index[offsets[calls] + slots] = np.arange(calls.size)
    first_tok, first_ctx = tokens[rows, positions], tctx[rows, positions]  # (n,)
    bonus_tok = np.full(calls.size, -1, dtype=np.int64)
    bonus_ctx = np.zeros(calls.size, dtype=np.int64)
    if bonus_position is not None:
        br, bt = np.nonzero(run.block_positions.numpy() == bonus_position)
        if br.size:
            # the block start of the same row and block: entries are row-major, blocks ascending
            row_start = np.searchsorted(rows, br, side="left")
            entry = row_start + block_of[br, bt]
            bonus_tok[entry], bonus_ctx[entry] = tokens[br, bt], tctx[br, bt]
    gen = torch.Generator().manual_seed(scenario_seed(seed, "pairs/" + scenario))
    pairs: dict[str, list[tuple[np.ndarray, np.ndarray]]] = {}
    for c, b in enumerate(sizes.tolist()):
        for name, (sa, sb) in stats.call_pairs(b, block_size=block_size, generator=gen).items():
            pairs.setdefault(name, []).append((index[offsets[c] + sa], index[offsets[c] + sb]))
    results = []
    table_np = table.numpy()
    for name, chunks in pairs.items():
        ea = np.concatenate([a for a, _ in chunks])
        eb = np.concatenate([b for _, b in chunks])
        both = (bonus_tok[ea] >= 0) & (bonus_tok[eb] >= 0)
        law_a = np.concatenate([first_ctx[ea], bonus_ctx[ea[both]]])
        law_b = np.concatenate([first_ctx[eb], bonus_ctx[eb[both]]])
        tok_a = np.concatenate([first_tok[ea], bonus_tok[ea[both]]])
        tok_b = np.concatenate([first_tok[eb], bonus_tok[eb[both]]])
        if tok_a.size < MIN_PAIRS:
            continue
        res = stats.pair_dependence_test(
            table_np, law_a, tok_a, law_b, tok_b, alpha=alpha, name=f"pairs_{name}", scenario=scenario,
            position="first token" + (" + bonus" if bonus_position is not None else "") + " per call",
        )  # fmt: skip
        details = {**res.details, "first_token_pairs": int(ea.size), "bonus_pairs": int(both.sum())}
        results.append(res.replace(details=details))
    return results
