"""llama.cpp through llama-cpp-python (``Llama.generate`` with and without ``draft_model=``) as a decoder.

The decoder protocol of ``docs/design.md``::

    generate(prompt (T,) long, *, num_samples, max_new_tokens, seed) -> (num_samples, max_new_tokens) long

:class:`LlamaCppDecoder` holds one ``llama_cpp.Llama`` on the tiny target GGUF (``n_threads=1``,
``n_threads_batch=1``, a float32 KV cache, ``last_n_tokens_size`` the penalty window) and, per sample, calls
``Llama.set_seed(s)`` and takes ``max_new_tokens`` tokens from ``Llama.generate(prompt ids, temp=...,
top_k=..., top_p=..., min_p=..., repeat_penalty=..., frequency_penalty=..., presence_penalty=...,
grammar=...)``.  ``generate`` never stops at end-of-generation by itself (``create_completion``
does), so every row has ``max_new_tokens`` tokens and no option changes the conditionals.
``generate`` seeds its ``dist`` sampler with the ``Llama``'s seed in every call, so each sample
gets its own: distinct 32-bit draws of a ``torch.Generator`` seeded with the protocol's ``seed``
(:func:`sample_seeds`; ``0xFFFFFFFF``, llama.cpp's "random seed", is never drawn).

Speculation (``drafter``): ``"prompt_lookup"`` passes ``LlamaPromptLookupDecoding(max_ngram_size,
num_pred_tokens)``, the only drafter llama-cpp-python ships; ``"draft_model"`` passes
:class:`DraftModelDrafter`, a ``LlamaDraftModel`` (llama-cpp-python's drafting interface:
``draft_model(input_ids) -> draft ids``) that proposes the argmax continuation of a second ``Llama``
on the perturbed draft GGUF.  Both are wrapped in :class:`CountingDrafter` (a pass-through that
counts calls and proposed tokens).  ``None`` is the control.

:class:`LlamaCppTarget` gives the exact law: the same weights in transformers float32 (the
Hugging Face directory the GGUF was written from), each position's logits processed by
:func:`specverify.adapters.llamacpp.sampler_chain.processed_probs` in float64 with the penalty window
and grammar state of the tokens generated since the prompt.  :func:`max_conditional_difference`
compares llama.cpp's raw law with it.  References: llama-cpp-python ``llama_cpp/llama.py``
(``Llama.generate``, ``_init_sampler``), ``llama_cpp/llama_speculative.py``; llama.cpp
``src/llama-sampler.cpp``, ``src/llama-grammar.cpp``.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import torch

from specverify.adapters.llamacpp.gguf_model import EOG, PIECES, save_tiny_gguf
from specverify.adapters.llamacpp.sampler_chain import WORD_GRAMMAR, SamplerOptions, processed_probs, sampler_options
from specverify.adapters.runtime import OutputMemo, max_law_difference
from specverify.core.errors import ImplementationError, InvalidArgument
from specverify.core.validation import check_bool, check_int, check_shape, check_tokens

__all__ = [
    "INSTALL",
    "DRAFTERS",
    "DraftStats",
    "CountingDrafter",
    "DraftModelDrafter",
    "LlamaCppDecoder",
    "LlamaCppTarget",
    "sample_seeds",
    "tokens_from_rows",
    "tiny_decoder",
    "tiny_target",
    "max_conditional_difference",
    "engine_version",
]

#: One shell command, run from the repository root (the virtualenv lands in ``.venvs/llama``);
#: llama-cpp-python compiles llama.cpp from its sdist (``CMAKE_BUILD_PARALLEL_LEVEL`` caps the jobs).
INSTALL = (
    "python -m venv .venvs/llama && . .venvs/llama/bin/activate && pip install torch==2.13.0 && "
    "CMAKE_BUILD_PARALLEL_LEVEL=1 pip install llama-cpp-python==0.3.36 gguf==0.19.0 && "
    'pip install -e ".[test,plots,hf]" transformers==5.24.0'
)
DRAFTERS = (None, "prompt_lookup", "draft_model")
VOCAB_SIZE = len(PIECES)
N_CTX = 256
#: ``Llama(type_k=..., type_v=...)``: a float32 KV cache (``GGML_TYPE_F32``).  llama.cpp's default f16
#: cache moves the tiny model's raw law by up to 3e-4 from the float32 weights' law: a precision
#: choice, not the speculative rule; the target is float32.
KV_F32 = dict(type_k=0, type_v=0)
LLAMA_DEFAULT_SEED = 0xFFFFFFFF


def _import_llama_cpp():
    try:
        import llama_cpp
    except ImportError as error:
        raise ImportError(
            f"specverify.adapters.llamacpp needs llama-cpp-python ({error}); install it in its own virtualenv: {INSTALL}"
        ) from error
    return llama_cpp


def engine_version() -> str:
    """``llama_cpp.__version__`` (ImportError naming the install line without it)."""
    return _import_llama_cpp().__version__


def sample_seeds(seed: int, num_samples: int) -> list[int]:
    """``num_samples`` distinct seeds in [0, 2**32 - 1) drawn from a generator seeded with ``seed``.

    ``0xFFFFFFFF`` is excluded: llama.cpp reads it as "seed from the clock".
    """
    seed = check_int("seed", seed, minimum=0)
    n = check_int("num_samples", num_samples, minimum=1, maximum=2**31)
    generator = torch.Generator().manual_seed(seed)
    seeds: list[int] = []
    seen: set[int] = set()
    while len(seeds) < n:
        for value in torch.randint(0, LLAMA_DEFAULT_SEED, (n - len(seeds),), generator=generator).tolist():  # (n',)
            if value not in seen:
                seen.add(value)
                seeds.append(value)
    return seeds


def tokens_from_rows(rows, *, num_samples: int, max_new_tokens: int, vocab_size: int) -> torch.Tensor:
    """Validate the engine's token-id rows -> (num_samples, max_new_tokens) long; else ImplementationError."""
    rows = [[int(t) if not isinstance(t, bool) and hasattr(t, "__index__") else t for t in r] for r in rows]
    if len(rows) != num_samples:
        raise ImplementationError(f"llama-cpp-python returned {len(rows)} sequences, want {num_samples}")
    for i, row in enumerate(rows):
        if len(row) != max_new_tokens:
            raise ImplementationError(
                f"llama-cpp-python returned {len(row)} tokens for sample {i}, want max_new_tokens={max_new_tokens}"
            )
        bad = [t for t in row if not isinstance(t, int) or not 0 <= t < vocab_size]
        if bad:
            raise ImplementationError(f"llama-cpp-python sample {i} holds token ids outside [0, {vocab_size}): {bad}")
    return torch.tensor(rows, dtype=torch.long).reshape(num_samples, max_new_tokens)  # (N, L)


@dataclass(frozen=True)
class DraftStats:
    """What a drafter proposed: ``calls`` (one per target verification pass), ``proposed`` tokens."""

    calls: int
    proposed: int


class CountingDrafter:
    """A pass-through around a drafter that counts its calls and proposed tokens (nothing else changes)."""

    def __init__(self, inner):
        self.inner = inner
        self.calls = 0
        self.proposed = 0

    def __call__(self, input_ids, /, **kwargs):
        out = self.inner(input_ids, **kwargs)
        self.calls += 1
        self.proposed += len(out)
        return out

    def stats(self) -> DraftStats:
        return DraftStats(self.calls, self.proposed)


class DraftModelDrafter:
    """A ``LlamaDraftModel``: ``num_pred_tokens`` argmax tokens of a second ``Llama`` (the draft GGUF).

    Every call re-evaluates the whole ``input_ids`` from an empty cache (the model is tiny), then
    appends its argmax ``num_pred_tokens`` times.  Deterministic: no randomness.
    """

    def __init__(self, model_path, *, num_pred_tokens: int = 3):
        llama_cpp = _import_llama_cpp()
        self.num_pred_tokens = check_int("num_pred_tokens", num_pred_tokens, minimum=1)
        self.llm = llama_cpp.Llama(
            str(model_path), n_ctx=N_CTX, n_threads=1, n_threads_batch=1, logits_all=True, verbose=False, **KV_F32
        )

    def __call__(self, input_ids, /, **kwargs):
        import numpy as np

        llm = self.llm
        llm.reset()
        llm.eval([int(t) for t in input_ids])
        out: list[int] = []
        for _ in range(min(self.num_pred_tokens, N_CTX - llm.n_tokens - 1)):
            token = int(np.argmax(llm.scores[llm.n_tokens - 1]))
            out.append(token)
            llm.eval([token])
        return np.array(out, dtype=np.intc)


class LlamaCppDecoder:
    """``Llama.generate`` (llama-cpp-python) behind the decoder protocol (the ``Llama`` built lazily, once).

    Parameters
    ----------
    model_path : path
        The target GGUF.
    drafter : {None, "prompt_lookup", "draft_model"}
        ``Llama(draft_model=...)``: none (the control), ``LlamaPromptLookupDecoding`` or
        :class:`DraftModelDrafter` on ``draft_path``.
    num_pred_tokens : int
        Draft tokens per call (``LlamaPromptLookupDecoding(num_pred_tokens=...)``; the draft model's K).
    max_ngram_size : int
        ``LlamaPromptLookupDecoding(max_ngram_size=...)``.
    draft_path : path, optional
        The draft GGUF (``drafter="draft_model"``).
    grammar : bool
        Constrain generation with :data:`~specverify.adapters.llamacpp.sampler_chain.WORD_GRAMMAR`.
    memoize : bool
        Diagnostic replay of repeated calls (:class:`specverify.adapters.runtime.OutputMemo`).
    **options
        Sampler options (:func:`~specverify.adapters.llamacpp.sampler_chain.sampler_options`; ``last_n``
        is ``Llama(last_n_tokens_size=...)``).
    """

    def __init__(
        self,
        model_path,
        *,
        drafter=None,
        num_pred_tokens=3,
        max_ngram_size=2,
        draft_path=None,
        grammar=False,
        memoize=False,
        **options,
    ):
        if drafter not in DRAFTERS:
            raise InvalidArgument(f"drafter must be one of {list(DRAFTERS)}, got {drafter!r}")
        if drafter == "draft_model" and draft_path is None:
            raise InvalidArgument("drafter='draft_model' needs draft_path")
        self._memo = OutputMemo(memoize)
        self.model_path, self.drafter, self.draft_path = str(model_path), drafter, draft_path
        self.num_pred_tokens = check_int("num_pred_tokens", num_pred_tokens, minimum=1)
        self.max_ngram_size = check_int("max_ngram_size", max_ngram_size, minimum=1)
        self.grammar = check_bool("grammar", grammar)
        self.options: SamplerOptions = sampler_options(**options)
        self.vocab_size = VOCAB_SIZE
        self.counter: CountingDrafter | None = None
        self._llm = None

    def __repr__(self) -> str:
        spec = "no draft" if self.drafter is None else f"{self.drafter}, num_pred_tokens={self.num_pred_tokens}"
        return f"LlamaCppDecoder({spec}, {self.options}, grammar={self.grammar})"

    @property
    def llm(self):
        if self._llm is None:
            llama_cpp = _import_llama_cpp()
            draft = None
            if self.drafter == "prompt_lookup":
                from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

                inner = LlamaPromptLookupDecoding(
                    max_ngram_size=self.max_ngram_size, num_pred_tokens=self.num_pred_tokens
                )
                draft = self.counter = CountingDrafter(inner)
            elif self.drafter == "draft_model":
                draft = self.counter = CountingDrafter(
                    DraftModelDrafter(self.draft_path, num_pred_tokens=self.num_pred_tokens)
                )
            self._llm = llama_cpp.Llama(
                self.model_path,
                n_ctx=N_CTX,
                n_threads=1,
                n_threads_batch=1,
                last_n_tokens_size=self.options.last_n,
                draft_model=draft,
                verbose=False,
                **KV_F32,
            )
        return self._llm

    def _grammar(self):
        if not self.grammar:
            return None
        from llama_cpp.llama_grammar import LlamaGrammar

        return LlamaGrammar.from_string(WORD_GRAMMAR.gbnf, verbose=False)

    def generate(self, prompt, *, num_samples: int, max_new_tokens: int, seed: int) -> torch.Tensor:
        """Sample ``num_samples`` continuations of ``prompt`` (T,) -> (num_samples, max_new_tokens) long."""
        n = check_int("num_samples", num_samples, minimum=1)
        L = check_int("max_new_tokens", max_new_tokens, minimum=1)
        prompt = torch.as_tensor(prompt).reshape(-1)  # (T,)
        check_tokens("prompt", prompt, self.vocab_size)
        ids = [int(t) for t in prompt.tolist()]
        if len(ids) + L + self.num_pred_tokens + 1 > N_CTX:
            raise InvalidArgument(f"prompt ({len(ids)}) + max_new_tokens ({L}) + drafts exceed n_ctx={N_CTX}")
        key = (tuple(ids), n, L, seed)
        replay = self._memo.lookup(key)
        if replay is not None:
            return replay
        llm, kwargs, rows = self.llm, self.options.generate_kwargs(), []
        for s in sample_seeds(seed, n):
            llm.set_seed(s)
            stream = llm.generate(ids, grammar=self._grammar(), **kwargs)
            rows.append(list(itertools.islice(stream, L)))
            stream.close()
        tokens = tokens_from_rows(rows, num_samples=n, max_new_tokens=L, vocab_size=self.vocab_size)  # (N, L)
        return self._memo.store(key, tokens)


class LlamaCppTarget:
    """Exact processed conditionals of llama-cpp-python's sampler chain on the tiny target's weights.

    Raw logits: transformers float32 on the Hugging Face directory the GGUF was written from.  The
    chain (:func:`~specverify.adapters.llamacpp.sampler_chain.processed_probs`) sees the tokens
    generated since the prompt: ``conditionals(sequences, start)`` takes ``sequences[:, :start]``
    as the prompt; ``next_token_probs(prefix)`` is the law of the first token ``generate(prefix)``
    emits (the whole prefix is the prompt: empty penalty window, grammar at its start).

    Parameters
    ----------
    hf_dir : path
        The target's Hugging Face directory.
    grammar : bool
        Mask with :data:`~specverify.adapters.llamacpp.sampler_chain.WORD_GRAMMAR`.
    **options
        Sampler options, as :class:`LlamaCppDecoder`'s.
    """

    def __init__(self, hf_dir, *, grammar=False, **options):
        from transformers import LlamaForCausalLM

        self.hf_dir = str(hf_dir)
        self.grammar = check_bool("grammar", grammar)
        self.options = sampler_options(**options)
        self.model = LlamaForCausalLM.from_pretrained(self.hf_dir, dtype=torch.float32).eval()
        self.vocab_size = VOCAB_SIZE

    def __repr__(self) -> str:
        return f"LlamaCppTarget({self.hf_dir!r}, {self.options}, grammar={self.grammar})"

    def logits(self, sequences: torch.Tensor) -> torch.Tensor:
        """Raw float32 logits of every position (B, S) -> (B, S, V)."""
        check_shape("sequences", sequences, (None, None))
        check_tokens("sequences", sequences, self.vocab_size)
        with torch.no_grad():
            return self.model(input_ids=sequences.to(torch.long)).logits.to(torch.float32)  # (B, S, V)

    def _process(self, logits: torch.Tensor, generated: torch.Tensor) -> torch.Tensor:
        """Processed law after ``generated`` (B, H) tokens since the prompt, from raw (B, V) logits."""
        allowed = None
        if self.grammar:
            states = WORD_GRAMMAR.states(generated, list(PIECES))
            allowed = WORD_GRAMMAR.mask(states, list(PIECES), EOG)  # (B, V)
        return processed_probs(logits, self.options, history=generated, allowed=allowed)  # (B, V)

    def next_token_probs(self, prefix: torch.Tensor) -> torch.Tensor:
        """Law of the first token ``generate(prefix)`` emits, (B, T) -> (B, V) float64."""
        logits = self.logits(prefix)[:, -1]  # (B, V)
        return self._process(logits, prefix[:, :0])

    def conditionals(self, sequences: torch.Tensor, start: int) -> torch.Tensor:
        """Teacher-forced laws of ``sequences[:, start:]`` given the prompt ``sequences[:, :start]``: (B, S - start, V)."""
        S = check_shape("sequences", sequences, (None, None)).shape[1]
        start = check_int("start", start, minimum=1, maximum=S - 1)
        logits = self.logits(sequences)  # (B, S, V)
        steps = [self._process(logits[:, t - 1], sequences[:, start:t]) for t in range(start, S)]
        return torch.stack(steps, dim=1)  # (B, S - start, V)


def tiny_decoder(*, drafter=None, num_pred_tokens=3, max_ngram_size=2, grammar=False, memoize=False, seed=0, **options):
    """:class:`LlamaCppDecoder` on the tiny seeded target GGUF (and its perturbed draft for ``"draft_model"``)."""
    drafter = None if drafter in (None, "none") else drafter
    target_path, draft_path = save_tiny_gguf(seed=seed)
    return LlamaCppDecoder(
        target_path,
        drafter=drafter,
        num_pred_tokens=num_pred_tokens,
        max_ngram_size=max_ngram_size,
        draft_path=draft_path,
        grammar=grammar,
        memoize=memoize,
        **options,
    )


def tiny_target(*, grammar=False, seed=0, **options):
    """Exact processed conditionals of :func:`tiny_decoder`'s target (transformers float32, chain in float64)."""
    from specverify.adapters.fixtures.llama import save_tiny_models

    hf_dir, _ = save_tiny_models(seed=seed)
    return LlamaCppTarget(hf_dir, grammar=grammar, **options)


def max_conditional_difference(*, seed: int = 0, num_sequences: int = 8, length: int = 12) -> float:
    """Largest |p_llama.cpp - p_transformers| over the raw next-token laws of random sequences (tiny target).

    llama.cpp's are ``softmax`` of the logits ``Llama.eval`` computes (``logits_all=True``, one
    sequence at a time from an empty cache); transformers' the float32 logits of the same weights.
    Sequences are drawn from a ``torch.Generator`` seeded with ``seed``.
    """
    llama_cpp = _import_llama_cpp()
    target = tiny_target(seed=seed, temperature=1.0)
    target_path, _ = save_tiny_gguf(seed=seed)
    llm = llama_cpp.Llama(
        str(target_path), n_ctx=N_CTX, n_threads=1, n_threads_batch=1, logits_all=True, verbose=False, **KV_F32
    )

    def laws(sequences: torch.Tensor) -> torch.Tensor:
        rows = []
        for row in sequences.tolist():
            llm.reset()
            llm.eval(row)
            rows.append(torch.from_numpy(llm.scores[: len(row)].copy()))  # (T, V)
        return torch.softmax(torch.stack(rows).double(), -1)  # (N, T, V)

    return max_law_difference(
        laws, target.model, vocab_size=VOCAB_SIZE, seed=seed, num_sequences=num_sequences, length=length
    )
