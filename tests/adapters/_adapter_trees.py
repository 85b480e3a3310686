"""The hand-built tree of the tree-adapter tests (``test_eagle.py``, ``test_medusa_tree.py``).

pytest puts ``tests/adapters`` on ``sys.path`` for the tests here, so they import it as
``from _adapter_trees import TREE`` (not ``_trees``: ``tests/tree/_trees.py`` has that name).
"""

from __future__ import annotations

import torch

from specverify.protocols.tree import PAD

__all__ = ["TREE"]

#: Parents (N=7,): root -> nodes 0, 1, 2; node 0 -> nodes 3, 4; node 1 -> node 5; node 6 padding.
TREE = torch.tensor([-1, -1, -1, 0, 0, 1, PAD])
