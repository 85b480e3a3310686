"""Resolve ``PKG.MOD:NAME`` specifications to Python objects (no pickles are ever loaded)."""

from __future__ import annotations

import ast
import importlib
import importlib.util
import os
import sys
from collections.abc import Mapping
from typing import Any

from specverify.core.errors import InvalidArgument

__all__ = [
    "load_object",
    "parse_options",
    "put_on_import_path",
    "moved_module",
    "reference_alias",
    "MOVED_MODULES",
    "REFERENCE_PACKAGE",
]

#: Modules that moved (old name -> new name), named in the error of a spec that still uses the
#: old one (reports and scripts written before the move do).
MOVED_MODULES: dict[str, str | dict[str, str]] = {
    "specverify.plugin": "specverify.cli.plugin",
    "specverify.demo": "specverify.cli.demo",
    "specverify.examples.factories": "specverify.cli.factories",
    "specverify.examples.hf": "specverify.adapters.hf",
    "specverify.cli.examples.hf": "specverify.adapters.hf",
    "specverify.errors": "specverify.core.errors",
    "specverify.exact": "specverify.core.chain_laws",
    "specverify.core.exact": "specverify.core.chain_laws",
    "specverify.loading": "specverify.core.loading",
    "specverify.results": "specverify.core.results",
    "specverify.models": "specverify.core.tables",
    "specverify.validation": "specverify.core.validation",
    "specverify.decoder_check": "specverify.decoder",
    "specverify.pipeline": "specverify.decoder.pipeline",
    "specverify.drafter_audit": "specverify.drafter",
    "specverify.efficiency": "specverify.measure.costmodel",
    "specverify.drafter.costmodel": "specverify.measure.costmodel",
    "specverify.decoder_mutants": "specverify.mutants.decoder",
    "specverify.drafter_mutants": "specverify.mutants.drafter",
    "specverify.efficiency_limit": "specverify.selftest.lr_limit",
    "specverify.peers": "specverify.selftest.peers",
    "specverify.battery": "specverify.verifier.battery",
    "specverify.harness": "specverify.verifier.harness",
    "specverify.scenarios": "specverify.verifier.scenarios",
    "specverify.strategies": "specverify.verifier.strategies",
    "specverify.drafters": "specverify.verifier.zoo",
    "reference.sampling": "specverify.core.sampling",
    "specverify.verifier.protocol": "specverify.protocols.chain",
    "specverify.verifier.tree.protocol": "specverify.protocols.tree",
    "specverify.verifier.uniforms": "specverify.protocols.uniforms",
    "specverify.verifier.measure": "specverify.measure.chain",
    "specverify.verifier.tree.measure": "specverify.measure.tree",
    "specverify.decoder.measure": "specverify.measure.decoder",
    "specverify.verifier.sweep": "specverify.measure.sweep",
    "specverify.verifier.tree.exact": "specverify.verifier.tree.laws",
    "specverify.verifier.tree.layouts": "specverify.adapters.layouts",
    "specverify.adapters.hf_kernel": "specverify.adapters.hf",
    "specverify.adapters.hf_models": "specverify.adapters.fixtures.llama",
    "specverify.adapters.vllm_engine": "specverify.adapters.vllm",
    "specverify.adapters.vllm_eagle": "specverify.adapters.fixtures.eagle_head",
    "specverify.adapters.vllm_layout": "specverify.adapters.vllm.layout",
    "specverify.adapters.medusa_tree": "specverify.adapters.medusa",
    "specverify.drafter.audit": "specverify.drafter.battery",
    "specverify.shard.anytime": "specverify.verifier.anytime",
    "specverify.adapters.gpu_kernels": {
        "vllm_rejection_sample": "specverify.adapters.vllm",
        "*": "specverify.adapters.flashinfer",
    },
}


def moved_module(module_name: str, attr: str = "") -> str | None:
    """Where ``module_name`` (and its attribute ``attr``) moved, or None."""
    moved = MOVED_MODULES.get(module_name)
    if isinstance(moved, dict):
        return moved.get(attr.split(".")[0], moved.get("*"))
    return moved


#: The installed name of the repository's ``reference/`` directory (the reference implementations).
REFERENCE_PACKAGE = "specverify_reference"


def reference_alias(module_name: str) -> str:
    """``reference.X`` in a spec names ``specverify_reference.X``, unless a package ``reference`` of the user's own is importable.

    The repository's ``reference/`` directory installs as ``specverify_reference`` (a top-level
    ``reference`` could clash with a user's package).  Specs written ``reference.rules:verify`` --
    the README's, the recorded commands of reports -- keep working: from a checkout (where
    ``reference/`` is that same directory) and once installed.  A ``reference`` package that is
    not this one is the user's, and is used as it is.
    """
    if module_name != "reference" and not module_name.startswith("reference."):
        return module_name
    theirs = importlib.util.find_spec("reference")
    ours = importlib.util.find_spec(REFERENCE_PACKAGE)
    if ours is None:
        return module_name
    if theirs is not None:
        their_dirs = {os.path.realpath(p) for p in theirs.submodule_search_locations or ()}
        our_dirs = {os.path.realpath(p) for p in ours.submodule_search_locations or ()}
        if not their_dirs & our_dirs:
            return module_name  # the user's own package named reference
    return REFERENCE_PACKAGE + module_name[len("reference") :]


def put_on_import_path(directory: str | os.PathLike | None = None) -> None:
    """Put ``directory`` (default: the working directory) first on ``sys.path`` unless it is there.

    ``python -m`` and pytest's rootdir do the same, so ``mypkg/spec.py`` next to where the user
    runs ``specverify`` (or ``pytest -m specverify``) is importable as ``mypkg.spec``.
    """
    path = os.path.abspath(os.fspath(directory) if directory is not None else os.getcwd())
    if path not in (os.path.abspath(p or os.curdir) for p in sys.path):
        sys.path.insert(0, path)


def _not_found_hint(error: ImportError, module_name: str) -> str:
    """Where to put a package that was not found at all (not one that failed while importing)."""
    top = module_name.split(".")[0]
    if not isinstance(error, ModuleNotFoundError) or error.name != top:
        return ""
    return (
        f"; {top!r} is not on the import path: run from the directory that holds {top}/ (it is put on the path), "
        f"install it (pip install -e), or add its parent directory to PYTHONPATH"
    )


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
    written, module_name = module_name, reference_alias(module_name)
    try:
        obj = importlib.import_module(module_name)
    except ImportError as error:
        moved = moved_module(written, attr_path) or moved_module(module_name, attr_path)
        hint = f"; it is now {moved!r}: {moved}:{attr_path}" if moved else _not_found_hint(error, module_name)
        raise InvalidArgument(f"{argument}={spec!r}: cannot import module {module_name!r} ({error}){hint}") from error
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
