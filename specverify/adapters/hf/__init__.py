"""Hugging Face transformers: assisted generation, its ``_speculative_sampling`` kernel, exact targets.

Wraps transformers' ``generate(assistant_model=...)`` (:class:`HFAssistedDecoder`, a decoder),
``generation.candidate_generator._speculative_sampling`` (:class:`SpeculativeSamplingVerifier`,
a chain verifier) and a model's processed next-token conditionals (:class:`HFTarget`), on
tiny seeded Llamas (:mod:`specverify.adapters.fixtures.llama`).  Every other candidate generator
``generate`` can pick (assistant schedules, early exit, prompt lookup, different tokenizers, MTP,
DFlash, the Gemma 4 assistants) goes through :class:`HFGeneratorDecoder`
(:mod:`~specverify.adapters.hf.generators`) on the tiny models of
:mod:`~specverify.adapters.hf.catalog` (factories :func:`tiny_generator_decoder`,
:func:`tiny_generator_target`).  Checked against transformers 5.24.0 (``pip install -e ".[hf]"``);
the reports are in ``reports/hf-transformers``.
"""

from specverify.adapters.hf.assisted import (
    TRANSFORMERS_VERSION,
    HFAssistedDecoder,
    HFGreedyAssistedDecoder,
    HFTarget,
    sampling_processors,
    tiny_assisted_decoder,
    tiny_greedy_assisted_decoder,
    tiny_target,
)
from specverify.adapters.hf.catalog import GENERATORS, tiny_generator_decoder, tiny_generator_target
from specverify.adapters.hf.generators import GeneratorStats, HFGeneratorDecoder
from specverify.adapters.hf.kernel import SpeculativeSamplingVerifier, speculative_sampling_verifier

__all__ = [
    "GENERATORS",
    "GeneratorStats",
    "HFGeneratorDecoder",
    "tiny_generator_decoder",
    "tiny_generator_target",
    "HFAssistedDecoder",
    "HFGreedyAssistedDecoder",
    "HFTarget",
    "SpeculativeSamplingVerifier",
    "TRANSFORMERS_VERSION",
    "sampling_processors",
    "speculative_sampling_verifier",
    "tiny_assisted_decoder",
    "tiny_greedy_assisted_decoder",
    "tiny_target",
]
