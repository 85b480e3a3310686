"""Drive tree speculative decoding around a tree verifier under test, on table models.

One *round* for every unfinished row: grow a draft tree from the row's contexts
(:func:`~specverify.verifier.tree.drafting.draft_trees`), gather the target's exact row at
the root and at every node and the drafter's row at every slot, call the verifier through
:func:`~specverify.protocols.tree.call_tree_verifier` (which validates the output),
and append the emitted tokens.  Rows advance independently until each holds L tokens.

The result is a chain :class:`~specverify.verifier.harness.HarnessRun`, so the chain
battery's statistics apply unchanged: every emitted token with its target context (its
exact conditional), its *in-round position* j = 1..D+1 (``block_positions``: the depth it
was emitted at), and the drafter context of the slot it was drawn at (the q its siblings
came from; -1 where the slot had no children or the rule reads no q).  Acceptance trials
are per reached slot with children: success when the walk descends, with the exact
probability of that event given the past -- ``sum_x p(x)`` over the slot's distinct child
tokens for deterministic children (topk, any) and the probability averaged over the
drafting of the children for i.i.d. / without-replacement children
(:func:`~specverify.verifier.tree.laws.node_law`).  Per round it also records the accepted
depth and the root contexts, for the accepted-length law.

Verifiers see float32 rows, as real kernels do; the float64 tables are the exact law.

Shapes: b rows, N nodes, V vocabulary, D maximum depth, L sequence length.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from specverify.core.devices import check_device, check_prob_dtype
from specverify.core.errors import ImplementationError, InvalidArgument
from specverify.core.tables import TableModel
from specverify.core.validation import check_generator, check_int
from specverify.protocols.tree import TreeBatch, call_tree_verifier, children_table, draw_uniforms
from specverify.verifier.harness import HarnessRun, collect_run
from specverify.verifier.rounds import _Columns, _Group
from specverify.verifier.tree.drafting import TreeDrafting, draft_trees
from specverify.verifier.tree.laws import node_law

__all__ = ["TreeHarnessRun", "run_tree_harness"]


@dataclass(frozen=True)
class TreeHarnessRun:
    """A tree harness run: the chain-shaped run plus per-round accepted depths."""

    run: HarnessRun
    accepted_depths: torch.Tensor  # (rounds,) accepted tokens per verifier row
    root_target_contexts: torch.Tensor  # (rounds,)
    root_draft_contexts: torch.Tensor  # (rounds,)
    num_nodes: int


class _AcceptProbs:
    """Exact probability that the walk descends from a slot, given what was known before its children."""

    def __init__(self, target: TableModel, drafter: TableModel, mode: str):
        self.target, self.drafter, self.mode = target, drafter, mode
        self.cache: dict[tuple[int, int, int], float] = {}

    def __call__(self, tctx, dctx, kid_tokens, kid_real) -> torch.Tensor:
        """tctx, dctx (n,); kid_tokens, kid_real (n, S) -> (n,) float64."""
        if self.mode in ("topk", "any"):  # deterministic children given the tree: sum of p over distinct tokens
            V = self.target.vocab_size
            onehot = torch.zeros(kid_tokens.shape[0], V, dtype=torch.float64)  # (n, V)
            onehot.scatter_add_(1, kid_tokens.clamp(min=0), kid_real.to(torch.float64))  # duplicates add up
            return (self.target.table[tctx] * (onehot > 0)).sum(-1)
        counts = kid_real.sum(-1)  # (n,)
        keys = torch.stack([tctx, dctx, counts], 1)  # (n, 3)
        unique, inverse = torch.unique(keys, dim=0, return_inverse=True)  # (u, 3), (n,)
        values = torch.empty(unique.shape[0], dtype=torch.float64)  # (u,)
        for i, key in enumerate(map(tuple, unique.tolist())):
            if key not in self.cache:
                accept, _ = node_law(self.target.table[key[0]], self.drafter.table[key[1]], key[2], drafting=self.mode)
                self.cache[key] = float(accept.sum())
            values[i] = self.cache[key]
        return values[inverse]


def _positions(out, children, slot_t, slot_d, K: int):
    """Per emitted position j = 1..K+1: slot, target context, drafter context, has-children; each (b, K+1)."""
    b, D = out.path.shape
    slot = torch.zeros(b, K + 1, dtype=torch.long)  # (b, K+1) slot 0 = root
    slot[:, 1 : D + 1] = out.path + 1  # path -1 -> slot 0 (unused positions)
    tctx = slot_t.gather(1, slot)  # (b, K+1)
    dctx = slot_d.gather(1, slot)  # (b, K+1)
    has_kids = (children.gather(1, slot[:, :, None].expand(-1, -1, children.shape[2])) >= 0).any(-1)  # (b, K+1)
    return slot, tctx, dctx, has_kids


def run_tree_harness(
    verify_tree,
    target: TableModel,
    drafter: TableModel,
    spec: TreeDrafting,
    *,
    batch_size: int,
    length: int,
    generator: torch.Generator,
    num_groups: int = 1,
    determinism_rows: int = 64,
    edge_coins: bool = False,
    device=None,
    dtype=None,
) -> TreeHarnessRun:
    """Run tree speculative decoding with ``verify_tree`` on table models; see the module docstring.

    ``edge_coins=True`` drives a uniforms-in kernel (``verify_tree.kernel``, see
    :func:`~specverify.protocols.tree.uniforms_in`) with exact-zero coins on every
    fourth row: only exact tests (support, protocol) stay valid on such a run.

    ``device`` (default the CPU) is where ``verify_tree`` runs: its inputs are copied there
    each round (probabilities in ``dtype``, default float32), it gets a generator of that
    device, and its output is copied back and validated on the CPU.  Drafting and the
    bookkeeping stay on the CPU, so ``device="cpu"`` is bit-identical to the default.

    Raises
    ------
    ImplementationError
        when the verifier raises, violates the protocol, or differs between two calls with one seed.
    """
    B = check_int("batch_size", batch_size, minimum=1)
    L = check_int("length", length, minimum=1)
    G = check_int("num_groups", num_groups, minimum=1)
    check_generator("generator", generator)
    K = spec.max_depth
    if edge_coins:
        verify_tree = _edge_coin_verifier(verify_tree)
    seeds = torch.randint(0, 2**62, (3,), generator=generator).tolist()
    draft_gen = torch.Generator().manual_seed(seeds[0])
    dev = check_device("device", device)
    prob_dtype = check_prob_dtype("dtype", dtype)
    move = {} if dev.type == "cpu" and prob_dtype == torch.float32 else {"device": dev, "dtype": prob_dtype}
    verify_gen = torch.Generator(device=dev).manual_seed(seeds[1])
    accept_probs = _AcceptProbs(target, drafter, spec.mode)
    trial_pos, trial_prob, trial_acc = [], [], []
    depths, root_t, root_d = [], [], []
    start = time.perf_counter()
    columns, num_calls, N = _Columns(B, G, L), 0, 0
    for g in range(G):
        group = _Group(target, drafter, B, L, K)
        while group.num_unfinished:
            trees = draft_trees(target, drafter, spec, group.tcur, group.dcur, generator=draft_gen)
            N = trees.parents.shape[1]
            slot_t = torch.cat([group.tcur[:, None], trees.target_contexts], 1)  # (b, N+1)
            slot_d = torch.cat([group.dcur[:, None], trees.draft_contexts], 1)  # (b, N+1)
            batch = TreeBatch.trusted(
                target.table32[slot_t],  # (b, N+1, V)
                None if spec.mode == "any" else drafter.table32[slot_d],  # (b, N+1, V)
                trees.tokens,
                trees.parents,
                spec.mode,
            )
            if num_calls == 0 and determinism_rows > 0:
                _check_determinism(verify_tree, batch, determinism_rows, seeds[2] % 2**63, move)
            out = call_tree_verifier(verify_tree, batch, generator=verify_gen, **move)
            num_calls += 1
            children = children_table(trees.parents)  # (b, N+1, S)
            slot, tctx, dctx, has_kids = _positions(out, children, slot_t, slot_d, K)
            j = torch.arange(K + 1)  # (K+1,)
            emitted_at = j[None] < out.num_emitted[:, None]  # (b, K+1)
            trial = emitted_at & has_kids  # (b, K+1) a reached slot with children
            rows, cols = trial.nonzero(as_tuple=True)  # (T,)
            kids = children[rows, slot[rows, cols]]  # (T, S)
            kid_tokens = torch.where(kids >= 0, trees.tokens[rows[:, None], kids.clamp(min=0)], 0)  # (T, S)
            trial_pos.append(cols + 1)
            trial_acc.append(cols + 1 < out.num_emitted[rows])
            trial_prob.append(accept_probs(tctx[rows, cols], dctx[rows, cols], kid_tokens, kids >= 0))
            depths.append(out.num_emitted - 1)
            root_t.append(group.tcur.clone())
            root_d.append(group.dcur.clone())
            emitted = torch.zeros(out.emitted.shape[0], K + 1, dtype=torch.long)  # (b, K+1)
            emitted[:, : out.emitted.shape[1]] = out.emitted
            # the q the emitted token competed with: the slot's draft row (none at a leaf or for target-only rules)
            has_law = has_kids if spec.mode != "any" else torch.zeros_like(has_kids)  # (b, K+1)
            group.append(emitted, out.num_emitted, tctx, dctx, has_law=has_law)
        columns.add(g, group)
    run = collect_run(columns, trial_pos, trial_prob, trial_acc, K, num_calls, start)
    return TreeHarnessRun(run, torch.cat(depths), torch.cat(root_t), torch.cat(root_d), N)


def _edge_coin_verifier(verify_tree):
    """The protocol verifier of ``verify_tree.kernel`` with every fourth row's coins set to exactly 0."""
    kernel = getattr(verify_tree, "kernel", None)
    if kernel is None:
        raise InvalidArgument("edge coins need a uniforms-in kernel: verify_tree.kernel (see uniforms_in)")

    def edge_verify_tree(target_probs, draft_probs, tokens, parents, *, mode, generator):
        B, N1 = target_probs.shape[:2]
        coins, final_coins = draw_uniforms(B, N1 - 1, generator=generator, device=target_probs.device)
        coins[::4], final_coins[::4] = 0.0, 0.0  # (B, N+1), (B,): a legal coin value, hit exactly
        return kernel(target_probs, draft_probs, tokens, parents, mode=mode, coins=coins, final_coins=final_coins)

    return edge_verify_tree


def _check_determinism(verify_tree, batch: TreeBatch, rows: int, seed: int, move=None) -> None:
    """Two calls with generators of one seed on the first rows must agree."""
    r = min(rows, batch.shape[0])
    head = TreeBatch.trusted(
        batch.target_probs[:r],
        None if batch.draft_probs is None else batch.draft_probs[:r],
        batch.tokens[:r],
        batch.parents[:r],
        batch.mode,
    )
    move = move or {}
    dev = move.get("device", torch.device("cpu"))
    first = call_tree_verifier(verify_tree, head, generator=torch.Generator(device=dev).manual_seed(seed), **move)
    second = call_tree_verifier(verify_tree, head, generator=torch.Generator(device=dev).manual_seed(seed), **move)
    for name in ("emitted", "num_emitted", "path"):
        a, b = getattr(first, name), getattr(second, name)
        if not torch.equal(a, b):
            row = int((a != b).reshape(a.shape[0], -1).any(-1).nonzero()[0])
            raise ImplementationError(
                f"row {row}: two calls with generators of the same seed returned different {name} "
                f"({a[row].tolist()} vs {b[row].tolist()}): the verifier must draw all randomness from its generator",
                row=row,
            )
