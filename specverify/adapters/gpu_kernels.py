"""GPU verification kernels behind the chain-verifier protocol: FlashInfer and vLLM.

``verify(target_probs (B, K+1, V), draft_probs (B, K, V), draft_tokens (B, K), *, generator)
-> (tokens (B, K+1) long, num_emitted (B,) long)`` on the device of the inputs; audit with
``check_verifier(verify, device="cuda:0")`` or
``specverify audit --verifier specverify.adapters.gpu_kernels:flashinfer_chain --device cuda:0``.

* **FlashInfer** ``flashinfer.sampling.chain_speculative_sampling`` (package
  ``flashinfer-python``).  Up to v0.2.5 it takes ``uniform_samples (B, K+1)`` float32
  (``chain_speculative_sampling(draft_probs, draft_token_ids, uniform_samples, target_probs,
  ...)``): the adapter is :func:`~specverify.protocols.uniforms.uniforms_in` with float32
  coins drawn from the harness's generator.  Later versions take a Philox ``seed`` and
  ``offset`` instead (``chain_speculative_sampling(draft_probs, draft_token_ids,
  target_probs, ..., deterministic, generator=None, seed=None, offset=None)``): the adapter
  is :func:`~specverify.protocols.uniforms.seed_offset_in`, the pair drawn from the
  harness's generator.  The form is chosen from the installed signature.  The kernel
  returns ``output_token_ids (B, K+1)`` int32 with -1 past the emitted tokens (and, in
  later versions, the accepted and emitted counts as well).
* **vLLM** ``vllm.v1.sample.rejection_sampler.rejection_sample`` on CUDA (the Triton
  kernels; ``specverify.adapters.vllm`` owns the CPU build): the ragged layout (drafts
  flattened to ``(B*K,)`` with ``cu_num_draft_tokens``), target logits ``log p`` (or
  ``target_probs`` for versions that take probabilities), draft probabilities in
  float32, per-request ``torch.Generator`` s of the device seeded from the harness's
  generator (the engine's seeded-request path), and bonus tokens drawn from
  ``p_{K+1}`` with the suite's exact sampler (only vLLM's accept, recovered-token and
  assembly steps are under test).

Both packages are imported inside functions: this module imports without them and
without a GPU.  Their probabilities are handed over in float32 (the kernels' own dtype).
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable

import torch

from reference.rules import check_verifier_inputs
from specverify.core.errors import ImplementationError, raised
from specverify.core.sampling import sample
from specverify.core.validation import check_bool, check_generator
from specverify.protocols.uniforms import seed_offset_in, uniforms_in

__all__ = [
    "from_padded",
    "flashinfer_chain_verifier",
    "flashinfer_chain",
    "vllm_rejection_sample_verifier",
    "vllm_rejection_sample",
]


def from_padded(output_token_ids, B: int, K: int, engine: str):
    """``(tokens (B, K+1) long, num_emitted (B,) long)`` from a kernel's ids padded with -1 after the emitted ones."""
    if isinstance(output_token_ids, (tuple, list)):
        output_token_ids = output_token_ids[0]
    if not isinstance(output_token_ids, torch.Tensor) or tuple(output_token_ids.shape) != (B, K + 1):
        shape = tuple(getattr(output_token_ids, "shape", ())) or type(output_token_ids).__name__
        raise ImplementationError(f"{engine} returned output_token_ids of shape {shape}, want ({B}, {K + 1})")
    ids = output_token_ids.long()  # (B, K+1)
    valid = ids >= 0  # (B, K+1) -1 is the placeholder
    num_emitted = valid.long().cumprod(-1).sum(-1)  # (B,) the emitted prefix
    return torch.where(valid, ids, 0), num_emitted


# ---------------------------------------------------------------------------- FlashInfer


def _missing(need: str, exc: ImportError) -> str:
    """The message of a kernel package that does not import: what is needed, and why the import failed.

    The package may be installed but fail to import (a dependency of its own is missing, or it was
    built for another torch); the underlying error says which.
    """
    return f"{need}; importing it failed with {type(exc).__name__}: {exc}"


def _flashinfer_kernel():
    try:
        from flashinfer.sampling import chain_speculative_sampling
    except ImportError as exc:
        raise ImportError(
            _missing("the FlashInfer adapter needs flashinfer (pip install flashinfer-python)", exc)
        ) from exc
    return chain_speculative_sampling


def flashinfer_chain_verifier(*, deterministic: bool = True):
    """FlashInfer's ``chain_speculative_sampling`` as a protocol verifier (see the module docstring).

    Parameters
    ----------
    deterministic : bool
        FlashInfer's ``deterministic`` flag (its deterministic reduction order).

    Returns
    -------
    callable
        ``verify(target_probs, draft_probs, draft_tokens, *, generator)``; ``verify.form`` is
        ``"uniforms"`` or ``"seed_offset"``.
    """
    check_bool("deterministic", deterministic)
    fn = _flashinfer_kernel()
    params = inspect.signature(fn).parameters

    def inputs(target_probs, draft_probs, draft_tokens):
        check_verifier_inputs(target_probs, draft_probs, draft_tokens)
        return target_probs.float().contiguous(), draft_probs.float().contiguous(), draft_tokens.int().contiguous()

    if "uniform_samples" in params:

        def uniforms_kernel(target_probs, draft_probs, draft_tokens, *, uniforms):
            target, draft, ids = inputs(target_probs, draft_probs, draft_tokens)
            out = fn(draft, ids, uniforms.float().contiguous(), target, deterministic=deterministic)
            return from_padded(out, *draft_tokens.shape, "FlashInfer chain_speculative_sampling")

        verify = uniforms_in(uniforms_kernel, dtype=torch.float32)
        verify.form = "uniforms"  # type: ignore[attr-defined]
    elif "seed" in params and "offset" in params:

        def seed_offset_kernel(target_probs, draft_probs, draft_tokens, *, seed, offset):
            target, draft, ids = inputs(target_probs, draft_probs, draft_tokens)
            out = fn(draft, ids, target, deterministic=deterministic, seed=seed, offset=offset)
            return from_padded(out, *draft_tokens.shape, "FlashInfer chain_speculative_sampling")

        verify = seed_offset_in(seed_offset_kernel)
        verify.form = "seed_offset"  # type: ignore[attr-defined]
    else:
        raise ImplementationError(
            f"flashinfer.sampling.chain_speculative_sampling{inspect.signature(fn)} takes neither uniform_samples "
            "nor seed/offset: this adapter does not know that version"
        )
    verify.__name__ = verify.__qualname__ = "flashinfer_chain"
    return verify


_CACHE: dict[str, Callable] = {}


def flashinfer_chain(target_probs, draft_probs, draft_tokens, *, generator):
    """:func:`flashinfer_chain_verifier` with its defaults, built on first use (``--verifier ...:flashinfer_chain``)."""
    if "flashinfer" not in _CACHE:
        _CACHE["flashinfer"] = flashinfer_chain_verifier()
    return _CACHE["flashinfer"](target_probs, draft_probs, draft_tokens, generator=generator)


# ---------------------------------------------------------------------------- vLLM (CUDA)

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
        raise ImportError(_missing("the vLLM GPU adapter needs vllm, a CUDA build (pip install vllm)", exc)) from exc
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
