"""Hugging Face transformers adapters: assisted-generation decoder, exact target, HF kernel.

Three things from transformers can be put under test through these adapters:

* the verifier kernel ``_speculative_sampling`` (:mod:`specverify.adapters.hf.kernel`,
  re-exported here as :func:`speculative_sampling_verifier` and
  :class:`SpeculativeSamplingVerifier`);
* the whole decoder ``model.generate(..., assistant_model=assistant, do_sample=True)``
  behind the decoder protocol (:class:`HFAssistedDecoder`);
* the target's exact processed conditionals for ``check_decoder`` (:class:`HFTarget`):
  the same logits processors ``generate`` builds for sampling (suppressed tokens,
  then temperature, top-k, top-p, min-p, in generate's order), built from
  transformers' own ``LogitsProcessor`` classes, softmaxed in float64.

Assisted generation is batch-1 and samples from the *global* torch RNG, so the
decoder loops over samples and, for each, seeds the global RNG with a seed drawn
from ``torch.Generator().manual_seed(seed)`` inside ``torch.random.fork_rng()``:
outputs are a function of ``seed`` and the caller's global RNG state is restored.

CLI factories (``PKG.MOD:FACTORY``), all keyword-only with defaults:
``specverify.adapters.hf:tiny_assisted_decoder``, ``specverify.adapters.hf:tiny_target``
(same ``seed`` => same weights) and ``specverify.adapters.hf:speculative_sampling_verifier``.
Models come from :mod:`specverify.adapters.fixtures.llama` (offline, no hub download).

References: transformers ``generation/utils.py`` (``_assisted_decoding``,
``_get_logits_processor``), ``generation/candidate_generator.py``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from specverify.core.errors import ImplementationError, InvalidArgument
from specverify.core.validation import check_float, check_int, check_shape, check_tokens

try:
    import transformers
    from transformers import GenerationConfig
    from transformers.generation.logits_process import (
        LogitsProcessorList,
        MinPLogitsWarper,
        SuppressTokensLogitsProcessor,
        TemperatureLogitsWarper,
        TopKLogitsWarper,
        TopPLogitsWarper,
    )
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError("specverify.adapters.hf needs Hugging Face transformers: pip install 'specverify[hf]'") from exc

from specverify.adapters.fixtures.llama import tiny_llama, tiny_llama_pair
from specverify.adapters.hf.kernel import (
    SpeculativeSamplingVerifier,
    check_ensemble_weight,
    forked_global_rng,
    speculative_sampling_verifier,
    torch_threads,
)

__all__ = [
    "HFTarget",
    "HFAssistedDecoder",
    "SpeculativeSamplingVerifier",
    "speculative_sampling_verifier",
    "tiny_assisted_decoder",
    "HFGreedyAssistedDecoder",
    "tiny_greedy_assisted_decoder",
    "tiny_target",
    "sampling_processors",
    "TRANSFORMERS_VERSION",
]

TRANSFORMERS_VERSION = transformers.__version__
_MAX_SEED = 2**63 - 1


def _sampling_options(temperature, top_k, top_p, min_p, suppress_tokens):
    temperature = check_float("temperature", temperature, minimum=0.0, exclusive_minimum=True)
    top_k = check_int("top_k", 0 if top_k is None else top_k, minimum=0)
    top_p = check_float("top_p", 1.0 if top_p is None else top_p, minimum=0.0, maximum=1.0, exclusive_minimum=True)
    if min_p is not None:
        min_p = check_float("min_p", min_p, minimum=0.0, maximum=1.0)
    suppress_tokens = tuple(check_int("suppress_tokens[]", t, minimum=0) for t in (suppress_tokens or ()))
    return dict(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p, suppress_tokens=suppress_tokens)


def sampling_processors(*, temperature=1.0, top_k=0, top_p=1.0, min_p=None, suppress_tokens=(), device="cpu"):
    """The ``LogitsProcessorList`` that ``generate(do_sample=True, ...)`` builds for these options.

    Same classes, same conditions (temperature != 1, top_k != 0, top_p < 1,
    min_p set) and same order as transformers' ``_get_logits_processor`` for
    batch sampling without beams (``min_tokens_to_keep=1``).
    """
    opts = _sampling_options(temperature, top_k, top_p, min_p, suppress_tokens)
    processors = LogitsProcessorList()
    if opts["suppress_tokens"]:
        processors.append(SuppressTokensLogitsProcessor(list(opts["suppress_tokens"]), device=device))
    if opts["temperature"] != 1.0:
        processors.append(TemperatureLogitsWarper(opts["temperature"]))
    if opts["top_k"] != 0:
        processors.append(TopKLogitsWarper(top_k=opts["top_k"], min_tokens_to_keep=1))
    if opts["top_p"] < 1.0:
        processors.append(TopPLogitsWarper(top_p=opts["top_p"], min_tokens_to_keep=1))
    if opts["min_p"] is not None:
        processors.append(MinPLogitsWarper(min_p=opts["min_p"], min_tokens_to_keep=1))
    return processors


def _check_threads(num_threads):
    return None if num_threads is None else check_int("num_threads", num_threads, minimum=1)


def _vocab_size(model) -> int:
    return int(model.get_output_embeddings().weight.shape[0])


class HFTarget:
    """Exact processed next-token conditionals of a causal LM (target protocol).

    Parameters
    ----------
    model : transformers.PreTrainedModel
        A causal LM; used in eval mode under ``torch.no_grad()``.
    temperature, top_k, top_p, min_p : sampling options as in ``generate``
        ``top_k=0`` and ``top_p=1`` disable those warpers; ``min_p=None`` disables min-p.
    suppress_tokens : sequence of int
        Token ids whose logits are set to -inf first (generate's ``suppress_tokens``).
    num_threads : int, optional
        torch intra-op threads while computing (restored afterwards); 1 is fastest
        for tiny models on a loaded machine.  None leaves the setting alone.
    """

    def __init__(
        self,
        model,
        *,
        temperature=1.0,
        top_k=0,
        top_p=1.0,
        min_p=None,
        suppress_tokens: Sequence[int] = (),
        num_threads: int | None = None,
    ):
        self.model = model.eval()
        self.num_threads = _check_threads(num_threads)
        self.options = _sampling_options(temperature, top_k, top_p, min_p, suppress_tokens)
        self.vocab_size = _vocab_size(model)
        self.device = next(model.parameters()).device
        self.processors = sampling_processors(**self.options, device=self.device)

    def __repr__(self) -> str:
        return f"HFTarget({type(self.model).__name__}, V={self.vocab_size}, {self.options}; transformers {TRANSFORMERS_VERSION})"

    def _logits(self, sequences: torch.Tensor) -> torch.Tensor:
        ids = sequences.to(self.device, torch.long)
        with torch.no_grad(), torch_threads(self.num_threads):
            out = self.model(input_ids=ids, attention_mask=torch.ones_like(ids), use_cache=False)
        # generate casts the last-position logits to float32 before processing
        return out.logits.to(torch.float32)  # (B, S, V)

    def _check_sequences(self, name: str, sequences, min_len: int = 1) -> torch.Tensor:
        check_shape(name, sequences, (None, None))
        check_tokens(name, sequences, self.vocab_size)
        if sequences.shape[0] < 1 or sequences.shape[1] < min_len:
            raise InvalidArgument(f"{name} must have shape (B >= 1, T >= {min_len}), got {tuple(sequences.shape)}")
        return sequences

    def _process(self, ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            scores = self.processors(ids.to(self.device), scores)  # (B, V)
        return torch.softmax(scores.double(), dim=-1)  # (B, V)

    def next_token_probs(self, prefix: torch.Tensor) -> torch.Tensor:
        """Processed law of the next token after each row of ``prefix`` (B, T) -> (B, V) float64."""
        self._check_sequences("prefix", prefix)
        logits = self._logits(prefix)[:, -1]  # (B, V)
        return self._process(prefix.long(), logits).to(prefix.device)

    def conditionals(self, sequences: torch.Tensor, start: int) -> torch.Tensor:
        """Teacher-forced processed conditionals of ``sequences[:, start:]``, one forward pass.

        Parameters
        ----------
        sequences : Tensor, shape (B, T+L), integer
        start : int
            T, the prompt length, in [1, T+L-1].

        Returns
        -------
        Tensor, shape (B, L, V), float64
            ``[b, i]`` is the processed law of ``sequences[b, start+i]`` given
            ``sequences[b, :start+i]``.
        """
        self._check_sequences("sequences", sequences, min_len=2)
        S = sequences.shape[1]
        start = check_int("start", start, minimum=1, maximum=S - 1)
        logits = self._logits(sequences)[:, start - 1 : S - 1]  # (B, L, V)
        ids = sequences.long()
        out = [self._process(ids[:, : start + i], logits[:, i]) for i in range(S - start)]  # L x (B, V)
        return torch.stack(out, dim=1).to(sequences.device)  # (B, L, V)


class HFAssistedDecoder:
    """``model.generate(assistant_model=...)`` behind the decoder protocol.

    Configures the assistant's generation config for a fixed draft length:
    ``num_assistant_tokens=k``, ``num_assistant_tokens_schedule="constant"``,
    ``assistant_confidence_threshold=0`` (no early stop of drafting); this mutates
    ``assistant.generation_config``.  End-of-sequence tokens of the target, if any,
    are suppressed (generate's ``suppress_tokens``) so every sample has exactly
    ``max_new_tokens`` tokens; :meth:`target` returns the :class:`HFTarget` with the
    same processors.

    Parameters
    ----------
    model, assistant : transformers.PreTrainedModel
        Target and assistant sharing one vocabulary.
    k : int
        Draft length per round.
    temperature, top_k, top_p, min_p : sampling options as in ``generate``.
    assistant_ensemble_weight : float in (0, 1), optional
        HF's lossy ensemble verification (for negative controls).
    num_threads : int, optional
        torch intra-op threads while generating (restored afterwards); None leaves it alone.
    """

    def __init__(
        self,
        model,
        assistant,
        *,
        k: int = 4,
        temperature=1.0,
        top_k=0,
        top_p=1.0,
        min_p=None,
        assistant_ensemble_weight: float | None = None,
        num_threads: int | None = None,
    ):
        self.model = model.eval()
        self.num_threads = _check_threads(num_threads)
        self.assistant = assistant.eval()
        self.k = check_int("k", k, minimum=1)
        self.vocab_size = _vocab_size(model)
        if _vocab_size(assistant) != self.vocab_size:
            raise InvalidArgument(
                f"assistant vocabulary {_vocab_size(assistant)} != target vocabulary {self.vocab_size}"
            )
        eos = getattr(model.generation_config, "eos_token_id", None)
        eos = [] if eos is None else ([eos] if isinstance(eos, int) else list(eos))
        self.options = _sampling_options(temperature, top_k, top_p, min_p, eos)
        gen_assistant = assistant.generation_config
        gen_assistant.num_assistant_tokens = self.k
        gen_assistant.num_assistant_tokens_schedule = "constant"
        gen_assistant.assistant_confidence_threshold = 0.0
        extra = {}
        if assistant_ensemble_weight is not None:
            extra["assistant_ensemble_weight"] = check_ensemble_weight(assistant_ensemble_weight)
        self.assistant_ensemble_weight = assistant_ensemble_weight
        o = self.options
        self._config_kwargs = dict(
            do_sample=True,
            temperature=o["temperature"],
            top_k=o["top_k"],
            top_p=o["top_p"],
            min_p=o["min_p"],
            suppress_tokens=list(o["suppress_tokens"]) or None,
            pad_token_id=0 if model.generation_config.pad_token_id is None else model.generation_config.pad_token_id,
            use_cache=True,
            **extra,
        )
        self.device = next(model.parameters()).device

    def __repr__(self) -> str:
        return (
            f"HFAssistedDecoder(k={self.k}, V={self.vocab_size}, {self.options}, ensemble="
            f"{self.assistant_ensemble_weight!r}; transformers {TRANSFORMERS_VERSION})"
        )

    def target(self) -> HFTarget:
        """The target adapter with exactly the processors this decoder samples under."""
        o = self.options
        return HFTarget(
            self.model,
            temperature=o["temperature"],
            top_k=o["top_k"],
            top_p=o["top_p"],
            min_p=o["min_p"],
            suppress_tokens=o["suppress_tokens"],
            num_threads=self.num_threads,
        )

    def generate(self, prompt: torch.Tensor, *, num_samples: int, max_new_tokens: int, seed: int) -> torch.Tensor:
        """Draw ``num_samples`` independent continuations of ``prompt`` (T,) -> (N, max_new_tokens) long.

        Sample ``i`` runs one ``generate`` call with the global RNG seeded by the
        ``i``-th seed drawn from ``torch.Generator().manual_seed(seed)``, inside
        ``torch.random.fork_rng()``; the caller's global RNG is untouched.
        """
        check_shape("prompt", prompt, (None,))
        check_tokens("prompt", prompt, self.vocab_size)
        if prompt.shape[0] < 1:
            raise InvalidArgument("prompt must hold at least one token, got shape (0,)")
        num_samples = check_int("num_samples", num_samples, minimum=1)
        max_new_tokens = check_int("max_new_tokens", max_new_tokens, minimum=1)
        seed = check_int("seed", seed, minimum=0, maximum=_MAX_SEED)
        seeds = torch.randint(0, _MAX_SEED, (num_samples,), generator=torch.Generator().manual_seed(seed)).tolist()
        config = GenerationConfig(max_new_tokens=max_new_tokens, **self._config_kwargs)
        ids = prompt.to(self.device, torch.long)[None]  # (1, T)
        T = ids.shape[1]
        out = torch.empty((num_samples, max_new_tokens), dtype=torch.long)
        with forked_global_rng(self.device) as reseed, torch.no_grad(), torch_threads(self.num_threads):
            for i, sample_seed in enumerate(seeds):
                reseed(sample_seed)
                try:
                    seq = self.model.generate(
                        ids,
                        attention_mask=torch.ones_like(ids),
                        assistant_model=self.assistant,
                        generation_config=config,
                    )
                except Exception as exc:
                    raise ImplementationError(
                        f"transformers {TRANSFORMERS_VERSION} assisted generate raised on sample {i}: "
                        f"{type(exc).__name__}: {exc}",
                        row=i,
                    ) from exc
                self._check_sequence(seq, ids, i, max_new_tokens)
                out[i] = seq[0, T:].cpu()
        return out

    def _check_sequence(self, seq, ids, i: int, max_new_tokens: int) -> None:
        T = ids.shape[1]
        if not isinstance(seq, torch.Tensor) or seq.ndim != 2 or tuple(seq.shape) != (1, T + max_new_tokens):
            shape = tuple(seq.shape) if isinstance(seq, torch.Tensor) else type(seq).__name__
            raise ImplementationError(
                f"assisted generate returned shape {shape} on sample {i}, expected (1, {T + max_new_tokens})", row=i
            )
        if not torch.equal(seq[0, :T], ids[0]):
            raise ImplementationError(f"assisted generate changed the prompt on sample {i}", row=i)
        new = seq[0, T:]
        bad = (new < 0) | (new >= self.vocab_size)
        if bool(bad.any()):
            raise ImplementationError(
                f"assisted generate emitted token {int(new[bad][0])} on sample {i}, outside [0, {self.vocab_size})",
                row=i,
            )


def tiny_assisted_decoder(
    *,
    vocab_size: int = 32,
    k: int = 4,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    min_p: float | None = None,
    seed: int = 0,
    assistant_layers: int = 1,
    assistant_noise: float = 0.0,
    assistant_ensemble_weight: float | None = None,
    num_threads: int | None = 1,
) -> HFAssistedDecoder:
    """Assisted generation on the tiny Llama pair of :func:`tiny_llama_pair` (offline).

    The target is a 2-layer random Llama, the assistant its first layer(s); same
    ``seed`` and ``vocab_size`` give the same weights as :func:`tiny_target`.
    Runs single-threaded by default (fastest for models this small; restored after each call).
    """
    target, assistant = tiny_llama_pair(
        vocab_size=vocab_size, assistant_layers=assistant_layers, assistant_noise=assistant_noise, seed=seed
    )
    return HFAssistedDecoder(
        target,
        assistant,
        k=k,
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
        min_p=min_p,
        assistant_ensemble_weight=assistant_ensemble_weight,
        num_threads=num_threads,
    )


def tiny_target(
    *,
    vocab_size: int = 32,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    min_p: float | None = None,
    seed: int = 0,
    num_threads: int | None = 1,
) -> HFTarget:
    """Exact processed conditionals of the tiny target of :func:`tiny_assisted_decoder` (same ``seed``)."""
    return HFTarget(
        tiny_llama(vocab_size=vocab_size, seed=seed),
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
        min_p=min_p,
        num_threads=num_threads,
    )


class HFGreedyAssistedDecoder(HFAssistedDecoder):
    """Greedy assisted decoding: ``generate(assistant_model=..., do_sample=False)``.

    Same protocol, seeding and validation as :class:`HFAssistedDecoder` (fixed draft length
    ``k``); only the generation config differs: no sampling options, so the assistant drafts by
    argmax and the target verifies by argmax matching.  Check it with
    ``check_decoder(decoder, decoder.target(), greedy=True)``.
    """

    def __init__(self, model, assistant, *, k: int = 4, num_threads: int | None = 1):
        super().__init__(model, assistant, k=k, num_threads=num_threads)
        self._config_kwargs.update(do_sample=False, temperature=None, top_k=None, top_p=None, min_p=None)


def tiny_greedy_assisted_decoder(
    *, k: int = 4, vocab_size: int = 32, seed: int = 0, num_threads: int | None = 1
) -> HFGreedyAssistedDecoder:
    """CLI factory: greedy assisted decoding on the tiny pair (pair it with :func:`tiny_target` of the same
    ``seed`` and ``--greedy``)."""
    model, assistant = tiny_llama_pair(vocab_size=vocab_size, seed=seed)
    return HFGreedyAssistedDecoder(model, assistant, k=k, num_threads=num_threads)
