"""Resolve ``PKG.MOD:NAME`` specifications to Python objects (no pickles are ever loaded)."""

from __future__ import annotations

import ast
import importlib
from collections.abc import Mapping
from typing import Any

from specverify.core.errors import InvalidArgument

__all__ = ["load_object", "parse_options"]


def load_object(spec: str, *, argument: str = "spec") -> Any:
    """Import ``module.path:attribute.path`` and return the attribute.

    Raises
    ------
    InvalidArgument
        If the spec is malformed, the module cannot be imported or the attribute is missing.
    """
    if not isinstance(spec, str) or spec.count(":") != 1:
        raise InvalidArgument(f"{argument} must look like 'package.module:name', got {spec!r}")
    module_name, attr_path = spec.split(":")
    if not module_name or not attr_path:
        raise InvalidArgument(f"{argument} must look like 'package.module:name', got {spec!r}")
    try:
        obj = importlib.import_module(module_name)
    except ImportError as error:
        raise InvalidArgument(f"{argument}={spec!r}: cannot import module {module_name!r} ({error})") from error
    for part in attr_path.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise InvalidArgument(f"{argument}={spec!r}: {module_name!r} has no attribute {attr_path!r}") from None
    return obj


def parse_options(pairs: list[str] | None, *, argument: str = "--option") -> Mapping[str, Any]:
    """Parse ``KEY=VALUE`` strings; values are Python literals (``3``, ``0.7``, ``None``, ``'x'``) or plain strings."""
    options: dict[str, Any] = {}
    for pair in pairs or ():
        key, sep, text = pair.partition("=")
        if not sep or not key.isidentifier():
            raise InvalidArgument(f"{argument} must look like KEY=VALUE, got {pair!r}")
        try:
            options[key] = ast.literal_eval(text)
        except (ValueError, SyntaxError):
            options[key] = text
    return options
