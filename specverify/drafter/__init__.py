"""Auditing a drafter: ``audit_drafter``, consistency, acceptance and the speedup cost model.

``audit`` (``audit_drafter``: orchestration and grading), ``consistency`` (do the drafted
tokens follow the q the drafter reports?), ``acceptance`` (acceptance per position
against its exact value, tokens per target pass, best K), ``costmodel`` (the
speedup / memory-bound latency model of Leviathan et al.).
"""

from __future__ import annotations

import importlib

_LAZY = {name: "specverify.drafter.audit" for name in ("audit_drafter", "AuditPlan", "AUDIT_PLANS", "DEFAULT_K")}

__all__ = list(_LAZY)


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'specverify.drafter' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
