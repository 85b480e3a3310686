"""The suite's version (the distribution ``specverify-suite``), recorded in every report's environment."""

from __future__ import annotations

__all__ = ["__version__"]

__version__ = "0.1.0"
