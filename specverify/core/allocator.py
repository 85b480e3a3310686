"""Large temporaries reused, not mapped afresh: glibc's malloc thresholds for the ``specverify`` command.

At a real vocabulary an audit makes and frees (rows, V) float64 blocks of 30-170 MB many times
(a decoding chunk's logits and laws, a block of teacher-forced conditionals, their checks).
glibc serves an allocation above its mmap threshold (adjusted at run time, at most 32 MiB by
default) with a fresh mapping and unmaps it on free, so every block costs a page fault and a
kernel-zeroed page per 4 KiB when first written, and those costs grow with the block count,
which grows with V at a fixed entry budget.  Measured on a 2-core AMD EPYC (glibc 2.36): the exact
analysis of 500 x 8 tokens at V = 262,144 took 82-86 s with the defaults and 49-51 s with the
thresholds raised, the same p-values, peak resident memory 0.78 GB -> 0.92-1.05 GB.

:func:`reuse_large_blocks` raises the mmap and trim thresholds to :data:`THRESHOLD_BYTES` with
``mallopt``, so a freed block stays in the heap for the next one (the process keeps its peak
until it exits).  It is process-wide, so only the command line calls it
(:func:`specverify.cli.commands.console_main`); the library and the pytest plugin run inside the
user's process and never do.  Skipped where the C library has no glibc ``mallopt`` and where the
user set glibc's own ``MALLOC_MMAP_THRESHOLD_`` or ``MALLOC_TRIM_THRESHOLD_``.
"""

from __future__ import annotations

import ctypes
import os
import sys

__all__ = ["THRESHOLD_BYTES", "reuse_large_blocks"]

#: Allocations below this come from the heap and freed memory below it is kept (1 GiB).
THRESHOLD_BYTES = 1 << 30
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameters


def reuse_large_blocks() -> bool:
    """Raise glibc's mmap and trim thresholds (see the module docstring); whether both were set."""
    if not sys.platform.startswith("linux") or {"MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_"} & set(os.environ):
        return False
    try:
        libc = ctypes.CDLL(None)
        mallopt = libc.mallopt
        if not hasattr(libc, "gnu_get_libc_version"):  # glibc only: musl's mallopt accepts and ignores these
            return False
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    return bool(mallopt(_M_MMAP_THRESHOLD, THRESHOLD_BYTES)) and bool(mallopt(_M_TRIM_THRESHOLD, THRESHOLD_BYTES))
