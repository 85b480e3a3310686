"""Argument types and the parser of the ``specverify`` command: usage errors before any heavy import.

Every number the command takes is checked by its ``argparse`` type, so a negative seed, an alpha
outside (0, 1) or a zero worker count is one line on stderr within a fraction of a second
(torch, numpy and scipy are imported only once the arguments are known to be good).  A usage
error prints that one line and a hint to ``--help``, not the whole usage block.  The library's
own checks (:func:`specverify.core.validation.check_run_options`) still guard the Python API.
"""

from __future__ import annotations

import argparse
import math
import sys
from typing import NoReturn

__all__ = ["Parser", "nonnegative_float", "nonnegative_int", "positive_float", "positive_int", "probability"]


class Parser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose usage errors are one line and a hint to ``--help``."""

    def error(self, message: str) -> NoReturn:
        sys.stderr.write(f"{self.prog}: error: {message}\n")
        sys.stderr.write(f"  ('{self.prog} --help' lists the options)\n")
        sys.exit(2)


def _number(text: str, kind, what: str):
    try:
        value = kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be {what}, got {text!r}") from None
    return value


def nonnegative_int(text: str) -> int:
    """An integer >= 0 (seeds)."""
    value = _number(text, int, "an integer >= 0")
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be an integer >= 0, got {text!r}")
    return value


def positive_int(text: str) -> int:
    """An integer >= 1 (workers, shards, sample sizes, K)."""
    value = _number(text, int, "an integer >= 1")
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1, got {text!r}")
    return value


def positive_float(text: str) -> float:
    """A finite number > 0 (costs, parameter counts, bandwidths)."""
    value = _number(text, float, "a number > 0")
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"must be a finite number > 0, got {text!r}")
    return value


def nonnegative_float(text: str) -> float:
    """A finite number >= 0 (a drafter's cost relative to a target pass)."""
    value = _number(text, float, "a number >= 0")
    if not (math.isfinite(value) and value >= 0):
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0, got {text!r}")
    return value


def probability(text: str) -> float:
    """A number strictly between 0 and 1 (alpha, confidence levels)."""
    value = _number(text, float, "a number in (0, 1)")
    if not (0.0 < value < 1.0):
        raise argparse.ArgumentTypeError(f"must be a number in (0, 1), got {text!r}")
    return value
