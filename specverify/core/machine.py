"""One line naming the machine a timing was taken on: CPU model, usable CPUs, load average.

Every runtime the suite writes down (the example-report index, the benchmarks) states it, so a
figure taken on a busy machine says so.
"""

from __future__ import annotations

import os
import platform
from pathlib import Path

__all__ = ["describe_machine"]


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def describe_machine() -> str:
    """``"AMD EPYC, 2 CPUs usable, load average 0.06"`` (the 1-minute load average, now)."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    load = f", load average {os.getloadavg()[0]:.2f}" if hasattr(os, "getloadavg") else ""
    return f"{_cpu_model()}, {cpus} CPUs usable{load}"
