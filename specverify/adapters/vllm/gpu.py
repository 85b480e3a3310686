"""vLLM's ``rejection_sample`` on CUDA (the Triton kernels) behind the chain-verifier protocol.

``specverify audit --verifier specverify.adapters.vllm:vllm_rejection_sample --device cuda:0``
(:mod:`specverify.adapters.vllm.kernel` owns the CPU build).  The ragged layout (drafts
flattened to ``(B*K,)`` with ``cu_num_draft_tokens``), target logits ``log p`` (or
``target_probs`` for versions that take probabilities), draft probabilities in float32,
per-request ``torch.Generator`` s of the device seeded from the harness's generator (the
engine's seeded-request path), and bonus tokens drawn from ``p_{K+1}`` with the suite's exact
sampler (only vLLM's accept, recovered-token and assembly steps are under test).  vllm is
imported inside functions: this module imports without it and without a GPU.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable

import torch

from specverify.adapters.layouts import from_padded
from specverify.adapters.runtime import missing_package
from specverify.core.errors import ImplementationError, raised
from specverify.core.sampling import sample
from specverify.core.validation import check_generator
from specverify_reference.rules import check_verifier_inputs

__all__ = ["vllm_rejection_sample_verifier", "vllm_rejection_sample"]

_CACHE: dict[str, Callable] = {}

#: SamplingMetadata fields for B random-sampling requests at temperature 1, nothing else on.
_METADATA_FIELDS = (
    "temperature",
    "all_greedy",
    "all_random",
    "top_p",
    "top_k",
    "generators",
    "max_num_logprobs",
    "no_penalties",
    "prompt_token_ids",
    "frequency_penalties",
    "presence_penalties",
    "repetition_penalties",
    "output_token_ids",
    "allowed_token_ids_mask",
    "bad_words_token_ids",
    "logitsprocs",
    "spec_token_ids",
)


def _vllm_metadata(B: int, device: torch.device, seeds: list[int]):
    from vllm.v1.sample.metadata import SamplingMetadata

    values: dict = dict(
        temperature=torch.ones(B, dtype=torch.float32, device=device),
        all_greedy=False,
        all_random=True,
        top_p=None,
        top_k=None,
        generators={b: torch.Generator(device=device).manual_seed(s) for b, s in enumerate(seeds)},
        max_num_logprobs=None,
        no_penalties=True,
        prompt_token_ids=None,
        frequency_penalties=torch.zeros(B, device=device),
        presence_penalties=torch.zeros(B, device=device),
        repetition_penalties=torch.ones(B, device=device),
        output_token_ids=[],
        allowed_token_ids_mask=None,
        bad_words_token_ids={},
        spec_token_ids=None,
    )
    try:
        from vllm.v1.sample.logits_processor import LogitsProcessors

        values["logitsprocs"] = LogitsProcessors()
    except ImportError:  # older versions
        pass
    fields = {f.name: f for f in dataclasses.fields(SamplingMetadata)}
    missing = [
        n
        for n, f in fields.items()
        if n not in values and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    ]
    if missing:
        raise ImplementationError(f"vLLM SamplingMetadata has required fields {missing} this adapter does not know")
    return SamplingMetadata(**{k: v for k, v in values.items() if k in fields})


def vllm_rejection_sample_verifier():
    """vLLM's ``rejection_sample`` on the inputs' device as a protocol verifier (see the module docstring)."""
    try:
        from vllm.v1.sample import rejection_sampler as rs
    except ImportError as exc:
        raise ImportError(
            missing_package("the vLLM GPU adapter needs vllm, a CUDA build (pip install vllm)", exc)
        ) from exc
    params = inspect.signature(rs.rejection_sample).parameters
    takes_logits = "target_logits" in params

    def verify(target_probs, draft_probs, draft_tokens, *, generator):
        B, K, V = check_verifier_inputs(target_probs, draft_probs, draft_tokens)
        check_generator("generator", generator)
        device = target_probs.device
        seeds = torch.randint(0, 2**62, (B,), generator=generator, device=generator.device).tolist()
        bonus = sample(target_probs[:, K].double(), generator=generator, check=False)[:, None]  # (B, 1)
        target_rows = target_probs[:, :K].reshape(B * K, V).float()  # (B*K, V)
        target_in = torch.log(target_rows) if takes_logits else target_rows  # log 0 = -inf: exactly 0 after softmax
        try:
            out = rs.rejection_sample(
                draft_tokens.reshape(-1).to(torch.int32).contiguous(),  # (B*K,)
                [K] * B,  # num_draft_tokens
                K,  # max_spec_len
                torch.arange(1, B + 1, device=device, dtype=torch.int32) * K,  # (B,) cu_num_draft_tokens
                draft_probs.reshape(B * K, V).float().contiguous(),  # (B*K, V)
                target_in.contiguous(),
                bonus.to(torch.int64).contiguous(),  # (B, 1)
                _vllm_metadata(B, device, seeds),
            )  # (B, K+1) int32, -1 past the emitted tokens
        except ImplementationError:
            raise
        except Exception as exc:  # the implementation under test failed
            raise raised("vLLM rejection_sample", exc) from exc
        return from_padded(out, B, K, "vLLM rejection_sample")

    verify.__name__ = verify.__qualname__ = "vllm_rejection_sample"
    return verify


def vllm_rejection_sample(target_probs, draft_probs, draft_tokens, *, generator):
    """:func:`vllm_rejection_sample_verifier`, built on first use (``--verifier ...:vllm_rejection_sample``)."""
    if "vllm" not in _CACHE:
        _CACHE["vllm"] = vllm_rejection_sample_verifier()
    return _CACHE["vllm"](target_probs, draft_probs, draft_tokens, generator=generator)
