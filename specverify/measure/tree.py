"""Measure how far a (lossy) tree verifier is from the target, per in-round depth and position.

:func:`measure_tree_divergence` runs the tree harness
(:func:`~specverify.verifier.tree.harness.run_tree_harness`) over a tree scenario and hands
its chain-shaped run to :func:`specverify.measure.chain.measure_run`: the strata are the
absolute positions ``abs=t`` (t from 0) and the in-round depths ``depth=j`` for j >= 2 (the
j-th token a round emits, first per row; j = D+1 is the final token after a fully accepted
path; depth 1 is ``abs=0``, where every row opens a round, so it is measured once, there),
each with the TV point estimate inside its confidence interval, KL and the most over- and under-emitted tokens
(:func:`specverify.stats.divergence.divergence`); plus the descent rate per depth, the mean
accepted depth and tokens per target pass (one verifier call is one target pass over the
tree).  The validity argument is the chain measurement's: one token per row and stratum,
taken at a stopping time of the row's own past.

A declared law is not taken: the law a lossy tree rule claims for a depth depends on the
whole drafted tree, not on one (target row, draft row) pair.  Chain-shaped lossy rules are
checked for conformance with :func:`specverify.measure.chain.measure_divergence`.

Shapes: R rows, L tokens per row, D maximum depth.
"""

from __future__ import annotations

import torch

from specverify.core.errors import ImplementationError, InvalidArgument
from specverify.core.seeds import scenario_seed
from specverify.core.validation import check_int
from specverify.measure.chain import MeasureResult, measure_run
from specverify.verifier.scenarios import TIERS
from specverify.verifier.tree.harness import run_tree_harness
from specverify.verifier.tree.scenarios import TreeScenario, get_tree_scenarios

__all__ = ["measure_tree_divergence", "DEFAULT_TREE_SCENARIO"]

#: Tree scenario measured when none is given.
DEFAULT_TREE_SCENARIO = "markov8_topk_3x2"


def _scenario(scenario) -> TreeScenario:
    if scenario is None:
        scenario = DEFAULT_TREE_SCENARIO
    if isinstance(scenario, str):
        (scenario,) = get_tree_scenarios([scenario])
    if not isinstance(scenario, TreeScenario):
        raise InvalidArgument(f"scenario must be a TreeScenario or a tree scenario name, got {scenario!r}")
    if scenario.edge_coins:
        raise InvalidArgument(f"scenario {scenario.name!r} hands in exact-zero coins: it checks support, not a law")
    return scenario


def measure_tree_divergence(
    verify_tree,
    *,
    scenario=None,
    tier: str = "smoke",
    seed: int = 0,
    level: float = 0.95,
    batch_size: int | None = None,
    length: int | None = None,
) -> MeasureResult:
    """Distance of a tree verifier's output from the target per depth and position, with confidence intervals.

    Parameters
    ----------
    verify_tree : callable
        Tree verifier protocol ``verify_tree(target_probs, draft_probs, tokens, parents, *, mode, generator)``
        (:mod:`specverify.protocols.tree`).
    scenario : str or TreeScenario, optional
        A tree battery scenario (default :data:`DEFAULT_TREE_SCENARIO`, EAGLE's static top-3/top-2 tree);
        its drafting fixes the tree shape and ``mode``.
    tier : {"smoke", "standard", "deep"}
        Number of batches, as in the tree battery.
    seed : int
        Sampling seed (combined with the scenario name as the tree battery does).
    level : float, default 0.95
        Level of every TV interval (per stratum; the overall mean TV's interval is simultaneous).
    batch_size, length : int, optional
        Override the scenario's rows per batch and tokens per row.

    Returns
    -------
    MeasureResult
        ``by_block`` holds the ``depth=j`` strata (j >= 2; depth 1 is ``abs=0``), ``acceptance_by_block`` the descent rate at
        depths 1..D, ``mean_accepted`` the mean accepted depth, ``tokens_per_pass`` one more.

    Raises
    ------
    InvalidArgument
        Bad arguments.
    ImplementationError
        The verifier raised or violated the tree protocol.
    """
    if tier not in TIERS:
        raise InvalidArgument(f"tier must be one of {TIERS}, got {tier!r}")
    if not callable(verify_tree):
        raise InvalidArgument(f"verify_tree must be callable, got {verify_tree!r}")
    seed = check_int("seed", seed, minimum=0)
    scenario = _scenario(scenario)
    B = scenario.batch_size if batch_size is None else check_int("batch_size", batch_size, minimum=1)
    L = scenario.length if length is None else check_int("length", length, minimum=1)
    target, drafter = scenario.build()
    generator = torch.Generator().manual_seed(scenario_seed(seed, "tree/" + scenario.name))
    tree_run = run_tree_harness(
        verify_tree, target, drafter, scenario.drafting, batch_size=B, length=L, generator=generator,
        num_groups=scenario.num_groups(tier),
    )  # fmt: skip
    if tree_run.accepted_depths.numel() == 0:
        raise ImplementationError(f"{scenario.name}: the verifier was never called")
    depths = tree_run.accepted_depths.to(torch.float64)  # (rounds,)
    return measure_run(
        tree_run.run, target, drafter, name=scenario.name, tier=tier, seed=seed, level=level, declared_law=None,
        alpha=1e-3, mean_accepted=float(depths.mean()), row_calls=int(depths.numel()), stratum="depth",
    )  # fmt: skip
