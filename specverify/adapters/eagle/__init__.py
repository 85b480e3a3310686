"""EAGLE's tree verification (``eagle.model.utils`` of eagle-llm): ``evaluate_posterior`` and the acceptance update.

``tree`` puts EAGLE-1's verification of a drafted tree behind the tree-verifier protocol
(:class:`EagleTreeVerifier`; without-replacement trees, temperature / top-k / top-p warpers,
greedy), converting with :mod:`specverify.adapters.layouts`.  Checked against eagle-llm 1.2.1
(``pip install --no-deps eagle-llm==1.2.1``); the reports are in ``reports/eagle``.
"""

from specverify.adapters.eagle.tree import (
    GREEDY_TEMPERATURE,
    INSTALL,
    EagleTreeVerifier,
    GreedyChainVerifier,
    greedy_tree_verifier,
    patched_evaluate_posterior,
    sampling_tree_verifier,
    seeded_global_rngs,
    wor_conditionals,
)

__all__ = [
    "EagleTreeVerifier",
    "GREEDY_TEMPERATURE",
    "GreedyChainVerifier",
    "INSTALL",
    "greedy_tree_verifier",
    "patched_evaluate_posterior",
    "sampling_tree_verifier",
    "seeded_global_rngs",
    "wor_conditionals",
]
