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
