"""Any candidate generator of transformers' ``generate`` behind the decoder protocol, instrumented.

``generate(..., assistant_model=..., prompt_lookup_num_tokens=..., assistant_early_exit=...,
use_mtp=..., speculation_type=...)`` picks one ``CandidateGenerator`` in
``GenerationMixin._get_candidate_generator`` (transformers ``generation/utils.py``) and runs
``_assisted_decoding``: each round the generator proposes draft tokens, with their logits (q) or
without; with ``do_sample=True`` and logits the target verifies them with ``_speculative_sampling``
(accept/residual), without logits (prompt lookup, different tokenizers) it samples every position
from the target's own processed law and keeps the drafts up to the first mismatch.

:class:`HFGeneratorDecoder` runs one ``generate`` call per sample (assisted generation is batch-1),
as :class:`~specverify.adapters.hf.assisted.HFAssistedDecoder` does: the *global* torch RNG is
seeded for each sample with a seed drawn from ``torch.Generator().manual_seed(seed)`` inside
``torch.random.fork_rng()``, so outputs are a function of ``seed`` and the caller's RNG state is
restored.  In addition it

* checks, on every call, that ``generate`` built the expected generator class (a different one is
  an :class:`~specverify.core.errors.ImplementationError`: the audit would test the wrong path);
* counts rounds, drafted tokens and emitted tokens (:attr:`HFGeneratorDecoder.stats`,
  :class:`GeneratorStats`), so a report can say the generator actually drafted;
* optionally makes one warm-up call at construction (``warm_up=True``): the first sampling call
  with different tokenizers builds the vocabulary translator, whose ``prune_linear_layer``
  creates a new ``nn.Linear`` and so draws from the global RNG, shifting that one call's draws
  (later calls with the same seed agree with each other, not with the first);
* restores the drafting fields of the generation config the generator reads
  (``num_assistant_tokens``, its schedule, ``assistant_confidence_threshold``) before every call:
  the ``heuristic`` schedule writes the last round's draft length back into the assistant's
  generation config at the end of ``generate``, so without the reset a call's draft lengths
  (hence its RNG use and output) would depend on the calls before it.

References: transformers ``generation/utils.py`` (``_get_candidate_generator``,
``_assisted_decoding``, ``_speculative_sampling``), ``generation/candidate_generator.py``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import torch

from specverify.adapters.hf.assisted import (
    TRANSFORMERS_VERSION,
    HFAssistedDecoder,
    HFTarget,
    _check_threads,
    _sampling_options,
    _vocab_size,
)
from specverify.adapters.hf.kernel import forked_global_rng, torch_threads
from specverify.core.errors import ImplementationError, InvalidArgument
from specverify.core.validation import check_int, check_shape, check_tokens

try:
    from transformers import GenerationConfig
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError("specverify.adapters.hf needs Hugging Face transformers: pip install 'specverify[hf]'") from exc

__all__ = ["GeneratorStats", "HFGeneratorDecoder", "DRAFT_FIELDS"]

_MAX_SEED = 2**63 - 1
#: Generation-config fields a candidate generator reads for its draft length; reset before every call.
DRAFT_FIELDS = ("num_assistant_tokens", "num_assistant_tokens_schedule", "assistant_confidence_threshold")


@dataclasses.dataclass(frozen=True)
class GeneratorStats:
    """What the candidate generator did over the calls counted so far.

    Attributes
    ----------
    generators : tuple of str
        Class names ``generate`` built (one expected).
    calls : int
        ``generate`` calls.
    rounds : int
        ``get_candidates`` calls (verification rounds; the first of MTP / DFlash / Gemma 4 drafts nothing).
    drafting_rounds : int
        Rounds that proposed at least one token.
    drafted : int
        Draft tokens proposed in all.
    with_logits : int
        Drafting rounds that handed the target draft logits (the accept/residual path).
    new_tokens : int
        Tokens emitted in all.
    """

    generators: tuple[str, ...] = ()
    calls: int = 0
    rounds: int = 0
    drafting_rounds: int = 0
    drafted: int = 0
    with_logits: int = 0
    new_tokens: int = 0

    def to_dict(self) -> dict:
        """Plain-JSON form, with the derived rates (drafted per drafting round, emitted per round)."""
        out = dataclasses.asdict(self)
        out["generators"] = list(self.generators)
        out["drafted_per_drafting_round"] = self.drafted / self.drafting_rounds if self.drafting_rounds else 0.0
        out["tokens_per_round"] = self.new_tokens / self.rounds if self.rounds else 0.0
        return out


class HFGeneratorDecoder(HFAssistedDecoder):
    """``model.generate`` with a chosen candidate generator, behind the decoder protocol.

    Parameters
    ----------
    model : transformers.PreTrainedModel
        The target.
    expected_generator : str
        Class name of the ``CandidateGenerator`` that ``generate`` must build.
    k : int
        Draft tokens per round as the generator defines it (reported; the caller sets it in
        ``draft_config`` / ``options``).
    assistant : transformers.PreTrainedModel, optional
        Passed as ``assistant_model``.
    options : mapping
        Extra ``GenerationConfig`` fields (``prompt_lookup_num_tokens``, ``assistant_early_exit``,
        ``use_mtp``, ``speculation_type``, ...).
    draft_config : GenerationConfig, optional
        The config the generator reads its draft length from (the assistant's, or the target's own
        for early exit); its :data:`DRAFT_FIELDS` are snapshotted here and restored before each call.
    tokenizer, assistant_tokenizer : optional
        Passed to ``generate`` (different vocabularies).
    greedy : bool
        ``do_sample=False`` (then ``temperature`` etc. must be left at their defaults).
    temperature, top_k, top_p, min_p : sampling options as in ``generate``.
    num_threads : int, optional
        torch intra-op threads while generating (restored afterwards).
    warm_up : bool
        Make one throwaway call now (a failure is left for the audit to meet) and reset the stats.
    """

    def __init__(
        self,
        model,
        *,
        expected_generator: str,
        k: int,
        assistant=None,
        options: Mapping | None = None,
        draft_config=None,
        tokenizer=None,
        assistant_tokenizer=None,
        greedy: bool = False,
        temperature=1.0,
        top_k=0,
        top_p=1.0,
        min_p=None,
        num_threads: int | None = 1,
        warm_up: bool = False,
    ):
        self.model = model.eval()
        self.assistant = None if assistant is None else assistant.eval()
        self.num_threads = _check_threads(num_threads)
        self.k = check_int("k", k, minimum=1)
        self.vocab_size = _vocab_size(model)
        self.expected_generator = str(expected_generator)
        self.greedy = bool(greedy)
        if self.greedy and (temperature != 1.0 or top_k or top_p != 1.0 or min_p is not None):
            raise InvalidArgument("greedy decoding takes no sampling options")
        eos = getattr(model.generation_config, "eos_token_id", None)
        eos = [] if eos is None else ([eos] if isinstance(eos, int) else list(eos))
        self.options = _sampling_options(temperature, top_k, top_p, min_p, eos)
        self.generate_options = dict(options or {})
        self.tokenizers = (tokenizer, assistant_tokenizer)
        self.draft_config = draft_config
        self.draft_fields = {f: getattr(draft_config, f) for f in DRAFT_FIELDS} if draft_config is not None else {}
        o = self.options
        sampling = (
            dict(do_sample=False)
            if self.greedy
            else dict(
                do_sample=True, temperature=o["temperature"], top_k=o["top_k"], top_p=o["top_p"], min_p=o["min_p"]
            )
        )
        pad = model.generation_config.pad_token_id
        self._config_kwargs = dict(
            **sampling,
            suppress_tokens=list(o["suppress_tokens"]) or None,
            pad_token_id=0 if pad is None else pad,
            use_cache=True,
            **self.generate_options,
        )
        self.device = next(model.parameters()).device
        self.assistant_ensemble_weight = None
        self._counts = GeneratorStats()
        model._get_candidate_generator = self._spy  # instance attribute: only this model object
        if warm_up:
            try:
                self.generate(torch.zeros(1, dtype=torch.long), num_samples=1, max_new_tokens=2, seed=0)
            except ImplementationError:
                pass
            self.reset_stats()

    # ------------------------------------------------------------------ instrumentation

    def _spy(self, **kwargs):
        generator = type(self.model)._get_candidate_generator(self.model, **kwargs)
        name = type(generator).__name__
        if name != self.expected_generator:
            raise ImplementationError(f"generate built {name}, expected {self.expected_generator}")
        counts = self._counts
        self._counts = dataclasses.replace(
            counts, generators=tuple(sorted({*counts.generators, name})), calls=counts.calls + 1
        )
        original = generator.get_candidates

        def get_candidates(input_ids, *args, **kw):
            ids, logits = original(input_ids, *args, **kw)
            n = int(ids.shape[1] - input_ids.shape[1])
            c = self._counts
            self._counts = dataclasses.replace(
                c,
                rounds=c.rounds + 1,
                drafting_rounds=c.drafting_rounds + (n > 0),
                drafted=c.drafted + n,
                with_logits=c.with_logits + (n > 0 and logits is not None),
            )
            return ids, logits

        generator.get_candidates = get_candidates
        return generator

    @property
    def stats(self) -> GeneratorStats:
        """Counts over every call so far (:class:`GeneratorStats`)."""
        return self._counts

    def reset_stats(self) -> None:
        """Start counting afresh."""
        self._counts = GeneratorStats()

    # ------------------------------------------------------------------ protocol

    def __repr__(self) -> str:
        mode = "greedy" if self.greedy else str(self.options)
        return (
            f"HFGeneratorDecoder({self.expected_generator}, k={self.k}, V={self.vocab_size}, {mode}, "
            f"{self.generate_options}; transformers {TRANSFORMERS_VERSION})"
        )

    def target(self) -> HFTarget:
        """The target adapter with exactly the processors this decoder samples under (none when greedy)."""
        if self.greedy:
            return HFTarget(self.model, suppress_tokens=self.options["suppress_tokens"], num_threads=self.num_threads)
        return super().target()

    def generate(self, prompt: torch.Tensor, *, num_samples: int, max_new_tokens: int, seed: int) -> torch.Tensor:
        """Draw ``num_samples`` continuations of ``prompt`` (T,) -> (N, max_new_tokens) long, one call each.

        Sample ``i`` runs one ``generate`` call with the global RNG seeded by the ``i``-th seed
        drawn from ``torch.Generator().manual_seed(seed)``, inside ``torch.random.fork_rng()``.
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
        extra = {}
        if self.assistant is not None:
            extra["assistant_model"] = self.assistant
        if self.tokenizers[0] is not None:
            extra["tokenizer"], extra["assistant_tokenizer"] = self.tokenizers
        out = torch.empty((num_samples, max_new_tokens), dtype=torch.long)
        with forked_global_rng(self.device) as reseed, torch.no_grad(), torch_threads(self.num_threads):
            for i, sample_seed in enumerate(seeds):
                for field, value in self.draft_fields.items():
                    setattr(self.draft_config, field, value)
                reseed(sample_seed)
                try:
                    seq = self.model.generate(
                        ids, attention_mask=torch.ones_like(ids), generation_config=config, **extra
                    )  # (1, T + max_new_tokens)
                except ImplementationError:
                    raise
                except Exception as exc:
                    raise ImplementationError(
                        f"transformers {TRANSFORMERS_VERSION} generate ({self.expected_generator}) raised on "
                        f"sample {i}: {type(exc).__name__}: {exc}",
                        row=i,
                    ) from exc
                self._check_sequence(seq, ids, i, max_new_tokens)
                out[i] = seq[0, T:].cpu()
                self._counts = dataclasses.replace(self._counts, new_tokens=self._counts.new_tokens + max_new_tokens)
        return out
