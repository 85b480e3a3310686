"""llama.cpp through llama-cpp-python: ``Llama.generate`` with ``draft_model=`` as a decoder.

``decoder`` wraps ``llama_cpp.Llama.generate`` without a drafter (the control), with
``LlamaPromptLookupDecoding`` and with a draft ``Llama`` behind llama-cpp-python's
``LlamaDraftModel`` interface, on the tiny seeded Llamas written as GGUF offline
(:mod:`~specverify.adapters.llamacpp.gguf_model`), and gives the exact law from the same weights
with llama.cpp's sampler chain re-implemented in float64 (:mod:`~specverify.adapters.llamacpp.sampler_chain`:
temperature, top-k, top-p, min-p, repeat / frequency / presence penalties over the penalty window,
a grammar's allowed-token mask).  Checked against llama-cpp-python 0.3.36 (its own virtualenv: see
the README); the reports are in ``reports/llama-cpp``.  llama_cpp is imported inside functions.
"""

from specverify.adapters.llamacpp.decoder import (
    DRAFTERS,
    INSTALL,
    CountingDrafter,
    DraftModelDrafter,
    DraftStats,
    LlamaCppDecoder,
    LlamaCppTarget,
    engine_version,
    max_conditional_difference,
    sample_seeds,
    tiny_decoder,
    tiny_target,
    tokens_from_rows,
)
from specverify.adapters.llamacpp.sampler_chain import (
    DEFAULTS,
    WORD_GRAMMAR,
    CharGrammar,
    SamplerOptions,
    processed_probs,
    sampler_options,
)

__all__ = [
    "DEFAULTS",
    "DRAFTERS",
    "INSTALL",
    "WORD_GRAMMAR",
    "CharGrammar",
    "CountingDrafter",
    "DraftModelDrafter",
    "DraftStats",
    "LlamaCppDecoder",
    "LlamaCppTarget",
    "SamplerOptions",
    "engine_version",
    "max_conditional_difference",
    "processed_probs",
    "sample_seeds",
    "sampler_options",
    "tiny_decoder",
    "tiny_target",
    "tokens_from_rows",
]
