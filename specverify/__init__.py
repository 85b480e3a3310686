"""specverify: does this speculative-decoding implementation emit exactly its target's distribution?

Public entry points are imported lazily so that ``reference`` (which uses
``specverify.errors``) and the suite can import each other without cycles.
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

_LAZY = {
    "check_verifier": "specverify.battery",
    "check_greedy_verifier": "specverify.battery",
    "check_verifier_on": "specverify.battery",
    "list_scenarios": "specverify.battery",
    "check_decoder": "specverify.decoder_check",
    "audit_drafter": "specverify.drafter_audit",
    "Report": "specverify.results",
    "TestResult": "specverify.results",
    "write_report": "specverify.report",
    "load_report": "specverify.report",
    "SpecVerifyError": "specverify.errors",
    "InvalidArgument": "specverify.errors",
    "ImplementationError": "specverify.errors",
}

__all__ = ["__version__", *_LAZY]


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'specverify' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_LAZY))
