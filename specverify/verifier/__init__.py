"""Auditing a chain verifier kernel: ``check_verifier`` and what drives it.

``battery`` (``check_verifier``, grading), ``harness`` (drives a verifier over table
models and collects counts), ``scenarios`` (the scenario catalogue and tiers), ``zoo``
(the drafter zoo, adversarial drafters included), ``strategies`` (hypothesis strategies
over table models and drafters).
"""

from __future__ import annotations

from specverify.core.lazy import lazy_getattr

_LAZY = {
    name: "specverify.verifier.battery"
    for name in ("check_verifier", "check_greedy_verifier", "check_verifier_on", "list_scenarios")
}

__all__ = list(_LAZY)

__getattr__ = lazy_getattr("specverify.verifier", _LAZY, globals())
