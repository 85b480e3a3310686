"""What every adapter around third-party code needs from torch's process-wide state.

Engines and kernels read torch's global settings; an adapter changes them for the length of
one call and puts them back, so the suite's own runs are unaffected.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

__all__ = ["torch_threads"]


@contextlib.contextmanager
def torch_threads(num_threads: int | None) -> Iterator[None]:
    """Temporarily set torch's intra-op thread count (None: leave it alone)."""
    if num_threads is None:
        yield
        return
    old = torch.get_num_threads()
    torch.set_num_threads(num_threads)
    try:
        yield
    finally:
        torch.set_num_threads(old)
