"""ONNX Runtime GenAI base speculative decoding (a draft model in ``genai_config.json``) as a decoder.

``decoder`` wraps ``onnxruntime_genai.Generator`` on a composite target + draft configuration
behind the decoder protocol, on the tiny seeded Llamas exported offline by the engine's model
builder, and gives the exact target law from the same weights; ``law`` is the engine's
sampling law in float64 and its configuration files (engine-free); ``engine_drafts`` probes the
``Engine`` API's caller-supplied draft path (``Request.set_draft_tokens``).  Checked against
onnxruntime-genai 0.18.0 (its own virtualenv: see the README); the reports are in
``reports/onnxruntime-genai``.  onnxruntime_genai is imported inside functions.
"""

from specverify.adapters.ortgenai.decoder import (
    EOS_TOKEN,
    INSTALL,
    ORTGenAIDecoder,
    ORTGenAITarget,
    engine_logits,
    engine_version,
    export_tiny_models,
    max_conditional_difference,
    tiny_decoder,
    tiny_target,
)
from specverify.adapters.ortgenai.law import (
    processed_law,
    sample_seeds,
    sampling_options,
    speculative_config,
    tokens_from_rows,
)

__all__ = [
    "EOS_TOKEN",
    "INSTALL",
    "ORTGenAIDecoder",
    "ORTGenAITarget",
    "engine_logits",
    "engine_version",
    "export_tiny_models",
    "max_conditional_difference",
    "processed_law",
    "sample_seeds",
    "sampling_options",
    "speculative_config",
    "tiny_decoder",
    "tiny_target",
    "tokens_from_rows",
]
