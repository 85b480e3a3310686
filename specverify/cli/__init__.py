"""How users run the suite: the ``specverify`` command line and the pytest plugin.

``commands`` (argument parsing, ``audit`` / ``selftest`` / ``examples`` / ``demo``),
``audit`` (building implementations from ``PKG.MOD:NAME`` specs and options, running an
audit, the canonical command line each report records), ``plugin`` (the pytest11 plugin;
``plugin_settings``, ``plugin_messages``), ``factories`` (built-in implementations by
``PKG.MOD:NAME``), ``examples`` (the example-report generator), ``demo``.
"""

from __future__ import annotations


def main(argv=None) -> int:
    """The ``specverify`` console script (see :mod:`specverify.cli.commands`)."""
    from specverify.cli.commands import main as _main

    return _main(argv)
