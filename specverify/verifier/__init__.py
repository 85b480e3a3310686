"""Auditing a chain verifier kernel: ``check_verifier`` and what drives it.

``battery`` (``check_verifier``, grading), ``harness`` (drives a verifier over table
models and collects counts), ``scenarios`` (the scenario catalogue and tiers), ``zoo``
(the drafter zoo, adversarial drafters included), ``strategies`` (hypothesis strategies
over table models and drafters).
"""

from __future__ import annotations

import importlib

_LAZY = {
    name: "specverify.verifier.battery"
    for name in ("check_verifier", "check_greedy_verifier", "check_verifier_on", "list_scenarios")
}

__all__ = list(_LAZY)


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'specverify.verifier' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
