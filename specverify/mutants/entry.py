"""A catalogue entry: one deliberately wrong (or correct-but-different) implementation, with provenance."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from specverify.core.errors import InvalidArgument

__all__ = ["KINDS", "SUBJECTS", "CatalogueEntry"]

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
