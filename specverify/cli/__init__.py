"""How users run the suite: the ``specverify`` command line and the pytest plugin.

``commands`` (argument parsing; ``audit``, ``measure``, ``selftest``, ``demo``), ``argtypes``
(the parser's argument types: usage errors before any heavy import), ``audit`` (building
implementations from ``PKG.MOD:NAME`` specs and options, running an audit, the canonical
command line each report records), ``measure``, ``plugin`` (the pytest11 plugin;
``plugin_settings``, ``plugin_messages``), ``factories`` (built-in implementations by
``PKG.MOD:NAME``), ``demo``.  ``console_main`` (the console script: ``main`` in a process tuned by
:mod:`specverify.core.allocator`) and ``main`` are imported on first use, so the
plugin loads without the command line.
"""

from __future__ import annotations

from specverify.core.lazy import lazy_getattr

_LAZY = {"main": "specverify.cli.commands", "console_main": "specverify.cli.commands"}

__all__ = list(_LAZY)

__getattr__ = lazy_getattr("specverify.cli", _LAZY, globals())
