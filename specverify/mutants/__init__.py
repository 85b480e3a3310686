"""The mutation catalogue: deliberately wrong implementations and correct-but-different ones.

The suite tests itself with it (``specverify selftest``): every entry of kind
``"verifier"`` is a lossy verifier that must be caught on a scenario matching its
``needs``; every entry of kind ``"equivalent"`` is a correct verifier written
differently that must pass on the scenarios its ``requires`` allows.  Entries mirror
bugs engines really shipped (``provenance``; see ``shared/bugs.md``).

Modules: ``steps`` (the chain rule factored into parametrised steps) and ``verifier``
(the verifier entries composed from them).  Drafter and decoder mutants may be added as
further modules; ``CATALOGUE`` is the concatenation.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from specverify.core.errors import InvalidArgument

__all__ = ["CatalogueEntry", "CATALOGUE", "by_name", "entries"]

KINDS = ("verifier", "equivalent")


@dataclass(frozen=True)
class CatalogueEntry:
    """One catalogued implementation.

    Attributes
    ----------
    name : str
        Unique identifier (snake_case).
    kind : str
        ``"verifier"`` (a lossy mutant of the verifier protocol) or ``"equivalent"``
        (a correct verifier that differs from the reference in form).
    fn : callable
        ``fn(target_probs, draft_probs, draft_tokens, *, generator) -> (tokens, num_emitted)``.
    description : str
        The rule it implements, and for a mutant what is wrong with it.
    provenance : str
        The issue / PR / code base the entry mirrors, or ``"classic"`` / ``"specverify"``.
    needs : str
        Mutants: the scenario that makes the loss visible (empty for equivalents).
    requires : str
        Equivalents: the scenarios on which the variant is correct (empty: any).
    """

    name: str
    kind: str
    fn: Callable
    description: str
    provenance: str
    needs: str = ""
    requires: str = ""

    def __post_init__(self):
        if self.kind not in KINDS:
            raise InvalidArgument(f"kind must be one of {KINDS}, got {self.kind!r}")


def _build() -> tuple[CatalogueEntry, ...]:
    from specverify.mutants.verifier import ENTRIES as verifier_entries

    entries_ = tuple(verifier_entries)
    names = [e.name for e in entries_]
    duplicated = sorted({n for n in names if names.count(n) > 1})
    if duplicated:
        raise RuntimeError(f"duplicate catalogue names: {duplicated}")
    return entries_


CATALOGUE: tuple[CatalogueEntry, ...] = _build()


def entries(kind: str | None = None) -> tuple[CatalogueEntry, ...]:
    """The catalogue entries of one kind (all when ``kind`` is None)."""
    if kind is not None and kind not in KINDS:
        raise InvalidArgument(f"kind must be one of {KINDS} or None, got {kind!r}")
    return tuple(e for e in CATALOGUE if kind is None or e.kind == kind)


def by_name(name: str) -> CatalogueEntry:
    """The entry called ``name``."""
    for entry in CATALOGUE:
        if entry.name == name:
            return entry
    raise InvalidArgument(f"name {name!r} is not in the catalogue; known: {[e.name for e in CATALOGUE]}")


def __getattr__(name: str):
    """``specverify.mutants:<entry name>`` resolves to the entry's verifier, for the CLI and plugin.

    e.g. ``specverify audit --verifier specverify.mutants:residual_is_p``.
    """
    for entry in CATALOGUE:
        if entry.name == name:
            return entry.fn
    raise AttributeError(f"module 'specverify.mutants' has no attribute {name!r}")
