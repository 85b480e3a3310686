"""Exception hierarchy of specverify.

``InvalidArgument`` is raised at public boundaries for bad input (it names the
argument and its value); ``ImplementationError`` describes an implementation
under test that misbehaved (raised, returned bad shapes or out-of-vocabulary
tokens, was not deterministic for a fixed seed).  Both derive from
``SpecVerifyError`` so callers can catch everything the suite raises at once.
"""

from __future__ import annotations

__all__ = ["SpecVerifyError", "InvalidArgument", "ImplementationError"]


class SpecVerifyError(Exception):
    """Base class of every error raised by specverify."""


class InvalidArgument(SpecVerifyError, ValueError):
    """A public function was called with an invalid argument."""


class ImplementationError(SpecVerifyError):
    """The implementation under test violated its protocol.

    Parameters
    ----------
    message : str
        What was violated, observed vs expected.
    row : int, optional
        The offending batch row, when one can be named.
    """

    def __init__(self, message: str, *, row: int | None = None):
        super().__init__(message)
        self.row = row


def raised(call: str, error: BaseException) -> ImplementationError:
    """The :class:`ImplementationError` for ``call`` (what the suite called) having raised ``error``.

    The message names the exception and where it was raised: the innermost frame outside
    torch, numpy, scipy, specverify and the standard library (the implementation's own line,
    rather than the operator it called), as a path relative to the import root that holds it, e.g.
    ``"verifier raised ValueError: bad shape (at mypkg/spec.py:12, in verify)"``.
    """
    where = raised_at(error)
    return ImplementationError(f"{call} raised {type(error).__name__}: {error}{f' (at {where})' if where else ''}")


def raised_at(error: BaseException) -> str:
    """``"mypkg/spec.py:12, in verify"`` for the frame that raised ``error`` (see :func:`raised`); "" if unknown."""
    import os
    import sys
    import traceback

    frames = traceback.extract_tb(error.__traceback__)
    if not frames:
        return ""
    skip = [os.path.dirname(os.__file__)]  # the standard library
    for name in ("torch", "numpy", "scipy", "specverify"):
        file = getattr(sys.modules.get(name), "__file__", None)
        if file:
            skip.append(os.path.dirname(os.path.abspath(file)))
    own = [f for f in frames if not any(os.path.abspath(f.filename).startswith(d + os.sep) for d in skip)]
    if not own:  # raised inside the suite's own checks or a library: the message says what
        return ""
    frame = own[-1]
    return f"{_import_path(frame.filename)}:{frame.lineno}, in {frame.name}"


def _import_path(filename: str) -> str:
    """``filename`` relative to the longest ``sys.path`` entry holding it (the same on every machine)."""
    import os
    import sys

    path = os.path.abspath(filename)
    roots = sorted((os.path.abspath(p or os.curdir) for p in sys.path), key=len, reverse=True)
    for root in roots:
        if path.startswith(root.rstrip(os.sep) + os.sep):
            return os.path.relpath(path, root).replace(os.sep, "/")
    return os.path.basename(path)
