"""``check_tree_verifier``: the statistical battery for tree / multi-draft verifiers.

Per scenario (:mod:`specverify.verifier.tree.scenarios`) the tree harness decodes with the
verifier under test and returns a chain-shaped run, so the chain battery's tests apply
unchanged (:func:`specverify.verifier.battery.analyse_run`): support, goodness of fit per
absolute position, per in-round position (depth) and per context node, directed PIT and
score tests, acceptance per depth against its exact value, within-batch collisions.  Added
here: the law of the accepted depth per round, against its exact value
(:func:`specverify.verifier.tree.laws.round_law`), in the most visited root contexts.
Everything is graded once (:func:`specverify.stats.grade`): the law tests under one error
budget, the acceptance tests (rule conformance against the declared mode's rule,
:mod:`specverify.core.conformance`) under their own, out of the verdict unless
``gate_conformance=True``.

The verifier is called with float32 rows through
:func:`~specverify.protocols.tree.call_tree_verifier`; an exception, a protocol
violation or a non-deterministic output is an ``ImplementationError`` recorded in the
report (verdict "fail"), never a crash.

Shapes: V vocabulary, D depth.
"""

from __future__ import annotations

import functools
import time
from typing import Any

import numpy as np
import torch

from specverify import stats
from specverify.core.devices import check_device, check_prob_dtype, device_extra
from specverify.core.environment import callable_name, environment
from specverify.core.errors import InvalidArgument
from specverify.core.results import Report, TestResult, protocol_result
from specverify.core.validation import check_bool, check_run_options
from specverify.shard.collect import Parallel
from specverify.verifier.battery import analyse_run
from specverify.verifier.pairs import declared_block_size
from specverify.verifier.runs import TreeRunner, run_battery
from specverify.verifier.scenarios import TIERS
from specverify.verifier.tree.harness import TreeHarnessRun
from specverify.verifier.tree.laws import round_law
from specverify.verifier.tree.scenarios import TreeScenario, get_tree_scenarios

__all__ = ["check_tree_verifier", "check_verifier", "list_scenarios", "list_tree_scenarios"]

#: Root-context strata tested for the accepted-depth law, and the rounds each needs.
LENGTH_STRATA, LENGTH_MIN_ROUNDS = 3, 400

PROTOCOL_METHOD = (
    "tree verifier output validation: shapes, dtypes, num_emitted in [1, D+1], the path a root-down "
    "chain of real nodes, emitted tokens = the path's tokens, final token in [0, V), same output for "
    "the same generator seed (exact)"
)


def list_tree_scenarios() -> list[dict]:
    """Name, drafting and description of every tree scenario."""
    return [
        {"name": s.name, "drafting": s.drafting.describe(), "description": s.description} for s in get_tree_scenarios()
    ]


def accepted_length_results(tree_run: TreeHarnessRun, scenario: TreeScenario, target, drafter, *, alpha: float):
    """GOF of the accepted depth per round against its exact law, in the most visited root contexts.

    Returns ``(results, note, first)``: ``first`` holds the most visited stratum's observed
    counts and exact law (for the report's acceptance section), or None.
    """
    parents = scenario.drafting.template_parents()
    if parents is None or scenario.drafting.duplicate:
        return [], "accepted-depth law not modelled for dynamic, pruned or duplicate-sibling trees", None
    keys = tree_run.root_target_contexts * drafter.num_contexts + tree_run.root_draft_contexts  # (rounds,)
    values, counts = torch.unique(keys, return_counts=True)
    order = torch.argsort(-counts, stable=True)[:LENGTH_STRATA]
    out, first = [], None
    for key, n in zip(values[order].tolist(), counts[order].tolist()):
        if n < LENGTH_MIN_ROUNDS:
            break
        tc, dc = divmod(key, drafter.num_contexts)
        try:
            law = round_law(parents, target, drafter, mode=scenario.drafting.mode, target_context=tc, draft_context=dc)
        except InvalidArgument as exc:  # beyond the exact enumeration's size limits
            return out, f"accepted-depth law skipped: {exc}", first
        depths = tree_run.accepted_depths[keys == key].numpy()
        expected = law.accepted_length_law().numpy()  # (D+1,)
        observed = np.bincount(depths, minlength=expected.shape[0])[: expected.shape[0]]
        res = stats.gof_test(
            observed, expected, name="accepted_length", family="acceptance", scenario=scenario.name,
            position=f"root=({tc},{dc})", alpha=alpha,
        )  # fmt: skip
        exp_len = float(law.expected_accepted_length())
        details = {**res.details, "expected_accepted_length": exp_len, "observed_accepted_length": float(depths.mean())}
        out.append(res.replace(details=details))
        if first is None:  # the most visited root context: its counts and exact law go to the report
            first = {"root": f"({tc},{dc})", "length_counts": observed.tolist(), "length_probs": expected.tolist()}
    return out, "", first


#: Why the edge-coin scenario cannot run on a plain protocol verifier (the reference's ``verify_tree`` too).
SKIP_NOTE = (
    "skipped: edge coins need a uniforms-in kernel (verify_tree.kernel). A plain verifier draws its own "
    "uniforms from the generator: a float64 uniform is exactly 0 with probability 2**-53 per draw, and no seed "
    "puts a 0 on a chosen test of an implementation whose draw order is its own, so the harness cannot reach "
    "the boundary u = 0. Audit the kernel wrapped by specverify.protocols.tree.uniforms_in to run it (the "
    "reference: uniforms_in(reference.tree_rules.verify_tree_coins))"
)


def _skipped(verify_tree, scenario: TreeScenario) -> bool:
    return scenario.edge_coins and getattr(verify_tree, "kernel", None) is None


def tree_scenario_results(
    scenario: TreeScenario, tree_run: TreeHarnessRun | None, error, *, alpha: float, seed: int, block_size=None
):
    """The tests of one tree scenario's (merged) run: ``(results, errors, summary)``."""
    if tree_run is None:
        message = error or f"{scenario.name}: no run"
        result = protocol_result(scenario.name, message, 0, method=PROTOCOL_METHOD, position="all")
        return [result], [message], {}
    target, drafter = scenario.build()
    results: list[TestResult] = [protocol_result(scenario.name, None, tree_run.run.num_calls, method=PROTOCOL_METHOD)]
    analysed = analyse_run(
        tree_run.run, target, drafter, scenario=scenario.name, alpha=alpha, seed=seed, block_size=block_size
    )
    if scenario.edge_coins:  # zero coins: only the exact tests are valid
        results += [r for r in analysed if r.family == "support"]
        note, first = "edge coins: support and protocol only", None
    else:
        results += analysed
        length_results, note, first = accepted_length_results(tree_run, scenario, target, drafter, alpha=alpha)
        results += length_results
    depths = tree_run.accepted_depths.double()
    summary: dict[str, Any] = {
        "rounds": int(depths.numel()),
        "mean_accepted_depth": float(depths.mean()),
        "tokens_per_target_pass": float(depths.mean()) + 1.0,
        "accepted_depth_counts": np.bincount(tree_run.accepted_depths.numpy()).tolist(),
        "num_nodes": tree_run.num_nodes,
    }
    if note:
        summary["note"] = note
    summary["acceptance"] = _acceptance_entry(tree_run, first)
    return results, [], summary


def _acceptance_entry(tree_run: TreeHarnessRun, first) -> dict:
    """The report's acceptance record: per depth observed vs exact rate, and the accepted-depth law."""
    run = tree_run.run
    positions = []
    for depth in range(1, run.k + 1):
        sel = run.trial_positions == depth
        n = int(sel.sum())
        if n:
            positions.append(
                {
                    "position": depth,
                    "observed_rate": float(run.trial_accepted[sel].double().mean()),
                    "expected_rate": float(run.trial_accept_probs[sel].mean()),
                    "n": n,
                }
            )
    entry: dict[str, Any] = {"positions": positions}
    if first is not None:
        entry.update(length_counts=first["length_counts"], length_probs=first["length_probs"], root=first["root"])
    return entry


def check_tree_verifier(
    verify_tree,
    *,
    tier: str = "smoke",
    seed: int = 0,
    alpha: float = 1e-3,
    scenarios=None,
    modes=None,
    progress=None,
    implementation: str | None = None,
    device=None,
    dtype=None,
    workers: int | None = None,
    backend: str | None = None,
    shards: int | None = None,
    ray_address: str | None = None,
    until_decisive: bool = False,
    gate_conformance: bool = False,
) -> Report:
    """Statistically audit a tree / multi-draft verifier; return a :class:`~specverify.core.results.Report`.

    Parameters
    ----------
    verify_tree : callable
        ``verify_tree(target_probs (B, N+1, V), draft_probs (B, N+1, V) | None, tokens (B, N),
        parents (B, N), *, mode, generator) -> (emitted (B, D+1), num_emitted (B,), path (B, D))``
        (see :mod:`specverify.protocols.tree`); it receives float32 probabilities.
    tier : {"smoke", "standard", "deep"}
    seed : int
        Root seed; each scenario's generator derives from (seed, scenario name).
    alpha : float
        Family-wise error rate of the whole run.
    scenarios : sequence of str, optional
        Run only these tree scenarios.
    modes : sequence of {"iid", "wor", "topk", "any"}, optional
        Run only scenarios whose children are drawn this way (for a verifier that supports
        only some sibling modes, e.g. EAGLE's top-k rule).
    progress : callable, optional
        Told as each group finishes, in emitted tokens, as for
        :func:`specverify.check_verifier` (:mod:`specverify.core.progress`).
    implementation : str, optional
        Name recorded in the report.
    device : str or torch.device, optional
        Where ``verify_tree`` runs (default the CPU); see
        :func:`~specverify.verifier.tree.harness.run_tree_harness`.
    dtype : torch.dtype or str, optional
        dtype of the probabilities handed in: float32 (default), bfloat16, float16.
    workers, backend, shards, ray_address, until_decisive : optional
        Sharded execution and anytime stopping, as in :func:`specverify.check_verifier`.
    gate_conformance : bool
        Make rule conformance (acceptance per depth and the accepted-depth law against the
        declared mode's rule) part of the verdict, as in :func:`specverify.check_verifier`.

    Returns
    -------
    Report
        ``kind="tree_verifier"``; per scenario in ``extra["trees"]`` the accepted-depth counts
        and tokens per target pass.
    """
    if not callable(verify_tree):
        raise InvalidArgument(f"verify_tree must be callable, got {verify_tree!r}")
    seed, alpha = check_run_options(tier, TIERS, seed, alpha, progress)
    gate = check_bool("gate_conformance", gate_conformance)
    dev, prob_dtype = check_device("device", device), check_prob_dtype("dtype", dtype)
    chosen = get_tree_scenarios(scenarios, modes=modes)
    if not chosen:
        raise InvalidArgument(f"no tree scenario matches scenarios={scenarios!r} and modes={modes!r}")
    parallel = Parallel(workers, backend, shards, ray_address, until_decisive=until_decisive)
    start = time.perf_counter()
    summaries = {s.name: {"note": SKIP_NOTE} for s in chosen if _skipped(verify_tree, s)}
    runnable = [s for s in chosen if s.name not in summaries]

    analyse = functools.partial(
        tree_scenario_results, alpha=alpha, seed=seed, block_size=declared_block_size(verify_tree)
    )

    outcome = run_battery(
        TreeRunner(verify_tree, seed, tuple(runnable), dev, prob_dtype), runnable, tier=tier, alpha=alpha,
        parallel=parallel, progress=progress, analyse=analyse,
    )  # fmt: skip
    graded, errors, timings = outcome.results, outcome.errors, outcome.timings
    summaries.update(outcome.summaries)
    summaries = {s.name: summaries[s.name] for s in chosen if s.name in summaries}
    verdict = stats.run_verdict(graded, errors, gate_conformance=gate)
    timings["total"] = time.perf_counter() - start
    name = implementation or callable_name(verify_tree)
    return Report(
        kind="tree_verifier",
        implementation=name,
        tier=tier,
        seed=seed,
        alpha=alpha,
        verdict=verdict,
        results=graded,
        errors=tuple(errors),
        scenarios=tuple(s.config(tier) for s in chosen),
        timings=timings,
        environment=environment(),
        extra={
            "trees": {name: {k: v for k, v in s.items() if k != "acceptance"} for name, s in summaries.items()},
            "acceptance": {name: s["acceptance"] for name, s in summaries.items() if s.get("acceptance")},
            "modes": sorted({s.drafting.mode for s in chosen}),
            **device_extra(dev, prob_dtype),
            **outcome.extra,
        },
        gate_conformance=gate,
    )


# The battery API of the pytest plugin (``pytest --specverify-tree-impl PKG.MOD:NAME`` uses this module).
def list_scenarios(tier: str = "smoke", *, greedy: bool = False) -> list[str]:
    """The tree scenario names (the same for every tier); there is no greedy tree battery."""
    if tier not in TIERS:
        raise InvalidArgument(f"tier must be one of {TIERS}, got {tier!r}")
    if greedy:
        raise InvalidArgument("the tree battery has no greedy mode")
    return [s.name for s in get_tree_scenarios()]


check_verifier = check_tree_verifier
