"""What the command line prints for a report: its summary and the sections of its kind.

:meth:`Report.summary <specverify.core.results.Report.summary>` says what every report says
(verdict, errors once each, flagged tests, detectability); a drafter audit adds the answer to
its efficiency question (tokens per target pass, speedup, best K, latency:
:func:`specverify.report.drafter.terminal_lines`).
"""

from __future__ import annotations

from specverify.core.results import Report
from specverify.report.drafter import terminal_lines

__all__ = ["terminal_summary"]


def terminal_summary(report: Report) -> str:
    """``report.summary()`` and, for a drafter audit with an efficiency section, its answer."""
    return "\n".join([report.summary(), *terminal_lines(report)])
