"""The mutation catalogue: deliberately wrong implementations and correct-but-different ones.

One catalogue, one entry type, for every subject the suite audits.  The suite tests
itself with it (``specverify selftest``): a *mutant* (kind ``"verifier"``,
``"drafter"`` or ``"decoder"``) is a lossy implementation that must be caught on a
scenario matching its ``needs``; an *equivalent* (kind ``"equivalent"``,
``"drafter_equivalent"`` or ``"decoder_equivalent"``) is correct but written
differently (or honest but slower) and must pass.  Entries mirror bugs engines
really shipped (``provenance``; see ``docs/bugs.md``).

Modules: ``steps`` (the chain rule factored into parametrised steps), ``verifier``
(verifier entries composed from them), ``uniforms`` (uniforms-in chain kernels), ``drafter`` (drafters whose reported q is not
the law they sample), ``decoder`` (reference-decoder subclasses with integration
bugs).  ``CATALOGUE`` is their concatenation; :func:`entries` selects by kind or
subject, :func:`by_name` finds one entry, and ``specverify.mutants:NAME`` resolves a
verifier entry to its verifier for the CLI and the plugin.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from specverify.core.errors import InvalidArgument

__all__ = ["CATALOGUE", "KINDS", "SUBJECTS", "CatalogueEntry", "by_name", "entries"]

SUBJECTS: dict[str, tuple[str, str]] = {  # subject -> (mutant kind, equivalent kind)
    "verifier": ("verifier", "equivalent"),
    "drafter": ("drafter", "drafter_equivalent"),
    "decoder": ("decoder", "decoder_equivalent"),
    "tree": ("tree_verifier", "tree_equivalent"),
}
KINDS = tuple(kind for pair in SUBJECTS.values() for kind in pair)


@dataclass(frozen=True)
class CatalogueEntry:
    """One catalogued implementation.

    Attributes
    ----------
    name : str
        Unique identifier (snake_case).
    kind : str
        One of :data:`KINDS`: ``"verifier"`` / ``"drafter"`` / ``"decoder"`` for a lossy
        mutant of that subject, ``"equivalent"`` / ``"drafter_equivalent"`` /
        ``"decoder_equivalent"`` for a correct (or honest) variant.
    fn : callable
        Verifiers: the verifier, ``fn(target_probs, draft_probs, draft_tokens, *,
        generator) -> (tokens, num_emitted)``.  Drafters: a factory
        ``fn(target: TableModel, **options) -> drafter``.  Decoders: a class
        ``fn(target, drafter, *, k, sampling, **options) -> decoder``.  :meth:`build`
        calls it with ``config`` filled in.
    description : str
        The rule it implements, and for a mutant what is wrong with it.
    provenance : str
        The issue / PR / code base the entry mirrors, or ``"classic"`` / ``"specverify"``.
        A mutant whose provenance does not start with ``"specverify"`` (one of the suite's
        own bug classes) must have a row in ``docs/bugs.md`` (``tests/test_docs.py``).
    needs : str
        Mutants: the scenario that makes the loss visible (empty for equivalents).
    requires : str
        Equivalents: the scenarios on which the variant is correct (empty: any).  Tree
        entries: the tree scenarios on which the entry's base rule is lossless.
    caught_by : str
        Drafters: the consistency test expected to catch the mutant.
    config : object
        Decoders: the sampling configuration under which the bug changes the law.
    """

    name: str
    kind: str
    fn: Callable
    description: str
    provenance: str
    needs: str = ""
    requires: str = ""
    caught_by: str = ""
    config: Any = None

    def __post_init__(self):
        if self.kind not in KINDS:
            raise InvalidArgument(f"kind must be one of {KINDS}, got {self.kind!r}")

    @property
    def subject(self) -> str:
        """``"verifier"``, ``"drafter"`` or ``"decoder"``."""
        return next(s for s, pair in SUBJECTS.items() if self.kind in pair)

    @property
    def lossy(self) -> bool:
        """True for a mutant (must be caught), False for an equivalent (must pass)."""
        return self.kind == SUBJECTS[self.subject][0]

    def build(self, *args: Any, **options: Any) -> Any:
        """The drafter or decoder of this entry (``config`` as ``sampling`` unless given)."""
        if self.subject in ("verifier", "tree"):
            raise InvalidArgument(f"entry {self.name!r} is a verifier: call entry.fn, there is nothing to build")
        if self.subject == "decoder":
            options.setdefault("sampling", self.config)
        return self.fn(*args, **options)


def _build() -> tuple[CatalogueEntry, ...]:
    from specverify.mutants.decoder import ENTRIES as decoder_entries
    from specverify.mutants.drafter import ENTRIES as drafter_entries
    from specverify.mutants.tree import ENTRIES as tree_entries
    from specverify.mutants.uniforms import ENTRIES as uniforms_entries
    from specverify.mutants.verifier import ENTRIES as verifier_entries

    chain = tuple(verifier_entries) + tuple(uniforms_entries)
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


def __getattr__(name: str):
    """``specverify.mutants:<entry name>`` resolves to the entry's verifier, for the CLI and plugin.

    e.g. ``specverify audit --verifier specverify.mutants:residual_is_p``.
    """
    for entry in CATALOGUE:
        if entry.name == name and entry.subject in ("verifier", "tree"):
            return entry.fn
    raise AttributeError(f"module 'specverify.mutants' has no attribute {name!r}")
