"""Detectable node TV of the tree battery, per tree scenario and tier.

Runs the reference tree verifier (:func:`reference.tree_rules.verify_tree`) through
``check_tree_verifier`` at the smoke tier, seed 0, and takes every node-level goodness-of-fit
test (``gof`` at ``node=(context)``: the law of the token emitted at a context node against
the target's row there).  Each such test reports ``mde_tv``, the binned TV it detects with
power 0.9 at its own share of the error budget (:func:`specverify.stats.min_detectable_tv`).

The standard tier is computed from the plan, not run: each node test's sample count is
scaled by the tier's number of batches over smoke's (``TreeScenario.num_groups``) and
``min_detectable_tv`` is evaluated at the smoke test's bins and alpha share.  At standard
more strata pass the minimum-count rule and the budget is split over more tests, so the
standard figures are slightly optimistic (an alpha share halved moves an mde by ~3-5%).
``--run-standard`` runs the standard tier instead (minutes).

Prints one Markdown table: scenario, node tests at smoke, median and worst ``mde_tv`` at
smoke and at standard.  Run: ``nice python benchmarks/bench_tree_detectable.py``.
"""

from __future__ import annotations

import argparse
import statistics

from specverify.stats import min_detectable_tv
from specverify.verifier.tree.battery import check_tree_verifier
from specverify.verifier.tree.scenarios import TREE_SCENARIOS
from specverify_reference.tree_rules import verify_tree


def node_tests(report, scenario: str) -> tuple[list, str]:
    """The node-level goodness-of-fit results of one scenario, and their stratum (``node`` or ``abs``).

    A positional table's context is the absolute position, so its node-level tests are the
    ``abs=`` strata.  One-bin tests (df 0) detect nothing and are left out.
    """
    ours = [r for r in report.results if r.scenario == scenario and r.name == "gof" and r.mde_tv is not None]
    ours = [r for r in ours if r.df and r.df >= 1]
    for stratum in ("node", "abs"):
        chosen = [r for r in ours if str(r.position).startswith(stratum + "=")]
        if chosen:
            return chosen, stratum
    return [], "-"


def planned(results, scale: float) -> list[float]:
    """``mde_tv`` of each test with its sample count scaled by ``scale`` (same bins, same alpha share)."""
    return [min_detectable_tv(r.n * scale, r.df, r.alpha, 0.9) for r in results]


def summary(values: list[float]) -> str:
    return f"{statistics.median(values):.3f} | {max(values):.3f}" if values else "- | -"


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--run-standard", action="store_true", help="run the standard tier instead of scaling smoke")
    args = parser.parse_args(argv)
    runnable = [s for s in TREE_SCENARIOS if not s.edge_coins]  # edge coins: support tests only
    names = [s.name for s in runnable]
    smoke = check_tree_verifier(verify_tree, tier="smoke", seed=args.seed, scenarios=names)
    standard = (
        check_tree_verifier(verify_tree, tier="standard", seed=args.seed, scenarios=names)
        if args.run_standard
        else None
    )
    how = "run" if args.run_standard else "planned"
    print(f"| scenario | rows (smoke) | node tests (smoke) | smoke median | smoke worst | standard median ({how}) "
          "| standard worst |")  # fmt: skip
    print("|---|---|---|---|---|---|---|")
    for s in runnable:
        tests, stratum = node_tests(smoke, s.name)
        if standard is not None:
            std = [r.mde_tv for r in node_tests(standard, s.name)[0]]
        else:
            std = planned(tests, s.num_groups("standard") / s.num_groups("smoke"))
        rows = s.batch_size * s.num_groups("smoke")
        print(f"| {s.name} | {rows} | {len(tests)} {stratum} | {summary([r.mde_tv for r in tests])} | {summary(std)} |")
    for s in TREE_SCENARIOS:
        if s.edge_coins:
            print(f"| {s.name} | {s.batch_size * s.num_groups('smoke')} | 0 (support only) | - | - | - | - |")


if __name__ == "__main__":
    main()
