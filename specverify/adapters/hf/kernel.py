"""Verifier-protocol adapter around transformers' ``_speculative_sampling`` kernel.

``transformers.generation.utils._speculative_sampling`` is the accept/residual step
of Hugging Face assisted generation with ``do_sample=True`` (Leviathan et al. 2023,
Algorithm 1).  It is private, batch-1 and draws its randomness from the *global*
torch RNG (``torch.rand_like`` for K uniforms, then one ``torch.multinomial``).
This module adapts it to the verifier protocol::

    verify(target_probs (B, K+1, V), draft_probs (B, K, V), draft_tokens (B, K), *, generator)
        -> (tokens (B, K+1) long, num_emitted (B,) long)

* rows are verified one at a time; for each row a seed is drawn from the harness'
  ``generator`` (``torch.randint``) and the global RNG is seeded with it inside
  ``torch.random.fork_rng()``, so results are a function of ``generator`` alone and
  the caller's global RNG state is restored afterwards;
* the kernel takes logits and applies ``softmax`` itself, so probabilities are
  passed as their logarithms: ``softmax(log p) = p / sum p`` and ``log 0 = -inf``
  becomes exactly 0 again;
* by default the logits are float32, the dtype assisted generation hands the
  kernel (it casts the target logits to float32); ``dtype=None`` keeps the input
  dtype, ``torch.float64`` removes float32 rounding from the audit.

The kernel's signature is checked when this module is imported; a changed
signature makes the verifier raise :class:`ImplementationError` naming the
installed transformers version instead of silently mis-calling it.  The
``is_done_candidate`` argument of transformers 4.40-4.4x is passed as False.

Behaviour of the kernel worth knowing (transformers 5.24.0, read from its source):
accept iff ``r <= p(x)/q(x)`` with ``r = torch.rand_like`` in the logits' dtype, so
a float32 ``r`` equal to 0 (probability 2**-24) accepts a draft with ``p(x) = 0``;
on rejection the residual ``(p - q)+`` is divided by its sum without a zero check
(a zero-mass residual gives NaN and ``torch.multinomial`` raises); when all K drafts
are accepted the bonus token is drawn from ``p_{K+1}``.  ``assistant_ensemble_weight
= w`` accepts with ``1 - w + w p/q`` (lossy by design, the "ensemble" mutant).

References: transformers ``generation/utils.py``; Leviathan, Kalman & Matias (2023).
"""

from __future__ import annotations

import contextlib
import inspect

import torch

from specverify.adapters.runtime import torch_threads
from specverify.core.errors import ImplementationError, InvalidArgument
from specverify.core.validation import check_float, check_generator, check_int
from specverify_reference.rules import check_verifier_inputs

try:
    import transformers
    from transformers.generation import utils as _hf_utils
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "specverify.adapters.hf.kernel needs Hugging Face transformers: pip install 'specverify[hf]'"
    ) from exc

__all__ = [
    "KERNEL_PARAMETERS",
    "KERNEL_PROBLEM",
    "SpeculativeSamplingVerifier",
    "check_ensemble_weight",
    "speculative_sampling_verifier",
]

_REQUIRED = ("candidate_input_ids", "candidate_logits", "candidate_length", "new_logits")
_OPTIONAL = {"is_done_candidate", "assistant_ensemble_weight"}
_MAX_SEED = 2**63 - 1


def _inspect_kernel():
    """Return ``(kernel, parameter names, problem)``; ``problem`` is None when usable."""
    version = transformers.__version__
    kernel = getattr(_hf_utils, "_speculative_sampling", None)
    if kernel is None:
        return (
            None,
            (),
            (
                f"transformers {version} has no transformers.generation.utils._speculative_sampling; "
                "the HF verifier adapter supports the kernel of transformers 4.40 .. 5.x"
            ),
        )
    try:
        params = tuple(inspect.signature(kernel).parameters.values())
    except (TypeError, ValueError) as exc:  # pragma: no cover - builtins only
        return None, (), f"cannot read the signature of _speculative_sampling in transformers {version}: {exc}"
    names = tuple(p.name for p in params)
    extra_required = [
        p.name for p in params[len(_REQUIRED) :] if p.default is inspect.Parameter.empty and p.name not in _OPTIONAL
    ]
    if (
        names[: len(_REQUIRED)] != _REQUIRED
        or extra_required
        or any(n not in _OPTIONAL for n in names[len(_REQUIRED) :])
    ):
        return (
            None,
            names,
            (
                f"transformers {version} changed _speculative_sampling{inspect.signature(kernel)}; "
                f"the adapter expects ({', '.join(_REQUIRED)}[, is_done_candidate][, assistant_ensemble_weight])"
            ),
        )
    return kernel, names, None


_KERNEL, KERNEL_PARAMETERS, KERNEL_PROBLEM = _inspect_kernel()


@contextlib.contextmanager
def forked_global_rng(device: torch.device):
    """Fork the global RNG that torch ops on ``device`` draw from; yield a function seeding it.

    Inside the block ``reseed(seed)`` seeds only that default generator (the CPU
    one, or the current CUDA device's): ``torch.manual_seed`` would also queue a
    lazy CUDA seeding with a traceback capture per call, which dominates the cost
    of a batch-1 kernel call.  The state is restored on exit (``torch.random.fork_rng``).
    """
    device = torch.device(device)
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        generator = torch.cuda.default_generators[index]
        devices = [index]
    elif device.type == "cpu":
        generator, devices = torch.default_generator, []
    else:  # other accelerators: the portable, slower path
        generator, devices = None, []
    with torch.random.fork_rng(devices=devices, device_type="cuda"):
        if generator is None:
            yield torch.manual_seed
        else:
            yield generator.manual_seed


def _resolve_dtype(dtype):
    if dtype is None or isinstance(dtype, torch.dtype):
        resolved = dtype
    elif isinstance(dtype, str) and isinstance(getattr(torch, dtype.removeprefix("torch."), None), torch.dtype):
        resolved = getattr(torch, dtype.removeprefix("torch."))
    else:
        raise InvalidArgument(f"dtype must be a floating torch dtype, its name (e.g. 'float32') or None, got {dtype!r}")
    if resolved is not None and not resolved.is_floating_point:
        raise InvalidArgument(f"dtype must be a floating dtype, got {dtype!r}")
    return resolved


def check_ensemble_weight(value) -> float:
    """``assistant_ensemble_weight`` as a float in (0, 1), where this transformers has the argument."""
    weight = check_float(
        "assistant_ensemble_weight", value, minimum=0.0, maximum=1.0, exclusive_minimum=True, exclusive_maximum=True
    )
    if "assistant_ensemble_weight" not in KERNEL_PARAMETERS:
        raise InvalidArgument(
            f"assistant_ensemble_weight={value!r}, but _speculative_sampling of "
            f"transformers {transformers.__version__} has no such argument"
        )
    return weight


class SpeculativeSamplingVerifier:
    """HF ``_speculative_sampling`` behind the verifier protocol.

    Parameters
    ----------
    dtype : torch.dtype, str or None
        Dtype of the logits handed to the kernel (default float32, as in assisted
        generation); None keeps the dtype of ``target_probs`` / ``draft_probs``.
    assistant_ensemble_weight : float in (0, 1), optional
        Forwarded to the kernel (DIVERSE static ensemble verification; lossy by
        design, so an audit must fail it).  Needs a transformers with that argument.
    num_threads : int or None
        torch intra-op threads during the row loop (default 1, restored afterwards):
        the per-row tensors are tiny and thread wake-ups dominate on a busy machine.

    Raises
    ------
    ImplementationError
        When the installed transformers' kernel has an unexpected signature.
    """

    def __init__(self, *, dtype="float32", assistant_ensemble_weight: float | None = None, num_threads: int | None = 1):
        if KERNEL_PROBLEM is not None:
            raise ImplementationError(KERNEL_PROBLEM)
        self.dtype = _resolve_dtype(dtype)
        self.num_threads = None if num_threads is None else check_int("num_threads", num_threads, minimum=1)
        self._kwargs = {}
        if "is_done_candidate" in KERNEL_PARAMETERS:
            self._kwargs["is_done_candidate"] = False
        if assistant_ensemble_weight is not None:
            self._kwargs["assistant_ensemble_weight"] = check_ensemble_weight(assistant_ensemble_weight)
        self.assistant_ensemble_weight = assistant_ensemble_weight

    def __repr__(self) -> str:
        return (
            f"SpeculativeSamplingVerifier(dtype={self.dtype}, assistant_ensemble_weight="
            f"{self.assistant_ensemble_weight!r}; transformers {transformers.__version__})"
        )

    def verify(self, target_probs, draft_probs, draft_tokens, *, generator: torch.Generator):
        """Verify each row with the HF kernel; see the module docstring.

        Returns
        -------
        tokens : Tensor, shape (B, K+1), long
            Accepted drafts then the residual or bonus token; entries past
            ``num_emitted`` are 0.
        num_emitted : Tensor, shape (B,), long
        """
        B, K, V = check_verifier_inputs(target_probs, draft_probs, draft_tokens)
        check_generator("generator", generator)
        device = target_probs.device
        dtype = self.dtype or torch.promote_types(target_probs.dtype, draft_probs.dtype)
        # softmax(log p) == p / sum p; log 0 = -inf softmaxes back to exactly 0.
        target_logits = target_probs.to(device=device, dtype=dtype).log()  # (B, K+1, V)
        draft_logits = draft_probs.to(device=device, dtype=dtype).log()  # (B, K, V)
        candidates = draft_tokens.to(device=device, dtype=torch.long)  # (B, K)
        seeds = torch.randint(0, _MAX_SEED, (B,), generator=generator, device=generator.device).tolist()

        tokens = torch.zeros((B, K + 1), dtype=torch.long)  # (B, K+1)
        num_emitted = torch.zeros((B,), dtype=torch.long)  # (B,)
        with forked_global_rng(device) as reseed, torch_threads(self.num_threads):
            for b in range(B):
                reseed(seeds[b])
                try:
                    valid, n_matches = _KERNEL(
                        candidates[b : b + 1], draft_logits[b : b + 1], K, target_logits[b : b + 1], **self._kwargs
                    )
                except Exception as exc:  # the implementation under test failed
                    raise ImplementationError(
                        f"transformers {transformers.__version__} _speculative_sampling raised on row {b} "
                        f"(K={K}, V={V}): {type(exc).__name__}: {exc}",
                        row=b,
                    ) from exc
                tokens_b, n = self._check_output(valid, n_matches, b, K, V)
                tokens[b, : n + 1] = tokens_b
                num_emitted[b] = n + 1
        return tokens.to(device), num_emitted.to(device)

    __call__ = verify

    @staticmethod
    def _check_output(valid, n_matches, row: int, K: int, V: int):
        try:
            n = int(n_matches)
        except (TypeError, ValueError, RuntimeError) as exc:
            raise ImplementationError(
                f"_speculative_sampling returned n_matches={n_matches!r} on row {row}", row=row
            ) from exc
        if not 0 <= n <= K:
            raise ImplementationError(
                f"_speculative_sampling returned n_matches={n} on row {row}, outside [0, {K}]", row=row
            )
        if not isinstance(valid, torch.Tensor) or tuple(valid.shape) != (1, n + 1):
            shape = tuple(valid.shape) if isinstance(valid, torch.Tensor) else type(valid).__name__
            raise ImplementationError(
                f"_speculative_sampling returned tokens of shape {shape} on row {row}, expected (1, {n + 1})", row=row
            )
        tokens = valid[0].to("cpu", torch.long)  # (n+1,)
        bad = (tokens < 0) | (tokens >= V)
        if bool(bad.any()):
            raise ImplementationError(
                f"_speculative_sampling emitted token {int(tokens[bad][0])} on row {row}, outside [0, {V})", row=row
            )
        return tokens, n


_DEFAULT = None


def speculative_sampling_verifier(target_probs, draft_probs, draft_tokens, *, generator: torch.Generator):
    """The HF kernel as a plain verify callable (float32 logits, no ensemble weight).

    Equivalent to ``SpeculativeSamplingVerifier().verify(...)``; usable directly as
    ``--verifier specverify.adapters.hf:speculative_sampling_verifier``.  For options
    use ``--verifier specverify.adapters.hf:SpeculativeSamplingVerifier
    --verifier-option dtype=float64``.
    """
    global _DEFAULT
    if _DEFAULT is None:
        _DEFAULT = SpeculativeSamplingVerifier()
    return _DEFAULT.verify(target_probs, draft_probs, draft_tokens, generator=generator)
