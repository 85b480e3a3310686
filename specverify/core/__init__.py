"""Shared ground every room of the suite stands on.

``errors`` (the exception hierarchy), ``validation`` (argument checks at public
boundaries), ``loading`` (``PKG.MOD:NAME`` specs and ``KEY=VALUE`` options),
``results`` (the frozen result dataclasses and ``Report``), ``tables`` (table models
with exact conditionals) and ``exact`` (exact output laws of the rule in float64).
Nothing here imports from the subject folders (``verifier``, ``decoder``, ``drafter``)
or from ``selftest``, ``report`` or ``cli``.
"""
