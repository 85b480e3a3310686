"""Adapters that put third-party speculative-decoding implementations under test.

Each submodule wraps one framework behind the protocols of ``docs/design.md``
(verifier, drafter, target, decoder) and imports that framework itself, so
``import specverify.adapters`` never needs an optional dependency:

* :mod:`specverify.adapters.hf` -- Hugging Face transformers (extra ``hf``):
  ``_speculative_sampling`` as a verifier, ``generate(assistant_model=...)`` as a
  decoder, a model's processed conditionals as a target, tiny offline models.
"""

__all__: list[str] = []
