"""mistral.rs (PyPI ``mistralrs``) as a decoder, with the exact law of its sampler.

``decoder`` wraps ``mistralrs.Runner`` completions (float32 weights and, through
``MISTRALRS_CPU_KV_F32=1``, a float32 KV cache) on the tiny seeded Llama written as a
mistral.rs directory offline (:mod:`~specverify.adapters.mistralrs.model`), and gives the exact
law from the same weights with mistral.rs's CPU sampler re-implemented in float64
(:mod:`~specverify.adapters.mistralrs.sampler_chain`: penalties, temperature, top-k, top-p, min-p).
mistral.rs 0.9.5's only speculative path reachable from Python (an MTP assistant) needs
PagedAttention, which CPU builds lack: the decoder's ``assistant="draft"`` shows the refusal.
Checked against mistralrs 0.9.5 (its own virtualenv: see the README); the reports are in
``reports/mistralrs``.  mistralrs is imported inside functions.
"""

from specverify.adapters.mistralrs.decoder import (
    ASSISTANTS,
    INSTALL,
    KV_F32_ENV,
    MistralRsDecoder,
    MistralRsTarget,
    engine_raw_law,
    engine_version,
    max_conditional_difference,
    runner_probe,
    tiny_decoder,
    tiny_target,
    tokens_from_texts,
)
from specverify.adapters.mistralrs.model import PIECES, VOCAB_SIZE, ids_to_text, save_tiny_mistralrs, text_to_ids
from specverify.adapters.mistralrs.sampler_chain import DEFAULTS, SamplerOptions, processed_probs, sampler_options

__all__ = [
    "ASSISTANTS",
    "DEFAULTS",
    "INSTALL",
    "KV_F32_ENV",
    "PIECES",
    "VOCAB_SIZE",
    "MistralRsDecoder",
    "MistralRsTarget",
    "SamplerOptions",
    "engine_raw_law",
    "engine_version",
    "ids_to_text",
    "max_conditional_difference",
    "processed_probs",
    "runner_probe",
    "sampler_options",
    "save_tiny_mistralrs",
    "text_to_ids",
    "tiny_decoder",
    "tiny_target",
    "tokens_from_texts",
]
