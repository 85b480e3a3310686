"""Medusa's typical acceptance (``medusa.model.utils.evaluate_posterior``), lossy by design, measured.

``chain`` puts it behind the chain-verifier protocol (with its declared typical law, so
``specverify measure`` grades conformance), ``tree`` behind the tree-verifier protocol on the
protocol's trees laid out as Medusa's candidate paths.  Checked against medusa-llm 0.1 (its
only PyPI release; ``pip install --no-deps medusa-llm==0.1``); the reports are in ``reports/lossy``.
"""

from specverify.adapters.medusa.chain import (
    ENTROPY_OFFSET,
    INSTALL,
    MedusaTypicalVerifier,
    greedy_declared_law,
    next_tokens,
    typical_verifier,
)
from specverify.adapters.medusa.tree import MedusaTreeVerifier, typical_tree_verifier

__all__ = [
    "ENTROPY_OFFSET",
    "INSTALL",
    "MedusaTreeVerifier",
    "MedusaTypicalVerifier",
    "greedy_declared_law",
    "next_tokens",
    "typical_tree_verifier",
    "typical_verifier",
]
