"""Lazy public names: a package exposes names of its submodules without importing them up front.

``import specverify`` (and the pytest plugin's start-up) stays cheap, and ``reference`` can
import ``specverify.core`` without pulling the batteries in.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["lazy_getattr"]


def lazy_getattr(package: str, exports: Mapping[str, str], namespace: dict[str, Any]) -> Callable[[str], Any]:
    """A module ``__getattr__`` resolving ``exports[name]`` (a module path) on first access.

    The value is cached in ``namespace`` (the package's ``globals()``) so later lookups are plain.
    """

    def __getattr__(name: str) -> Any:
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        namespace[name] = value
        return value

    return __getattr__
