"""What every adapter around third-party code shares: torch's process-wide state, the model cache.

Engines and kernels read torch's global settings; an adapter changes them for the length of
one call and puts them back, so the suite's own runs are unaffected.  Tiny models written for
engines live under one cache directory (:func:`cache_root`).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

import torch

__all__ = ["torch_threads", "cache_root"]


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


def cache_root(root=None) -> Path:
    """Where tiny models are written: ``root``, else ``$SPECVERIFY_CACHE``, else ``~/.cache/specverify``."""
    return Path(root or os.environ.get("SPECVERIFY_CACHE", Path.home() / ".cache" / "specverify"))
