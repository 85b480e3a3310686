"""OpenVINO GenAI speculative decoding (``LLMPipeline(..., draft_model=...)``) as a decoder.

``decoder`` wraps ``openvino_genai.LLMPipeline`` and ``ContinuousBatchingPipeline`` with a
draft model behind the decoder protocol, on the tiny seeded Llamas exported to OpenVINO IR
offline, and gives the exact target law from the same weights.  Checked against
openvino-genai 2026.4.1 (its own virtualenv: see the README); the reports are in
``reports/openvino``.  openvino_genai is imported inside functions.
"""

from specverify.adapters.openvino.decoder import (
    INSTALL,
    OpenVINODecoder,
    OpenVINOTarget,
    engine_version,
    export_tiny_models,
    max_conditional_difference,
    sample_seeds,
    sampling_options,
    tiny_decoder,
    tiny_target,
    tokens_from_rows,
)

__all__ = [
    "INSTALL",
    "OpenVINODecoder",
    "OpenVINOTarget",
    "engine_version",
    "export_tiny_models",
    "max_conditional_difference",
    "sample_seeds",
    "sampling_options",
    "tiny_decoder",
    "tiny_target",
    "tokens_from_rows",
]
