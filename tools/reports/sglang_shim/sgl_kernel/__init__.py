"""An import shim named ``sgl_kernel`` for serving SGLang on a CPU without AVX-512 and AMX (not the real package).

SGLang 0.5.23 imports its CPU kernel package whenever ``SGLANG_USE_CPU_ENGINE=1``, even where it then
runs its torch-native paths; that package is built only for CPUs with AVX-512 and AMX and has no wheel
on PyPI.  With this directory on ``PYTHONPATH`` every ``from sgl_kernel import name`` succeeds and binds
a function that raises ``NotImplementedError`` naming the op when called: plain serving (no speculation)
calls none, and a configuration that needs one fails loudly with that op's name, never with a stand-in
result.  Its submodules (``sgl_kernel.speculative``, ...) do not exist: SGLang imports the optional
ones under ``except ImportError``, and one it needs fails with its name.  Used only by :mod:`tools.reports.sglang_served`.
"""

from __future__ import annotations

__version__ = "0+shim"


def _missing(module: str, name: str):
    def op(*args, **kwargs):
        raise NotImplementedError(f"{module}.{name} is an SGLang CPU kernel op: the sgl_kernel import shim has none")

    op.__name__ = name
    return op


def _module_getattr(module: str):
    def getattr_(name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        return _missing(module, name)

    return getattr_


__getattr__ = _module_getattr("sgl_kernel")

