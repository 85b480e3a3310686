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

from specverify.mutants.catalogue import CATALOGUE, by_name, entries, verifier_named
from specverify.mutants.entry import KINDS, SUBJECTS, CatalogueEntry

__all__ = ["CATALOGUE", "KINDS", "SUBJECTS", "CatalogueEntry", "by_name", "entries"]

#: ``specverify.mutants:<entry name>``: the entry's verifier (``specverify audit --verifier specverify.mutants:residual_is_p``).
__getattr__ = verifier_named
