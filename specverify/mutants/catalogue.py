"""The catalogue: every entry of the subjects' modules, checked and made picklable; lookups by kind and name."""

from __future__ import annotations

from specverify.core.errors import InvalidArgument
from specverify.mutants.entry import KINDS, SUBJECTS, CatalogueEntry

__all__ = ["CATALOGUE", "by_name", "entries", "verifier_named"]


def _build() -> tuple[CatalogueEntry, ...]:
    from specverify.mutants.decoder import ENTRIES as decoder_entries
    from specverify.mutants.drafter import ENTRIES as drafter_entries
    from specverify.mutants.rows import ENTRIES as row_entries
    from specverify.mutants.tree import ENTRIES as tree_entries
    from specverify.mutants.uniforms import ENTRIES as uniforms_entries
    from specverify.mutants.verifier import ENTRIES as verifier_entries

    chain = tuple(verifier_entries) + tuple(uniforms_entries) + tuple(row_entries)
    chain = tuple(e for e in chain if e.lossy) + tuple(e for e in chain if not e.lossy)  # mutants first
    entries_ = chain + tuple(drafter_entries) + tuple(decoder_entries) + tuple(tree_entries)
    names = [e.name for e in entries_]
    duplicated = sorted({n for n in names if names.count(n) > 1})
    if duplicated:
        raise RuntimeError(f"duplicate catalogue names: {duplicated}")
    _importable(entries_)
    return entries_


def _importable(entries_) -> None:
    """Make every entry function pickle by reference, in any fresh interpreter.

    A function pickles as ``(module, qualname)``.  Written-out functions already resolve
    that way; generated ones (named after their entry) are registered here as attributes of
    this module and given it as ``__module__``, and unpickling imports this module, whose
    import rebuilds the same catalogue (sharded runs send implementations to workers this
    way: :mod:`specverify.shard`).
    """
    import importlib
    import sys

    here = sys.modules[__name__]
    for entry in entries_:
        fn = entry.fn
        try:
            module = importlib.import_module(fn.__module__)
            resolved = getattr(module, fn.__qualname__, None)
        except (AttributeError, ImportError, TypeError):
            resolved = None
        if resolved is fn:
            continue
        if not entry.name.isidentifier() or getattr(here, entry.name, fn) is not fn:
            raise RuntimeError(f"catalogue entry {entry.name!r} cannot be registered in {__name__}")
        fn.__module__, fn.__qualname__ = __name__, entry.name
        setattr(here, entry.name, fn)


CATALOGUE: tuple[CatalogueEntry, ...] = _build()


def entries(kind: str | None = None, *, subject: str | None = None) -> tuple[CatalogueEntry, ...]:
    """The catalogue entries of one kind and/or one subject (all when both are None)."""
    if kind is not None and kind not in KINDS:
        raise InvalidArgument(f"kind must be one of {KINDS} or None, got {kind!r}")
    if subject is not None and subject not in SUBJECTS:
        raise InvalidArgument(f"subject must be one of {tuple(SUBJECTS)} or None, got {subject!r}")
    return tuple(e for e in CATALOGUE if (kind is None or e.kind == kind) and (subject is None or e.subject == subject))


def by_name(name: str) -> CatalogueEntry:
    """The entry called ``name``."""
    for entry in CATALOGUE:
        if entry.name == name:
            return entry
    raise InvalidArgument(f"name {name!r} is not in the catalogue; known: {[e.name for e in CATALOGUE]}")


def verifier_named(name: str):
    """``specverify.mutants:<entry name>`` resolves to the entry's verifier, for the CLI and plugin.

    e.g. ``specverify audit --verifier specverify.mutants:residual_is_p``.
    """
    for entry in CATALOGUE:
        if entry.name == name and entry.subject in ("verifier", "tree"):
            return entry.fn
    raise AttributeError(f"module 'specverify.mutants' has no attribute {name!r}")
