"""Tree / multi-draft verification: the protocol, engine layouts, exact laws.

``protocol`` (the tree-verifier protocol, input and output validation, uniforms-in
kernels), ``layouts`` (converters to and from SGLang's ``retrive_*`` linked lists and
EAGLE's ``retrieve_indices``), ``rules`` (sibling rules as the exact laws model them),
``exact`` (exact one-round and multi-round laws in float64) and ``law`` (their result
type, :class:`~specverify.verifier.tree.treelaw.TreeLaw`).  The reference rules live in
:mod:`reference.tree_rules`.  See issue 12.
"""

from __future__ import annotations

from specverify.protocols.tree import (
    MODES,
    PAD,
    ROOT,
    TreeBatch,
    TreeOutput,
    call_tree_verifier,
    check_tree_inputs,
    check_tree_output,
    children_table,
    draw_uniforms,
    node_depths,
    uniforms_in,
)

__all__ = [
    "MODES",
    "PAD",
    "ROOT",
    "TreeBatch",
    "TreeOutput",
    "call_tree_verifier",
    "check_tree_inputs",
    "check_tree_output",
    "children_table",
    "draw_uniforms",
    "node_depths",
    "uniforms_in",
]
