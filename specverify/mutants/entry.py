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
    tokens_to_detect : int
        Mutants whose effect is below the smoke tier's detectable deviation: a measured lower
        bound on the emitted tokens the battery needs to kill them -- the largest run of their
        witness scenario (the smoke battery, rows doubled, seed 0, alpha 1e-3) that did not kill
        them; 0 for a mutant the smoke tier must kill.  The selftest runs such a mutant, reports
        it, and expects a kill only from a run of more than this many tokens.
    effect : str
        The validated effect of a ``tokens_to_detect`` mutant (exact, or measured by a large-sample
        direct test) and how ``tokens_to_detect`` was measured.
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
    tokens_to_detect: int = 0
    effect: str = ""

    def __post_init__(self):
        if self.kind not in KINDS:
            raise InvalidArgument(f"kind must be one of {KINDS}, got {self.kind!r}")
        if self.tokens_to_detect < 0 or (self.tokens_to_detect > 0) != bool(self.effect):
            raise InvalidArgument(
                f"entry {self.name!r}: tokens_to_detect (got {self.tokens_to_detect}) must be >= 0, and > 0 exactly "
                "when effect states the validated effect"
            )

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
