"""specverify: does this speculative-decoding implementation emit exactly its target's distribution?

The public entry points, re-exported lazily: importing ``specverify`` (as ``reference`` and the
pytest plugin do, for ``specverify.core``) loads neither torch nor a battery.
"""

from __future__ import annotations

from specverify.core.lazy import lazy_getattr
from specverify.core.version import __version__

_LAZY = {
    "check_verifier": "specverify.verifier.battery",
    "check_greedy_verifier": "specverify.verifier.battery",
    "check_verifier_on": "specverify.verifier.battery",
    "list_scenarios": "specverify.verifier.listing",
    "check_decoder": "specverify.decoder",
    "audit_drafter": "specverify.drafter",
    "check_tree_verifier": "specverify.verifier.tree.battery",
    "measure_divergence": "specverify.measure.chain",
    "check_endpoint": "specverify.endpoint.checks",
    "Report": "specverify.core.results",
    "TestResult": "specverify.core.results",
    "write_report": "specverify.report",
    "load_report": "specverify.report",
    "SpecVerifyError": "specverify.core.errors",
    "InvalidArgument": "specverify.core.errors",
    "ImplementationError": "specverify.core.errors",
}

__all__ = ["__version__", *_LAZY]

__getattr__ = lazy_getattr("specverify", _LAZY, globals())


def __dir__():
    return sorted(set(globals()) | set(_LAZY))
