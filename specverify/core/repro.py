"""How to rerun a report: the Python snippet recorded by a run started from Python.

A report's ``command`` says how to reproduce it.  The command line records its own,
canonical ``specverify audit ...`` line (:mod:`specverify.cli.audit`).  A run started
from Python with plain objects has no ``PKG.MOD:NAME`` spec, so it records a Python
snippet instead (:func:`python_repro`), never a made-up command line: it imports every
object that can be imported back as the very same object (a module-level function or
instance) and marks the ones that cannot (an instance built in the caller's code, a
lambda) with ``...`` and what is known about them.  Snippets start with
:data:`PYTHON_MARK`, which is how renderers and tests tell them from command lines.
"""

from __future__ import annotations

import ast
from collections.abc import Mapping
from typing import Any

from specverify.core.loading import load_object

__all__ = ["PYTHON_MARK", "is_python_repro", "spec_of", "python_repro"]

#: First characters of every Python snippet recorded as a report's ``command``.
PYTHON_MARK = "# Python"


def is_python_repro(command: str) -> bool:
    """True when ``command`` is a Python snippet (not a shell command line)."""
    return isinstance(command, str) and command.startswith(PYTHON_MARK)


def spec_of(obj: Any) -> str | None:
    """``"module:qualname"`` when importing it gives back this very object, else None."""
    module, name = getattr(obj, "__module__", None), getattr(obj, "__qualname__", None)
    if not isinstance(module, str) or not isinstance(name, str) or "<" in name:
        return None
    try:
        found = load_object(f"{module}:{name}")
    except Exception:  # an unimportable module or a name that is not there: not a spec
        return None
    return f"{module}:{name}" if found is obj else None


def _literal(value: Any) -> str | None:
    """Python source that evaluates to ``value`` (tensors and arrays as nested lists), or None."""
    if hasattr(value, "tolist") and not isinstance(value, (int, float)):
        value = value.tolist()
    try:
        text = repr(value)
        return text if ast.literal_eval(text) == value else None
    except Exception:  # not a literal (or a repr/compare that raises): never break the run that records it
        return None


def _describe(obj: Any) -> str:
    """What is known about an object that cannot be imported back."""
    cls = spec_of(type(obj))
    if callable(obj) and getattr(obj, "__qualname__", None):
        where = getattr(obj, "__module__", "?")
        return f"{obj.__qualname__} defined in {where}: not importable, pass the same callable"
    if cls:
        return f"an instance of {cls}; its constructor arguments were not recorded"
    try:
        text = repr(obj)
    except Exception:  # a broken __repr__ must not break the run that records it
        text = f"an object of type {type(obj).__name__}"
    return (text[:77] + "...") if len(text) > 80 else text


def python_repro(function: str, positional: Mapping[str, Any], keywords: Mapping[str, Any] | None = None) -> str:
    """The snippet that reruns ``function(*positional, **keywords)`` from Python.

    Parameters
    ----------
    function : str
        ``"module:name"`` of the entry point, e.g. ``"specverify.verifier.battery:check_verifier"``.
    positional : mapping of str to object
        The positional arguments by name (the name becomes the snippet's variable); None
        values are skipped.
    keywords : mapping of str to object
        Keyword arguments; None values are skipped.  Literals (numbers, strings, lists,
        tensors as nested lists) are written out; other objects are imported when
        :func:`spec_of` finds them, else marked with ``...``.

    Returns
    -------
    str
        A snippet starting with :data:`PYTHON_MARK`; its first line says whether it reruns
        the report as it stands or names objects the caller must supply.
    """
    module, _, name = function.partition(":")
    imports, setup, args = [f"from {module} import {name}"], [], []
    complete = True
    items = [(k, v, True) for k, v in positional.items()] + [(k, v, False) for k, v in dict(keywords or {}).items()]
    for key, value, is_positional in items:
        if value is None:
            continue
        source = None if callable(value) else _literal(value)
        if source is None:
            spec = spec_of(value)
            if spec is not None:
                mod, _, attr = spec.partition(":")
                if "." in attr:
                    imports.append(f"import {mod}")
                    setup.append(f"{key} = {mod}.{attr}")
                else:
                    imports.append(f"from {mod} import {attr}" + (f" as {key}" if attr != key else ""))
            else:
                complete = False
                setup.append(f"{key} = ...  # {_describe(value)}")
            source = key
        args.append(source if is_positional else f"{key}={source}")
    head = f"{PYTHON_MARK}: this run was started from Python with plain objects (no PKG.MOD:NAME spec); " + (
        "this snippet reruns it." if complete else "supply the objects marked '...' as they were, then run:"
    )
    lines = [head, *dict.fromkeys(imports), *setup, f"report = {name}({', '.join(args)})"]
    return "\n".join(lines)
