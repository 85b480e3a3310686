"""Auditing a tree (multi-draft) verifier: ``check_tree_verifier`` and the exact tree laws.

``battery`` (``check_tree_verifier``), ``harness`` (drafted trees over table models, the
verifier driven round by round), ``drafting`` (how children are drawn: i.i.d., without
replacement, static and dynamic top-k, target-only), ``scenarios``, ``laws`` (exact
one-round and multi-round laws in float64), ``treelaw`` (their result type), ``sibling_rules``
(the sibling rules those laws model), ``chain`` (a tree verifier driven as a chain verifier).
The protocol is :mod:`specverify.protocols.tree`; the reference rules are
:mod:`reference.tree_rules`; engine layouts are :mod:`specverify.adapters.layouts`.
"""
