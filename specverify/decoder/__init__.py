"""Auditing a whole decoder: ``check_decoder`` and the protocol decoder.

``battery`` (``check_decoder``: tiers, orchestration, grading), ``protocol`` (driving a
decoder and a target under test, output validation, seeds and prompts), ``exact`` (the
exact-conditional battery), ``twosample`` (the two-sample battery against direct target
sampling), ``pipeline`` (``ProtocolDecoder``: a speculative decoder assembled from a
drafter, a target and a verifier, used to audit drafters end to end).
"""

from __future__ import annotations

from specverify.core.lazy import lazy_getattr

_LAZY = {name: "specverify.decoder.battery" for name in ("check_decoder", "TierPlan", "TIER_PLANS")}

__all__ = list(_LAZY)

__getattr__ = lazy_getattr("specverify.decoder", _LAZY, globals())
