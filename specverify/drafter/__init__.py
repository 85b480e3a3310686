"""Auditing a drafter: ``audit_drafter``, consistency, losslessness, acceptance and efficiency.

``battery`` (``audit_drafter``: orchestration and grading), ``consistency`` (do the drafted
tokens follow the q the drafter reports?), ``acceptance`` (acceptance per position against its
exact value, tokens per target pass, best K; the speedup model is
:mod:`specverify.measure.costmodel`).
"""

from __future__ import annotations

from specverify.core.lazy import lazy_getattr

_LAZY = {name: "specverify.drafter.battery" for name in ("audit_drafter", "AuditPlan", "AUDIT_PLANS", "DEFAULT_K")}

__all__ = list(_LAZY)

__getattr__ = lazy_getattr("specverify.drafter", _LAZY, globals())
